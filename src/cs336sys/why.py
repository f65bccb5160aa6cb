"""Why a job re-runs: what changed in the code it runs since its results, or its pin, were made.

Each rule's `code` parameter hashes what its job runs (cs336sys.codehash); seeing another hash, Snakemake
says only "Params have changed". This names the change. A job is judged against its pin's code while the
pin is outdated (cs336sys.pins: the code changed again since it was pinned), else against its results':
the commit a result names (`env.git_commit`), or, for a section or the report, the last commit before its
job ran. From there, the first commit whose sources give the hash the job was judged by is unpacked
(cs336sys.provenance.sources_at), and its manifest is compared with today's, definition by definition.

    python -m cs336sys.codehash why [RULE...]   # any rule with provenance records, sections and report too

The workflow prints `summary` after a dry run's job list, and as a run starts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

from cs336sys import codehash, provenance, registry
from cs336sys import pins as pins_lib

REPORT_ENTRIES = {  # what the report's rules hash (workflow/rules/rules.smk)
    "report_markdown": ("cs336sys.report", "cs336sys.deliverables", "cs336sys.writeup.items"),
    "report_pdf": ("cs336sys.report",),
}
SEARCHED = 12  # commits tried, from the one a result or pin names on, for the sources that give its hash


def entries_of(rule: str, rec: dict | None) -> tuple[str, ...] | None:
    """What a rule's `code` parameter hashes now, from one of its provenance records (None: a rule without
    one): an experiment job's function is chosen by its points' impl (registry.function_of), which may be
    another function than the one its record names (`recorded_entries`)."""
    function = provenance.function_param(rec)
    if function:
        params = [p.strip("'") for p in rec.get("params", []) if isinstance(p, str)]
        problem = next((p for p in params if p in registry.EXPERIMENTS), None)
        points = next((json.loads(p) for p in params if p.startswith("[{")), [])
        return (registry.function_of(problem, points) if problem else function), codehash.RUNNER
    sections = {s.rule: s.module for s in registry.SECTIONS.values()}
    return (sections[rule],) if rule in sections else REPORT_ENTRIES.get(rule)


def recorded_entries(outputs: list[str], entries: tuple[str, ...]) -> tuple[str, ...]:
    """What the `code` of these results hashed when they were made: the function their record names
    (an experiment split since has another one today), else today's `entries`."""
    rec = next((r for o in outputs if Path(o).exists() and (r := provenance.record(o))), None)
    function = provenance.function_param(rec)
    return (function, codehash.RUNNER) if function else entries


@cache
def _tree(commit: str) -> codehash.Tree | None:
    src = provenance.sources_at(commit)
    return None if src is None else codehash.Tree(src)


@cache
def _hash_at(commit: str, entries: tuple[str, ...]) -> str | None:
    tree = _tree(commit)
    try:
        return None if tree is None else tree.code_hash(*entries)
    except ValueError:  # the entry did not exist yet
        return None


def source_commit(entries: tuple[str, ...], want: str, commit: str | None = None,
                  before: float | None = None) -> str | None:
    """The commit whose sources give hash `want` for `entries`: `commit` or, failing that, the first later
    commit that changed src/ and does; with no commit, the same from the last commit before time `before`."""
    start = commit or (before and provenance.git("rev-list", "-1", f"--before=@{int(before)}", "HEAD", "--", "src"))
    if not start:
        return None
    later = provenance.git("rev-list", "--reverse", "--ancestry-path", f"{start}..HEAD", "--", "src") or ""
    return next((c for c in [start, *later.split()][:SEARCHED] if _hash_at(c, entries) == want), None)


@dataclass
class Reference:
    """The code a job is judged against: `since` in words, the commits whose sources are that code, and
    what could not be found."""

    since: str
    commits: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)


def reference(rule: str, entries: tuple[str, ...], outputs: list[str], pins: list[pins_lib.Pin]) -> Reference:
    then = recorded_entries(outputs, entries)  # what the results' (and a pin's) hash covered
    pin = next((p for p in pins if rule in p.rules), None)
    if pin is not None and pins_lib.state(pin.rules[rule], codehash.code_hash(*entries), pin.outputs.get(rule, []),
                                          at=pin.code.get(rule)) == "outdated":
        at = (pin.pinned_at or "?")[:10]
        found = source_commit(then, pin.code[rule], pin.pinned_at)
        return Reference(f"its pin ({found[:10] if found else at})", [found] if found else [],
                         [] if found else [f"no commit from {at} on gives the pin's hash {pin.code[rule]}"])
    made: dict[tuple[str, str | None], str] = {}  # (recorded hash, the commit its result names) -> an output
    for o in outputs:
        h = provenance.recorded_hash(o)
        if h is not None and Path(o).exists():
            made.setdefault((h, provenance.results_commit(o)), o)
    ref = Reference("its results")
    for (h, named), o in sorted(made.items(), key=str):
        ran = None if named else (provenance.record(o) or {}).get("endtime")
        found = source_commit(then, h, named, ran)
        if found is None:
            ref.missing.append(f"no commit from {(named or 'the time it ran')[:10]} on gives its hash {h} "
                               "(made from uncommitted code, or history this checkout lacks)")
        elif found not in ref.commits:
            ref.commits.append(found)
    if ref.commits:
        ref.since += f" ({', '.join(c[:10] for c in ref.commits)})"
    return ref


