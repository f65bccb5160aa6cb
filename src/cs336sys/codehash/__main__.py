"""`python -m cs336sys.codehash`: what a hash covers (`show`), and why jobs are stale (`why`, cs336sys.why).

The command line lives apart from the hash so that the hash (cs336sys.codehash) knows nothing of the pins
and provenance records that `why` reads: imports point down, from here to cs336sys.why to the rest."""

from __future__ import annotations

import argparse
import sys

from cs336sys import codehash, why


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m cs336sys.codehash", description=codehash.__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    w = sub.add_parser("why", help="which jobs are stale by their code, and which definitions changed")
    w.add_argument("rules", nargs="*", help="rules to explain: experiments, sections, report (default: every "
                                            "stale or pinned one)")
    s = sub.add_parser("show", help="what an entry's hash covers: each counted statement and its hash")
    s.add_argument("entries", nargs="+", help="module or module:function, e.g. cs336sys.bench:run_point")
    args = p.parse_args(argv)
    try:
        if args.command == "why":
            lines = why.why(args.rules)
        else:
            lines = [f"{codehash.code_hash(*args.entries)}  {' + '.join(args.entries)}"]
            for m, rows in codehash.manifest(*args.entries).items():
                lines.append(m)
                lines += [f"    {digest}  {label}" for label, digest in rows]
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
