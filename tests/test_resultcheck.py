"""The check the workflow runs on result files before any job: each way a file can be damaged is
named, and a sound result (fresh from the writer) passes."""

from __future__ import annotations

import json

import pytest

from cs336sys.resultcheck import corrupt, problem_of
from cs336sys.results import write_result


@pytest.fixture
def sound(tmp_path):
    path = tmp_path / "r.json"
    write_result(path, "benchmarking", {"size": "small"}, {"mean_ms": 1.5})
    return path


def test_a_result_from_the_writer_is_sound(sound, tmp_path):
    assert problem_of(sound, "benchmarking") is None
    oom = tmp_path / "oom.json"
    write_result(oom, "benchmarking", {"size": "xl"}, status="oom", reason="CUDA out of memory")
    assert problem_of(oom) is None


@pytest.mark.parametrize("edit, said", [
    (lambda d: d.pop("metrics"), "no 'metrics'"),
    (lambda d: d.update(status="finished"), "status 'finished' is not one of"),
    (lambda d: d.update(status="error", reason=None), "status 'error' without a reason"),
    (lambda d: d.update(settings=["small"]), "'settings' is list, not an object"),
    (lambda d: d.update(schema=2), "schema 2, not 1"),
    (lambda d: d.update(schema=True), "'schema' is bool"),
    (lambda d: d.update(problem="ddp_step"), "problem 'ddp_step', but its rule runs 'benchmarking'"),
])
def test_each_schema_violation_is_named(sound, edit, said):
    data = json.loads(sound.read_text())
    edit(data)
    sound.write_text(json.dumps(data))
    assert said in problem_of(sound, "benchmarking")


def test_truncated_and_non_json_files_are_named(sound):
    text = sound.read_text()
    sound.write_text(text[: len(text) // 2])
    assert "is not valid JSON" in problem_of(sound) and f"{len(text) // 2} bytes" in problem_of(sound)
    sound.write_text("[1, 2]")
    assert problem_of(sound) == "is not a result: JSON list, not an object"
    sound.write_bytes(b"\xff\xfe")
    assert problem_of(sound) == "is not text (not UTF-8)"


def test_corrupt_lists_only_the_damaged_files_that_exist(sound, tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    found = corrupt([(str(sound), "benchmarking"), (str(bad), "benchmarking"), (str(tmp_path / "gone.json"), None)])
    assert [f for f, _ in found] == [str(bad)]
