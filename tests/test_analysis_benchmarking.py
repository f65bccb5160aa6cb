"""The benchmarking section built from the committed H100 results: the backward column is what the results
time (alone, or the difference of two timed modes in older results), the GPU-busy columns,
the compact tables hold one row per size, the summary rows come from the results, and
the section (and its appendix) renders with nothing the report's lint objects to."""

from __future__ import annotations

import json
import random
import statistics
from pathlib import Path

import pytest

from cs336sys.analysis import benchmarking
from cs336sys.analysis.context import as_json
from cs336sys.report import render_section
from cs336sys.results import read_result
from cs336sys.writeup import lint

REPO = Path(__file__).resolve().parent.parent
TEMPLATES = REPO / "writeup" / "templates"


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    paths = sorted(REPO.glob("results/benchmarking/**/*.json")) + sorted(REPO.glob("results/warmup/**/*.json")) \
        + sorted(REPO.glob("results/matmul_peak/*.json")) + sorted(REPO.glob("benchmarks/benchmarking/*.tsv"))
    if not paths:
        pytest.skip("no committed benchmarking results")
    out = tmp_path_factory.mktemp("benchmarking")
    return paths, benchmarking.build(paths, out)


def expected_backward(f: dict, fb: dict) -> str:
    if "phase_ms" in fb:  # timed alone
        t = fb["phase_ms"]["backward"]
        return f"{statistics.fmean(t):.2f} ± {statistics.stdev(t):.2f}"
    return f"{fb['mean_ms'] - f['mean_ms']:.2f} ± {fb['std_ms'] + f['std_ms']:.2f}"


def test_the_backward_column_is_what_the_results_time(built):
    paths, ctx = built
    c = ctx.timing_context_main
    results = [read_result(p) for p in paths if p.suffix == ".json" and "results/benchmarking/" in p.as_posix()]
    by = {(r["settings"]["size"], r["settings"]["mode"]): r for r in results
          if r["settings"]["context_length"] == c and r["settings"]["dtype"] == "fp32"
          and r["settings"]["compile"] == "eager" and r["status"] == "ok"}
    row = next(line for line in ctx.tables["timing"][str(c)].splitlines() if line.startswith("| 2.7B |"))
    f, fb = by[("2.7B", "forward")]["metrics"], by[("2.7B", "forward_backward")]["metrics"]
    assert expected_backward(f, fb) in row
    assert ("timed alone" if "phase_ms" in fb else "difference") in ctx.tables["timing"][str(c)]
    # the prose's ratio is the table's backward over its forward, whichever size it names
    low, high = ctx.backward_ratio
    backward = statistics.fmean(fb["phase_ms"]["backward"]) if "phase_ms" in fb else fb["mean_ms"] - f["mean_ms"]
    assert 0 < low <= backward / f["mean_ms"] <= high
    assert high == pytest.approx(backward / f["mean_ms"]) or ctx.backward_ratio_sizes[1] != "2.7B"


def test_phase_and_busy_times_make_their_columns(built, tmp_path):
    """Results with each phase timed alone and the GPU's busy time (what bench.py now records): the
    backward column is timed alone, and a point whose kernels fill little of its wall time is host-bound."""
    paths, _ = built
    rng = random.Random()
    copies = []
    for p in paths:
        if p.suffix != ".json" or "results/benchmarking/" not in p.as_posix():
            copies.append(p)
            continue
        r = json.loads(p.read_text())
        m = r["metrics"]
        if r["status"] == "ok":
            if r["settings"]["mode"] != "forward":
                m["phase_ms"] = {"forward": [m["median_ms"] * 0.3] * 3,
                                 "backward": [m["median_ms"] * rng.uniform(0.5, 0.7) for _ in range(3)]}
            busy = 0.5 if r["settings"]["size"] == "small" else 0.95  # small: the GPU idles half the step
            m["gpu_busy_ms"] = [m["median_ms"] * busy] * 3
            m["gpu_busy_median_ms"] = m["median_ms"] * busy
        q = tmp_path / p.relative_to(REPO)
        q.parent.mkdir(parents=True, exist_ok=True)
        q.write_text(json.dumps(r))
        copies.append(q)
    (tmp_path / "out").mkdir()
    ctx = benchmarking.build(copies, tmp_path / "out")
    assert ctx.backward_timed_alone and "backward (ms, timed alone)" in ctx.tables["timing"]["512"]
    assert ctx.host_bound and all(p.startswith("small ") for p in ctx.host_bound)
    assert "GPU busy (ms)" in ctx.tables_busy and ctx.busy_pct_range[0] == pytest.approx(50)
    assert any("GPU-busy" in limit for limit in ctx.limitations)
    assert lint.problems(render_section("benchmarking", as_json(ctx), TEMPLATES)) == []


