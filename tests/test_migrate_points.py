"""tools/migrate_points.py: a record's points are rewritten only where they run the same settings."""

import importlib.util
import json
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("migrate_points", REPO / "tools" / "migrate_points.py")
migrate = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(migrate)


def job(points, outputs=("results/allreduce/x/8.json",)):
    return {"experiment": "allreduce", "points": points, "outputs": list(outputs)}


def test_a_default_left_out_is_the_same_job_and_its_record_is_rewritten():
    before = {"allreduce_x": job([{"warmup": 5, "iters": 7, "size_bytes": 8}])}
    after = {"allreduce_x": job([{"iters": 7, "size_bytes": 8}])}
    found = migrate.changes(before, after)
    old, new, outputs = found["allreduce_x"]
    assert json.loads(old) == before["allreduce_x"]["points"] and json.loads(new) == after["allreduce_x"]["points"]
    record = {"rule": "allreduce_x", "params": sorted(["'allreduce'", repr(old), "'abc123'"]),
              "shellcmd": f"run allreduce --points '{old}' --outputs {outputs[0]}"}
    rewritten = migrate.rewrite(record, old, new)
    assert sorted(rewritten["params"]) == sorted(["'allreduce'", repr(new), "'abc123'"])
    assert f"--points '{new}'" in rewritten["shellcmd"] and old not in rewritten["shellcmd"]
    with pytest.raises(SystemExit, match="not the snapshot's"):  # a record of other points is left alone
        migrate.rewrite({**record, "params": ["'other'"]}, old, new)


def test_unchanged_points_need_nothing_and_changed_settings_are_refused():
    same = {"allreduce_x": job([{"size_bytes": 8}])}
    assert migrate.changes(same, same) == {}
    with pytest.raises(SystemExit, match="runs other settings"):
        migrate.changes({"allreduce_x": job([{"warmup": 5, "size_bytes": 8}])},
                        {"allreduce_x": job([{"warmup": 4, "size_bytes": 8}])})
    with pytest.raises(SystemExit, match="outputs or number of points"):
        migrate.changes(same, {"allreduce_x": job([{"size_bytes": 8}, {"size_bytes": 9}])})
    with pytest.raises(SystemExit, match="only before"):
        migrate.changes(same, {})
