"""The two test commands split the tests between them by tests/conftest.py's rule: `pytest` (the fast suite)
runs every test that needs no long fixture, `pytest -m long` the others, and no test is in both or neither.
Checked on a fresh collection of the whole suite, so a new test is held to the rule when it lands."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import LONG_FIXTURES, SUITES, SUITES_ENV

REPO = Path(__file__).resolve().parent.parent

# The long checks the issue names, by test: they must stay long (the rule finds them by their fixtures).
MUST_BE_LONG = (
    "tests/test_workflow.py::test_smoke_grid_reruns_exactly_what_changed",  # the smoke grid, the re-run contract
    "tests/test_workflow.py::test_a_second_run_is_locked_out_and_ctrl_c_leaves_exactly_the_interrupted_jobs",
    "tests/test_workflow.py::test_fresh_clone_with_committed_results_runs_no_experiment",  # the re-run contract
    "tests/test_pins.py::test_a_pin_keeps_committed_results_across_a_code_change",
    "tests/test_move_results.py::test_a_moved_result_folder_keeps_its_results_up_to_date",
    "tests/test_slurm_profile.py::test_gpu_request_arrives_at_slurm[one]",  # the Slurm dispatch
    "tests/test_slurm_profile.py::test_more_gpus_than_the_node_has_fails_fast",
)


def collect(tmp_path: Path, *args: str) -> tuple[list[str], dict[str, dict]]:
    """The test ids a `pytest --collect-only` with `args` selects, and every collected test's suite."""
    dump = tmp_path / f"suites{len(list(tmp_path.iterdir()))}.json"
    proc = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                           *args], cwd=REPO, env={**os.environ, SUITES_ENV: str(dump)},
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    selected = [line for line in proc.stdout.splitlines() if line.startswith("tests/") and "::" in line]
    return selected, json.loads(dump.read_text())


def plain_command(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[list[str], dict[str, dict]]:
    """What the plain `pytest` collects and runs: this session's own collection when it is that command (the
    whole suite, no -m, -k or named tests), else a collection in a subprocess."""
    config = request.config
    if config.args_source == pytest.Config.ArgsSource.TESTPATHS and not config.option.markexpr \
            and not config.option.keyword and not config.option.deselect:
        every, selected = config.stash[SUITES]
        return selected, every
    return collect(tmp_path)


def test_every_test_is_in_exactly_one_suite_by_the_rule(request, tmp_path):
    fast, every = plain_command(request, tmp_path)
    long = {t for t, v in every.items() if v["suite"] == "long"}
    assert len(every) > 1000 and set(fast) | long == set(every) and not set(fast) & long
    for test, v in every.items():  # the rule: long exactly when it asks for a long fixture
        assert (v["suite"] == "long") == bool(LONG_FIXTURES.keys() & set(v["fixtures"])), test
        # the `long` marker, which `pytest -m long` selects by, is on exactly the long ones: none by hand
        assert v["marked"] == (v["suite"] == "long"), f"{test}: marked `long` by hand, not by the rule"
    for test in MUST_BE_LONG:
        assert every[test]["suite"] == "long", f"{test} is in the fast suite"
    for fixture in LONG_FIXTURES:  # each fixture of the rule is one a test asks for (the rule is not dead)
        assert any(fixture in v["fixtures"] for v in every.values()), f"no test asks for {fixture}"


def test_a_long_check_named_on_the_command_line_runs_without_minus_m_long(tmp_path):
    named = MUST_BE_LONG[1]
    selected, every = collect(tmp_path, "tests/test_workflow.py", named)
    assert named in selected and every[named]["suite"] == "long"
    assert MUST_BE_LONG[0] not in selected  # the file's other long check: not named, left out
    assert {t for t, v in every.items() if v["suite"] == "fast"} <= set(selected)
