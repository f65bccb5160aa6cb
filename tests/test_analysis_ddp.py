"""The ddp section on synthetic results: the overhead model against its own queue, the fit recovering
known constants, the targets meeting and missing, and the section built and rendered from a GPU-like
grid, from the smoke grid's kind of results (gloo, a real CPU trace) and from no results."""

from __future__ import annotations

import json
import math
import random
import shutil
from pathlib import Path

import pytest

from cs336sys.analysis import ddp, ddp_allreduce, ddp_steps, ddp_sweep, ddp_trace
from cs336sys.analysis.context import as_json
from cs336sys.analysis.ddp_model import (
    exposed_time,
    fit_bucket_model,
    fit_latency_bandwidth,
    formulas,
    nnls,
    optimal_bucket_bytes,
    simulate,
)
from cs336sys.profiling.timeline import save_summary, summarize_timeline
from cs336sys.report import render_markdown
from cs336sys.results import read_result, write_json_atomic, write_result
from cs336sys.sizes import train_step_flops
from cs336sys.writeup import lint

TEMPLATES = Path(__file__).parent.parent / "writeup" / "templates"
MIB = 2**20
H200_ENV = {"gpu": "NVIDIA H200", "gpus": [{"index": 0, "name": "NVIDIA H200"}] * 2, "device": "cuda",
            "cuda": "12.8", "driver": "570.00", "gpu_count": 2, "backend": "nccl", "world_size": 2}


# --- the model ------------------------------------------------------------------------------------------

@pytest.mark.parametrize("n_b", [1, 2, 7, 40, 300])
@pytest.mark.parametrize("o,w", [(5e-5, 3e11), (1e-3, 1e9), (0.0, 2e11)])
def test_closed_form_is_the_queue_of_all_reduces(n_b, o, w):
    s = 6e9
    assert simulate(s, n_b, o, w) == pytest.approx(exposed_time(s, s / n_b, o, w), rel=1e-12)


def test_a_slow_backward_leaves_only_the_last_bucket():
    """When computing a bucket takes longer than its all-reduce, the queue drains between buckets."""
    s, n_b, o, w = 1e9, 10, 1e-4, 1e11
    b = s / n_b
    assert simulate(s, n_b, o, w, compute_per_bucket=10 * (o + b / w)) == pytest.approx(o + b / w)


def test_the_optimum_minimises_the_closed_form():
    s, o, w = 6e9, 8e-5, 2.5e11
    b_star = optimal_bucket_bytes(s, o, w)
    assert b_star == pytest.approx(math.sqrt(s * o * w))
    t_star = exposed_time(s, b_star, o, w)
    assert t_star == pytest.approx(2 * math.sqrt(s * o / w))
    for f in (0.5, 0.9, 1.1, 2.0):
        assert exposed_time(s, f * b_star, o, w) > t_star
    assert optimal_bucket_bytes(1e6, 1.0, 1e12) == 1e6  # capped at one bucket
    assert optimal_bucket_bytes(s, 0.0, w) == 0.0 and optimal_bucket_bytes(s, o, math.inf) == math.inf


def test_formulas_are_derived_by_sympy():
    f = formulas()
    assert f["b_star"] == r"\sqrt{o s w}" and f["n_star"] == r"\sqrt{\frac{s}{o w}}"
    assert f["exposed_n"] == r"n o + \frac{s}{n w}" and f["equal_terms"] == r"\frac{o s}{b} = \frac{b}{w}"
    assert f["t_star"] == r"2 \sqrt{\frac{o s}{w}}"
    # what runs in the text has no fraction, sub- or superscript: they would print below 8 pt
    for key, latex in f.items():
        if key.endswith("_inline"):
            assert not any(mark in latex for mark in (r"\frac", "_", "^")), key


def test_nnls_keeps_coefficients_non_negative():
    x = [[1.0, 1.0], [1.0, 2.0], [1.0, 3.0]]
    assert list(nnls(x, [3.0, 2.0, 1.0])) == pytest.approx([2.0, 0.0])  # slope would be negative
    assert list(nnls(x, [2.0, 3.0, 4.0])) == pytest.approx([1.0, 1.0])


def test_fit_recovers_the_constants_of_data_made_by_the_model():
    s, o, w = 6.0e9, 9e-5, 1.8e11
    n_b = [412, 118, 14, 2]  # what 1, 10, 100, 1000 MiB buckets give on a model of many tensors
    exposed = [n * o + s / (n * w) for n in n_b]
    f = fit_bucket_model(n_b, s, exposed)
    assert f.o_s == pytest.approx(o, rel=1e-9) and f.w_bytes_per_s == pytest.approx(w, rel=1e-9)
    assert f.r2 == pytest.approx(1.0) and f.dof == 2 and max(map(abs, f.residuals_s)) < 1e-12
    noisy = [e * (1 + random.Random(0).uniform(-0.02, 0.02)) for e in exposed]
    g = fit_bucket_model(n_b, s, noisy)
    assert g.o_s == pytest.approx(o, rel=0.1) and g.w_bytes_per_s == pytest.approx(w, rel=0.1) and g.r2 > 0.99


def test_a_sweep_the_model_cannot_describe_fits_poorly():
    # exposed time largest in the middle of the sweep: no n_b·o + s/(n_b·w) curve has a maximum
    f = fit_bucket_model([400, 100, 10, 1], 6e9, [0.01, 0.05, 0.05, 0.01])
    assert f.r2 is not None and f.r2 < ddp_steps.FIT_R2_GOOD
    by = {"none": {"variant": "none", "mean_ms": 50.0}}
    for mb, ms, n in [(1, 60.0, 400), (10, 100.0, 100), (100, 100.0, 10), (1000, 60.0, 1)]:
        by[f"b{mb}"] = {"variant": "bucketed", "bucket_mb": mb, "mean_ms": ms, "all_reduces": n}
    fit = ddp_steps.bucket_model(by, 6000 * MIB, None)["fits"]["step"]
    assert fit["r2"] < 0 and not fit["good"] and fit["worse_than_the_mean"]  # the mean predicts better


