"""tools/move_results.py moves committed results to new paths with their metadata: nothing re-runs."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def _run(clone: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=clone, capture_output=True, text=True, timeout=600)


def _scheduled(clone: Path) -> set[str]:
    """The rules a dry run of the report would run (its job-count table)."""
    out = _run(clone, sys.executable, "-m", "snakemake", "-n", "writeup/report.pdf", "--quiet", "rules")
    assert out.returncode == 0, out.stderr[-2000:]
    return {m.group(1) for m in re.finditer(r"^(\w+)\s+\d+$", out.stdout + out.stderr, re.M)} - {"total"}


@pytest.fixture
def rerun_copy(tmp_path) -> Path:
    """A git clone of this checkout (the tool moves files with `git mv`), where the test checks what
    re-runs: a long check (tests/conftest.py)."""
    clone = tmp_path / "clone"
    assert _run(tmp_path, "git", "clone", "-q", str(REPO), str(clone)).returncode == 0
    return clone


@pytest.mark.slow(seconds=40)
def test_a_moved_result_folder_keeps_its_results_up_to_date(rerun_copy, tmp_path):
    clone = rerun_copy
    assert _scheduled(clone) == set()
    tool = [sys.executable, "tools/move_results.py"]
    assert _run(clone, *tool, "snapshot", str(tmp_path / "jobs.json")).returncode == 0

    rules = clone / "workflow" / "rules" / "precision.smk"
    old = "results/autocast_dtypes/{p['autocast_dtype']}.json"
    assert old in rules.read_text()
    rules.write_text(rules.read_text().replace(old, "results/autocast_dtypes/moved/{p['autocast_dtype']}.json"))
    assert "autocast_dtypes" in _scheduled(clone)  # before the move: the new paths are missing

    moved = _run(clone, *tool, "apply", str(tmp_path / "jobs.json"))
    assert moved.returncode == 0, moved.stderr
    assert "git mv results/autocast_dtypes/bf16.json results/autocast_dtypes/moved/bf16.json" in moved.stdout
    assert (clone / "results/autocast_dtypes/moved/bf16.json").is_file()
    assert not (clone / "results/autocast_dtypes/bf16.json").exists()
    # no experiment: at most the section that reads the moved files (new input paths) and the report
    assert _scheduled(clone) <= {"precision_section", "report_markdown", "report_pdf"}

    # a rule edit that changes points, not only paths, is refused
    rules.write_text(rules.read_text().replace('point("autocast_dtypes", PRECISION, autocast_dtype=d)',
                                               'point("autocast_dtypes", PRECISION, autocast_dtype=d, device="meta")'))
    refused = _run(clone, *tool, "apply", str(tmp_path / "jobs.json"))
    assert refused.returncode == 1 and "not in both" in refused.stderr
