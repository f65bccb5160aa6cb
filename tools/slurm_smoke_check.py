#!/usr/bin/env python3
"""What a pipeline run through Slurm must show: every job of a rule that is not local was submitted to
Slurm and completed there, holding a GPU exactly when its rule declares one (`resources: gpu=N`); no
local rule was submitted; the report was rebuilt by the run.

Reads Snakemake's log of the run and asks Slurm (`scontrol show job`) about every job id in it, so it
runs on the cluster's submit host while Slurm still remembers the jobs (`MinJobAge`, .ci/slurm-up.sh).
Used by the smoke-grid test of tests/test_workflow.py when CI runs it through the cluster of
.ci/slurm-smoke.sh, or by hand:

    python tools/slurm_smoke_check.py SNAKEMAKE_LOG SINCE_EPOCH_S REPORT_PDF
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

JOB = re.compile(r"^(localrule|rule) (\S+):\n((?:[ \t]+\S.*\n)+)", re.M)
SUBMITTED = re.compile(r"Job (\d+) has been submitted with SLURM jobid (\d+)")


def check(log: str, since: float, report: Path) -> tuple[list[str], str]:
    """(problems, summary) of the run whose Snakemake output is `log`, started at `since` (epoch s)."""
    jobs = {}  # Snakemake job id -> (rule, local?)
    gpus = {}  # Snakemake job id -> the GPUs its rule declares
    for kind, rule, body in JOB.findall(log):
        jobid = re.search(r"^\s+jobid: (\d+)$", body, re.M)
        jobs[jobid.group(1)] = (rule, kind == "localrule")
        gpu = re.search(r"^\s+resources:.*\bgpu=(\d+)", body, re.M)
        gpus[jobid.group(1)] = int(gpu.group(1)) if gpu else 0
    submitted = dict(SUBMITTED.findall(log))

    problems = []
    remote = {j for j, (_, local) in jobs.items() if not local}
    if not remote:
        problems.append("no experiment job ran at all")
    for j in sorted(remote - submitted.keys(), key=int):
        problems.append(f"job {j} ({jobs[j][0]}) did not go through Slurm")
    for j in sorted(submitted.keys() & {j for j, (_, local) in jobs.items() if local}, key=int):
        problems.append(f"local job {j} ({jobs[j][0]}) was submitted to Slurm")
    for j, slurm_id in sorted(submitted.items(), key=lambda kv: int(kv[0])):
        info = subprocess.run(["scontrol", "show", "job", slurm_id], capture_output=True, text=True,
                              timeout=10).stdout
        # A rule with gpu=N > 0 must reach Slurm as a GPU request; a CPU-only experiment (gloo, gpu=0)
        # must not hold a GPU it does not use.
        with_gpu = bool(re.search(r"TresPerJob=\S*gpu", info))
        wanted = gpus.get(j, 0) > 0
        if "JobState=COMPLETED" not in info or with_gpu != wanted:
            problems.append(f"Slurm job {slurm_id} (job {j}, {jobs.get(j, ('?',))[0]}, gpu={gpus.get(j, 0)}) did "
                            f"not complete {'with' if wanted else 'without'} a GPU: {' '.join(info.split()[:40])}")
    if not report.exists() or report.stat().st_mtime < int(since):
        problems.append(f"{report} was not rebuilt")
    rules = {jobs[j][0] for j in remote}
    summary = (f"{len(remote)} experiment jobs ran as Slurm jobs {', '.join(sorted(submitted.values(), key=int))} "
               f"({len(rules)} rules); {len(jobs) - len(remote)} local jobs stayed local")
    return problems, summary


def main(argv: list[str]) -> int:
    if len(argv) != 3:
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    log, since, report = argv
    problems, summary = check(Path(log).read_text(), float(since), Path(report))
    if problems:
        print("slurm check: ERROR:\n  " + "\n  ".join(problems), file=sys.stderr)
        return 1
    print(f"slurm check: {summary}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