def test_a_sweep_no_slower_than_no_communication_has_no_zero_fit_column():
    # gloo on a busy CPU: every bucketed step as fast as `none` or faster, so the fit's cost is zero
    by = {"none": {"variant": "none", "mean_ms": 50.0}}
    for mb, ms, n in [(1, 49.0, 40), (10, 48.5, 5), (100, 49.5, 1)]:
        by[f"b{mb}"] = {"variant": "bucketed", "bucket_mb": mb, "mean_ms": ms, "all_reduces": n}
    model = ddp_steps.bucket_model(by, 40 * MIB, None)
    assert model["fits"]["step"]["predicted_ms"] == pytest.approx([0.0] * 3, abs=1e-9)
    assert model["fits"]["step"]["b_star_unbounded"] and model["fits"]["step"]["no_optimum_for_lack_of"] == "fixed cost"
    assert "Δ step fit (ms)" not in model["frame"].columns and "Δ step (ms)" in model["frame"].columns


def test_latency_bandwidth_fit_of_an_all_reduce_sweep():
    sizes = [2**20, 10 * 2**20, 100 * 2**20, 2**30]
    o, inv_w = fit_latency_bandwidth(sizes, [2e-5 + n / 3e11 for n in sizes])
    assert o == pytest.approx(2e-5) and 1 / inv_w == pytest.approx(3e11)


def test_the_default_bucket_is_the_experiments():
    from cs336sys.distributed.experiments import TORCH_DDP_DEFAULT_BUCKET_MB

    assert ddp_steps.TORCH_DDP_DEFAULT_MB == TORCH_DDP_DEFAULT_BUCKET_MB


# --- synthetic result trees ----------------------------------------------------------------------------

def _write(path: Path, problem: str, settings: dict, metrics: dict, env: dict | None = None, status: str = "ok"):
    write_result(path, problem, settings, metrics, status=status, reason=None if status == "ok" else status)
    if env:
        r = read_result(path)
        r["env"].update(env)
        write_json_atomic(path, r)


def _allreduce(root: Path, backend: str, world: int, sizes: list[int], o: float, w: float, env: dict | None,
               nominal: float | None = None, busbw_1g_factor: float = 1.0):
    device = "cuda" if backend == "nccl" else "cpu"
    for n in sizes:
        t = o + n / w * (busbw_1g_factor if n == 2**30 else 1.0)
        times = [t * 1e3 * (1 + 0.01 * k) for k in range(20)]
        algbw = n / t / 1e9
        metrics = {"mean_ms": sum(times) / 20, "std_ms": 0.01 * t * 1e3, "median_ms": t * 1e3, "min_ms": min(times),
                   "max_ms": max(times), "times_ms": times, "backend": backend, "world_size": world,
                   "algbw_gbps": algbw, "busbw_gbps": algbw * 2 * (world - 1) / world}
        if device == "cuda":
            metrics["nvlink_nominal_gbps"] = nominal
        _write(root / "results" / "allreduce" / f"{backend}-{world}" / f"{n}.json", "allreduce",
               {"size_bytes": n, "warmup": 5, "iters": 20, "device": device}, metrics,
               (env or {}) | {"backend": backend, "world_size": world})


def _step(root: Path, size: str, dtype: str, variant: str, bucket: float | None, mean: float, *, std: float = 1.0,
          wait: float = 0.0, calls: int | None = None, in_bwd: int | None = None, grad_bytes: int = 6_000_000_000,
          device: str = "cuda", env: dict | None = None, steps: int = 10, status: str = "ok"):
    name = variant + (f"-{bucket:g}MB" if bucket is not None else "")
    step_ms = [mean + std * (1 if k % 2 else -1) for k in range(steps)]
    metrics = {} if status != "ok" else {
        "mean_ms": mean, "std_ms": std, "median_ms": mean, "min_ms": min(step_ms), "max_ms": max(step_ms),
        "step_ms": step_ms, "sync_wait_ms": wait, "sync_wait_step_ms": [wait] * steps,
        "ranks": [{"mean_ms": mean, "wait_ms": wait, "peak_memory_bytes": None, "parameter_checksum": 1.0}] * 2,
        "slowest_rank_mean_ms": mean, "grad_bytes": grad_bytes, "parameters": grad_bytes // 4,
        "all_reduces_per_step": calls, "launched_in_backward": in_bwd, "peak_memory_bytes": None, "world_size": 2}
    _write(root / "results" / "ddp_step" / f"{size}-{dtype}" / f"{name}.json", "ddp_step",
           {"size": size, "variant": variant, "bucket_size_mb": bucket, "context_length": 512, "batch_size": 4,
            "dtype": dtype, "warmup": 2, "steps": steps, "device": device}, metrics, env, status)


def _ddp_job(root: Path, size: str, dtype: str, none: float, *, bucketed_best: float, overlap: float, torch: float,
             o: float = 9e-5, w: float = 1.8e11, env: dict | None = H200_ENV, device: str = "cuda"):
    """A job whose bucketed sweep follows the model with constants (o, w) on top of `none`, scaled so
    its best point is `bucketed_best`; PyTorch's DDP at 25 and 100 MiB."""
    s = 6_000_000_000
    sweep = {1.0: 412, 10.0: 118, 100.0: 14, 1000.0: 2}
    exposed = {b: (n * o + s / (n * w)) * 1e3 for b, n in sweep.items()}
    shift = bucketed_best - (none + min(exposed.values()))
    _step(root, size, dtype, "none", None, none, device=device, env=env)
    _step(root, size, dtype, "naive", None, none + 95.0, wait=92.0, calls=412, in_bwd=0, device=device, env=env)
    _step(root, size, dtype, "flat", None, none + 60.0, wait=58.0, calls=1, in_bwd=0, device=device, env=env)
    _step(root, size, dtype, "overlap", None, overlap, wait=overlap - none - 3, calls=412, in_bwd=412, device=device,
          env=env)
    for b, n in sweep.items():
        _step(root, size, dtype, "bucketed", b, none + exposed[b] + shift, wait=exposed[b], calls=n, in_bwd=n,
              device=device, env=env)
    _step(root, size, dtype, "torch_ddp", 25.0, torch, device=device, env=env)
    _step(root, size, dtype, "torch_ddp", 100.0, torch * 1.004, device=device, env=env)


def _launch(name: str, ts: float, corr: int, stream: int, start: float, dur: float) -> list[dict]:
    return [{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": ts, "dur": 1.0,
             "args": {"correlation": corr}},
            {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream, "ts": start, "dur": dur,
             "args": {"correlation": corr, "stream": stream, "device": 0}}]


