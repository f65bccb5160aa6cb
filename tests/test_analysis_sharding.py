"""The sharding section (problems 21-24): built and rendered from real CPU results (the three sharding
experiments run by the job runner on two gloo ranks, as the smoke grid runs them), from a GPU-like grid of
synthetic results (allocator readings, failed points, a CUDA timeline), and from no results."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cs336sys.accounting import memory
from cs336sys.analysis import sharding
from cs336sys.analysis.context import as_json
from cs336sys.profiling.timeline import save_summary, summarize_timeline
from cs336sys.report import render_markdown
from cs336sys.results import read_result, write_json_atomic, write_result

TEMPLATES = Path(__file__).parent.parent / "writeup" / "templates"
SRC = Path(__file__).parents[1] / "src"
FUNCTIONS = "cs336sys.distributed.sharding_experiments"
H200_ENV = {"gpu": "NVIDIA H200", "gpus": [{"index": 0, "name": "NVIDIA H200"}] * 2, "device": "cuda",
            "cuda": "12.8", "driver": "570.00", "gpu_count": 2, "backend": "nccl", "world_size": 2}


# --- helpers ----------------------------------------------------------------------------------------------

def inputs(root: Path) -> list[Path]:
    """What the section rule gives: result files, the trace's rendered folder, the timing records."""
    results = [p for p in sorted((root / "results").rglob("*.json")) if p.name not in ("timeline.json", "index.json")]
    folders = sorted(p for p in (root / "results" / "fsdp_trace").glob("*") if p.is_dir())
    return results + folders + sorted((root / "benchmarks").rglob("*.tsv"))


def build(root: Path, paths: list[Path]) -> tuple[sharding.ShardingContext, Path]:
    out = root / "sections" / "sharding"
    out.mkdir(parents=True)
    return sharding.build(paths, out), out


def render(ctx: sharding.ShardingContext | dict, tmp: Path) -> str:
    section = tmp / "sections" / "sharding"
    section.mkdir(parents=True, exist_ok=True)
    (section / "context.json").write_text(json.dumps(as_json(ctx) | {"result_counts": {}}))
    text = render_markdown([section], TEMPLATES, tmp / "writeup" / "report.md")
    return text[text.index(" Optimizer state sharding and FSDP\n"):]


def table_widths(text: str) -> list[int]:
    return [len(line.strip().strip("|").split("|")) for line in text.splitlines() if line.startswith("|")]


def all_tables(ctx: sharding.ShardingContext) -> list[str]:
    return [t for group in (ctx.opt, ctx.fsdp) for info in group or [] for t in info["tables"].values()]


def timing(root: Path, stem: str, seconds: float) -> None:
    path = root / "benchmarks" / f"{stem}.tsv"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"s\th:m:s\tmax_rss\n{seconds}\t0:00:{int(seconds) % 60:02d}\t100.0\n")


# --- real results on the CPU --------------------------------------------------------------------------------

def run_job(root: Path, experiment: str, function: str, points: list[dict], outputs: list[str],
            rendered: bool = False) -> None:
    """One job through the job runner, on two gloo ranks, as the smoke grid runs it."""
    env = {**os.environ, "PYTHONPATH": str(SRC), "CS336SYS_PG_TIMEOUT_S": "60"}
    cmd = [sys.executable, "-m", "cs336sys.run", experiment, "--function", f"{FUNCTIONS}:{function}",
           "--points", json.dumps(points), "--outputs", *outputs, "--nproc", "2"] + (["--rendered"] if rendered else [])
    proc = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]