def test_summary_rows_name_their_table_and_come_from_the_results(built):
    _, ctx = built
    parts = [r["part"] for r in ctx.summary]
    # bf16's MFU first (fp32's, against the CUDA cores' far lower ceiling, is no headline), bf16 against fp32
    # with TF32 off; the optimised series' row when its results are among the inputs
    assert parts == ["MFU of a bf16 train step, the best", "bf16 autocast against fp32 (TF32 off)",
                     "torch.compile against eager"]
    assert f"{ctx.best_mfu_by_dtype['bf16']['pct']:.1f} %" in ctx.summary[0]["result"]
    assert ctx.best_mfu_by_dtype["bf16"]["pct"] < ctx.best_mfu["pct"] == ctx.best_mfu_by_dtype["fp32"]["pct"]
    assert all(r["ref"].startswith("bench-") for r in ctx.summary)
    # bf16 against fp32: the largest size's train step in GPU-busy time, which the host does not move, then
    # its wall-time ratio, said to move with the host
    size, wall = list(ctx.bf16_train_speedup.items())[-1]
    busy = ctx.bf16_busy_train_speedup[size]
    assert ctx.summary[1]["result"] == (f"{busy:.2f}× faster in GPU-busy time, {wall:.2f}× in wall time "
                                        f"({size} train step, context {ctx.bf16_context_length})")


def test_the_section_and_its_appendix_render_cleanly(built):
    _, ctx = built
    text = render_section("benchmarking", as_json(ctx), TEMPLATES)
    assert lint.problems(text) == []
    assert "### 1.2 (b) Forward and backward times" in text and "## A Benchmarking: every point" in text


def test_the_optimised_series_says_every_size_and_names_its_kept_results_once(built, tmp_path):
    """A configuration slower at every size reads "at every size"; the pins that keep the series' results
    make one sentence, each with its commit."""
    series = sorted(REPO.glob("results/optimized_step/**/*.json"))
    if not series:
        pytest.skip("no committed optimised-step results")
    ctx = benchmarking.build(built[0] + series, tmp_path)
    sizes, slower = ctx.optimized["sizes"], ctx.optimized.get("slower") or {}
    everywhere = [name for name, at in slower.items() if len(at) == len(sizes)]
    pins = [{"what": "optimized_step", "results_commit": "1111111111"},
            {"what": "optimized_step (4 jobs)", "results_commit": "2222222222"},
            {"what": "ddp_step", "results_commit": "3333333333"}]
    text = render_section("benchmarking", as_json(ctx), TEMPLATES, pins=pins)
    assert lint.problems(text) == []
    assert everywhere, "the committed series has a configuration slower at every size"
    for name in everywhere:
        assert f"{name} at every size" in text
    assert text.count("Made with earlier code") == 1
    assert "Made with earlier code: optimized_step at 1111111111; optimized_step (4 jobs) at 2222222222 (" in text
    assert "3333333333" not in text


def _on_gpus(paths: list[Path], tmp_path: Path, gpu_of) -> list[Path]:
    """Copies of the committed results, each result's GPU set to `gpu_of(relative path)`."""
    copies = []
    for p in paths:
        if p.suffix != ".json":
            copies.append(p)
            continue
        r = json.loads(p.read_text())
        rel = p.relative_to(REPO).as_posix()
        r["env"]["gpu"] = gpu_of(rel)
        q = tmp_path / rel
        q.parent.mkdir(parents=True, exist_ok=True)
        q.write_text(json.dumps(r))
        copies.append(q)
    return copies


