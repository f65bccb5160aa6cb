"""The job runner (`python -m cs336sys.run`): one result per point, settings as run, outcomes
recorded, and with several ranks (gloo on the CPU, as the smoke grid runs them) rank 0 writes,
every rank agrees on a point's status, and a failing or dying rank ends its point in bounded time."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from cs336sys.results import read_result

DATA = Path(__file__).parent / "data"
FUNCTION = "toy_experiments:run_toy"


def run_job(cwd: Path, points: list[dict], nproc: int = 1, rendered: bool = False, timeout: float = 240):
    outputs = [f"results/toy/p{i}.json" for i in range(len(points))]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(DATA), str(Path(__file__).parents[1] / "src")]),
           "CS336SYS_PG_TIMEOUT_S": "20", "CS336SYS_GIT_COMMIT": "0123456789abcdef0123456789abcdef01234567"}
    cmd = [sys.executable, "-m", "cs336sys.run", "toy", "--function", FUNCTION, "--points", json.dumps(points),
           "--outputs", *outputs, "--nproc", str(nproc)] + (["--rendered"] if rendered else [])
    start = time.monotonic()
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    return proc, [cwd / o for o in outputs], time.monotonic() - start


def test_one_process_records_each_outcome_and_the_settings_as_run(tmp_path):
    proc, outs, _ = run_job(tmp_path, [{"kind": "ok", "x": 2.0}, {"kind": "oom"}, {"kind": "unsupported"},
                                       {"kind": "raise"}, {"kind": "ok"}])
    assert proc.returncode == 1, proc.stderr  # one point was a bug
    ok = read_result(outs[0])
    assert ok["status"] == "ok" and ok["metrics"]["sum"] == 2.0
    assert ok["settings"] == {"kind": "ok", "x": 2.0, "failing_rank": 1, "device": "cpu"}  # defaults filled in
    assert ok["env"]["world_size"] == 1 and ok["env"]["git_commit"] == "0123456789abcdef0123456789abcdef01234567"
    assert read_result(outs[1])["status"] == "oom" and "out of memory" in read_result(outs[1])["reason"]
    assert read_result(outs[2])["status"] == "unsupported"
    assert not outs[3].exists()  # a bug leaves no result behind ...
    assert "planted bug on rank 0" in proc.stderr and "Traceback" in proc.stderr
    assert read_result(outs[4])["status"] == "ok"  # ... and the points after it still run
    assert "[toy 5/5]" in proc.stdout


def test_bad_settings_fail_before_anything_runs(tmp_path):
    proc, outs, _ = run_job(tmp_path, [{"kind": "ok"}, {"kind": "ok", "colour": "red"}])
    assert proc.returncode == 2 and "unknown setting(s) ['colour']" in proc.stderr
    assert not any(o.exists() for o in outs)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message shown on machines without a GPU")
def test_gpu_points_fail_clearly_without_a_gpu(tmp_path):
    proc, outs, _ = run_job(tmp_path, [{"kind": "ok", "device": "cuda"}])
    assert proc.returncode == 3 and "needs a CUDA GPU" in proc.stderr and "cluster profile" in proc.stderr
    assert not outs[0].exists()


def test_two_ranks_write_one_result_and_agree_on_failures(tmp_path):
    points = [{"kind": "ok", "x": 1.0}, {"kind": "oom"}, {"kind": "raise"}, {"kind": "ok", "x": 3.0}]
    proc, outs, seconds = run_job(tmp_path, points, nproc=2, rendered=True)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 1, log
    first = read_result(outs[0])
    assert first["status"] == "ok" and first["env"]["world_size"] == 2 and first["env"]["backend"] == "gloo"
    assert first["metrics"]["sum"] == 3.0 and first["metrics"]["rank"] == 0  # all-reduced; rank 0 wrote it
    assert json.loads((tmp_path / "results/toy/p0/index.json").read_text()) == {"status": "ok", "files": ["note.txt"]}
    oom = read_result(outs[1])
    assert oom["status"] == "oom" and "planted" in oom["reason"]  # rank 1 ran out; one status for the point
    assert not outs[2].exists()  # rank 1's bug: no result, its error and traceback named
    assert "error in point 3 on rank 1: ZeroDivisionError: planted bug on rank 1" in log
    assert "--- traceback of rank 1 ---" in log
    assert read_result(outs[3])["metrics"]["sum"] == 9.0  # fresh ranks ran the point after the failure
    assert seconds < 150  # rank 0 waited in a barrier for the failed rank: torchrun stopped it


def test_a_rank_that_dies_ends_the_job_in_bounded_time(tmp_path):
    proc, outs, seconds = run_job(tmp_path, [{"kind": "die"}, {"kind": "ok"}], nproc=2)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 1 and not outs[0].exists()
    assert "rank(s) [1] did not report" in log or "no rank reported why" in log
    assert seconds < 90


@pytest.mark.slow(seconds=45)
def test_a_rank_that_hangs_ends_the_job_in_bounded_time_and_leaves_no_process(tmp_path):
    proc, outs, seconds = run_job(tmp_path, [{"kind": "hang"}, {"kind": "ok"}], nproc=2)
    log = proc.stdout + proc.stderr
    assert proc.returncode == 1 and not outs[0].exists(), log[-3000:]
    assert "error in point 1 on rank 0" in log  # the rank left waiting names the point; the hung one is stopped
    assert read_result(outs[1])["status"] == "ok"  # fresh ranks ran the next point
    assert seconds < 120  # the process group's timeout (20 s here), not the hour the rank sleeps
    assert not processes_in(tmp_path), "processes left behind"


def processes_in(cwd: Path) -> list[int]:
    """Live processes whose working directory is `cwd` (the job's ranks ran there)."""
    found = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                if Path(os.readlink(p / "cwd")) == cwd:
                    found.append(int(p.name))
            except OSError:
                continue
    return found
