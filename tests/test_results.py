import json

import pytest

from cs336sys.results import load_results, make_result, read_result, write_result


def test_result_has_schema_and_environment(tmp_path):
    r = write_result(tmp_path / "a" / "r.json", "p", {"x": 1}, {"ms": 2.5})
    on_disk = read_result(tmp_path / "a" / "r.json")
    assert on_disk == json.loads(json.dumps(r))
    for key in ("python", "torch", "triton", "gpu", "gpus", "git_commit", "world_size", "timestamp", "device"):
        assert key in on_disk["env"]
    assert not list((tmp_path / "a").glob("*.tmp"))


def test_status_must_be_known_and_explained():
    with pytest.raises(ValueError, match="not one of"):
        make_result("p", {}, status="crashed")
    with pytest.raises(ValueError, match="needs a reason"):
        make_result("p", {}, status="oom")


def test_read_rejects_non_results(tmp_path):
    (tmp_path / "x.json").write_text("{}")
    with pytest.raises(ValueError, match="not a result file"):
        read_result(tmp_path / "x.json")


def test_load_results_flattens_settings_and_metrics(tmp_path):
    write_result(tmp_path / "1.json", "p", {"size": "s", "n": 1}, {"ms": 1.0, "n": 9})
    write_result(tmp_path / "2.json", "q", {"size": "t"}, status="oom", reason="out of memory")
    df = load_results(tmp_path)
    assert set(df.problem) == {"p", "q"}
    row = df[df.problem == "p"].iloc[0]
    assert row["ms"] == 1.0 and row["n"] == 1 and row["metric_n"] == 9
    assert load_results(tmp_path, problem="q").iloc[0]["status"] == "oom"