def synthetic_step_trace(overlapped: bool) -> dict:
    """One step: forward, a backward of eight gemms, four NCCL all-reduces of 30 us on their own
    stream, either each right after two backward gemms (overlapped) or all after the backward."""
    r = lambda name, ts, dur: {"ph": "X", "cat": "user_annotation", "name": name, "pid": 1, "tid": 1, "ts": ts,
                               "dur": dur, "args": {}}
    events = [r("step", 0.0, 1000.0), r("forward", 1.0, 99.0), r("backward", 100.0, 400.0), r("sync", 500.0, 200.0),
              r("optimizer_step", 700.0, 100.0)]
    corr = 0
    for i in range(4):
        corr += 1
        events += _launch("ampere_sgemm_fwd", 2.0 + i, corr, 7, 10.0 + 20 * i, 20.0)
    for i in range(8):
        corr += 1
        events += _launch("ampere_sgemm_bwd", 101.0 + i, corr, 7, 100.0 + 40 * i, 40.0)
    for i in range(4):
        corr += 1
        start = 180.0 + 80 * i if overlapped else 430.0 + 35 * i
        events += _launch("ncclDevKernel_AllReduce_Sum_f32", 150.0 + i if overlapped else 501.0 + i, corr, 13, start,
                          30.0)
    corr += 1
    events += _launch("multi_tensor_apply_kernel<adam>", 701.0, corr, 7, 720.0, 50.0)
    return {"traceEvents": events}


def _trace(root: Path, variant: str, bucket: float | None, summary: dict, env: dict | None, device: str = "cuda"):
    name = variant + (f"-{bucket:g}MB" if bucket is not None else "")
    path = root / "results" / "ddp_trace" / f"{name}.json"
    _write(path, "ddp_trace", {"size": "2.7B", "variant": variant, "bucket_size_mb": bucket, "context_length": 512,
                               "batch_size": 4, "dtype": "bf16", "warmup": 2, "device": device},
           {"totals": summary["totals"], "window_us": summary["window"]["dur_us"], "tool": summary["tool"]}, env)
    (root / "results" / "ddp_trace" / name).mkdir(parents=True, exist_ok=True)
    save_summary(summary, root / "results" / "ddp_trace" / name / "timeline.json")


def _timing(root: Path, stem: str, seconds: float):
    path = root / "benchmarks" / f"{stem}.tsv"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"s\th:m:s\tmax_rss\n{seconds}\t0:00:{int(seconds) % 60:02d}\t100.0\n")


def gpu_grid(root: Path) -> list[Path]:
    """Like the main grid on 2×H200: two all-reduce backends, two DDP jobs (one meets the targets, one
    misses them), naive/overlap/bucketed traces, timing records."""
    sizes = [2**20, 10 * 2**20, 100 * 2**20, 2**30]
    _allreduce(root, "nccl", 2, sizes, 2.5e-5, 3.3e11, H200_ENV, nominal=477.0)
    for world in (2, 4, 6):
        _allreduce(root, "gloo", world, sizes, 3e-4, 4e9 / world, H200_ENV)
    _ddp_job(root, "2.7B", "bf16", 300.0, bucketed_best=306.0, overlap=318.0, torch=303.0)  # meets both
    _ddp_job(root, "xl", "fp32", 500.0, bucketed_best=530.0, overlap=560.0, torch=505.0)  # misses both
    _trace(root, "naive", None, summarize_timeline(synthetic_step_trace(False)), H200_ENV)
    _trace(root, "overlap", None, summarize_timeline(synthetic_step_trace(True)), H200_ENV)
    _trace(root, "bucketed", 100.0, summarize_timeline(synthetic_step_trace(True)), H200_ENV)
    for stem, s in (("allreduce/nccl-2", 20.0), ("allreduce/gloo-2", 30.0), ("allreduce/gloo-4", 40.0),
                    ("allreduce/gloo-6", 50.0), ("ddp_step/2.7B-bf16", 150.0), ("ddp_step/xl-fp32", 160.0),
                    ("ddp_trace", 60.0)):
        _timing(root, stem, s)
    return inputs(root)


def inputs(root: Path) -> list[Path]:
    """What the section rule gives: result files, rendered folders and timing records."""
    results = sorted((root / "results").rglob("*.json"))
    results = [p for p in results if p.name != "timeline.json"]
    folders = sorted(p for p in (root / "results" / "ddp_trace").glob("*") if p.is_dir())
    return results + folders + sorted((root / "benchmarks").rglob("*.tsv"))


def render(ctx: ddp.DDPContext | dict, tmp: Path) -> str:
    section = tmp / "sections" / "ddp"
    section.mkdir(parents=True, exist_ok=True)
    (section / "context.json").write_text(json.dumps(as_json(ctx) | {"result_counts": {}}))
    text = render_markdown([section], TEMPLATES, tmp / "writeup" / "report.md")
    assert lint.problems(text) == [], "\n".join(lint.problems(text))
    return text[text.index(" Distributed data parallel\n"):]


def build(root: Path, paths: list[Path]) -> tuple[ddp.DDPContext, Path]:
    out = root / "sections" / "ddp"
    out.mkdir(parents=True)
    return ddp.build(paths, out), out


# --- the section ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def gpu_section(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpu")
    ctx, out = build(root, gpu_grid(root))
    return root, ctx, out


def test_all_reduce_table_figure_and_bus_bandwidth_target(gpu_section):
    _, ctx, out = gpu_section
    assert (out / ctx.allreduce_figure).stat().st_size > 10_000
    assert ctx.allreduce_table.count("\n") == 2 + 4 * 4
    assert "| nccl | 2 | 1 GiB |" in ctx.allreduce_table
    [t] = ctx.allreduce_targets
    assert t["world"] == 2 and t["ok"] and t["best_size"] == "1 GiB" and t["fraction"] == pytest.approx(1.0)
    assert t["nominal"] == 477.0 and t["of_nominal"] == pytest.approx(t["busbw"] / 477.0)
    fit = ctx.allreduce_fits["nccl-2"]
    assert fit["o_s"] == pytest.approx(2.5e-5, rel=1e-6) and 1 / fit["inv_w"] == pytest.approx(3.3e11, rel=1e-6)
    assert ctx.allreduce_compare["gloo_worlds"]["falls"]
    assert ctx.allreduce_compare["nccl_over_gloo"]["size"] == "1 GiB"


