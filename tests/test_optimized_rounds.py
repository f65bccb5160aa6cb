"""The optimised-step series in interleaved rounds: the experiment (a labelled `optimized_step` point), the
main grid's job (every configuration once a round, rotated), and what the benchmarking section says of it."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pandas as pd
import pytest
import yaml

from cs336sys import knobs, report
from cs336sys.analysis.optimized_rounds import optimized_rounds
from cs336sys.workflow_helpers import parsed_workflow
from cs336sys.writeup import lint

REPO = Path(__file__).resolve().parents[1]
SERIES = ["plain", "fused_adamw", "cuda_graph"]


def test_a_round_point_has_every_knob_of_the_series_point_and_its_round():
    series, rounds = knobs.knobs_of("optimized_step"), knobs.knobs_of("optimized_step_rounds")
    assert list(rounds) == [*series, "round"]
    assert all(rounds[k] == series[k] for k in series)  # the same types, defaults and docstrings
    assert rounds["round"].default == 0 and "interleaved rounds" in rounds["round"].doc


def test_a_round_point_runs_as_the_series_point_does_on_the_cpu():
    from cs336sys.bench_optimized_rounds import OptimizedRoundSettings, run_point
    from cs336sys.jobs import Run

    settings = OptimizedRoundSettings("tiny", 16, "fused_adamw", techniques=("fused_adamw",), compile="eager",
                                      warmup=1, steps=2, device="cpu", round=2)
    m = run_point(settings, Run(device="cpu"))
    assert len(m["step_ms"]) == 2 and len(m["losses"]) == 2 and m["median_ms"] > 0
    assert m["sm_clock_mhz"] is None  # no GPU sampled: said as such, not as 0


@pytest.fixture(scope="module")
def main_jobs():
    with parsed_workflow(REPO) as workflow:
        jobs = list(workflow.globals["EXPERIMENT_JOBS"])
    return ({j.job: j for j in jobs if j.experiment == "optimized_step_rounds"},
            {j.job: j for j in jobs if j.experiment == "optimized_step"})


def test_the_main_grid_runs_the_series_once_a_round_each_round_starting_one_later(main_jobs):
    rounds, series = main_jobs
    overlay = yaml.safe_load((REPO / "config" / "main.yaml").read_text())["main"]["optimized_step"]["rounds"]
    assert set(rounds) == set(overlay["sizes"]) and {"2.7B", "medium"} <= set(rounds)
    for size, job in rounds.items():
        names = [p["configuration"] for p in series[size].points]
        count = len(job.points) // len(names)
        assert count == overlay["count"] >= 2 and len(job.points) == count * len(names)
        for r in range(count):
            chunk = job.points[r * len(names):(r + 1) * len(names)]
            assert {p["round"] for p in chunk} == {r}
            assert [p["configuration"] for p in chunk] == names[r:] + names[:r]  # ABC, BCA, CAB
        # each configuration is the series' point (its techniques, context, steps), labelled with its round
        by_name = {p["configuration"]: p for p in series[size].points}
        assert all({k: v for k, v in p.items() if k != "round"} == by_name[p["configuration"]] for p in job.points)
        assert job.results[0] == f"results/optimized_step_rounds/{size}/{job.points[0]['configuration']}-r0.json"
        assert job.gpus == 1


def test_the_overlay_adds_no_second_rounds_job():
    # measured on main's grid; `grid=next` keeps main's rounds rather than a copy of its own
    assert "rounds" not in yaml.safe_load((REPO / "config" / "next.yaml").read_text())["next"]["optimized_step"]


def _rounds_frame(means: dict[str, list[float]], clock: float = 1800.0) -> pd.DataFrame:
    """Three configurations of the "2.7B" series in len(round means) rounds, each round's steps spread by 1 %
    about its mean, each point with its own ceiling measured at the step's clock."""
    rows = []
    for i, name in enumerate(SERIES):
        for r, mean in enumerate(means[name]):
            steps = [mean * (1 + 0.01 * k) for k in (-1, 0, 1)]
            path = f"results/optimized_step_rounds/2.7B/{name}-r{r}.json"
            rows.append({"problem": "optimized_step_rounds", "path": path,
                         "status": "ok", "size": "2.7B", "context_length": 512, "metric_batch_size": 4,
                         "configuration": name, "techniques": SERIES[1:i + 1], "round": r,
                         "mean_ms": mean, "median_ms": mean, "std_ms": 0.01 * mean, "step_ms": steps,
                         "env.gpu": "NVIDIA H200", "matmul_bf16_tflops": 700.0,
                         "step_clocks": {"sm_clock_mhz": clock + 10 * r}, "matmul_clocks": {"sm_clock_mhz": clock}})
    return pd.DataFrame(rows)


