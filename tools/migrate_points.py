"""Rewrite Snakemake's records after an edit that changes how points are written but not what they run.

    python tools/migrate_points.py snapshot /tmp/points.json     # 1. before the edit
    (edit: e.g. a grid value equal to its knob's default dropped; cs336sys.knobs.point normalises points)
    python tools/migrate_points.py apply /tmp/points.json [-n]   # 2. after: records rewritten

Snakemake re-runs a job whose `params` differ from its provenance record's (the `points` parameter is
the job's points as JSON), so an edit that only rewrites points, a knob at its default left out instead
of written, would re-run every job it touches, 2-GPU ones included, though each runs the same settings.
This matches each job by its rule in the grids `main` and `next`, checks that each of its points runs
the same settings before and after (the knobs a point leaves out take the defaults of the experiment's
settings dataclass, `cs336sys.knobs`), and replaces the points in the `params` and `shellcmd` of every
record of the job's outputs. A job whose points changed in meaning, or in number, is refused before
anything is written. Check with `snakemake -n writeup/report.pdf` afterwards: nothing to run.
(Used once, when `cs336sys.knobs.point` began to leave out knobs at their default.)
"""

from __future__ import annotations

import argparse
import base64
import json
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
GRIDS = ("main", "next")
METADATA = REPO / ".snakemake" / "metadata"


def _rules(grid: str) -> dict[str, dict]:
    """rule -> its experiment, its `points` parameter (parsed) and its outputs, as the workflow has them."""
    sys.path.insert(0, str(REPO / "src"))
    from cs336sys.whichjob import Workflow

    with Workflow(REPO, {"grid": grid}) as wf:
        jobs = {job.rule: job for job in wf.snakemake.globals["EXPERIMENT_JOBS"]}
        return {r.name: {"experiment": r.params.problem, "points": json.loads(r.params.points),
                         "outputs": list(jobs[r.name].results) + list(jobs[r.name].rendered_dirs)}
                for r in wf.snakemake.rules if hasattr(r.params, "points")}


def points_json(points: list[dict]) -> str:
    """As workflow/rules/common.smk writes the `points` parameter."""
    return json.dumps(points, sort_keys=True, separators=(",", ":"))


def snapshot() -> dict:
    """rule -> its experiment, points (its parameter) and outputs (result files and rendered folders)."""
    return {rule: found for grid in GRIDS for rule, found in _rules(grid).items()}


def settings(experiment: str, point: dict) -> dict:
    """The point with every knob it leaves out at its default (a knob with none stays absent)."""
    sys.path.insert(0, str(REPO / "src"))
    from cs336sys import knobs

    return knobs.with_defaults(experiment, point)


def changes(before: dict, after: dict) -> dict[str, tuple[str, str, list[str]]]:
    """rule -> (old points JSON, new points JSON, outputs) for the jobs whose points were rewritten."""
    problems, out = [], {}
    for rule in sorted(set(before) | set(after)):
        old, new = before.get(rule), after.get(rule)
        if old is None or new is None:
            problems.append(f"{rule}: only {'after' if old is None else 'before'} the edit")
            continue
        if old["outputs"] != new["outputs"] or len(old["points"]) != len(new["points"]):
            problems.append(f"{rule}: its outputs or number of points changed")
            continue
        for a, b in zip(old["points"], new["points"], strict=True):
            if settings(old["experiment"], a) != settings(new["experiment"], b):
                problems.append(f"{rule}: a point runs other settings: {a} -> {b}")
                break
        else:
            if points_json(old["points"]) != points_json(new["points"]):
                out[rule] = (points_json(old["points"]), points_json(new["points"]), new["outputs"])
    if problems:
        raise SystemExit("refused, nothing written:\n  " + "\n  ".join(problems[:20]))
    return out


def rewrite(record: dict, old: str, new: str) -> dict:
    params = [repr(new) if p == repr(old) else p for p in record["params"]]
    if params.count(repr(new)) != 1 or params == record["params"]:
        raise SystemExit(f"record of rule {record['rule']}: its points parameter is not the snapshot's")
    return {**record, "params": params, "shellcmd": record["shellcmd"].replace(old, new)}


def apply(found: dict[str, tuple[str, str, list[str]]], dry_run: bool) -> int:
    written = 0
    for rule, (old, new, outputs) in sorted(found.items()):
        for output in outputs:
            path = METADATA / base64.urlsafe_b64encode(output.encode()).decode()
            if not path.is_file():
                continue  # not made yet (the overlay's jobs)
            record = rewrite(json.loads(path.read_text()), old, new)
            written += 1
            if not dry_run:
                path.write_text(json.dumps(record))
        print(f"{rule}: {len(old)} -> {len(new)} characters of points")
    print(f"{written} records {'would be ' if dry_run else ''}rewritten")
    return written


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("snapshot", help="record every job's points (before the edit)")
    s.add_argument("file", type=Path)
    a = sub.add_parser("apply", help="rewrite the records of the jobs whose points were rewritten (after)")
    a.add_argument("file", type=Path)
    a.add_argument("-n", "--dry-run", action="store_true", help="check and count, write nothing")
    args = p.parse_args(argv)
    if args.command == "snapshot":
        args.file.write_text(json.dumps(snapshot(), indent=1, sort_keys=True))
        return 0
    apply(changes(json.loads(args.file.read_text()), snapshot()), args.dry_run)
    return 0


if __name__ == "__main__":
    sys.exit(main())