def test_bus_bandwidth_target_misses_when_one_gib_falls_short(tmp_path):
    sizes = [2**20, 100 * 2**20, 2**30]
    _allreduce(tmp_path, "nccl", 2, sizes, 1e-5, 3e11, H200_ENV, nominal=None, busbw_1g_factor=1.3)
    ctx = ddp.build(sorted((tmp_path / "results").rglob("*.json")), tmp_path)
    [t] = ctx.allreduce_targets
    assert not t["ok"] and t["best_size"] == "100 MiB" and t["fraction"] < ddp.BUSBW_TARGET_FRACTION
    assert "nominal" not in t


def test_the_curves_by_shape_in_the_prose(tmp_path):
    """Three sweeps made for the sentence's branches: a fixed cost most of the smallest call's time (o large),
    none (o = 0, a bus bandwidth flat in size, and falling at 1 GiB, whose call is slower than its bandwidth),
    and some (o under half); the curve that does not rise is named with its values."""
    sizes = [2**20, 10 * 2**20, 100 * 2**20, 2**30]
    _allreduce(tmp_path, "nccl", 2, sizes, 1e-4, 3e11, H200_ENV, nominal=477.0)  # o: 1e-4 s against 3.5e-6
    _allreduce(tmp_path, "gloo", 2, sizes, 0.0, 1e9, H200_ENV, busbw_1g_factor=1.5)
    _allreduce(tmp_path, "gloo", 4, sizes, 2e-4, 1e9, H200_ENV)  # o: 0.2 ms of the 1 MiB call's 1.25 ms
    ctx = ddp.build(sorted((tmp_path / "results").rglob("*.json")), tmp_path)
    shape = as_json(ctx)["allreduce_shape"]
    assert shape["latency_bound"] == ["nccl with 2 ranks"]
    assert shape["no_fixed_cost"] == ["gloo with 2 ranks"] and shape["some_fixed_cost"] == ["gloo with 4 ranks"]
    assert shape["rising"] == ["nccl with 2 ranks", "gloo with 4 ranks"]
    assert [c["label"] for c in shape["not_rising"]] == ["gloo with 2 ranks"]
    text = " ".join(render(ctx, tmp_path).split())
    busbw = ", ".join(f"{b:.2f}" for b in shape["not_rising"][0]["busbw"])
    assert (f"Bus bandwidth rises at every step in size for nccl with 2 ranks, gloo with 4 ranks; it does not "
            f"for gloo with 2 ranks ({busbw} GB/s).") in text
    assert ("For nccl with 2 ranks the fit puts most of the smallest size's time in $o$" in text
            and "for gloo with 2 ranks it finds no fixed cost; for gloo with 4 ranks its $o$ is under half" in text)


def test_every_curve_rising_is_said_once(tmp_path):
    sizes = [2**20, 10 * 2**20, 100 * 2**20, 2**30]
    _allreduce(tmp_path, "nccl", 2, sizes, 1e-4, 3e11, H200_ENV, nominal=477.0)
    _allreduce(tmp_path, "gloo", 2, sizes, 2e-4, 1e9, H200_ENV)
    ctx = ddp.build(sorted((tmp_path / "results").rglob("*.json")), tmp_path)
    assert as_json(ctx)["allreduce_shape"]["not_rising"] == []
    text = " ".join(render(ctx, tmp_path).split())
    assert "Bus bandwidth rises at every step in size on every curve." in text
    assert "rises at every step in size for" not in text and "it does not for" not in text


def test_ddp_targets_meet_and_miss(gpu_section):
    _, ctx, _ = gpu_section
    jobs = {j["name"]: j for j in ctx.ddp_jobs}
    assert list(jobs) == ["xl-fp32-ws2", "2.7B-bf16-ws2"]  # registry order of sizes
    meet, miss = jobs["2.7B-bf16-ws2"]["targets"], jobs["xl-fp32-ws2"]["targets"]
    assert meet["bucketed"]["ratio"] == pytest.approx(306.0 / 303.0) and meet["bucketed"]["ok"]
    assert meet["overlap"]["ratio"] == pytest.approx(318.0 / 303.0) and meet["overlap"]["ok"]
    assert miss["bucketed"]["ratio"] == pytest.approx(530.0 / 505.0) and not miss["bucketed"]["ok"]
    assert miss["overlap"]["ratio"] == pytest.approx(560.0 / 505.0) and not miss["overlap"]["ok"]
    assert "ok" not in meet["naive"] and "ok" not in meet["flat"]  # shown, not targets
    assert meet["bucketed"]["bucket_mb"] == 100.0  # the model's constants put the optimum near 100 MiB
    assert meet["bucketed"]["matched_ratio"] == pytest.approx(306.0 / (303.0 * 1.004))
    # one round: the ratio's range is two standard errors each way (a ratio of two means of 10 steps, std 1 ms)
    se = meet["bucketed"]["ratio"] * math.sqrt((1 / 306) ** 2 / 10 + (1 / 303) ** 2 / 10)
    assert not meet["bucketed"]["paired"] and meet["bucketed"]["rounds"] == 1
    assert meet["bucketed"]["lo"] == pytest.approx(meet["bucketed"]["ratio"] - 2 * se)
    assert meet["bucketed"]["hi"] == pytest.approx(meet["bucketed"]["ratio"] + 2 * se)


def test_a_missed_target_is_set_against_the_pace_of_the_same_dtype(gpu_section, tmp_path):
    """The note under the targets: only for a job that misses one, its no-communication pace from the
    model's FLOPs, against the job of the same dtype that computes fastest (none in another dtype)."""
    _, ctx, _ = gpu_section
    jobs = {j["name"]: j for j in ctx.ddp_jobs}
    assert jobs["2.7B-bf16-ws2"]["missed"] is None
    note = jobs["xl-fp32-ws2"]["missed"]
    assert note["targets"] == ["bucketed", "overlap"] and "other" not in note  # the other job is bf16
    assert note["tflops"] == pytest.approx(train_step_flops("xl", 4, 512) / 0.5 / 1e12)
    root = tmp_path / "same-dtype"
    _ddp_job(root, "2.7B", "fp32", 300.0, bucketed_best=304.0, overlap=306.0, torch=303.0)  # meets both
    _ddp_job(root, "xl", "fp32", 400.0, bucketed_best=450.0, overlap=420.0, torch=405.0)  # misses bucketed only
    ctx2, _ = build(root, inputs(root))
    jobs = {j["name"]: j for j in ctx2.ddp_jobs}
    note = jobs["xl-fp32-ws2"]["missed"]
    assert jobs["2.7B-fp32-ws2"]["missed"] is None and note["targets"] == ["bucketed"]
    assert note["other"] == "2.7B, fp32, 2 ranks"
    assert note["flops_ratio"] == pytest.approx(train_step_flops("xl", 4, 512) / train_step_flops("2.7B", 4, 512))
    assert note["time_ratio"] == pytest.approx(400.0 / 300.0)
    text = render(ctx2, tmp_path / "report")
    assert "xl, fp32, 2 ranks misses a target (bucketed)." in text
    # what bucketing adds is named, no cause is claimed for the miss (it was not measured apart)
    assert "Bucketing adds a copy of every gradient into and out of its buckets; the cost of each" in text
    assert "TFLOP/s per GPU" not in text and "the GPU's arithmetic is not what limits" not in text