@pytest.fixture(scope="module")
def cpu_grid(tmp_path_factory) -> Path:
    """The smoke grid's three sharding jobs on the tiny model: memory by variant, FSDP against FSDP2 at
    fp32 and bf16 compute, one profiled FSDP step."""
    root = tmp_path_factory.mktemp("cpu")
    shape = {"size": "tiny", "context_length": 16, "batch_size": 2, "device": "cpu"}
    variants = ("unsharded", "sharded", "zero")
    run_job(root, "sharding_memory", "run_sharding_memory_point",
            [{**shape, "variant": v, "warmup": 1, "steps": 2} for v in variants],
            [f"results/sharding_memory/tiny/{v}.json" for v in variants])
    fsdp = [(v, d) for d in ("fp32", "bf16") for v in ("ours", "fsdp2")]
    run_job(root, "fsdp_step", "run_fsdp_step_point",
            [{**shape, "variant": v, "compute_dtype": d, "warmup": 1, "steps": 2} for v, d in fsdp],
            [f"results/fsdp_step/tiny/{v}-{d}.json" for v, d in fsdp])
    run_job(root, "fsdp_trace", "run_fsdp_trace_point",
            [{**shape, "variant": "ours", "compute_dtype": "fp32", "warmup": 1}],
            ["results/fsdp_trace/ours-fp32.json"], rendered=True)
    for stem, seconds in (("sharding_memory/tiny", 7.0), ("fsdp_step/tiny", 9.0), ("fsdp_trace", 8.0)):
        timing(root, stem, seconds)
    return root


@pytest.fixture(scope="module")
def cpu_section(cpu_grid):
    ctx, out = build(cpu_grid, inputs(cpu_grid))
    return ctx, out


def test_cpu_memory_is_what_the_accounting_predicts(cpu_section):
    ctx, _ = cpu_section
    assert ctx.unit["name"] == "MiB" and not ctx.env["is_gpu"]
    [o] = ctx.opt
    assert o["world"] == 2 and not o["allocator"] and o["tensors_match"]
    un, sh, zero = (o["variants"][v] for v in ("unsharded", "sharded", "zero"))
    params = sharding.predict(memory.parameter_bytes("ddp"), "tiny", 2) / 2**20
    assert un["params"] == pytest.approx(params) and un["grads"] == pytest.approx(params)
    assert un["state"] == pytest.approx(2 * params)  # AdamW's two moments of every parameter
    for v in (sh, zero):  # each rank keeps about half of them
        assert sum(r["state"] for r in v["ranks"]) == pytest.approx(un["state"], rel=1e-3)
        assert abs(v["worst_ratio"] - 1) < 0.01 and v["state_max_over_min"] < 1.05
    assert o["communication"]["ours_over_ddp"] == pytest.approx(1.5)
    assert all(t["ok"] for t in ctx.targets if t["target"] == "model_state")


def test_cpu_tables_leave_out_the_allocator_and_have_no_empty_values(cpu_section):
    ctx, out = cpu_section
    [o] = ctx.opt
    assert set(o["tables"]) == {"breakdown", "prediction", "time"}  # no allocator table on the CPU
    breakdown = o["tables"]["breakdown"]
    assert "tensors (MiB)" in breakdown and "peak (MiB)" not in breakdown and "allocated" not in breakdown
    assert breakdown.count("\n") == 2 + 9  # three variants at three points
    assert "| ours (sharded) | after step |" in breakdown
    [f] = ctx.fsdp
    assert set(f["dtypes"]) == {"fp32", "bf16"} and f["tensors_match"]
    assert "peak (MiB)" not in f["tables"]["time_memory"] and "saving (MiB)" not in f["tables"]["savings"]
    for table in all_tables(ctx):
        assert "n/a" not in table and max(table_widths(table)) <= 9
    assert (out / "sharding_breakdown_tiny_ws2.csv").is_file() and (out / "fsdp_step_tiny_ws2.md").is_file()


def test_cpu_trace_finds_the_gathers(cpu_section):
    ctx, out = cpu_section
    t = ctx.trace
    assert t["size"] == "tiny" and not t["on_device"] and (out / t["figure"]).stat().st_size > 10_000
    x = t["exposure"]
    assert x["gathers"]["count"] > 0 and x["gathers"]["total_us"] > 0
    assert x["gathers"]["exposed_us"] + x["gathers"]["hidden_us"] == pytest.approx(x["gathers"]["total_us"])
    phases = x["phases"]
    assert set(phases) == {"forward", "backward"} and phases["forward"]["gathers"]["events"] > 1
    assert ctx.machine_time["jobs"] == 3 and ctx.machine_time["device_s"] == pytest.approx(2 * 24.0)


