"""tools/compare_results.py on a tiny git repository of fake results: a 2x change is beyond noise,
a 1% change is within it; status changes and points in one revision only are listed."""

from __future__ import annotations

import importlib.util
import json
import subprocess
from pathlib import Path

import pytest

TOOL = Path(__file__).resolve().parents[1] / "tools" / "compare_results.py"


def _tool():
    spec = importlib.util.spec_from_file_location("compare_results", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _result(metrics: dict, status: str = "ok") -> dict:
    return {"schema": 1, "problem": "fake", "settings": {"size": "s"}, "status": status,
            "reason": None if status == "ok" else "fake", "metrics": metrics, "env": {"gpu": "fake"}}


def _commit(repo: Path, files: dict[str, dict], message: str) -> str:
    for name, data in files.items():
        path = repo / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data))
    git = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run([*git, "add", "-A"], check=True, capture_output=True)
    subprocess.run([*git, "commit", "-q", "-m", message], check=True, capture_output=True)
    return subprocess.run([*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def revs(tmp_path: Path) -> tuple[str, str, Path]:
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True, capture_output=True)
    old = _commit(tmp_path, {
        "results/exp/double.json": _result({"median_ms": 10.0, "mean_ms": 10.0, "std_ms": 0.1}),
        "results/exp/same.json": _result({"median_ms": 10.0, "mean_ms": 10.0, "std_ms": 0.1}),
        "results/exp/nospread.json": _result({"forward_ms": 1.0}),
        "results/exp/status.json": _result({"median_ms": 5.0, "std_ms": 0.1}),
        "results/exp/gone.json": _result({"median_ms": 1.0}),
        "results/other.json": {"not": "a result"},
    }, "old")
    (tmp_path / "results/exp/gone.json").unlink()
    new = _commit(tmp_path, {
        "results/exp/double.json": _result({"median_ms": 20.0, "mean_ms": 20.0, "std_ms": 0.1}),
        "results/exp/same.json": _result({"median_ms": 10.1, "mean_ms": 10.1, "std_ms": 0.1}),
        "results/exp/nospread.json": _result({"forward_ms": 1.01}),
        "results/exp/status.json": _result({}, status="oom"),
        "results/exp/added.json": _result({"median_ms": 1.0}),
    }, "new")
    return old, new, tmp_path


def test_beyond_and_within_noise(revs):
    old_rev, new_rev, repo = revs
    tool = _tool()
    old, new = tool.git_results(old_rev, "results/", str(repo)), tool.git_results(new_rev, "results/", str(repo))
    assert "results/other.json" not in old
    df = tool.compare(old, new, r"(_ms|^tflops)$", 0.05, 2.0).set_index(["path", "metric"])
    assert "std_ms" not in df.index.get_level_values("metric")
    assert df.loc[("results/exp/double.json", "median_ms"), "beyond"]
    assert df.loc[("results/exp/double.json", "median_ms"), "ratio"] == pytest.approx(2.0)
    assert not df.loc[("results/exp/same.json", "median_ms"), "beyond"]
    assert not df.loc[("results/exp/nospread.json", "forward_ms"), "beyond"]


def test_report_lists_status_changes_and_one_sided_points(revs):
    old_rev, new_rev, repo = revs
    text = _tool().report(old_rev, new_rev, markdown=True, cwd=str(repo))
    assert "| results/exp/status.json | ok | oom |" in text
    assert "## Only in " + old_rev in text and "## Only in " + new_rev in text
    assert "| exp | median_ms | 2 |" in text  # double and same are the two common points with a median
