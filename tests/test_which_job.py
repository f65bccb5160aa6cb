"""Which rule makes a file, as the README asks it (Snakemake's `--summary`, `codehash why`, the result's
settings), on the committed results; and where each experiment job's results lie."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from cs336sys.workflow_helpers import parsed_workflow

REPO = Path(__file__).resolve().parent.parent
PROXY = "results/fsdp_step/2.7B-proxy/ours-bf16-layer.json"


def test_the_readmes_commands_name_a_results_rule_status_and_point():
    summary = subprocess.run(["snakemake", "--summary", PROXY], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert summary.returncode == 0, summary.stderr
    row = next(line.split("\t") for line in summary.stdout.splitlines() if line.startswith(PROXY + "\t"))
    assert row[2] == "fsdp_step_2_7B_proxy" and row[-1] == "no update", row
    why = subprocess.run([sys.executable, "-m", "cs336sys.codehash", "why", "fsdp_step_2_7B_proxy"], cwd=REPO,
                         capture_output=True, text=True, timeout=300)
    assert why.returncode == 0 and "fsdp_step_2_7B_proxy" in why.stdout and "stale" not in why.stdout, why.stdout
    settings = json.loads((REPO / PROXY).read_text())["settings"]
    assert settings["unit"] == "layer" and settings["single_rank_proxy"] is True


def test_each_result_lies_in_its_experiments_folder_and_its_jobs():
    """results/<experiment>/<job>/... (results/<experiment>/... for an experiment's only job), each made by one rule."""
    with parsed_workflow(REPO) as workflow:
        jobs = list(workflow.globals["EXPERIMENT_JOBS"])
        outputs = [str(f) for r in workflow.rules for f in r.output]
    assert jobs
    for job in jobs:
        folder = f"results/{job.experiment}/" + (f"{job.job}/" if job.job else "")
        assert all(r.startswith(folder) for r in job.results), (job.rule, folder, job.results[:2])
    assert len(outputs) == len(set(outputs))
