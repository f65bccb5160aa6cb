"""The conftest check behind `pytest -m gpu`: a test that skips because it "needs a CUDA GPU" fails
unless it carries the `gpu` marker, so the GPU host's test set cannot silently lose a test."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).parent

SAMPLE = '''
import pytest

@pytest.mark.gpu
@pytest.mark.skipif(True, reason="needs a CUDA GPU (none visible)")
def test_marked():
    pass

@pytest.mark.skipif(True, reason="needs a CUDA GPU (none visible)")
def test_unmarked_skipif():
    pass

def test_unmarked_skip_call():
    pytest.skip("needs a CUDA GPU for this")

@pytest.mark.skipif(True, reason="needs the interpreter")
def test_other_skip():
    pass

'''


def test_unmarked_gpu_skips_fail_and_marked_ones_skip(tmp_path):
    (tmp_path / "test_sample.py").write_text(SAMPLE)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(TESTS), os.environ.get("PYTHONPATH")]))}
    # this directory's conftest as a plugin, on a sample outside it
    cmd = [sys.executable, "-m", "pytest", str(tmp_path), "-p", "conftest", "-p", "no:cacheprovider", "-rA",
           "--rootdir", str(tmp_path), "-W", "ignore::pytest.PytestUnknownMarkWarning"]
    result = subprocess.run(cmd, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    out = result.stdout
    assert result.returncode == 1, out + result.stderr
    # a skipif fails the setup (an error), a pytest.skip call the test; the marked one and the other skip
    assert "1 failed, 2 skipped, 1 error" in out.splitlines()[-1], out
    assert "ERROR test_sample.py::test_unmarked_skipif" in out, out
    assert "FAILED test_sample.py::test_unmarked_skip_call" in out, out
    assert "has no @pytest.mark.gpu" in out