def test_ddp_step_table_and_answers(gpu_section):
    _, ctx, out = gpu_section
    j = next(j for j in ctx.ddp_jobs if j["name"] == "2.7B-bf16-ws2")
    naive = j["variants"]["naive"]
    assert naive["comm_ms"] == pytest.approx(95.0) and naive["comm_share"] == pytest.approx(95.0 / 395.0)
    assert j["variants"]["bucketed-100MB"]["vs_matched"]["ratio"] == pytest.approx(j["variants"]["bucketed-100MB"][
        "mean_ms"] / j["variants"]["torch_ddp-100MB"]["mean_ms"])
    assert j["variants"]["bucketed-10MB"]["vs_matched"] == {}  # no PyTorch DDP at 10 MiB
    lines = j["table"].strip().splitlines()
    assert len(lines) == 2 + 10 and len(lines[0].split("|")) - 2 <= 9
    assert "| naive | 395.0 ± 1.0 |" in j["table"] and "412 (0)" in j["table"] and "412 (412)" in j["table"]
    a = j["answers"]
    assert a["flat"]["faster"] and a["flat"]["naive_over_flat"] == pytest.approx(395.0 / 360.0)
    assert a["flat"]["predicted_saving_ms"] == pytest.approx(411 * 2.5e-5 * 1e3, rel=1e-6)
    assert a["overlap"]["faster_than_naive"] and a["overlap"]["faster_than_flat"]
    assert a["buckets"]["best_mb"] == 100.0 and a["buckets"]["shape"] == "valley"
    assert (out / ctx.ddp_figure).stat().st_size > 10_000
    assert (out / "ddp_steps_2.7B_bf16_ws2.csv").is_file()
    assert "| 2.7B, bf16, 2 ranks | 1 |" in ctx.ddp_bucket_table and "**306.0**" in ctx.ddp_bucket_table
    row = next(line for line in ctx.ddp_bucket_table.splitlines() if line.startswith("| 2.7B, bf16, 2 ranks"))
    assert "one bucket (flat) | PyTorch DDP |" in ctx.ddp_bucket_table and row.split("|")[-3].strip() == "360.0"
    assert a["buckets"]["brackets"] and a["buckets"]["largest_mb"] == 1000.0


def test_bucket_model_fit_recovers_the_grid_constants(gpu_section):
    _, ctx, _ = gpu_section
    model = next(j for j in ctx.ddp_jobs if j["name"] == "2.7B-bf16-ws2")["model"]
    wait = model["fits"]["wait"]  # the waits were made by the model with o = 90 us, w = 180 GB/s
    assert wait["o_ms"] == pytest.approx(0.09, rel=1e-6) and wait["w_gbps"] == pytest.approx(180.0, rel=1e-6)
    assert wait["good"] and wait["dof"] == 2 and wait["agrees"]
    assert wait["b_star_mb"] == pytest.approx(math.sqrt(6e9 * 9e-5 * 1.8e11) / MIB, rel=1e-6)
    step = model["fits"]["step"]  # the step excess is the same curve plus a constant the model lacks
    assert len(step["residuals_ms"]) == 4 and step["max_abs_residual_ms"] > 0
    assert model["from_allreduce"]["w_gbps"] == pytest.approx(330.0, rel=1e-6)
    assert model["n_max"] == 412
    assert "| 100 | 14 |" in model["table"]


def test_trace_table_and_timeline(gpu_section):
    root, ctx, out = gpu_section
    rows = {r["variant"]: r for r in ctx.trace_rows}
    assert list(rows) == ["naive", "overlap", "bucketed"]
    assert rows["naive"]["overlapped_ms"] == 0.0 and rows["naive"]["comm_ms"] == pytest.approx(0.12)
    # the last all-reduce starts as the backward's last kernel ends: three of four run under compute
    assert rows["overlap"]["overlapped_share"] == pytest.approx(0.75)
    assert (out / ctx.trace_figure).stat().st_size > 10_000
    assert ctx.trace_settings["source"] == "cuda"
    # each trace against the benchmark's step of the same variant, and against the bandwidth bound
    facts = {f["label"]: f for f in ctx.trace_vs_bench}
    steps = {r["settings"]["variant"]: r["metrics"] for r in map(read_result, sorted(
        (root / "results" / "ddp_step").rglob("*.json"))) if r["settings"]["size"] == "2.7B"
        and r["settings"]["dtype"] == ctx.trace_settings["dtype"] and r["status"] == "ok"}
    naive = facts["naive"]
    assert naive["ratio"] == pytest.approx(rows["naive"]["span_ms"] / steps["naive"]["mean_ms"])
    bound = 2 * (ctx.trace_busbw_ranks - 1) / ctx.trace_busbw_ranks * steps["naive"]["grad_bytes"] / (
        ctx.trace_busbw_gbps * 1e9) * 1e3
    assert naive["bound_ms"] == pytest.approx(bound) and naive["stretch"] == pytest.approx(naive["comm_ms"] / bound)


def test_grid_time_sums_the_timing_records(gpu_section):
    _, ctx, _ = gpu_section
    g = ctx.grid_time
    assert g["total_s"] == pytest.approx(510.0) and g["jobs"] == 7 and g["ok"]
    assert g["cpu_only_s"] == pytest.approx(120.0)
    assert {e["experiment"]: e["jobs"] for e in g["experiments"]} == {"allreduce": 4, "ddp_step": 2, "ddp_trace": 1}
    assert not ddp.grid_time([])


