"""The benchmarking section built from the committed H100 results: the backward column is the difference of
the two timed modes, the compact tables hold one row per size, the summary rows come from the results, and
the section (and its appendix) renders with nothing the report's lint objects to."""

from __future__ import annotations

from pathlib import Path

import pytest

from cs336sys.analysis import benchmarking
from cs336sys.report import render_section
from cs336sys.results import read_result
from cs336sys.writeup import lint

REPO = Path(__file__).resolve().parent.parent
TEMPLATES = REPO / "writeup" / "templates"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    paths = sorted(REPO.glob("results/benchmarking/**/*.json")) + sorted(REPO.glob("results/warmup/**/*.json")) \
        + sorted(REPO.glob("results/peak/*.json")) + sorted(REPO.glob("benchmarks/benchmarking/*.tsv"))
    if not paths:
        pytest.skip("no committed benchmarking results")
    out = tmp_path_factory.mktemp("benchmarking")
    return paths, benchmarking.build(paths, out)


def test_the_backward_is_the_difference_of_the_timed_modes(built):
    paths, ctx = built
    c = ctx["timing_context_main"]
    results = [read_result(p) for p in paths if p.suffix == ".json" and "results/benchmarking/" in p.as_posix()]
    by = {(r["settings"]["size"], r["settings"]["mode"]): r for r in results
          if r["settings"]["context_length"] == c and r["settings"]["dtype"] == "fp32"
          and r["settings"]["compile"] == "eager" and r["status"] == "ok"}
    row = next(line for line in ctx["tables"]["timing"][str(c)].splitlines() if line.startswith("| 2.7B |"))
    f, fb = by[("2.7B", "forward")]["metrics"], by[("2.7B", "forward_backward")]["metrics"]
    assert f"{fb['mean_ms'] - f['mean_ms']:.2f} ± {fb['std_ms'] + f['std_ms']:.2f}" in row
    low, high = ctx["backward_ratio"]
    assert 0 < low <= (fb["mean_ms"] - f["mean_ms"]) / f["mean_ms"] <= high


def test_summary_rows_name_their_table_and_come_from_the_results(built):
    _, ctx = built
    parts = [r["part"] for r in ctx["summary"]]
    assert parts == ["Best MFU of a train step", "bf16 autocast against fp32", "torch.compile against eager"]
    assert f"{ctx['best_mfu']['pct']:.1f} %" in ctx["summary"][0]["result"]
    assert all(r["ref"].startswith("bench-") for r in ctx["summary"])


def test_the_section_and_its_appendix_render_cleanly(built):
    _, ctx = built
    text = render_section("benchmarking", ctx, TEMPLATES)
    assert lint.problems(text) == []
    assert "### 1.2 (b) Forward and backward times" in text and "## A Benchmarking: every point" in text