def test_no_ratio_and_no_ceiling_is_taken_across_gpu_models(built, tmp_path):
    # a grid part re-made on another GPU model (the whole-model compile points left on the H100 while the
    # eager ones and the matmul ceilings moved to the H200): those pairs get no speed-up, the section names
    # them, and each point's MFU is over its own GPU's ceiling, the H100's from its preset
    from cs336sys.accounting.hardware import PRESETS

    paths, _ = built
    h100, h200 = "NVIDIA H100 80GB HBM3", "NVIDIA H200"
    moved = random.choice(["full", "blocks"])
    copies = _on_gpus(paths, tmp_path, lambda rel: h100 if f"-{moved}/" in rel else h200)
    (tmp_path / "out").mkdir()
    ctx = benchmarking.build(copies, tmp_path / "out")
    assert ctx.cross_gpu and all(f"`{moved}`" in c and "H100" in c and "H200" in c for c in ctx.cross_gpu)
    assert f", {moved} (×)" not in (ctx.tables_compile_compact or "")
    rows = [line for line in ctx.tables_compile.splitlines() if f"| {moved} |" in line]
    assert rows and all(line.endswith("| H200 / H100 |") for line in rows)
    assert all(line.split("|")[8].strip() == "" for line in rows)  # the speed-up cell
    assert moved not in ctx.compile_speedup_by_method
    peak = {json.loads(p.read_text())["settings"]["dtype"]: json.loads(p.read_text())["metrics"]["tflops"]
            for p in paths if "matmul_peak" in p.as_posix()}
    assert ctx.ceilings[h200] == pytest.approx(peak) and ctx.peak_gpu == "H200"
    assert ctx.ceilings[h100] == {"bf16": pytest.approx(PRESETS["h100"].flops / 1e12)}
    assert ctx.ceiling_notes and "H100" in ctx.ceiling_notes[0] and "744" in ctx.ceiling_notes[0]
    text = render_section("benchmarking", as_json(ctx), TEMPLATES)
    assert "no ratio across GPU models" in text and lint.problems(text) == []

    # all on one GPU model: every pair has its ratio and nothing is named
    same = _on_gpus(paths, tmp_path / "same", lambda rel: h200)
    (tmp_path / "same" / "out").mkdir()
    one = benchmarking.build(same, tmp_path / "same" / "out")
    assert one.cross_gpu == [] and one.ceiling_notes == [] and moved in one.compile_speedup_by_method
    assert "no ratio across" not in render_section("benchmarking", as_json(one), TEMPLATES)


def test_points_without_a_gpu_pair_with_the_ceiling_measured_without_one(built, tmp_path):
    # the CPU smoke grid: no result names a GPU; the points and the ceilings pair as "" and MFU is computed
    paths, _ = built
    copies = _on_gpus(paths, tmp_path, lambda rel: None)
    (tmp_path / "out").mkdir()
    ctx = benchmarking.build(copies, tmp_path / "out")
    assert set(ctx.ceilings) == {""} and ctx.peak_gpu is None and ctx.cross_gpu == [] and ctx.on_eager is None
    assert ctx.best_mfu_by_dtype["bf16"]["pct"] > 0
    assert lint.problems(render_section("benchmarking", as_json(ctx), TEMPLATES)) == []  # fields left None render


def test_a_ceiling_measured_in_rounds_says_its_range_and_clock(built, tmp_path):
    # the matmul ceiling is its job's median round; the section gives the rounds' range and their clock
    paths, _ = built
    rounds = sorted(random.uniform(700.0, 800.0) for _ in range(5))
    copies = []
    for p in _on_gpus(paths, tmp_path, lambda rel: "NVIDIA H200"):
        if p.suffix == ".json" and "matmul_peak/bf16" in p.as_posix():
            r = json.loads(p.read_text())
            r["metrics"].update(tflops=statistics.median(rounds), tflops_rounds=rounds,
                                round_clocks=[{}] + [{"sm_clock_mhz": 1980.0}] * 4)  # the first round unsampled
            p.write_text(json.dumps(r))
        copies.append(p)
    (tmp_path / "out").mkdir()
    ctx = benchmarking.build(copies, tmp_path / "out")
    assert ctx.peak_rounds["bf16"] == {"min": rounds[0], "max": rounds[-1], "n": 5, "sm_clock_mhz": 1980.0}
    # the summary's MFU row gives the same point over the H200's datasheet peak as well (989.4 TFLOP/s)
    best = ctx.best_mfu_by_dtype["bf16"]
    row = benchmarking._summary(ctx)[0]["result"]
    assert row.endswith(f"; {best['achieved_tflops'] / 989.4 * 100:.1f} % of the datasheet's 989"), row
    text = render_section("benchmarking", as_json(ctx), TEMPLATES)
    assert (f"bf16 {statistics.median(rounds):.0f} TFLOP/s [the median of 5 rounds: {rounds[0]:.0f} to "
            f"{rounds[-1]:.0f}, SM clock 1,980 MHz]") in text
    assert lint.problems(text) == []
    # rounds that read the same (the CPU smoke grid's 0 TFLOP/s) give no range
    ctx.peak_rounds["bf16"].update(min=ctx.peak_tflops["bf16"], max=ctx.peak_tflops["bf16"])
    same = render_section("benchmarking", as_json(ctx), TEMPLATES)
    assert f"bf16 {ctx.peak_tflops['bf16']:.0f} TFLOP/s, " in same and lint.problems(same) == []


