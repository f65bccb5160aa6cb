import json

import pytest
import torch

from cs336sys.jobs import GpuRequired, Unsupported, require_device, run_points
from cs336sys.results import load_results, make_result, read_result, write_result


def test_result_has_schema_and_environment(tmp_path):
    r = write_result(tmp_path / "a" / "r.json", "p", {"x": 1}, {"ms": 2.5})
    on_disk = read_result(tmp_path / "a" / "r.json")
    assert on_disk == json.loads(json.dumps(r))
    for key in ("python", "torch", "triton", "gpu", "git_commit", "timestamp", "device"):
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


def _point(settings):
    kind = settings["kind"]
    if kind == "ok":
        return {"value": settings["x"] * 2}
    if kind == "oom":
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1 GiB")
    if kind == "unsupported":
        raise Unsupported("no such backend here")
    raise ZeroDivisionError("a bug")


def test_run_points_records_oom_and_unsupported_but_not_bugs(tmp_path, capsys):
    kinds = ["ok", "oom", "unsupported", "bug"]
    outs = [tmp_path / f"{k}.json" for k in kinds]
    errors = run_points("demo", [{"kind": k, "x": 3, "device": "cpu"} for k in kinds], outs, _point)
    assert errors == 1
    assert read_result(outs[0])["metrics"]["value"] == 6
    assert read_result(outs[1])["status"] == "oom" and "out of memory" in read_result(outs[1])["reason"]
    assert read_result(outs[2])["status"] == "unsupported"
    assert not outs[3].exists()  # a bug leaves no result behind
    assert "[demo 4/4]" in capsys.readouterr().out  # progress: which point, how many


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message shown on machines without a GPU")
def test_gpu_points_fail_clearly_without_a_gpu(tmp_path):
    with pytest.raises(GpuRequired, match="run it on a GPU host.*cluster profile"):
        require_device("cuda")
    with pytest.raises(GpuRequired):
        run_points("demo", [{"kind": "ok", "x": 1, "device": "cuda"}], [tmp_path / "r.json"], _point)
    assert not (tmp_path / "r.json").exists()