def test_the_section_renders_from_cpu_results(cpu_section, tmp_path):
    ctx, _ = cpu_section
    text = render(ctx, tmp_path)
    assert "CPU numbers from the smoke grid" in text and "No results yet" not in text
    for heading in ("optimizer_state_sharding_accounting (a)", "optimizer_state_sharding_accounting (b)",
                    "optimizer_state_sharding_accounting (c)", "fsdp: fully sharded", "fsdp_accounting (a)",
                    "fsdp_accounting (b)"):
        assert heading in text
    assert "on the CPU only the tensor sums are shown" in text and "as the accounting below expects" in text
    assert "sections/sharding/fsdp_timeline.png)" in text
    assert "| tiny | 2 | bf16 |" in text  # FSDP's target is judged in its table of steps, per unit
    # the environment line says "driver n/a" on the CPU
    body = text[text.index("optimizer_state_sharding: the sharded optimizer"):]
    assert "n/a" not in body and max(table_widths(text)) <= 9
    assert r"12 P \left(N - 1\right) / N" in text  # ours sends half as much again as ZeRO's paper


# --- a GPU-like grid of synthetic results -------------------------------------------------------------------

def write(path: Path, problem: str, settings: dict, metrics: dict, status: str = "ok", env: dict = H200_ENV):
    write_result(path, problem, settings, metrics, status=status, reason=None if status == "ok" else status)
    r = read_result(path)
    r["env"].update(env)
    write_json_atomic(path, r)


def predicted(term: str, strategy: str, size: str) -> int:
    return sharding.predict(getattr(memory, f"{term}_bytes")(strategy), size, 2)