def changes(entries: tuple[str, ...], ref: Reference,
            then: tuple[str, ...] | None = None) -> list[tuple[str, str, str]]:
    """(module, how, statement) for each change between the reference's code (`then`: what it hashed,
    today's `entries` unless told) and today's."""
    now = codehash.manifest(*entries)
    rows: list[tuple[str, str, str]] = []
    for c in ref.commits:
        rows += [r for r in codehash.diff(_tree(c).manifest(*(then or entries)), now) if r not in rows]
    return rows


def explain(rule: str, entries: tuple[str, ...], outputs: list[str], pins: list[pins_lib.Pin]) -> list[str]:
    """A line per changed module, `since its results (abc1234567): module: changed: def f`, then what
    could not be compared."""
    ref = reference(rule, entries, outputs, pins)
    then = recorded_entries(outputs, entries)
    lines = [f"since {ref.since}: {line}" for line in codehash.describe(changes(entries, ref, then))]
    if ref.commits and not lines:
        lines.append(f"{ref.since}, whose code is the same by the current rule (its records hold another hash)")
    return lines + ref.missing


def _listed(names: list[str], most: int = 4) -> str:
    return ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "")


def _short(line: str, width: int = 160) -> str:
    return line if len(line) <= width else line[: width - 1] + "…"


def summary(jobs: list[tuple[str, tuple[str, ...], str, list[str]]], pins: list[pins_lib.Pin],
            groups: int = 4, rows: int = 4) -> str:
    """Of `jobs` (rule, hash entries, the `code` it gets, its result files), those whose results hold another
    code hash, grouped by what changed (the modules and definitions): at most `groups` groups of `rows`
    lines. Empty when there are none."""
    grouped: dict[tuple[str, ...], dict[str, list[str]]] = {}  # what changed -> since what -> rules
    for rule, entries, code, outputs in jobs:
        made = {provenance.recorded_hash(o) for o in outputs if Path(o).exists()} - {None}
        if not made or made == {code}:
            continue
        ref = reference(rule, entries, outputs, pins)
        what = tuple(codehash.describe(changes(entries, ref, recorded_entries(outputs, entries)))) + tuple(ref.missing)
        since = "since their pins" if ref.since.startswith("its pin") else "since their results"
        grouped.setdefault(what or ("no change by the current rule (their records hold another hash)",), {}) \
            .setdefault(since, []).append(rule)
    if not grouped:
        return ""
    count = lambda by_since: sum(map(len, by_since.values()))  # noqa: E731
    ordered = sorted(grouped.items(), key=lambda kv: -count(kv[1]))
    out = [f"{sum(count(g) for g in grouped.values())} experiment job(s) re-run because code they run changed "
           "(Snakemake's 'Params have changed' is their `code`). What changed:"]
    for what, by_since in ordered[:groups]:
        out += [f"  {_short(line)}" for line in what[:rows]]
        out += [f"  ... and {len(what) - rows} more module(s)"] if len(what) > rows else []
        out += [f"    -> {len(r)} job(s), {since}: {_listed(sorted(r))}" for since, r in by_since.items()]
    if len(ordered) > groups:
        rest = [rule for _, g in ordered[groups:] for r in g.values() for rule in r]
        out.append(f"  ... and {len(rest)} job(s) with other changes: {_listed(sorted(rest))}")
    out.append("`python -m cs336sys.codehash why RULE...` lists each job's changes; a change that leaves the results "
               "valid can be pinned (`python -m cs336sys.pins add`).")
    return "\n".join(out)


def why(rules: list[str], pins: list[pins_lib.Pin] | None = None) -> list[str]:
    """For each rule with provenance records here (`rules`, or every one stale or pinned): up to date,
    pinned, or what changed since its results or its outdated pin."""
    pins = pins_lib.load() if pins is None else pins
    by_rule: dict[str, tuple[tuple[str, ...], list[str]]] = {}
    for output, rec in provenance.records():
        rule = rec.get("rule") or ""
        entries = entries_of(rule, rec)
        if entries and (not rules or rule in rules):
            by_rule.setdefault(rule, (entries, []))[1].append(output)
    unknown = sorted(set(rules) - set(by_rule))
    if unknown:
        raise ValueError(f"no provenance records for rule(s) {', '.join(unknown)}")
    lines: list[str] = []
    held: dict[int, list[str]] = {}  # pin -> its rules in effect (listed per pin unless rules are named)
    for rule, (entries, outputs) in sorted(by_rule.items()):
        now = codehash.code_hash(*entries)
        pin = next((p for p in pins if rule in p.rules), None)
        state = pin and pins_lib.state(pin.rules[rule], now, pin.outputs.get(rule, []), at=pin.code.get(rule))
        if state == "effective":
            held.setdefault(pins.index(pin), []).append(rule)
        elif {provenance.recorded_hash(o) for o in outputs} == {now}:
            lines += [f"{rule}: up to date"] if rules else []
        else:
            lines.append(f"{rule}: stale, its code changed")
            lines += [f"    {line}" for line in explain(rule, entries, outputs, pins)]
    for i, held_rules in sorted(held.items()):
        pin = pins[i]
        said = ", ".join(held_rules) if rules else f"{len(held_rules)} rule(s), {_listed(held_rules, 2)}"
        lines.append(f"up to date by pin [{i}] (the code is as pinned at {(pin.pinned_at or '?')[:10]}): {said}; "
                     f"{_short(pin.reason, 100)}")
    return lines or ["every job with provenance records here is up to date by its code"]