def test_the_matmul_ceiling_is_the_median_of_its_rounds(monkeypatch):
    from cs336sys import peak
    from cs336sys.jobs import Run

    rates = iter([3.0, 1.0, 2.0])
    monkeypatch.setattr(peak, "matmul_tflops", lambda *a: next(rates))
    metrics = peak.run_point(peak.PeakSettings("fp32", n=64, rounds=3, device="cpu"), Run())
    assert metrics["tflops"] == 2.0 and metrics["tflops_rounds"] == [3.0, 1.0, 2.0]
    assert metrics["round_clocks"] == [{}, {}, {}]  # nothing samples the CPU's clock
    with pytest.raises(ValueError, match="rounds must be positive"):
        peak.run_point(peak.PeakSettings("fp32", rounds=0, device="cpu"), Run())


def test_a_bf16_point_with_its_own_jobs_ceiling_is_set_against_that_one(built, tmp_path):
    # bf16 points that timed the 8192-cube product in their own job: MFU over that product, the section says
    # its range and the clocks under the products and the steps; fp32 points keep matmul_peak's ceiling
    paths, before = built
    rates, step_clock, product_clock = {}, random.uniform(1650.0, 1980.0), random.uniform(1500.0, 1650.0)
    copies = []
    for p in _on_gpus(paths, tmp_path, lambda rel: "NVIDIA H200"):
        if p.suffix == ".json" and "/benchmarking/" in p.as_posix():
            r = json.loads(p.read_text())
            if r["settings"].get("dtype") == "bf16" and r["status"] == "ok":
                rates[p.name + p.parent.name] = rate = random.uniform(650.0, 750.0)
                r["metrics"].update(matmul_bf16_tflops=rate, matmul_clocks={"sm_clock_mhz": product_clock},
                                    step_clocks={"sm_clock_mhz": step_clock})
                p.write_text(json.dumps(r))
        copies.append(p)
    if not rates:
        pytest.skip("no committed bf16 benchmarking point")
    (tmp_path / "out").mkdir()
    ctx = benchmarking.build(copies, tmp_path / "out")
    assert ctx.own_ceiling["points"] == len(rates)
    assert ctx.own_ceiling["tflops"] == pytest.approx((min(rates.values()), max(rates.values())))
    assert ctx.own_ceiling["ceiling_mhz"] == (product_clock, product_clock)
    assert ctx.own_ceiling["step_mhz"] == (step_clock, step_clock)
    best = ctx.best_mfu_by_dtype["bf16"]
    assert best["own_ceiling"] and min(rates.values()) <= best["ceiling"] <= max(rates.values())
    assert ctx.best_mfu_by_dtype["fp32"]["ceiling"] == before.best_mfu_by_dtype["fp32"]["ceiling"]
    assert f"of its job's {best['ceiling']:.0f} TFLOP/s" in benchmarking._summary(ctx)[0]["result"]
    # and against that product scaled to the steps' clock: MFU times the product's clock over the step's
    at_clock = best["pct"] * product_clock / step_clock
    assert best["pct_at_step_clock"] == pytest.approx(at_clock)
    assert f", {at_clock:.1f} % at the step's clock;" in benchmarking._summary(ctx)[0]["result"]
    text = render_section("benchmarking", as_json(ctx), TEMPLATES)
    assert f"The {len(rates)} bf16 points are each set against that product timed in their own job" in text
    assert lint.problems(text) == []
    # results measured before the job timed the product (the same points without it): none of this, and the
    # best bf16 point is set against matmul_peak's ceiling
    bare = []
    for p in copies:
        if p.suffix == ".json" and "/benchmarking/" in p.as_posix():
            r = json.loads(p.read_text())
            for key in ("matmul_bf16_tflops", "matmul_clocks", "step_clocks"):
                r["metrics"].pop(key, None)
            q = tmp_path / "bare" / p.relative_to(tmp_path)
            q.parent.mkdir(parents=True, exist_ok=True)
            q.write_text(json.dumps(r))
            p = q
        bare.append(p)
    (tmp_path / "bare-out").mkdir()
    without = benchmarking.build(bare, tmp_path / "bare-out")
    assert without.own_ceiling is None and without.best_mfu_by_dtype["bf16"]["own_ceiling"] is False
    assert "timed in the matmul_peak job" in render_section("benchmarking", as_json(without), TEMPLATES)
    assert "pct_at_step_clock" not in without.best_mfu_by_dtype["bf16"]  # no own product: no clock to scale to


