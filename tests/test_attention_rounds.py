"""The leaderboard shapes in interleaved rounds: the experiment on the CPU (one result per implementation
and round, through the job runner) and its analysis (pooled ratios to cuDNN, their per-round range, the
verdict, and the summary rows without a verdict while the rounds job has no results)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from cs336sys.analysis.attention import _summary, rounds_limitation
from cs336sys.analysis.attention_context import AttentionContext
from cs336sys.analysis.attention_rounds import rounds, summary_row

pytest.importorskip("triton")

# naive and SDPA's math backend run on the CPU at once (ours there compiles through Triton's interpreter for
# seconds: the smoke grid runs it); cuDNN and the Gluon kernels are unsupported on the CPU
IMPLS = ["sdpa_cudnn", "sdpa_math", "naive", "gluon_bwd"]


def test_the_rounds_job_writes_one_result_per_implementation_and_round(tmp_path):
    shape = {"batch": 1, "heads": 1, "seq": 16, "d": 16, "dtype": "fp32", "device": "cpu", "edition": "2026"}
    points = [{"impl": impl, "round": r, **shape} for r in range(3) for impl in IMPLS[r:] + IMPLS[:r]]
    outputs = [f"results/flash_leaderboard_rounds/any-2026/{p['impl']}-r{p['round']}.json" for p in points]
    env = os.environ | {"PYTHONPATH": str(Path(__file__).parents[1] / "src")}
    done = subprocess.run([sys.executable, "-m", "cs336sys.run", "flash_leaderboard_rounds", "--function",
                           "cs336sys.attention.bench_rounds:run_point", "--nproc", "1", "--points", json.dumps(points),
                           "--outputs", *outputs], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    results = {(r["settings"]["impl"], r["settings"]["round"]): r
               for r in (json.loads((tmp_path / o).read_text()) for o in outputs)}
    assert set(results) == {(impl, r) for impl in IMPLS for r in range(3)}
    for r in range(3):
        for impl in ("sdpa_math", "naive"):
            metrics = results[(impl, r)]["metrics"]
            assert results[(impl, r)]["status"] == "ok"
            assert {"fwd_ms", "bwd_ms", "fwd_bwd_ms", "sm_clock_mhz"} <= set(metrics)
            assert metrics["bwd_ms"] == metrics["fwd_bwd_ms"] - metrics["fwd_ms"]
        # neither cuDNN nor the Gluon kernels run on the CPU: recorded so, with the reason, in every round
        assert results[("gluon_bwd", r)]["status"] == "unsupported" and "Hopper" in results[("gluon_bwd", r)]["reason"]
        assert results[("sdpa_cudnn", r)]["status"] == "unsupported"


def _frame(times: dict[str, list[tuple[float, float]]], clocks: dict[str, float] | None = None) -> pd.DataFrame:
    """impl -> (fwd_ms, bwd_ms) per round, at one shape on an H200."""
    return pd.DataFrame([{"problem": "flash_leaderboard_rounds", "impl": impl, "round": r, "edition": "2026",
                          "status": "ok", "env.gpu": "NVIDIA H200", "fwd_ms": f, "bwd_ms": b, "fwd_bwd_ms": f + b,
                          "sm_clock_mhz": (clocks or {}).get(impl, 1755.0)}
                         for impl, rows in times.items() for r, (f, b) in enumerate(rows)])


def test_the_pooled_ratio_its_range_and_the_verdict(tmp_path):
    ctx = rounds(_frame({"sdpa_cudnn": [(10.0, 40.0), (10.0, 40.0), (10.0, 40.0)],
                         "ours": [(11.0, 52.0), (12.0, 48.0), (10.0, 50.0)],  # forward 1.10 (1.00-1.20): noise
                         "gluon_bwd": [(9.0, 36.0), (9.5, 38.0), (8.5, 39.0)]},  # met
                        {"ours": 1620.0}), tmp_path)
    [edition] = ctx["editions"]
    ours, gluon = edition["impls"]["ours"], edition["impls"]["gluon_bwd"]
    assert ours["ratios"]["fwd"]["ratio"] == pytest.approx(1.1)
    assert (ours["ratios"]["fwd"]["lo"], ours["ratios"]["fwd"]["hi"]) == pytest.approx((1.0, 1.2))
    assert ours["ratios"]["bwd"]["ratio"] == pytest.approx(1.25) and ours["verdicts"]["bwd"] is False
    assert ours["verdicts"]["fwd"] == "noise" and ours["met"] is False
    assert ours["clocks_differ"] is True and ours["clock_mhz"] == {"impl": 1620.0, "baseline": 1755.0}
    assert gluon["met"] is True and gluon["clocks_differ"] is False
    assert gluon["ratios"]["bwd"]["hi"] == pytest.approx(39 / 40)
    row = summary_row(ctx, ("gluon_bwd", "gluon"))
    assert row["met"] is True and row["rounds"] == 3 and "slowest round 0.97×" in row["result"]
    noisy = rounds(_frame({"sdpa_cudnn": [(10.0, 40.0)] * 3, "ours": [(9.0, 38.0), (10.5, 39.0), (9.5, 41.0)]}),
                   tmp_path)
    assert summary_row(noisy, ("ours",))["met"] == "noise"
    assert summary_row(rounds(_frame({"sdpa_cudnn": [(10.0, 40.0)] * 2, "ours": [(9.0, 38.0)] * 2}), tmp_path),
                       ("ours",)) is None  # two rounds are too few to judge


def test_without_rounds_results_the_summary_rows_carry_no_verdict():
    one_run = {"fwd": 0.95, "bwd": 0.96, "fwd_bwd": 0.96}
    edition = {"gpu": "H200", "edition": "2026"}
    ctx = AttentionContext(env={}, lb_editions=[edition | {"ratios": {"sdpa_cudnn": one_run}}],
                           lb_gluon={"editions": [edition | {"ratios": {"gluon_bwd": one_run}}]})
    rows = _summary(ctx)
    assert len(rows) == 2
    assert all(r["met"] is None and "(one run each, not judged)" in r["part"] for r in rows)
    [line] = rounds_limitation(ctx)  # and the conclusions say so
    assert "does not judge them" in line and "`flash_leaderboard_rounds`" in line
    assert rounds_limitation(AttentionContext(env={})) == []  # nothing measured: nothing to say


def test_the_section_shows_the_rounds_and_the_summary_judges_them(tmp_path):
    """With rounds results, the section says how they were run and prints their table (the template's other
    branch than the committed report's), and the summary's rows carry the rounds' verdicts."""
    from cs336sys import report

    repo = Path(__file__).parents[1]
    context = json.loads((repo / "results/sections/attention/context.json").read_text())
    lb_rounds = rounds(_frame({"sdpa_cudnn": [(10.0, 40.0)] * 3, "ours": [(11.0, 50.0), (11.5, 52.0), (10.5, 51.0)],
                               "gluon_bwd": [(9.0, 38.0), (10.5, 39.0), (9.5, 41.0)]}), tmp_path)
    text = report.render_section("attention", context | {"lb_rounds": lb_rounds}, repo / "writeup/templates")
    assert "**In interleaved rounds** (" in text
    assert "3 rounds in one process, each starting one implementation later" in text
    assert "| ours (Triton) |" in text and "1.10× (1.05–1.15)" in text
    assert "more than 30 MHz apart, and no pair here is." in text  # every side at 1,755 MHz
    times = {"sdpa_cudnn": [(10.0, 40.0)] * 3, "ours": [(11.0, 50.0)] * 3, "gluon_bwd": [(9.0, 38.0)] * 3}
    apart = rounds(_frame(times, {"ours": 1890.0, "gluon_bwd": 1770.0}), tmp_path)
    assert apart["clocks_apart"] == [{"gpu": "H200", "edition": "2026", "label": "ours (Triton)", "mhz": 1890.0,
                                      "cudnn_mhz": 1755.0}]  # 15 MHz apart is within the rule
    text = report.render_section("attention", context | {"lb_rounds": apart}, repo / "writeup/templates")
    assert ("more than 30 MHz apart: ours (Triton) against cuDNN, 2026 on H200 (1,890 against 1,755 MHz); every "
            "other pair ran within it.") in text
    ctx = AttentionContext(env={}, lb_rounds=lb_rounds)
    assert rounds_limitation(ctx) == []
    triton, gluon = _summary(ctx)
    assert triton["part"].endswith("3 rounds)") and triton["met"] is False and "7 tile products" in triton["why"]
    assert gluon["met"] == "noise" and gluon["why"] is None and "slowest round 1.05×" in gluon["result"]


def test_the_rounds_settings_are_the_leaderboard_settings_and_a_round():
    """The rounds job's settings repeat `LeaderboardSettings` field by field (the knobs' reader parses one
    class, not its bases): the two may not drift apart."""
    import dataclasses

    from cs336sys.attention.bench import LeaderboardSettings
    from cs336sys.attention.bench_rounds import LeaderboardRoundsSettings

    def spec(cls):
        return {f.name: (str(f.type), f.default) for f in dataclasses.fields(cls)}

    rounds = spec(LeaderboardRoundsSettings)
    assert rounds.pop("round") == ("int", 0)
    assert rounds == spec(LeaderboardSettings)
