"""Command line that the workflow's experiment rules call: run a batch of points of one problem.

    python -m cs336sys.run PROBLEM --function cs336sys.bench:run_point \
        --points '[{...}, ...]' --outputs a.json b.json ...

`--function` names a `run_point(settings) -> metrics` function; it is imported only here, so each
rule's code hash covers exactly the modules that function's module imports.
"""

from __future__ import annotations

import argparse
import importlib
import json
import sys

from cs336sys.jobs import GpuRequired, run_points


def resolve(target: str):
    module, _, func = target.partition(":")
    if not func:
        raise SystemExit(f"--function must look like 'package.module:function', got {target!r}")
    return getattr(importlib.import_module(module), func)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cs336sys.run", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("problem", help="the problem name recorded in each result")
    parser.add_argument("--function", required=True, help="module:function computing one point's metrics")
    parser.add_argument("--points", required=True, help="JSON list of settings dicts, one per output")
    parser.add_argument("--outputs", nargs="+", required=True)
    args = parser.parse_args(argv)
    points = json.loads(args.points)
    try:
        errors = run_points(args.problem, points, args.outputs, resolve(args.function))
    except GpuRequired as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 3
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