def test_the_section_renders_from_gpu_results(gpu_section, tmp_path):
    _, ctx, _ = gpu_section
    text = render(ctx, tmp_path)
    assert "No results yet" not in text and "CPU numbers" not in text
    for figure in (ctx.allreduce_figure, ctx.ddp_figure, ctx.trace_figure):
        assert f"sections/ddp/{figure})" in text
    assert "| 2.7B, bf16, 2 ranks | 1 | 100 |" in text and "✗" in text and "✓" in text
    assert "valley" not in text and "The minimum lies inside the sweep" in text
    assert r"b = \sqrt{o s w}" in text
    assert "NCCL ran with 2 ranks, one GPU each; 4 and 6 ranks" in text and "NCCL over NVLink" in text
    assert text.count("As expected, bucketing at its best") == 2 and "Why bucketing can fall short" not in text
    assert "Naive waits for the backward to end before it all-reduces: 0% of its" in text
    assert "bf16 means autocast" in text and "are xl: 2025; 2.7B: 2025 (2026 calls it xl)." in text
    assert "a poor fit" not in text.split("2.7B, bf16, 2 ranks (4 bucket sizes")[1].split("####")[0]
    assert "n/a" not in text


def test_the_section_reads_cleanly_as_a_pdf(gpu_section, tmp_path):
    """Through pandoc and typst, read back like the real report: tables fit, text at least 8 pt, and
    every figure at the text width with its text at least 8 pt."""
    pytest.importorskip("pypdf")
    import test_pdf_layout as layout

    from cs336sys import report
    from cs336sys.analysis import common

    root, _, _ = gpu_section
    figures: dict = {}
    original = common.save_figure

    def spy(fig, out_dir, name):
        figures[name] = (fig.get_size_inches()[0], layout.drawn_text(fig))
        return original(fig, out_dir, name)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ddp_allreduce, "save_figure", spy)
        mp.setattr(ddp_sweep, "save_figure", spy)
        mp.setattr(ddp_trace, "save_figure", spy)
        ctx, _ = build(tmp_path, inputs(root))
    assert set(figures) == {"allreduce_bandwidth", "ddp_step_vs_bucket", "ddp_timeline"}
    for name, (width, texts) in figures.items():
        assert width == pytest.approx(report.TEXT_WIDTH_CM / 2.54, rel=0.01), name
        assert min(size for _, size in texts) >= layout.MIN_TEXT_PT, name
    render(ctx, tmp_path)
    pdf = tmp_path / "writeup" / "report.pdf"
    report.render_pdf(tmp_path / "writeup" / "report.md", pdf)
    read = layout.read_layout(pdf)
    assert len(read.tables) >= 8
    assert layout.layout_problems(read, report.MARGIN_X_CM / 2.54 * 72) == []


def test_failed_points_show_their_status(tmp_path):
    _ddp_job(tmp_path, "xl", "bf16", 300.0, bucketed_best=306.0, overlap=318.0, torch=303.0)
    _step(tmp_path, "xl", "bf16", "torch_ddp", 25.0, 0.0, status="oom")
    ctx = ddp.build(inputs(tmp_path), tmp_path)
    [j] = ctx.ddp_jobs
    assert "| PyTorch DDP, 25 MiB (default) | oom |" in j["table"]
    assert not j["targets"]["has_default"] and "ratio" not in j["targets"]["bucketed"]
    assert "no PyTorch DDP run at its default bucket size" in render(ctx, tmp_path)


# --- the smoke grid's kind of results, and none -----------------------------------------------------------

