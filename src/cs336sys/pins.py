"""Result pins: committed results kept in use although code in their experiment's closure changed.

Each experiment rule carries the content hash of the code its experiment imports (`code`), so any
edit to that code makes its committed results stale. Most edits should: they change what is
measured. Some do not (a command-line option, a message, an estimate used only to refuse a point),
and the results may need a GPU this machine does not have. A pin keeps such results:

    python -m cs336sys.pins add --experiments benchmarking warmup --reason "the CLI's estimate only"
    python -m cs336sys.pins list
    snakemake -n writeup/report.pdf --config pins=off     # what the pins hold back

A pin names rules and, per rule, the code hash its committed results were made with (read from
Snakemake's provenance records in `.snakemake/metadata`). The workflow gives a pinned rule that
hash as its `code` parameter only while every output's record still holds it: once the results
are re-made (with pins off, or on a GPU host with newer code), the records hold another hash and
the pin is spent; and a pin also records the code's hash when it was made, so a later edit of the
same code makes it `outdated` (the job is stale again until re-run or pinned anew): a pin vouches for
one code change, never hides the next, and cannot keep a re-made job running. Spent
pins are listed as such and dropped by `prune`. The report lists every pin in effect.

No Snakemake import and no torch: the workflow, the report and the command line all use this.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import re
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path

import yaml

from cs336sys import codehash
from cs336sys.provenance import METADATA, git, record, recorded_hash, records, results_commit

PINS_FILE = Path("workflow/pins.yaml")
_HEADER = """\
# Result pins: committed results kept in use although code in their experiment changed since they
# were made (see src/cs336sys/pins.py). Written by `python -m cs336sys.pins add`; read by the
# workflow (workflow/rules/common.smk) and the report. `--config pins=off` ignores them.
"""


class PinError(ValueError):
    """A pins file or request that cannot be used; the message says what and where."""


@dataclass
class Pin:
    rules: dict[str, str]  # rule name -> code hash its committed results were made with
    reason: str
    code: dict[str, str] = field(default_factory=dict)  # rule name -> the code's hash when pinned
    pinned_at: str | None = None  # the commit at which the pin was added
    results_commit: str | None = None  # the commit the results were made at (their env.git_commit)
    date: str | None = None
    outputs: dict[str, list[str]] = field(default_factory=dict)  # rule -> its result files

    def as_yaml(self) -> dict:
        return {k: v for k, v in asdict(self).items() if v not in (None, {}, [])}


def load(path: Path = PINS_FILE) -> list[Pin]:
    """The pins of `path` (none if the file is missing); a malformed file is a PinError naming it."""
    if not Path(path).exists():
        return []
    try:
        # libyaml's loader where PyYAML has it: the workflow reads this file at every start (0.4 s in Python)
        data = yaml.load(Path(path).read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) or {}
    except yaml.YAMLError as e:
        raise PinError(f"{path}: not valid YAML ({e})") from None
    if not isinstance(data, dict) or not isinstance(data.get("pins", []), list):
        raise PinError(f"{path}: expected a mapping with a list under 'pins'")
    pins = []
    for i, entry in enumerate(data.get("pins") or []):
        where = f"{path}: pins[{i}]"
        if not isinstance(entry, dict) or not isinstance(entry.get("rules"), dict) or not entry["rules"]:
            raise PinError(f"{where}: needs 'rules', a mapping of rule name to code hash")
        if not isinstance(entry.get("reason"), str) or not entry["reason"].strip():
            raise PinError(f"{where}: needs a 'reason'")
        unknown = set(entry) - set(Pin.__dataclass_fields__)
        if unknown:
            raise PinError(f"{where}: unknown key(s) {sorted(unknown)}")
        for key in ("rules", "code"):
            for rule, h in (entry.get(key) or {}).items():
                if not isinstance(h, str) or not re.fullmatch(r"[0-9a-f]{16}", h):
                    raise PinError(f"{where}: {key} of rule {rule!r} is {h!r}, not 16 hex digits")
        if set(entry.get("code") or {}) != set(entry["rules"]):
            raise PinError(f"{where}: 'code' needs the hash of the code it was pinned at for each rule")
        pins.append(Pin(**entry))
    seen: dict[str, int] = {}
    for i, p in enumerate(pins):
        for rule in p.rules:
            if rule in seen:
                raise PinError(f"{path}: rule {rule!r} is pinned twice (pins[{seen[rule]}] and pins[{i}])")
            seen[rule] = i
    return pins


def save(pins: list[Pin], path: Path = PINS_FILE) -> None:
    text = _HEADER + yaml.safe_dump({"pins": [p.as_yaml() for p in pins]}, sort_keys=False, width=110)
    tmp = Path(path).with_suffix(".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def state(pinned: str, live: str, outputs: list[str], metadata: Path = METADATA, at: str | None = None) -> str:
    """`effective` (the results hold the pinned hash and the code is what it was when pinned),
    `outdated` (the code changed again since: the pin no longer vouches for it), `spent` (the results
    were re-made: they hold another hash), `unneeded` (the code is back at the results' hash), or
    `broken` (results or their records missing)."""
    recorded = {recorded_hash(o, metadata) for o in outputs}
    if not outputs or None in recorded or not all(Path(o).exists() for o in outputs):
        return "broken"
    if recorded != {pinned}:
        return "spent"
    if live == pinned:
        return "unneeded"
    return "effective" if at in (None, live) else "outdated"


def code_for(rule: str, live: str, outputs: list[str], pins: list[Pin], metadata: Path = METADATA) -> str:
    """The `code` parameter the workflow gives `rule`: the pinned hash while the pin is in effect,
    else the live one."""
    for p in pins:
        if rule in p.rules and state(p.rules[rule], live, outputs, metadata, p.code.get(rule)) == "effective":
            return p.rules[rule]
    return live


def for_report(pins: list[Pin], live: dict[str, str], metadata: Path = METADATA,
               experiment_of: dict[str, str] | None = None) -> list[dict]:
    """The pins in effect, for the report: rules, what they are (jobs per experiment), reason, the
    results' and the pin's commits."""
    shown = []
    for p in pins:
        rules = [r for r, h in p.rules.items()
                 if r in live and state(h, live[r], p.outputs.get(r, []), metadata, p.code.get(r)) == "effective"]
        if rules:
            count: dict[str, int] = {}
            for r in rules:
                e = (experiment_of or {}).get(r, r)
                count[e] = count.get(e, 0) + 1
            what = ", ".join(f"{e} ({n} jobs)" if n > 1 else e for e, n in count.items())
            shown.append({"rules": rules, "what": what, "reason": p.reason, "changes": changes(p.reason),
                          "results_commit": p.results_commit or "?", "pinned_at": (p.pinned_at or "?")[:10]})
    return shown


def changes(reason: str) -> list[str]:
    """A pin's reason as the code changes it vouches for, in order: `add` extends an outdated pin's reason
    with ". Then: " and the next change's."""
    return [part.rstrip(".") for part in reason.split(". Then: ")]


# --- the command line --------------------------------------------------------------------------------


def _outputs_by_rule(metadata: Path = METADATA) -> dict[str, list[str]]:
    """Every output with a provenance record, by the rule that made it (sections and report excluded)."""
    by: dict[str, list[str]] = {}
    for output, rec in records(metadata):
        rule = rec.get("rule")
        if rule and output.startswith("results/") and not output.startswith("results/sections/"):
            by.setdefault(rule, []).append(output)
    return by


def live_hashes() -> dict[str, tuple[str, list[str]]]:
    """rule -> (the hash the workflow computes now, its result files with provenance here), for every
    experiment rule with records: the experiment is its record's problem parameter, and the hash is
    computed as the workflow computes it (`experiment_code` in workflow/rules/common.smk)."""
    from cs336sys import registry

    hashes: dict[str, tuple[str, list[str]]] = {}
    for rule, outputs in _outputs_by_rule().items():
        rec = record(outputs[0]) or {}
        problem = next((p.strip("'") for p in rec.get("params", []) if p.strip("'") in registry.EXPERIMENTS), None)
        if problem is None:
            continue
        points = next((json.loads(p.strip("'")) for p in rec.get("params", []) if p.startswith("'[{")), [])
        function = registry.function_of(problem, points)  # the job's own now: some experiments choose by impl
        hashes[rule] = (codehash.code_hash(function, codehash.RUNNER), outputs)
    return hashes


def _results_commit(outputs: list[str]) -> str | None:
    commits = {c for o in outputs if (c := results_commit(o))}
    return ", ".join(sorted(c[:10] for c in commits)) or None  # short forms, as the report prints them


def add(rules: list[str], experiments: list[str], reason: str, path: Path = PINS_FILE) -> list[str]:
    """Pin the named rules (or every rule of the named experiments) whose committed results are stale
    by code only. Returns what it did, a line per rule."""
    from cs336sys import registry

    live = live_hashes()
    for e in experiments:
        registry.experiment(e)  # unknown experiment: a clear error
    wanted = set(rules)
    for rule, (_, outputs) in live.items():
        rec = record(outputs[0]) or {}
        if any(p.strip("'") in experiments for p in rec.get("params", [])):
            wanted.add(rule)
    unknown = sorted(r for r in rules if r not in live)
    if unknown:
        raise PinError(f"no committed results with provenance for rule(s) {unknown}: nothing to pin")
    if not wanted:
        raise PinError("nothing to pin: name --rules or --experiments that have committed results")
    pins = load(path)
    pinned_now = {r for p in pins for r in p.rules}
    said, new = [], Pin(rules={}, reason=reason, pinned_at=git("rev-parse", "HEAD"),
                        date=_dt.date.today().isoformat())
    extended: dict[int, Pin] = {}  # id(an outdated pin) -> the pin its re-pinned rules move to
    for rule in sorted(wanted):
        h, outputs = live[rule]
        recorded = {recorded_hash(o) for o in outputs}
        missing = [o for o in outputs if not Path(o).exists()]
        if missing:
            raise PinError(f"{rule}: result file(s) missing ({missing[0]} ...): re-make them, do not pin")
        if None in recorded or len(recorded) != 1:
            raise PinError(f"{rule}: its results were made with different code ({sorted(map(str, recorded))}); "
                           "re-make them")
        made = recorded.pop()
        if made == h:
            said.append(f"{rule}: up to date, not pinned")
            continue
        old = next((p for p in pins if rule in p.rules), None) if rule in pinned_now else None
        held = old and state(old.rules[rule], h, outputs, at=old.code.get(rule))
        if held == "effective":
            said.append(f"{rule}: already pinned and in effect")
            continue
        if held == "outdated":
            # the pin vouched for an earlier change: the rule moves to a pin that vouches for both
            target = extended.setdefault(id(old), Pin(rules={}, reason=f"{old.reason.rstrip('.')}. Then: {reason}",
                                                      pinned_at=new.pinned_at, date=new.date))
            del old.rules[rule], old.code[rule]
            old.outputs.pop(rule, None)
            said.append(f"{rule}: its outdated pin extended to this change (code now {h})")
        else:  # not pinned, or its pin is spent (the results were re-made) or broken: pinned anew
            if old:
                del old.rules[rule], old.code[rule]
                old.outputs.pop(rule, None)
            target = new
            said.append(f"{rule}: pinned to {made} (code now {h})")
        target.rules[rule] = made
        target.code[rule] = h
        target.outputs[rule] = outputs
    added = [p for p in [*extended.values(), new] if p.rules]
    for p in added:
        p.results_commit = _results_commit([o for outs in p.outputs.values() for o in outs])
    if added:
        save([p for p in pins if p.rules] + added, path)
    return said


def describe(path: Path = PINS_FILE) -> list[str]:
    live = live_hashes()
    lines = []
    for i, p in enumerate(load(path)):
        lines.append(f"[{i}] {p.reason} (pinned at {(p.pinned_at or '?')[:10]}, results of "
                     f"{p.results_commit or '?'})")
        for rule, h in p.rules.items():
            now = live.get(rule, ("?", []))[0]
            lines.append(f"    {rule}: {state(h, now, p.outputs.get(rule, []), at=p.code.get(rule))}")
    return lines or ["no pins"]


def prune(path: Path = PINS_FILE) -> list[str]:
    """Drop the rules whose pin is spent or unneeded, and the pins left with none."""
    live = live_hashes()
    kept, said = [], []
    for p in load(path):
        for rule, h in list(p.rules.items()):
            s = state(h, live.get(rule, ("?", []))[0], p.outputs.get(rule, []), at=p.code.get(rule))
            if s in ("spent", "unneeded"):
                del p.rules[rule]
                p.code.pop(rule, None)
                p.outputs.pop(rule, None)
                said.append(f"{rule}: {s}, removed")
        if p.rules:
            kept.append(p)
    save(kept, path)
    return said or ["nothing to prune"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m cs336sys.pins", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--file", type=Path, default=PINS_FILE, help="the pins file (default: %(default)s)")
    sub = p.add_subparsers(dest="command", required=True)
    a = sub.add_parser("add", help="pin rules whose committed results are stale by code only")
    a.add_argument("--rules", nargs="+", default=[])
    a.add_argument("--experiments", nargs="+", default=[])
    a.add_argument("--reason", required=True, help="why the code change leaves the results valid (shown in the report)")
    sub.add_parser("list", help="each pin and whether it is in effect")
    sub.add_parser("prune", help="remove spent pins")
    r = sub.add_parser("remove", help="remove a pin by its number in `list`")
    r.add_argument("index", type=int)
    args = p.parse_args(argv)
    try:
        if args.command == "add":
            lines = add(args.rules, args.experiments, args.reason, args.file)
        elif args.command == "list":
            lines = describe(args.file)
        elif args.command == "prune":
            lines = prune(args.file)
        else:
            pins = load(args.file)
            if not 0 <= args.index < len(pins):
                raise PinError(f"no pin [{args.index}]; `list` shows {len(pins)}")
            gone = pins.pop(args.index)
            save(pins, args.file)
            lines = [f"removed [{args.index}]: {', '.join(gone.rules)}"]
    except (PinError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