def test_the_compile_speed_up_in_gpu_busy_time_is_each_pairs_busy_times_ratio(built):
    """Beside the wall-time ratios (which count the launches compiling saves, set by the host), the section gives
    each way of compiling's speed-up in GPU-busy time per dtype: eager's busy median over the compiled twin's."""
    paths, ctx = built
    results = [read_result(p) for p in paths if p.suffix == ".json" and "results/benchmarking/" in p.as_posix()]
    key = lambda r: tuple(r["settings"][k] for k in ("size", "context_length", "mode", "dtype"))  # noqa: E731
    busy = {(key(r), r["settings"]["compile"]): r["metrics"].get("gpu_busy_median_ms")
            for r in results if r["status"] == "ok"}
    want: dict[str, dict[str, list[float]]] = {}
    for (k, method), t in busy.items():
        e = busy.get((k, "eager"))
        if method == "eager" or not t or not e:
            continue
        got = want.setdefault(method, {}).setdefault(k[3], [])
        got.append(e / t)
    if not want:
        pytest.skip("no committed compiled point with its eager twin's busy time")
    assert ctx.compile_busy_by_method.keys() == want.keys()
    for method, by in want.items():
        for dtype, ratios in by.items():
            assert ctx.compile_busy_by_method[method][dtype] == pytest.approx([min(ratios), max(ratios)])
    text = render_section("benchmarking", as_json(ctx), TEMPLATES)
    method, by = next(iter(want.items()))
    dtype, ratios = next(iter(by.items()))
    assert f"in GPU-busy time, the kernels alone, `{sorted(want)[0]}` is" in text
    assert f"{min(ratios):.2f}× to {max(ratios):.2f}× in {dtype}" in text
    assert lint.problems(text) == []
    # "largest in bf16" only where every bf16 pair is above every fp32 one
    flat = {d: [x for by in want.values() for x in by.get(d, [])] for d in ("bf16", "fp32")}
    above = bool(flat["bf16"] and flat["fp32"]) and min(flat["bf16"]) > max(flat["fp32"])
    assert ctx.compile_busy_trend["bf16_above_fp32"] is above
    assert ("the gain is largest where the elementwise share is, in bf16" in text) is above


def test_bf16_against_fp32_says_a_trend_with_size_only_where_the_series_has_one(built):
    """The section says the bf16 gain grows with size in busy time only where every size's busy-time ratio is
    above the one before, says the wall-time ratios do not follow size where they do not, and names the sizes
    whose bf16 train step keeps the GPU busy under the host-bound share."""
    from cs336sys.analysis.benchmarking_speedups import HOST_BOUND_BUSY
    from cs336sys.analysis.common import rises

    paths, ctx = built
    if not ctx.bf16_busy_train_speedup:
        pytest.skip("no committed busy times")
    busy, wall = list(ctx.bf16_busy_train_speedup.values()), list(ctx.bf16_train_speedup.values())
    assert ctx.bf16_trend["busy_rises"] is all(b > a for a, b in zip(busy, busy[1:], strict=False))
    assert ctx.bf16_trend["wall_rises"] is all(b > a for a, b in zip(wall, wall[1:], strict=False))
    assert rises([1.0, 2.0, 3.0]) and not rises([1.0, 0.9, 3.0]) and not rises([1.0])
    results = [read_result(p) for p in paths if p.suffix == ".json" and "results/benchmarking/" in p.as_posix()]
    want = [r["settings"]["size"] for r in results
            if r["status"] == "ok" and r["settings"]["compile"] == "eager" and r["settings"]["dtype"] == "bf16"
            and r["settings"]["mode"] == "train_step" and r["settings"]["context_length"] == ctx.busy_context
            and r["metrics"]["gpu_busy_median_ms"] < HOST_BOUND_BUSY * r["metrics"]["median_ms"]]
    assert sorted(ctx.bf16_trend["host_bound_train"]) == sorted(want)
    text = render_section("benchmarking", as_json(ctx), TEMPLATES)
    assert ("In busy time the gain grows with size" in text) is ctx.bf16_trend["busy_rises"]
    assert ("The wall-time ratios do not follow size" in text) is (bool(want) and not ctx.bf16_trend["wall_rises"])
    assert ("The wall-time ratios rise with size, but" in text) is (bool(want) and ctx.bf16_trend["wall_rises"])