@pytest.fixture(scope="module")
def cpu_timeline(tmp_path_factory):
    """A real CPU trace of a tiny model's step with gloo all-reduces (one process), summarised."""
    import torch
    import torch.distributed as dist

    from cs336sys.model import build_model
    from cs336sys.optim import cross_entropy
    from cs336sys.profiling.annotate import phase
    from cs336sys.profiling.trace import record_trace

    tmp = tmp_path_factory.mktemp("trace")
    dist.init_process_group("gloo", init_method=f"file://{tmp}/store", rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        model = build_model("tiny", 16)
        tokens = torch.randint(0, 10_000, (2, 16))

        def step():
            with phase("forward"):
                loss = cross_entropy(model(tokens), tokens)
            with phase("backward"):
                loss.backward()
            with phase("sync"):
                for p in model.parameters():
                    dist.all_reduce(p.grad)
            model.zero_grad(set_to_none=True)

        record_trace(step, 1, 1, "cpu", tmp / "ddp.json")
    finally:
        dist.destroy_process_group()
    return summarize_timeline(tmp / "ddp.json")


def test_the_section_builds_from_smoke_kind_results(tmp_path, cpu_timeline):
    cpu = {"device": "cpu", "backend": "gloo"}
    _allreduce(tmp_path, "gloo", 2, [4096, 2**20], 3e-3, math.inf, cpu)  # as the smoke grid: time flat in size
    for variant, bucket, mean, calls, in_bwd in (("none", None, 40.0, None, None), ("naive", None, 80.0, 21, 0),
                                                 ("flat", None, 70.0, 1, 0), ("overlap", None, 90.0, 21, 21),
                                                 ("bucketed", 0.01, 100.0, 21, 21), ("bucketed", 1.0, 85.0, 3, 3),
                                                 ("torch_ddp", 25.0, 65.0, None, None)):
        _step(tmp_path, "tiny", "fp32", variant, bucket, mean, std=15.0, wait=(mean - 40.0) * 0.8, calls=calls,
              in_bwd=in_bwd, grad_bytes=5_645_568, device="cpu", env=cpu, steps=2)
    for variant, bucket in (("naive", None), ("overlap", None), ("bucketed", 0.01)):
        _trace(tmp_path, variant, bucket, cpu_timeline, cpu, device="cpu")
    _timing(tmp_path, "allreduce/gloo-2", 7.0)
    _timing(tmp_path, "ddp_step/tiny-fp32", 14.0)
    _timing(tmp_path, "ddp_trace", 11.0)
    ctx, out = build(tmp_path, inputs(tmp_path))
    assert ctx.allreduce_targets == [] and "allreduce_nominal_gbps" not in as_json(ctx)  # no NVLink nominal
    [j] = ctx.ddp_jobs
    assert j["backend"] == "gloo" and j["targets"]["bucketed"]["bucket_mb"] == 1.0
    assert j["model"]["fits"]["step"]["dof"] == 0  # two bucket sizes: an exact fit that tests nothing
    assert ctx.trace_settings["source"] == "cpu" and (out / ctx.trace_figure).is_file()
    text = render(ctx, tmp_path / "report")
    assert "CPU numbers from the smoke grid" in text
    assert "there are no NCCL results here, so it is not evaluated" in text
    assert "the fit is exact and tests nothing" in text
    assert "$w$ = unbounded with the same ranks), no interior optimum: one bucket is best" in text
    assert "Why bucketing can fall short (tiny, fp32, 2 ranks; not measured apart)" in text  # the appendix
    assert "This falls short of the expectation" in text
    assert "NCCL ran with" not in text and "bf16 means autocast" not in text


def test_traces_without_naive_or_nccl_points_render(tmp_path, cpu_timeline):
    """A part that ran without x (no naive trace to compare, no NCCL bus bandwidth) leaves x out of the
    context, and the template, whose names are strict, asks `is defined` of it."""
    cpu = {"device": "cpu", "backend": "gloo"}
    _allreduce(tmp_path, "gloo", 2, [4096, 2**20], 3e-3, math.inf, cpu)
    for variant, bucket, mean in (("none", None, 40.0), ("naive", None, 80.0), ("flat", None, 70.0),
                                  ("overlap", None, 90.0), ("bucketed", 1.0, 85.0), ("bucketed", 10.0, 80.0),
                                  ("torch_ddp", 25.0, 65.0)):
        _step(tmp_path, "2.7B", "bf16", variant, bucket, mean, wait=(mean - 40.0) * 0.8, device="cpu", env=cpu)
    _trace(tmp_path, "overlap", None, cpu_timeline, cpu, device="cpu")
    ctx, _ = build(tmp_path, inputs(tmp_path))
    seen = as_json(ctx)
    assert "trace_verdict" not in seen and "trace_busbw_gbps" not in seen
    assert seen["trace_vs_bench"] and "trace_busbw_ranks" not in seen
    text = render(ctx, tmp_path / "report")
    assert "What the traces measure" in text and "An NCCL kernel's time is not its transfer time" not in text
    assert "Naive waits for the backward" not in text and "the traces do not separate" not in text


def test_the_section_builds_from_no_results(tmp_path):
    ctx = ddp.build([], tmp_path)
    assert ctx.env == {} and "ddp_jobs" not in as_json(ctx) and "allreduce_table" not in as_json(ctx)
    text = render(ctx, tmp_path)
    assert "No results yet for this section" in text and "the bucket overhead model" in text
    assert "Step times of every variant" not in text


def test_the_template_renders_an_empty_context(tmp_path):
    """As the report renders a section whose rule has not run: env, tables and figures only."""
    text = render({"env": {}, "tables": {}, "figures": {}}, tmp_path)
    assert "No results yet for this section" in text and "Step times of every variant" not in text
    assert "The wrappers" in text  # the code deliverables are answered with or without results


def test_section_command_writes_the_context(tmp_path):
    """`python -m cs336sys.analysis ddp` as the rule runs it, on the GPU-like grid."""
    import subprocess
    import sys

    paths = gpu_grid(tmp_path / "grid")
    out = tmp_path / "sec"
    proc = subprocess.run([sys.executable, "-m", "cs336sys.analysis", "ddp", "--results", *map(str, paths),
                           "--out", str(out)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ctx = json.loads((out / "context.json").read_text())
    assert ctx["result_counts"] == {"allreduce": 16, "ddp_step": 20, "ddp_trace": 3}
    shutil.rmtree(out)


def test_gloo_points_from_a_cpu_host_get_their_own_environment_line(tmp_path):
    """gloo needs no GPU: its points may come from a CPU-only host. The section's environment line
    then describes the GPU points, and the gloo points get a line with the host's cores."""
    sizes = [2**20, 2**30]
    _allreduce(tmp_path, "nccl", 2, sizes, 2.5e-5, 3.3e11, H200_ENV, nominal=477.0)
    cores = random.randint(2, 3)
    for world in (2, 4, 6):
        _allreduce(tmp_path, "gloo", world, sizes, 3e-4, 4e9 / world,
                   {"gpu": None, "gpus": [], "cpu": "x86_64", "cpu_count": cores, "device": "cpu"})
    ctx, _ = build(tmp_path, inputs(tmp_path))
    assert ctx.env["is_gpu"] and ctx.env["points"] == len(sizes)
    g = ctx.gloo_env
    assert g["points"] == 3 * len(sizes) and g["cores"] == [cores] and g["max_world"] == 6 and g["oversubscribed"]
    assert g["device"] == "CPU (x86_64)" and g["host_gpus"] is None
    text = render(ctx, tmp_path / "report")
    assert f"were measured on CPU (x86_64) with {cores} cores" in text and "take turns on the cores" in text


def test_gloo_points_from_the_gpu_host_name_that_host(gpu_section):
    root, ctx, _ = gpu_section
    g = ctx.gloo_env
    results = [p for p in inputs(root) if p.suffix == ".json"]
    assert g["host_gpus"] == "NVIDIA H200" and g["points"] == 3 * 4
    assert ctx.env["points"] == len(results) - g["points"]


def _host_step(root: Path, job: str, variant: str, bucket: float | None, mean: float, proxy: bool, world: int,
               size: str = "2.7B", dtype: str = "bf16"):
    name = variant + (f"-{bucket:g}MB" if bucket is not None else "")
    calls = 3 if variant == "bucket_view" else None
    metrics = {"mean_ms": mean, "std_ms": 1.0, "median_ms": mean, "step_ms": [mean - 1, mean + 1] * 2,
               "sync_wait_ms": 0.5, "grad_bytes": 6_000_000_000, "parameters": 1_500_000_000,
               "all_reduces_per_step": calls, "launched_in_backward": calls, "world_size": world}
    _write(root / "results" / "ddp_step" / job / f"{name}.json", "ddp_step",
           {"size": size, "variant": variant, "bucket_size_mb": bucket, "context_length": 512, "batch_size": 4,
            "dtype": dtype, "warmup": 2, "steps": 4, "device": "cuda", "series": "host",
            "single_rank_proxy": proxy}, metrics, H200_ENV)


def test_host_series_jobs_show_apart_and_leave_the_grids_reading_unchanged(tmp_path):
    """Issue 24's jobs (series "host", same size and dtype as a grid job): a table per job, 2 ranks and
    the single-rank proxy apart; the grid's jobs, targets and trace comparison read as without them."""
    plain, with_host = tmp_path / "plain", tmp_path / "host"
    for root in (plain, with_host):
        gpu_grid(root)
    for proxy, world in ((False, 2), (True, 1)):
        job = "host-2.7B-bf16-" + ("proxy1" if proxy else "ws2")
        for variant, bucket, mean in (("none", None, 100.0), ("bucket_view", 0.0, 150.0),
                                      ("bucket_view", 25.0, 120.0), ("torch_ddp", 25.0, 110.0)):
            _host_step(with_host, job, variant, bucket, mean, proxy, world)
    a, _ = build(plain / "s", inputs(plain))
    b, _ = build(with_host / "s", inputs(with_host))
    assert "ddp_host_jobs" not in as_json(a)
    for key in ("ddp_jobs", "ddp_targets", "trace_vs_bench", "summary"):
        assert getattr(b, key) == getattr(a, key), key
    assert [(j["size"], j["dtype"], j["proxy"], j["world_size"]) for j in b.ddp_host_jobs] == [
        ("2.7B", "bf16", False, 2), ("2.7B", "bf16", True, 1)]
    text = render(b, tmp_path / "report")
    assert "Gradients as bucket views, and single-rank proxies" in text
    assert "single-rank proxy (1 GPU)" in text and "bucket views, 0 MiB (one per tensor)" in text
    assert "| 1.091 (1.0" in text  # bucket views at 25 MiB over PyTorch DDP's, same job: 120 / 110
    assert "Gradients as bucket views" not in render(a, tmp_path / "plain_report")


def test_a_missed_target_quotes_the_bucket_views_2_rank_job_of_its_size_and_dtype(tmp_path):
    """xl fp32 misses the grid's targets; its own 2-rank host job's fastest bucket views (not the
    single-rank proxy's, which is faster still) are quoted in the paragraph and the summary's reason,
    and without that job both say the 2-GPU run has not been made."""
    plain, with_host = tmp_path / "plain", tmp_path / "host"
    for root in (plain, with_host):
        gpu_grid(root)
    for job, proxy, world, views_ms in (("host-xl-fp32-ws2", False, 2, 450.0), ("host-xl-fp32-proxy1", True, 1, 300.0)):
        for variant, bucket, mean in (("none", None, 480.0), ("overlap", None, 530.0), ("bucketed", 1000.0, 520.0),
                                      ("bucket_view", 25.0, 505.0), ("bucket_view", 1000.0, views_ms),
                                      ("torch_ddp", 25.0, 500.0)):
            _host_step(with_host, job, variant, bucket, mean, proxy, world, size="xl", dtype="fp32")
    a, _ = build(plain / "s", inputs(plain))
    b, _ = build(with_host / "s", inputs(with_host))
    missed = {(j["size"], j["dtype"]): j["missed"] for j in b.ddp_jobs if j.get("missed")}
    assert set(missed) == {("xl", "fp32")}
    v = missed["xl", "fp32"]["views"]
    assert v["bucket_mb"] == 1000.0 and v["ratio"] == pytest.approx(0.9)
    assert v["bucketed_ratio"] == pytest.approx(1.04) and v["overlap_ratio"] == pytest.approx(1.06)
    text = render(b, tmp_path / "report")
    assert "bucket views at 1000 MiB, the fastest\nof them, take 0.900× PyTorch DDP's step, our bucketed" in text
    assert "Their 2-GPU run has not been made" not in text
    assert "Their bucket-views run of as many GPUs has not been made for xl, fp32, 2 ranks." in render(
        a, tmp_path / "plain_report")


def test_nccl_without_an_nvlink_nominal_renders_n_a(tmp_path):
    """A PCIe machine: NCCL points with no NVLink nominal. The section renders and passes the lint (no
    empty cell), the nominal's columns say n/a, and NCCL is not said to run over NVLink."""
    _allreduce(tmp_path, "nccl", 2, [2**20, 10 * 2**20, 100 * 2**20, 2**30], 2.5e-5, 2e10, H200_ENV)
    _allreduce(tmp_path, "gloo", 2, [2**20, 10 * 2**20, 100 * 2**20, 2**30], 3e-4, 2e9, H200_ENV)
    _ddp_job(tmp_path, "2.7B", "bf16", 300.0, bucketed_best=306.0, overlap=318.0, torch=303.0)
    ctx, _ = build(tmp_path, inputs(tmp_path))
    assert ctx.allreduce_nominal_gbps is None
    text = render(ctx, tmp_path / "report")
    assert "NCCL over NVLink" not in text and "| n/a | n/a |" in text


@pytest.mark.parametrize("naive,flat,outcome", [
    (True, True, "beats_both"), (True, False, "beats_naive_not_flat"), (True, None, "beats_naive"),
    (None, True, "beats_flat"), (False, True, "does_not_pay"), (False, None, "does_not_pay")])
def test_what_overlapping_bought_is_decided_against_the_variants_that_ran(naive, flat, outcome):
    o = {f"faster_than_{k}": v for k, v in (("naive", naive), ("flat", flat)) if v is not None}
    assert ddp_steps.overlap_outcome(o) == outcome


def test_one_bucket_of_every_gradient_bounds_a_sweep_whose_largest_size_is_fastest():
    """Past the largest size swept lies one bucket of all gradients, flat's schedule: where flat is slower than
    the fastest (largest) size in every round, the optimum lies below one bucket; within the spread it is not
    bounded; where a larger size was slower, the sweep brackets it and flat is not consulted."""
    from cs336sys.analysis.ddp_steps import answers

    def point(variant, rounds, mb=None):
        return {"variant": variant, "mean_ms": sum(rounds) / len(rounds), "round_ms": rounds, "bucket_mb": mb}

    buckets = {f"bucketed-{mb}": point("bucketed", r, mb) for mb, r in
               ((100, [330.0, 331.0, 329.0]), (1000, [312.0, 311.0, 313.0]), (5000, [300.0, 301.0, 299.0]))}
    slower = answers(buckets | {"flat": point("flat", [315.0, 314.0, 316.0])})["buckets"]
    assert slower["best_mb"] == 5000 and not slower["brackets"]
    assert slower["one_bucket"]["slower"] and slower["one_bucket"]["lo"] == pytest.approx(314.0 / 301.0)
    within = answers(buckets | {"flat": point("flat", [315.0, 296.0, 316.0])})["buckets"]
    assert not within["one_bucket"]["slower"] and within["one_bucket"]["lo"] < 1
    buckets["bucketed-10000"] = point("bucketed", [305.0, 306.0, 304.0], 10000)
    assert "one_bucket" not in answers(buckets | {"flat": point("flat", [315.0] * 3)})["buckets"]