def sharding_point(root: Path, size: str, variant: str, mean: float, acts: float, status: str = "ok") -> dict:
    """Rank 0 holds exactly the predicted tensors; rank 1 a little more state (whole tensors); the
    backward's peak is `acts` bytes above the parameters and gradients, the step's 1 GB above its tensors."""
    strategy = sharding.STRATEGY[variant]
    params, grads, state = (predicted(t, strategy, size) for t in ("parameter", "gradient", "optimizer_state"))
    readings = {"after_init_allocated_bytes": params, "after_init_peak_bytes": params,
                "before_step_allocated_bytes": params + grads, "before_step_peak_bytes": params + grads + acts,
                "after_step_allocated_bytes": params + grads + state,
                "after_step_peak_bytes": params + grads + state + 1e9}
    held = {"param_bytes": params, "grad_bytes": grads, "optimizer_state_bytes": state}
    more = state * (1.01 if strategy == "zero1" else 1)
    ranks = [{**readings, **held, "mean_ms": mean},
             {**readings, **held, "optimizer_state_bytes": more, "mean_ms": mean}]
    metrics = {} if status != "ok" else {
        "mean_ms": mean, "std_ms": 2.0, "median_ms": mean, "step_ms": [mean - 2, mean + 2], **readings, **held,
        "ranks": ranks, "parameters": params // 4, "world_size": 2}
    write(root / "results" / "sharding_memory" / size / f"{variant}.json", "sharding_memory",
          {"size": size, "variant": variant, "context_length": 512, "batch_size": 4, "dtype": "fp32", "warmup": 2,
           "steps": 6, "device": "cuda"}, metrics, status)
    return readings


def fsdp_point(root: Path, size: str, variant: str, dtype: str, mean: float, peak: float, status: str = "ok",
               **extra):
    """A point as the committed results are (no unit setting), or with `extra` settings (unit, proxy)."""
    params, state = predicted("parameter", "fsdp", size), predicted("optimizer_state", "fsdp", size)
    world = 1 if extra.get("single_rank_proxy") else 2
    metrics = {} if status != "ok" else {
        "mean_ms": mean, "std_ms": 3.0, "median_ms": mean, "step_ms": [mean - 3, mean + 3],
        "after_init_allocated_bytes": params, "peak_bytes": peak, "sharded_param_bytes": params,
        "optimizer_state_bytes": state, "parameters": predicted("parameter", "ddp", size) // 4, "world_size": world,
        "ranks": [{"mean_ms": mean, "peak_bytes": peak, "sharded_param_bytes": params,
                   "optimizer_state_bytes": state}] * world}
    if variant == "ours" and extra:
        metrics["fsdp_units"] = {"layer": 98, "block": 50}[extra["unit"]]
    stem = "-".join([("proxy-" if extra.get("single_rank_proxy") else "") + variant, dtype]
                    + ([str(extra["unit"])] if "unit" in extra else []))
    write(root / "results" / "fsdp_step" / size / f"{stem}.json", "fsdp_step",
          {"size": size, "variant": variant, "compute_dtype": dtype, "context_length": 512, "batch_size": 4,
           "warmup": 2, "steps": 6, "device": "cuda", **extra}, metrics, status)


def _kernel(name: str, corr: int, stream: int, launch: float, start: float, dur: float) -> list[dict]:
    return [{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": launch,
             "dur": 0.5, "args": {"correlation": corr}},
            {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": stream, "ts": start, "dur": dur,
             "args": {"correlation": corr, "stream": stream, "device": 0}}]


def synthetic_fsdp_trace(late: bool) -> dict:
    """One step: a forward of four gemms (100 us apart), each layer's NCCL all-gather on its own stream,
    the first issued as the forward starts. On time, gathers 2-4 run under the previous gemm; late, each
    ends after the previous gemm and its gemm starts just after it ends. A backward of four gemms with
    gathers under them, then the optimizer."""
    r = lambda name, ts, dur: {"ph": "X", "cat": "user_annotation", "name": name, "pid": 1, "tid": 1, "ts": ts,
                               "dur": dur, "args": {}}
    events = [r("step", 0.0, 2000.0), r("forward", 0.5, 99.0), r("backward", 100.0, 200.0),
              r("optimizer_step", 300.0, 100.0)]
    gather, gemm = "ncclDevKernel_AllGather_RING_LL", "sm90_xmma_gemm_f32f32"
    corr, start = 0, 23.0
    events += _kernel(gather, 1000, 13, 1.0, 2.0, 20.0)
    for i in range(4):
        if i:
            if late:
                g0 = start - 10.0  # issued as the previous gemm ends, finishes 40 us after it
                events += _kernel(gather, 1000 + i, 13, 2.0 + i, g0, 50.0)
                start = g0 + 52.0
            else:
                events += _kernel(gather, 1000 + i, 13, 2.0 + i, start - 75.0, 30.0)
        corr += 1
        events += _kernel(gemm, corr, 7, 10.0 + i, start, 80.0)
        start += 81.0
    bwd = start + 5.0
    for i in range(4):
        corr += 1
        events += _kernel(gemm, corr, 7, 110.0 + i, bwd + 100 * i, 95.0)
        events += _kernel(gather, 2000 + i, 13, 120.0 + i, bwd + 100 * i + 10, 40.0)
    events += _kernel("multi_tensor_apply_kernel<adam>", 3000, 7, 301.0, bwd + 420.0, 30.0)
    return {"traceEvents": events}


def gpu_grid(root: Path) -> list[Path]:
    """xl: every variant, the sharded optimizer's target met and FSDP's at bf16 missed; 2.7B: the
    ZeroRedundancyOptimizer point and FSDP2 at bf16 out of memory; a trace whose gathers are on time."""
    base = sharding_point(root, "xl", "unsharded", 1000.0, acts=40e9)  # the backward's peak is the highest
    sharding_point(root, "xl", "sharded", 1020.0, acts=40e9)
    sharding_point(root, "xl", "zero", 1000.0, acts=40e9)
    # FSDP's saving is measured from the unsharded run's steady-state peak: the first step's forward and
    # backward peak plus the optimizer state a later step holds through them
    unsharded_peak = base["before_step_peak_bytes"] + predicted("optimizer_state", "ddp", "xl")
    for dtype, ours, theirs in (("fp32", 900.0, 700.0), ("bf16", 690.0, 600.0)):
        fsdp_point(root, "xl", "ours", dtype, ours, unsharded_peak - 12e9)
        fsdp_point(root, "xl", "fsdp2", dtype, theirs, unsharded_peak - 13e9)
    sharding_point(root, "2.7B", "unsharded", 1500.0, acts=9e9)  # the step's peak is the highest
    sharding_point(root, "2.7B", "sharded", 1480.0, acts=9e9)
    sharding_point(root, "2.7B", "zero", 0.0, acts=9e9, status="oom")
    fsdp_point(root, "2.7B", "ours", "bf16", 950.0, 40e9)
    fsdp_point(root, "2.7B", "fsdp2", "bf16", 0.0, 0.0, status="oom")
    summary = summarize_timeline(synthetic_fsdp_trace(late=False))
    write(root / "results" / "fsdp_trace" / "ours-bf16.json", "fsdp_trace",
          {"size": "2.7B", "variant": "ours", "compute_dtype": "bf16", "context_length": 512, "batch_size": 4,
           "warmup": 2, "device": "cuda"},
          {"totals": summary["totals"], "window_us": summary["window"]["dur_us"], "tool": summary["tool"]})
    (root / "results" / "fsdp_trace" / "ours-bf16").mkdir()
    save_summary(summary, root / "results" / "fsdp_trace" / "ours-bf16" / "timeline.json")
    for stem, seconds in (("sharding_memory/xl", 120.0), ("sharding_memory/2.7B", 150.0), ("fsdp_step/xl", 90.0),
                          ("fsdp_step/2.7B", 100.0), ("fsdp_trace", 60.0)):
        timing(root, stem, seconds)
    return inputs(root)


@pytest.fixture(scope="module")
def gpu_section(tmp_path_factory):
    root = tmp_path_factory.mktemp("gpu")
    ctx, out = build(root, gpu_grid(root))
    return root, ctx, out


def test_gpu_memory_breakdown_and_saving(gpu_section):
    _, ctx, _ = gpu_section
    assert ctx.unit["name"] == "GiB" and ctx.env["is_gpu"]
    assert [o["size"] for o in ctx.opt] == ["xl", "2.7B"]  # registry order
    xl = ctx.opt[0]
    assert xl["allocator"] and xl["tensors_match"]
    breakdown = xl["tables"]["breakdown"]
    assert "allocated (GiB)" in breakdown and "peak − tensors (GiB)" in breakdown
    un, sh = xl["variants"]["unsharded"], xl["variants"]["sharded"]
    assert un["other"]["before step"] == pytest.approx(40e9 / 2**30)  # the activations planted above the tensors
    assert un["other"]["after step"] == pytest.approx(1e9 / 2**30)
    expected = (predicted("optimizer_state", "ddp", "xl") - predicted("optimizer_state", "zero1", "xl")) / 2**30
    assert xl["saving"]["expected"] == pytest.approx(expected)
    # steady state: a later step's backward holds the state, so sharding it lowers that peak by the state saved
    assert xl["saving"]["sharded"]["peak"] == pytest.approx(expected)
    assert un["overall_peak"] == pytest.approx(un["peak"]["before step"] + un["state"])
    big = ctx.opt[1]["saving"]
    assert big["sharded"]["peak"] == pytest.approx(big["expected"])
    assert big["sharded"]["peak_over_expected"] == pytest.approx(1.0)
    assert sh["state_max_over_min"] == pytest.approx(1.01)
    assert sh["worst_ratio"] == pytest.approx(1 + 0.01 * sh["state"] / sh["predicted"]["total"])
    for table in all_tables(ctx):
        assert max(table_widths(table)) <= 9


def test_gpu_targets_meet_miss_and_are_not_measured(gpu_section):
    _, ctx, _ = gpu_section
    by = {(t["target"], t["size"]): t for t in ctx.targets if t["target"] != "model_state"}
    assert by["sharded_vs_zero", "xl"]["value"] == pytest.approx(1.02) and by["sharded_vs_zero", "xl"]["ok"]
    assert by["sharded_vs_zero", "2.7B"]["status"] == "not measured"  # ZeroRedundancyOptimizer ran out
    assert by["fsdp_vs_fsdp2_bf16", "xl"]["value"] == pytest.approx(690 / 600)
    assert by["fsdp_vs_fsdp2_bf16", "xl"]["status"] == "missed"
    assert by["fsdp_vs_fsdp2_bf16", "2.7B"]["status"] == "not measured"
    xl = ctx.fsdp[0]
    assert xl["dtypes"]["fp32"]["ours_vs_fsdp2"] == pytest.approx(900 / 700)
    assert xl["baseline"]["source"] == "measured"
    saving = {(s["variant"], s["dtype"]): s["saving"] for s in xl["measured_savings"]}
    assert saving["ours, per layer", "bf16"] == pytest.approx(12e9 / 2**30)
    assert saving["FSDP2", "fp32"] == pytest.approx(13e9 / 2**30)
    # the parameters' and AdamW state's share of the model state FSDP saves: 12 of its 16 bytes a parameter
    pred = xl["predicted"]
    assert pred["params_state_share"] == pytest.approx(0.75)
    assert pred["params_state_saving"] == pytest.approx(0.75 * pred["model_state_saving"])
    # the planted peak is 40 GB above the parameters and gradients, far above the accounting's activations:
    # it does not fit a peak without gradients, and the text does not say it does
    fit = ctx.opt[0]["forward_peak_fit"]
    assert fit["residual"] == pytest.approx(fit["peak"] - fit["params"] - fit["activations"])
    assert fit["no_gradients"] is False


@pytest.fixture(scope="module")
def units_section(tmp_path_factory):
    """xl at bf16: ours per layer (a committed point, no unit setting), ours per block, FSDP2; and
    the single-rank proxy per layer and per block."""
    root = tmp_path_factory.mktemp("units")
    fsdp_point(root, "xl", "ours", "bf16", 690.0, 30e9)
    fsdp_point(root, "xl", "fsdp2", "bf16", 600.0, 29e9)
    fsdp_point(root, "xl", "ours", "bf16", 630.0, 29e9, unit="block")
    fsdp_point(root, "xl", "ours", "bf16", 800.0, 40e9, unit="layer", single_rank_proxy=True)
    fsdp_point(root, "xl", "ours", "bf16", 700.0, 40e9, unit="block", single_rank_proxy=True)
    return build(root, inputs(root))


def test_block_units_beside_per_layer_and_the_proxy_apart(units_section, tmp_path):
    ctx, _ = units_section
    [xl] = ctx.fsdp
    assert xl["world"] == 2, "the proxy's points are not part of the two-rank comparison"
    per = xl["dtypes"]["bf16"]
    assert list(per["variants"]) == ["ours", "ours-block", "fsdp2"]
    assert per["ours_vs_fsdp2"] == pytest.approx(690 / 600)
    assert per["units_vs_fsdp2"] == {"block units": pytest.approx(630 / 600)}
    assert "| bf16 | ours, block units | 630.00 |" in xl["tables"]["time_memory"]
    layer, block = [t for t in ctx.targets if t["target"] == "fsdp_vs_fsdp2_bf16"]  # the default first
    assert layer["unit"] == "layer" and layer["value"] == pytest.approx(690 / 600) and "the default" in layer["what"]
    assert block["unit"] == "block units" and block["value"] == pytest.approx(630 / 600)
    assert "block units" in block["what"] and block["gathers"] == 50
    assert layer["gathers"] is None  # a point as committed before the count was recorded
    table = ctx.fsdp_proxy["table"]
    assert "| xl | bf16 | layer | 98 | 800.00 |" in table and "| xl | bf16 | block | 50 | 700.00 |" in table
    text = render(ctx, tmp_path)
    assert "| xl | 2 | bf16 | 600.0 | 1.150 (1.1" in text and "| 1.050 (1.0" in text  # per layer, per block
    assert "A proxy on one rank." in text and "not a distributed result" in text


def test_the_proxy_runs_on_one_cpu_rank():
    """The single-rank proxy point, run as a one-GPU job runs it (no process group), on the CPU."""
    from cs336sys.distributed.sharding_experiments import FSDPSettings, run_fsdp_step_point
    from cs336sys.jobs import Run

    settings = FSDPSettings(size="tiny", variant="ours", compute_dtype="fp32", unit="block", single_rank_proxy=True,
                            context_length=16, batch_size=2, warmup=1, steps=2, device="cpu")
    r = run_fsdp_step_point(settings, Run(device="cpu"))
    assert r["world_size"] == 1 and r["fsdp_units"] == 2 + 2 and len(r["step_ms"]) == 2  # tiny: 2 blocks


def test_failed_points_show_their_status(gpu_section):
    _, ctx, _ = gpu_section
    big = ctx.opt[1]
    assert big["statuses"] == {"zero": "oom"}
    assert "| torch ZeRO | oom |" in big["tables"]["time"]
    assert "torch ZeRO" not in big["tables"]["breakdown"]
    assert "÷ torch ZeRO" not in big["tables"]["time"]  # a column of nothing is left out
    fsdp = ctx.fsdp[1]
    assert "| bf16 | FSDP2 | oom |" in fsdp["tables"]["time_memory"]
    assert fsdp["dtypes"]["bf16"]["ours_vs_fsdp2"] is None


def test_gathers_on_time_and_late():
    on_time = sharding.gather_exposure(summarize_timeline(synthetic_fsdp_trace(late=False)))
    fw = on_time["phases"]["forward"]["gathers"]
    assert fw["events"] == 4 and fw["waited"] == 1 and fw["waited_after_first"] == 0
    assert on_time["first_forward_exposed_us"] == pytest.approx(20.0)
    assert fw["exposed_us"] == pytest.approx(20.0)  # only the first, which nothing runs before
    assert on_time["phases"]["backward"]["gathers"]["exposed_us"] == pytest.approx(0.0)
    late = sharding.gather_exposure(summarize_timeline(synthetic_fsdp_trace(late=True)))
    fw = late["phases"]["forward"]["gathers"]
    assert fw["waited_after_first"] == 3 and fw["exposed_us"] == pytest.approx(20.0 + 3 * 41.0)


def test_the_section_renders_from_gpu_results(gpu_section, tmp_path):
    _, ctx, out = gpu_section
    text = render(ctx, tmp_path)
    assert "CPU numbers" not in text and "No results yet" not in text
    assert "on the CPU only the tensor sums" not in text
    assert "the steady-state peak unsharded and with our sharded" in text
    assert "zero: `oom`" in text and "No ratio: one of the two did not run." in text
    assert "**Yes**: after the first, no layer of the forward waited" in text
    assert "not measured" in text and "✓" in text and "✗" in text
    assert "of the expected)" in text and (out / ctx.trace["figure"]).is_file()
    assert "With bf16 compute ours per layer is slower than FSDP2 in every round of every job" in text
    assert "fall short because" not in text and "the highest point moves" not in text  # no cause unmeasured
    assert "Across the jobs the fp32 variants save" in text and "no gradient is alive" not in text
    assert "n/a" not in text and max(table_widths(text)) <= 9


def test_the_section_reads_cleanly_as_a_pdf(gpu_section, tmp_path):
    """Through pandoc and typst, read back like the real report: tables fit, text (formulas included) at
    least 8 pt, and the timeline figure at the text width with its text at least 8 pt."""
    pytest.importorskip("pypdf")
    import test_pdf_layout as layout

    from cs336sys import report
    from cs336sys.analysis import common

    root, _, _ = gpu_section
    figures: dict = {}

    def spy(fig, out_dir, name):
        figures[name] = (fig.get_size_inches()[0], layout.drawn_text(fig))
        return common.save_figure(fig, out_dir, name)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(sharding.timeline, "save_figure", spy)
        ctx, _ = build(tmp_path, inputs(root))
    [(width, texts)] = figures.values()
    assert width == pytest.approx(report.TEXT_WIDTH_CM / 2.54, rel=0.01)
    assert min(size for _, size in texts) >= layout.MIN_TEXT_PT
    render(ctx, tmp_path)
    pdf = tmp_path / "writeup" / "report.pdf"
    report.render_pdf(tmp_path / "writeup" / "report.md", pdf)
    read = layout.read_layout(pdf)
    assert len(read.tables) >= 10
    assert layout.layout_problems(read, report.MARGIN_X_CM / 2.54 * 72) == []


def test_a_late_trace_answers_no(tmp_path):
    summary = summarize_timeline(synthetic_fsdp_trace(late=True))
    write(tmp_path / "results" / "fsdp_trace" / "ours-bf16.json", "fsdp_trace",
          {"size": "xl", "variant": "ours", "compute_dtype": "bf16", "context_length": 512, "batch_size": 4,
           "warmup": 2, "device": "cuda"},
          {"totals": summary["totals"], "window_us": summary["window"]["dur_us"], "tool": summary["tool"]})
    (tmp_path / "results" / "fsdp_trace" / "ours-bf16").mkdir()
    save_summary(summary, tmp_path / "results" / "fsdp_trace" / "ours-bf16" / "timeline.json")
    ctx, _ = build(tmp_path, inputs(tmp_path))
    assert "opt" not in as_json(ctx) and "fsdp" not in as_json(ctx)
    assert "**No**: after the first, 3 of the forward's 3 gathers" in render(ctx, tmp_path)


def test_a_failed_trace_says_so(tmp_path):
    write(tmp_path / "results" / "fsdp_trace" / "ours-bf16.json", "fsdp_trace",
          {"size": "2.7B", "variant": "ours", "compute_dtype": "bf16", "device": "cuda"}, {}, status="oom")
    ctx, _ = build(tmp_path, inputs(tmp_path))
    assert ctx.trace == {"status": "oom"}
    assert "The profiled step did not run: `oom`." in render(ctx, tmp_path)


# --- no results -----------------------------------------------------------------------------------------------

def test_the_section_builds_from_no_results(tmp_path):
    ctx = sharding.build([], tmp_path)
    assert ctx.env == {} and not {"opt", "fsdp", "trace", "targets"} & set(as_json(ctx))
    text = render(ctx, tmp_path)
    assert "No results yet for this section" in text and "the steady-state peak" not in text
    assert "ShardedOptimizer(params, optimizer_cls, **kwargs)" in text


def test_the_template_renders_an_empty_context(tmp_path):
    """As the report renders a section whose rule has not run: env, tables and figures only."""
    text = render({"env": {}, "tables": {}, "figures": {}}, tmp_path)
    assert "No results yet for this section" in text and "the steady-state peak" not in text


def test_device_seconds_count_each_jobs_own_ranks(tmp_path):
    """A 4-rank, a 2-rank and a one-rank proxy job of one experiment, the 2-rank job's name a prefix of the
    others: each job's wall time is multiplied by its own ranks, not by the experiment's largest (which once
    counted the proxy as 4 GPUs)."""
    import pandas as pd

    header = "s\th:m:s\tmax_rss\tmax_vms\tmax_uss\tmax_pss\tio_in\tio_out\tmean_load\tcpu_time\n"
    walls = {"xl-ws4": 10.0, "xl": 20.0, "xl-proxy": 40.0}  # "xl" (2 ranks) is a prefix of the others
    tsvs = []
    for job, wall in walls.items():
        tsv = tmp_path / "benchmarks" / "fsdp_step" / f"{job}.tsv"
        tsv.parent.mkdir(parents=True, exist_ok=True)
        tsv.write_text(header + f"{wall}\t0:00:10\t1\t1\t1\t1\t0\t0\t1\t1\n")
        tsvs.append(tsv)
    frame = pd.DataFrame({"problem": ["fsdp_step"] * 3,
                          "path": [f"results/fsdp_step/{j}/ours.json" for j in walls],
                          "env.world_size": [4, 2, None]})
    t = sharding._machine_time(tsvs, frame)
    e = t["experiments"]["fsdp_step"]
    assert e["jobs"] == 3 and e["wall_s"] == pytest.approx(70.0)
    assert e["device_s"] == pytest.approx(4 * 10 + 2 * 20 + 1 * 40) and t["device_s"] == e["device_s"]