def test_a_technique_is_faster_or_slower_only_where_every_round_says_so(tmp_path):
    plain = [random.uniform(150.0, 160.0) for _ in range(3)]
    fused = [0.7 * p for p in plain]  # faster in every round
    graph = [f * x for f, x in zip(fused, (0.98, 1.01, 0.99), strict=True)]  # the rounds disagree
    ctx = optimized_rounds(_rounds_frame({"plain": plain, "fused_adamw": fused, "cuda_graph": graph}), tmp_path)
    s = ctx["sizes"]["2.7B"]
    assert s["rounds"] == 3 and s["gpu"] == "NVIDIA H200"
    assert s["faster"] == ["the fused AdamW"] and s["slower"] == [] and s["within"] == ["the CUDA graph"]
    name, means = min(("fused_adamw", fused), ("cuda_graph", graph), key=lambda c: sum(c[1]))
    labels = {"fused_adamw": "+ fused AdamW (Triton)", "cuda_graph": "+ CUDA graph (forward+backward)"}
    assert s["fastest"] == labels[name]
    # each round against its own roofline: the same ceiling and clock in every round, so the range is the steps'
    lo, hi = s["x_roofline"]
    assert lo < hi and hi / lo == pytest.approx(max(means) / min(means))
    # at the step's clock (10 MHz higher a round, round 0 at the ceiling's) the ceiling is higher, each later round's
    # ratio larger: neither end of the range falls, and the end a later round holds rises
    (lo_at, hi_at), by_round = s["x_at_clock"], {r: float(m) for r, m in enumerate(means)}
    assert lo_at >= lo and hi_at >= hi and (lo_at > lo if min(by_round, key=by_round.get) else hi_at > hi)
    lines = ctx["table"].splitlines()
    assert lines[0].startswith("| size | configuration | step (ms, mean) | rounds (ms) | × the one before |")
    assert "plain" in lines[2] and lines[2].split("|")[5].strip() == ""  # nothing before the first
    assert "(0.700)" in lines[3]  # the fused AdamW's rounds all 0.700 of plain's: one value, no range
    assert (tmp_path / "optimized_step_rounds.csv").exists()


def test_a_slower_technique_and_a_failed_round(tmp_path):
    plain = [150.0, 151.0, 149.0]
    slower = [160.0, 162.0, 158.0]
    frame = _rounds_frame({"plain": plain, "fused_adamw": slower, "cuda_graph": [100.0, 101.0, 99.0]})
    frame.loc[(frame.configuration == "cuda_graph") & (frame["round"] == 1), "status"] = "oom"
    s = optimized_rounds(frame, tmp_path)["sizes"]["2.7B"]
    assert s["slower"] == ["the fused AdamW"] and s["faster"] == [] and s["within"] == []
    assert s["fastest"].startswith("plain")  # the configuration out of memory in a round is no candidate
    assert optimized_rounds(frame[frame.problem == "none"], tmp_path) is None
    assert optimized_rounds(pd.DataFrame({"problem": ["optimized_step"]}), tmp_path) is None