def test_a_one_pass_ratio_near_its_target_is_said_to_be_unsettled(built, tmp_path):
    """Each size whose fastest step lies within NEAR_TARGET_PCT of its target gets a sentence saying one pass does
    not settle its verdict, and none other does (the committed series and the matmul ceilings)."""
    from cs336sys.analysis.optimized_step import NEAR_TARGET_PCT

    paths = sorted(REPO.glob("results/optimized_step/**/*.json"))
    if not paths:
        pytest.skip("no committed optimised-step results")
    ctx = benchmarking.build(built[0] + paths, tmp_path)
    o = ctx.optimized
    near = {s for s, b in o["best"].items()
            if b["x_roofline"] is not None and abs(b["x_roofline"] / b["target"] - 1) * 100 < NEAR_TARGET_PCT}
    assert {n["size"] for n in o["near_target"]} == near
    text = render_section("benchmarking", as_json(ctx), TEMPLATES)
    for size in o["best"]:
        assert (f'The fastest "{size}" step, ' in text) is (size in near)


def test_the_compiled_ratios_say_how_many_pairs_cross_days(built):
    """Each eager/compiled pair sets two jobs' points against each other; the section counts the pairs whose two
    points ran on different days (from each result's own timestamp) and says so, or that none does."""
    paths, ctx = built
    if not ctx.compile_days_apart:
        pytest.skip("no compiled points with timestamps")
    results = [read_result(p) for p in paths if p.suffix == ".json" and "results/benchmarking/" in p.as_posix()]
    ok = [r for r in results if r["status"] == "ok"]

    def key(r: dict) -> tuple:
        s = r["settings"]
        return s["size"], s["context_length"], s["mode"], s["dtype"], r["env"]["gpu"]

    eager = {key(r): r["env"]["timestamp"][:10] for r in ok if r["settings"]["compile"] == "eager"}
    pairs = [(eager[key(r)], r["env"]["timestamp"][:10]) for r in ok
             if r["settings"]["compile"] != "eager" and key(r) in eager]
    apart = [(e, c) for e, c in pairs if e != c]
    assert ctx.compile_days_apart["of"] == len(pairs) and ctx.compile_days_apart["pairs"] == len(apart)
    assert ctx.compile_days_apart["days"] == sorted({d for p in apart for d in p})
    text = render_section("benchmarking", as_json(ctx), TEMPLATES)
    said = f"{len(apart)} of the {len(pairs)} pairs set a point against one measured on another day"
    assert (said in text) is bool(apart)
    assert (f"all {len(pairs)} pairs from jobs run on the same day" in text) is (not apart)


def test_days_apart_counts_the_pairs_whose_points_ran_on_different_days():
    import pandas as pd

    from cs336sys.analysis.benchmarking_speedups import _days_apart

    day = random.choice(["2026-11-29", "2026-12-02"])
    pairs = pd.DataFrame([{"size": s, "env.timestamp_eager": e, "env.timestamp_compiled": c}
                          for s, e, c in [("small", f"{day}T01:00", f"{day}T23:00"),
                                          ("xl", f"{day}T02:00", "2026-11-30T00:00"),
                                          ("large", None, "2026-11-21T00:00")]])  # large: no time, not counted
    assert _days_apart(pairs) == {"pairs": 1, "of": 2, "days": sorted({day, "2026-11-30"})}
    assert _days_apart(pairs[pairs["size"] == "large"]) is None
