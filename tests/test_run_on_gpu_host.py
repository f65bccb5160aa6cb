"""tools/run_on_gpu_host.sh on this machine: its `tests` mode runs `pytest -m gpu` on the arguments given,
writes the log to $OUT/pytest-gpu.log and exits with pytest's status; the experiment mode refuses to start
without its arguments or the commit of the tree. (What it does on a GPU host is the README's "Tests on
a GPU" and the run records in notes/runs/.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
TOOL = REPO / "tools" / "run_on_gpu_host.sh"


def run_tool(tmp_path: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """The script with this interpreter as its `python3` (it calls python3 by name) and $OUT in tmp_path."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "python3").unlink(missing_ok=True)
    (bin_dir / "python3").symlink_to(sys.executable)
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    base = {k: v for k, v in os.environ.items() if k not in ("CS336SYS_GIT_COMMIT", "PYTHONPATH")}
    full_env = {**base, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", "OUT": str(out), **(env or {})}
    return subprocess.run(["bash", str(TOOL), *args], cwd=REPO, env=full_env, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.slow(40)
def test_tests_mode_runs_the_gpu_tests_it_is_given_and_keeps_the_log(tmp_path):
    # a gpu-marked test skips here (no CUDA GPU); one that is not gpu-marked is deselected by -m gpu
    chosen = "tests/test_attention_gpu.py::test_flash_point_times_cuda_graph_replays_on_gpu"
    proc = run_tool(tmp_path, "tests", chosen, "tests/test_tools.py", "-rs")
    log = (tmp_path / "out" / "pytest-gpu.log").read_text()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 skipped" in log and "deselected" in log and "needs a CUDA GPU" in log
    assert log in proc.stdout  # tee: the same output on the terminal


@pytest.mark.slow(20)
def test_tests_mode_exits_with_pytests_status(tmp_path):
    proc = run_tool(tmp_path, "tests", "tests/test_no_such_file.py")
    assert proc.returncode == 4  # pytest's "usage error": the file does not exist
    assert "test_no_such_file.py" in (tmp_path / "out" / "pytest-gpu.log").read_text()


def test_the_experiment_mode_needs_its_arguments_and_the_commit(tmp_path):
    proc = run_tool(tmp_path)
    assert proc.returncode != 0 and "usage: run_on_gpu_host.sh SECONDS TARGET" in proc.stderr
    proc = run_tool(tmp_path, "10", "matmul_peak")
    assert proc.returncode != 0 and "set CS336SYS_GIT_COMMIT" in proc.stderr
    assert not (tmp_path / "out" / "results.tgz").exists()  # nothing ran, nothing packed


def test_the_experiment_mode_refuses_an_abbreviated_commit(tmp_path):
    """A short hash would be recorded as is (the copy has no .git to expand it) and the report could not
    name the code the results came from: refused before anything runs."""
    proc = run_tool(tmp_path, "10", "matmul_peak", env={"CS336SYS_GIT_COMMIT": "9942f5d9"})
    assert proc.returncode == 2 and "is not a full commit hash" in proc.stderr
    assert not (tmp_path / "out" / "results.tgz").exists()
