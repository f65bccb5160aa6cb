"""Move every provenance record from one code-hash rule to the next without re-running anything.

    python tools/migrate_code_hashes.py OLD_CODEHASH.py [--write]

For each record in `.snakemake/metadata` that holds a `code` parameter:
- if its result names its commit (`env.git_commit`) and the old rule (OLD_CODEHASH.py: the previous rule
  in one file, as `cs336sys/codehash.py` was before it became a package) applied to that commit's
  sources gives the recorded hash, the record gets the current rule's hash of that commit's sources. A
  job is then up to date exactly when the current rule sees no change between the code it was made with
  and the code here;
- else, if it holds the hash the old rule gives this checkout's code and both rules count the same
  statements here, it gets the current rule's hash here (up to date, and a rule that counts nothing more
  cannot have missed a change);
- else it is left alone (its job re-runs) and listed.
Prints one line per rule. `--write` rewrites the records (byte for byte as Snakemake writes them, the
hash alone changed) and re-expresses each pin in the current rule's hashes. A pinned rule whose code
changed, since its results' commit, in statements the current rule sees and the old one did not is
listed with those statements, and its pin is left outdated (the job is stale): no pin's reason vouched
for them, so each must be reviewed and the pin extended (`python -m cs336sys.pins add`), or the job re-run.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import sys
from collections import defaultdict
from pathlib import Path

from cs336sys import codehash, provenance
from cs336sys import pins as pins_lib
from cs336sys.why import entries_of


def _old_rule(path: Path, src: Path):
    """The old codehash module, reading the sources under `src`."""
    spec = importlib.util.spec_from_file_location(f"old_codehash_{abs(hash(src))}", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    mod.SRC = src
    return mod


def _old_entries(entries: tuple[str, ...], by_module: bool) -> tuple[str, ...]:
    return tuple(e.partition(":")[0] for e in entries) if by_module else entries


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("old", type=Path, help="the previous rule in one file (as cs336sys/codehash.py was)")
    p.add_argument("--old-by-module", action="store_true",
                   help="the old rule hashed the experiment function's whole module (the first rule did)")
    p.add_argument("--write", action="store_true")
    args = p.parse_args(argv)
    here = codehash.SRC
    old_here = _old_rule(args.old, here)
    trees: dict[str, tuple[object, codehash.Tree] | None] = {}
    by_rule: dict[str, list[str]] = defaultdict(list)
    changes: dict[Path, tuple[str, str]] = {}
    for output, rec in provenance.records():
        h = provenance.code_param(rec)
        rule = rec.get("rule", "?")
        entries = entries_of(rule, rec)
        if h is None or entries is None:
            continue
        old_entries = _old_entries(entries, args.old_by_module)
        commit = provenance.results_commit(output)
        src = provenance.sources_at(commit) if commit else None
        if src is not None and commit not in trees:
            trees[commit] = (_old_rule(args.old, src), codehash.Tree(src))
        if src is not None and trees[commit][0].code_hash(*old_entries) == h:
            new = trees[commit][1].code_hash(*entries)
            now = codehash.code_hash(*entries)
            by_rule[rule].append(f"{commit[:10]} -> {'up to date' if new == now else 'changed since'}")
        elif old_here.code_hash(*old_entries) == h and _labels(old_here.manifest(*old_entries)) == _labels(
                codehash.manifest(*entries)):
            new = codehash.code_hash(*entries)
            by_rule[rule].append("up to date, stays so (both rules count the same statements)")
        else:
            why = (f"the old rule at {commit[:10]} does not give {h}" if src is not None else
                   f"no commit to rebuild its code from ({commit}), and the current rule counts other statements")
            by_rule[rule].append(f"LEFT (re-runs): {output}: {why}")
            continue
        changes[Path(provenance.METADATA) / provenance.record_name(output)] = (h, new)
    for rule, lines in sorted(by_rule.items()):
        counts = defaultdict(int)
        for line in lines:
            counts[line] += 1
        print(f"{rule}: " + "; ".join(f"{n}x {line}" for line, n in counts.items()))
    if args.write:
        for path, (old, new) in changes.items():
            text = path.read_text()
            assert json.dumps(json.loads(text)) == text, f"{path}: not as Snakemake writes records"
            rec = json.loads(text)
            rec["params"] = [f"'{new}'" if p == f"'{old}'" else p for p in rec["params"]]
            path.write_text(json.dumps(rec))
        print(f"rewrote {len(changes)} records", file=sys.stderr)
        print("\n".join(_migrate_pins(args.old)))
    return 0


Manifest = dict[str, list[tuple[str, str]]]  # module -> [(statement, hash)]


def _labels(manifest: Manifest) -> set[tuple[str, str]]:
    return {(m, label) for m, rows in manifest.items() for label, _ in rows}


def _changed(before: Manifest, after: Manifest) -> set[tuple[str, str, str]]:
    """(module, statement, how) for each statement changed, no longer counted or newly counted between two
    manifests."""
    b, a = ({(m, label): d for m, rows in x.items() for label, d in rows} for x in (before, after))
    return {(m, label, "changed" if (m, label) in a and (m, label) in b else
             "now counts" if (m, label) in a else "no longer counts")
            for m, label in set(b) | set(a) if b.get((m, label)) != a.get((m, label))}


def _newly_seen(old_path: Path, function: str, commit: str | None) -> list[str]:
    """The changes between `commit`'s sources and these that the current rule sees and the old one did not:
    each changed or dropped statement, and the statements newly counted (each reached through one of
    those) as a count per module."""
    src = provenance.sources_at(commit) if commit else None
    if src is None:
        return [f"(no commit to compare with: {commit})"]
    entries = (function, codehash.RUNNER)
    old_then, old_here = _old_rule(old_path, src), _old_rule(old_path, codehash.SRC)
    seen_before = _changed(old_then.manifest(*entries), old_here.manifest(*entries))
    unseen = _changed(codehash.Tree(src).manifest(*entries), codehash.manifest(*entries)) - seen_before
    added = defaultdict(int)
    for m, _, how in unseen:
        added[m] += how == "now counts"
    return ([f"{m}: {how}: {label}" for m, label, how in sorted(unseen) if how != "now counts"]
            + [f"{m}: {n} statement(s) now count" for m, n in sorted(added.items()) if n])


def _migrate_pins(old_path: Path) -> list[str]:
    """Each pin in effect vouched for today's code as the old rule saw it: a pinned rule whose records now
    hold today's hash needs no pin; the others keep it, re-expressed in the current rule's hashes, unless
    the current rule sees changes since the results' commit that the old one did not: those are listed,
    and the pin is left outdated."""
    said, kept = [], []
    for pin in pins_lib.load():
        for rule in list(pin.rules):
            outputs = pin.outputs.get(rule, [])
            recorded = {provenance.recorded_hash(o) for o in outputs}
            function = provenance.function_param(provenance.record(outputs[0])) if outputs else None
            if len(recorded) != 1 or None in recorded or function is None:
                said.append(f"{rule}: records missing or mixed, pin left as it was")
                continue
            now = codehash.code_hash(function, codehash.RUNNER)
            made = recorded.pop()
            if made == now:
                said.append(f"{rule}: up to date by the new rule, unpinned")
                del pin.rules[rule], pin.code[rule], pin.outputs[rule]
            else:
                commit = provenance.results_commit(outputs[0])
                unseen = _newly_seen(old_path, function, commit)
                # with nothing newly seen, the pin vouches for what it did; else it keeps the old rule's
                # code hash, which no current hash equals: outdated, the job is stale until pinned anew
                # (`python -m cs336sys.pins add --rules RULE --reason ...` extends the pin) or re-run
                pin.rules[rule] = made
                if not unseen:
                    pin.code[rule] = now
                    said.append(f"{rule}: still pinned ({pin.reason[:50]}...)")
                else:
                    said.append(f"{rule}: pin OUTDATED, review what it did not see since {(commit or '?')[:10]}:")
                    said += [f"    {line}" for line in unseen]
        if pin.rules:
            kept.append(pin)
    pins_lib.save(kept)
    return said


if __name__ == "__main__":
    sys.exit(main())