def test_the_section_says_it_after_the_one_pass_series(tmp_path):
    ctx = json.loads((REPO / "results" / "sections" / "benchmarking" / "context.json").read_text())
    plain = [150.0, 151.0, 149.0]
    rounds = optimized_rounds(_rounds_frame({"plain": plain, "fused_adamw": [100.0, 101.0, 99.0],
                                             "cuda_graph": [99.0, 102.0, 98.0]}), tmp_path)
    text = report.render_section("benchmarking", ctx | {"optimized_rounds": rounds, "result_counts": {}},
                                 REPO / "writeup" / "templates")
    assert lint.problems(text) == [], lint.problems(text)
    main = " ".join(text.split("APPENDIX")[0].split()) if "APPENDIX" in text else " ".join(text.split())
    assert 'The "2.7B" series also ran in 3 interleaved rounds, one job a size on NVIDIA H200' in main
    assert ("Against the configuration before it, in every round: faster with the fused AdamW; slower with none; "
            "the rounds disagree (faster in some, slower in others) for the CUDA graph.") in main
    assert ("The fastest \"2.7B\" configuration by the rounds' mean (\"+ CUDA graph (forward+backward)\", 99.7 ms) "
            "is 1.14× to 1.18× its roofline round by round") in main
    assert "within its 1.2× target in every round at both clocks, so met (the summary page's verdict" in main
    assert "| 2.7B | + CUDA graph (forward+backward) | 99.7 | 98.0–102.0 |" in text
    without = report.render_section("benchmarking", ctx | {"optimized_rounds": None, "result_counts": {}},
                                    REPO / "writeup" / "templates")
    assert "In interleaved rounds" not in without and "bench-optimized-rounds" not in without


def test_the_rounds_judge_their_size_at_both_clocks_and_the_summary_takes_it(tmp_path):
    from cs336sys.analysis.optimized_step import summary_rows

    plain = [random.uniform(150.0, 160.0) for _ in range(3)]
    fast = [random.uniform(97.0, 99.0) for _ in range(3)]  # about 1.14x the 2.7B roofline at a 700 TFLOP/s ceiling
    frame = _rounds_frame({"plain": plain, "fused_adamw": fast, "cuda_graph": [f + 20 for f in fast]})
    s = optimized_rounds(frame, tmp_path)["sizes"]["2.7B"]
    assert s["target"] == 1.2 and s["x_roofline"][1] < 1.2 and s["x_at_clock"][1] < 1.2
    assert s["met_at"] == {"ceiling": True, "step": True} and s["met"] is True
    # the steps at a clock 10 % above the ceiling's: within at the ceiling's clock, outside at the step's
    frame["step_clocks"] = [{"sm_clock_mhz": 1980.0 + 10 * r} for r in frame["round"]]
    s = optimized_rounds(frame, tmp_path)["sizes"]["2.7B"]
    assert s["x_roofline"][1] < 1.2 < s["x_at_clock"][0]
    assert s["met_at"] == {"ceiling": True, "step": False} and s["met"] == "noise"
    # the one pass said missed; the summary judges the size on its rounds and says it did
    one_pass = {"best": {"2.7B": {"x_roofline": 1.25, "x_text": "1.25", "target": 1.2, "met": False,
                                  "x_at_clock": 1.3},
                         "xl": {"x_roofline": 1.1, "x_text": "1.10", "target": 1.3, "met": True, "x_at_clock": 1.2}}}
    row, = summary_rows(one_pass, {"sizes": {"2.7B": s}})
    assert row["met"] == "noise" and row["result"].startswith(f"2.7B {s['x_roofline'][0]:.2f}")
    assert "×, xl 1.10×;" in row["result"] and "1.25" not in row["result"] and row["part"].endswith("; 3 rounds: 2.7B)")
    assert f"1.20–{s['x_at_clock'][1]:.2f}× at step clocks" in row["result"]
    assert summary_rows(one_pass)[0]["met"] is False  # without rounds: the one pass's verdict
