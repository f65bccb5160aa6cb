"""Move every provenance record from one code-hash rule to the next without re-running anything.

    python tools/migrate_code_hashes.py OLD_CODEHASH.py [--write]

For each record in `.snakemake/metadata` that holds a `code` parameter: if it holds the hash the old
rule (OLD_CODEHASH.py, the previous `cs336sys/codehash.py`) gives this checkout's code, it gets the
hash the current rule gives it (the job was up to date and stays so). Otherwise the record's result
names its commit (`env.git_commit`): the old rule applied to that commit's sources must give the
recorded hash (else the record is left alone and listed), and the record gets the current rule's hash
of that commit's sources. A job is then up to date exactly when the current rule sees no change
between the code it was made with and the code here. Prints one line per rule; `--write` rewrites
the records (byte for byte as Snakemake writes them, the hash alone changed).
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


def _old_rule(path: Path, src: Path):
    """The old codehash module, reading the sources under `src`."""
    spec = importlib.util.spec_from_file_location(f"old_codehash_{abs(hash(src))}", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    mod.SRC = src
    return mod


def _entries(rec: dict, section_of: dict[str, str]) -> tuple[str, ...] | None:
    function = provenance.function_param(rec)
    if function:
        return function, "cs336sys.run"
    rule = rec.get("rule", "")
    if rule in section_of:
        return (section_of[rule],)
    if rule == "report_markdown":
        return "cs336sys.report", "cs336sys.deliverables"
    if rule == "report_pdf":
        return ("cs336sys.report",)
    return None


def _old_entries(entries: tuple[str, ...], by_module: bool) -> tuple[str, ...]:
    return tuple(e.partition(":")[0] for e in entries) if by_module else entries


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("old", type=Path, help="the previous cs336sys/codehash.py")
    p.add_argument("--old-by-module", action="store_true",
                   help="the old rule hashed the experiment function's whole module (the first rule did)")
    p.add_argument("--write", action="store_true")
    args = p.parse_args(argv)
    from cs336sys import registry

    section_of = {s.rule: s.module for s in registry.SECTIONS.values()}
    here = codehash.SRC
    old_here = _old_rule(args.old, here)
    trees: dict[str, tuple[object, codehash.Tree] | None] = {}
    by_rule: dict[str, list[str]] = defaultdict(list)
    changes: dict[Path, tuple[str, str]] = {}
    for output, rec in provenance.records():
        h = provenance.code_param(rec)
        entries = _entries(rec, section_of)
        rule = rec.get("rule", "?")
        if h is None or entries is None:
            continue
        if old_here.code_hash(*_old_entries(entries, args.old_by_module)) == h:
            new = codehash.code_hash(*entries)
            by_rule[rule].append("up to date, stays so")
        else:
            commit = provenance.results_commit(output)
            src = provenance.sources_at(commit) if commit else None
            if src is None:
                by_rule[rule].append(f"LEFT: {output}: no commit to rebuild its code from ({commit})")
                continue
            if commit not in trees:
                trees[commit] = (_old_rule(args.old, src), codehash.Tree(src))
            old_then, new_then = trees[commit]
            if old_then.code_hash(*_old_entries(entries, args.old_by_module)) != h:
                by_rule[rule].append(f"LEFT: {output}: the old rule at {commit[:10]} does not give {h}")
                continue
            new = new_then.code_hash(*entries)
            now = codehash.code_hash(*entries)
            by_rule[rule].append(f"{commit[:10]} -> {'up to date' if new == now else 'changed since'}")
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
        print("\n".join(_migrate_pins()))
    return 0


def _migrate_pins() -> list[str]:
    """Each pin in effect vouched for today's code: a pinned rule whose records now hold today's hash
    needs no pin; the others keep it, re-expressed in the current rule's hashes."""
    said, kept = [], []
    for pin in pins_lib.load():
        for rule in list(pin.rules):
            outputs = pin.outputs.get(rule, [])
            recorded = {provenance.recorded_hash(o) for o in outputs}
            function = provenance.function_param(provenance.record(outputs[0])) if outputs else None
            if len(recorded) != 1 or None in recorded or function is None:
                said.append(f"{rule}: records missing or mixed, pin left as it was")
                continue
            now = codehash.code_hash(function, "cs336sys.run")
            made = recorded.pop()
            if made == now:
                said.append(f"{rule}: up to date by the new rule, unpinned")
                del pin.rules[rule], pin.code[rule], pin.outputs[rule]
            else:
                pin.rules[rule], pin.code[rule] = made, now
                said.append(f"{rule}: still pinned ({pin.reason[:50]}...)")
        if pin.rules:
            kept.append(pin)
    pins_lib.save(kept)
    return said


if __name__ == "__main__":
    sys.exit(main())
