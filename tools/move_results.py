"""Move committed results to the paths the rule files now give them, with everything that keeps them
up to date: Snakemake's metadata records, the job's timing record, the pins that name them.

    python tools/move_results.py snapshot /tmp/jobs.json      # 1. before editing the rule files
    (edit the result paths or job names in workflow/rules/*.smk)
    python tools/move_results.py apply /tmp/jobs.json [-n]    # 2. after: git mv + metadata

Each point is matched across the edit by its experiment and its point (the settings the rule gives
it), in the grids `main` and `next`; a point whose paths changed has its result file (and rendered
folder) moved with `git mv`, its metadata record renamed (Snakemake keys records by output path) with
every moved path inside it rewritten (the `results` parameter lists the job's outputs), its job's
timing record under benchmarks/ moved, and each moved path rewritten in workflow/pins.yaml. Nothing is
re-measured and nothing goes stale: check with `snakemake -n writeup/report.pdf` afterwards.
"""

from __future__ import annotations

import argparse
import base64
import json
import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
GRIDS = ("main", "next")
METADATA = Path(".snakemake/metadata")


def _jobs(grid: str) -> list:
    sys.path.insert(0, str(REPO / "src"))
    from cs336sys.workflow_helpers import parsed_workflow

    with parsed_workflow(REPO, {"grid": grid}) as workflow:
        return list(workflow.globals["EXPERIMENT_JOBS"])


def snapshot() -> dict:
    """(experiment, point) -> its result path, rendered folder, and its job's timing record."""
    found: dict[str, dict] = {}
    for grid in GRIDS:
        for job in _jobs(grid):
            for i, (point, result) in enumerate(zip(job.points, job.results, strict=True)):
                key = json.dumps([job.experiment, point], sort_keys=True)
                found[key] = {"result": result, "benchmark": job.benchmark, "rule": job.rule,
                              "rendered": job.rendered_dirs[i] if job.rendered else None}
    return found


def moves(before: dict, after: dict) -> tuple[dict[str, str], list[str]]:
    """old path -> new path for every file or folder that moves; points that appeared or vanished."""
    mapping: dict[str, str] = {}
    unmatched = sorted(set(before) ^ set(after))
    for key in set(before) & set(after):
        old, new = before[key], after[key]
        if old["rule"] != new["rule"]:
            raise SystemExit(f"rule renamed {old['rule']} -> {new['rule']}: not handled (pins and records "
                             "are keyed by rule name)")
        for kind in ("result", "rendered", "benchmark"):
            if old[kind] != new[kind]:
                if mapping.get(old[kind], new[kind]) != new[kind]:
                    raise SystemExit(f"{old[kind]} would move to two places")
                mapping[old[kind]] = new[kind]
    targets = list(mapping.values())
    if len(set(targets)) != len(targets):
        raise SystemExit("two paths would move to one")
    return mapping, unmatched


def _record(path: str) -> Path:
    return METADATA / base64.urlsafe_b64encode(path.encode()).decode()


def _rewrite(text: str, mapping: dict[str, str]) -> str:
    if not mapping:
        return text
    # a whole path only: not the rendered folder inside its result's name (a/b vs a/b.json)
    pattern = re.compile("|".join(re.escape(o) for o in sorted(mapping, key=len, reverse=True))
                         + r"(?![\w./-])")
    return pattern.sub(lambda m: mapping[m.group(0)], text)


def _tracked(path: str) -> bool:
    out = subprocess.run(["git", "ls-files", "--", path], cwd=REPO, capture_output=True, text=True, check=True)
    return bool(out.stdout.strip())


def apply(mapping: dict[str, str], dry_run: bool) -> None:
    def run(*cmd: str) -> None:
        print(" ".join(cmd))
        if not dry_run:
            subprocess.run(cmd, cwd=REPO, check=True)

    for old, new in sorted(mapping.items()):
        if not _tracked(old):
            continue  # a point not measured yet (the overlay's) or a timing record not committed
        if not dry_run:
            (REPO / new).parent.mkdir(parents=True, exist_ok=True)
        run("git", "mv", old, new)
    for old, new in sorted(mapping.items()):
        record = REPO / _record(old)
        if not record.is_file():
            continue
        text = _rewrite(record.read_text(), mapping)
        json.loads(text)  # still a record
        print(f"metadata {old} -> {new}")
        if not dry_run:
            (REPO / _record(new)).write_text(text)
            subprocess.run(["git", "add", str(_record(new))], cwd=REPO, check=True)
            subprocess.run(["git", "rm", "-q", str(_record(old))], cwd=REPO, check=True)
    pins = REPO / "workflow" / "pins.yaml"
    text = pins.read_text()
    if (new_text := _rewrite(text, mapping)) != text:
        print("workflow/pins.yaml: moved paths rewritten")
        if not dry_run:
            pins.write_text(new_text)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("snapshot", help="record every point's paths (before editing the rule files)")
    s.add_argument("file", type=Path)
    a = sub.add_parser("apply", help="move what the edit moved (after editing the rule files)")
    a.add_argument("file", type=Path)
    a.add_argument("-n", "--dry-run", action="store_true", help="print what would move")
    args = p.parse_args(argv)
    if args.command == "snapshot":
        args.file.write_text(json.dumps(snapshot(), indent=1, sort_keys=True))
        return 0
    mapping, unmatched = moves(json.loads(args.file.read_text()), snapshot())
    if unmatched:
        print(f"error: {len(unmatched)} points are not in both (a rule edit changed points, not paths):",
              *unmatched[:5], sep="\n  ", file=sys.stderr)
        return 1
    apply(mapping, args.dry_run)
    return 0


if __name__ == "__main__":
    sys.exit(main())
