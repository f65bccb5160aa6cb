"""Section: the 2026 leaderboard (problem 25) — one full training step of the 8B model on 2 GPUs,
ours against PyTorch's own parts, the FLOP floor, what each optimisation bought (the ablation), memory
per GPU and where the time goes (one profiled step per config).

Inputs: `leaderboard_step` result files (`results/leaderboard_step/<job>/<config>.json`, one per config
of each job of the grid's `leaderboard.jobs`), the folder rendered beside each (its `timeline.json`),
each job's Snakemake timing record, and from the config (`extra`): the size, context, world size,
compute dtype, the peak for MFU, the configs and the jobs, so the
floor and the plan print before any result exists.

FLOPs. `cs336sys.sizes.train_step_flops` counts attention's full seq x seq products, as the naive
implementation computes them (and as PaLM's MFU does: 6 N T with N the non-embedding parameters, plus
12 L d T^2 for attention; the result files' `flops_per_step`). The leaderboard's attention is causal,
and every implementation timed here (our FlashAttention-2, SDPA) skips the masked half, so the model
FLOPs used for the floor and MFU count half of the attention products (FlashAttention's convention):
3 x (2 x tokens x dense parameters + attention / 2), forward plus a backward of twice the forward. MFU
is given both ways (`mfu`, `mfu_palm`), against the datasheet's dense bf16 peak.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from cs336sys.analysis.common import environment_summary, read_benchmark_tsv, results_frame, save_table
from cs336sys.analysis.context import SectionContext
from cs336sys.analysis.formatting import mean_std
from cs336sys.analysis.leaderboard_judgement import (
    ablation_rows,
    ablation_table,
    entry_point,
    gap_to_baseline,
    headline_cells,
    headline_rows,
    verdict_of,
)
from cs336sys.analysis.leaderboard_kernels import (
    entry_time,
    gap_merged_share,
    kernel_gap,
    kernel_gap_table,
    kernels,
    kernels_table,
)
from cs336sys.analysis.leaderboard_proxy import offload_pairs, proxy_table
from cs336sys.analysis.leaderboard_verdicts import (
    MEMORY_MATCH,
    TARGET_NATIVE_SPEEDUP,
    TARGET_STEP_S,
    TARGET_WALL_S,
    fastest_point,
    memory_matched,
    native_points,
    public_reference,
    readme_claim,
    runner_up,
    summary_rows,
    verdicts,
    why_kernels,
    why_step,
)
from cs336sys.results import read_result
from cs336sys.sizes import get_size, train_step_flops
from cs336sys.units import GIB

VARIANT_LABEL = {"ours": "ours", "pytorch_parts": "PyTorch's parts"}
PHASES = ("forward", "backward", "sync", "optimizer_step")


@dataclass
class LeaderboardContext(SectionContext):
    world_size: int = 2
    """(25) GPUs (ranks) of the step, from the config."""
    compute_dtype: str = "bf16"
    """(25) The step's compute dtype, from the config."""
    peak_tflops: float | None = None
    """(25) One GPU's datasheet dense peak (TFLOP/s) for the floor and MFU; None on the smoke grid's CPU."""
    jobs: dict[str, list[str]] = field(default_factory=dict)
    """(25) Job -> its configs, in the config's order (`leaderboard.jobs`)."""
    flash_tuned_at: dict | None = None
    """(25) The attention shape our FlashAttention was tuned at: {"d", "seq"}."""
    configs: dict[str, str] = field(default_factory=dict)
    """(25) Config -> its settings that differ from ours' defaults, in words."""
    targets: dict[str, float] = field(default_factory=lambda: {
        "step_s": TARGET_STEP_S, "native_speedup": TARGET_NATIVE_SPEEDUP, "wall_s": TARGET_WALL_S,
        "memory_match_pct": 100 * MEMORY_MATCH})
    """(25) The targets: step seconds, speedup over the memory-matched PyTorch-native step (within
    `memory_match_pct` of the entry's peak), wall seconds of the timing run."""
    model: dict | None = None
    """(25) The model's shape and FLOPs per step (PFLOP: total, dense, causal attention; PaLM's count)."""
    floor_s: float | None = None
    """(25) The step's FLOP floor (s) at the datasheet peak; None without a peak."""
    target_mfu: float | None = None
    """(25) The share of the peak that the step target asks for."""
    proxy_layers: list[int] | None = None
    """(25) The layer counts of the one-GPU proxy's results (not leaderboard results)."""
    proxy_offload: list[dict] = field(default_factory=list)
    """(25) Each proxy config that offloads blocks, beside its twin that recomputes them (the same settings,
    `offload_blocks` 0): offloaded and checkpointed counts, both steps (s) and peaks (GiB), their ratio."""
    limitations: list[str] = field(default_factory=list)
    """(25) Lines for the report's limitations: what the step was timed on, against the leaderboard's B200s."""
    points: list[dict] | None = None
    """(25) Every step result as a row: config, status, setup, host, step, peak, TFLOP/s, MFU, phases."""
    kernels: list[dict] | None = None
    """(25) Each profiled config's kernel milliseconds by family."""
    verdict: dict | None = None
    """(25) `ours` as built against the targets, the floor and PyTorch's parts in the same job."""
    gap: dict | None = None
    """(25) Where ours loses to PyTorch's parts in the verdict's job: phases, exposed collectives, kernels."""
    fastest: dict | None = None
    """(25) The fastest config of ours with any attention, labelled by the attention it uses."""
    entry: dict | None = None
    """(25) Our entry: the fastest config with only our own kernels, against the targets and its job's baseline."""
    runner_up: dict | None = None
    """(25) The fastest config of ours with another attention than the entry's, and whether it differs from the
    entry beyond the noise (in the same job, the steps' spread; across jobs, identical configs' between-job spread)."""
    entry_time: dict | None = None
    """(25) Where our entry's step goes: kernel seconds by family, its products' rate, the recomputation's cost
    (`leaderboard_kernels.entry_time`)."""
    natives: list[dict] | None = None
    """(25) Every PyTorch-native point timed beside our entry: time, peak, the entry's time in its job."""
    native: dict | None = None
    """(25) The memory-matched PyTorch-native step: the fastest native point within the entry's peak +-10 %."""
    verdicts: dict | None = None
    """(25) Each target's one verdict (met True / False / None: not measured), for every place that says it."""
    readme_claim: str | None = None
    """(25) The README's sentence about the 8B step, from `verdicts`."""
    largest_change: dict | None = None
    """(25, ablation) The ablation row whose change saves the most time against `ours`."""
    largest_single_change: dict | None = None
    """(25, ablation) Of the rows that change one setting, the one that saves the most beyond the noise."""
    ablation_changed: list[int] = field(default_factory=list)
    """(25, ablation) How many settings the ablation's rows change, each count once, smallest first."""
    reference: dict | None = None
    """(25) The public best set against ours by the share of each GPU's peak; None without a peak."""
    not_ok: list[str] | None = None
    """(25) "job/config: status (reason)" of each point that did not run to completion."""
    job_wall_s: dict[str, float] | None = None
    """(25) Job -> its wall seconds (Snakemake's timing records)."""
    summary: list[dict] = field(default_factory=list)
    """The section's lines of the report's summary page."""


def model_flops(size: str, batch: int, context: int) -> dict[str, float]:
    """FLOPs of one training step with causal attention (see the module docstring), by part."""
    s = get_size(size)
    tokens = batch * context
    dense_params = s.num_layers * (4 * s.d_model**2 + 3 * s.d_model * s.d_ff) + s.d_model * s.vocab_size
    dense = 3 * 2 * tokens * dense_params
    attention_full = 3 * s.num_layers * 2 * 2 * batch * context**2 * s.d_model
    return {"dense": float(dense), "attention": attention_full / 2, "total": dense + attention_full / 2,
            "attention_full": float(attention_full), "dense_params": float(dense_params)}


def _describe(settings: dict, changes_only: bool = False) -> str:
    """A config's setup in words: its attention, checkpointing and gathering, and each option it turns on;
    with `changes_only`, only what differs from `ours` as built (flash, every block checkpointed, gathered
    again for the backward, no option), in short words."""
    if settings.get("variant") == "pytorch_parts":
        return "FSDP2 per block, SDPA, checkpoint every block, chunked CE, torch AdamW (fused on CUDA)"
    if settings.get("variant") == "pytorch_native":
        return _native_policy(settings)
    attention, ckpt = settings.get("attention", "flash"), settings.get("checkpoint_blocks", "all")
    reshard = settings.get("reshard_after_forward", True)
    parts = [f"attention {attention}"] if attention != "flash" or not changes_only else []
    if ckpt != "all" or not changes_only:
        parts.append("checkpoint every block" if ckpt == "all" else "no checkpointing" if ckpt in ("none", 0)
                     else f"checkpoint the first {ckpt} blocks")
    if not reshard or not changes_only:
        parts.append("gather again for the backward" if reshard else "keep gathered params")
    if settings.get("fused_elementwise"):  # short in a table's column; the configs table says it in full
        parts.append("fused elementwise" if changes_only else "fused RMSNorm, SwiGLU gate and RoPE")
    if settings.get("keep_attention"):
        parts.append("kept attention" if changes_only else "attention kept through the checkpoint")
    if settings.get("offload_blocks"):
        k = settings["offload_blocks"]
        parts.append(f"{k} offloaded" if changes_only else f"the first {k} of them offloaded to host memory instead")
    return ", ".join(parts) or "nothing"


def _native_policy(settings: dict) -> str:
    """The PyTorch-native step's checkpoint policy in words (the rest of its recipe is fixed)."""
    ckpt, matmuls = settings.get("checkpoint_blocks", "all"), settings.get("matmul_blocks", 0)
    saves = "attention saved" if settings.get("checkpoint_saves", "nothing") == "attention" else "all recomputed"
    blocks = "every block checkpointed" if ckpt == "all" else f"the first {ckpt} blocks checkpointed"
    parts = [f"{blocks} ({saves}" + (f"; the last {matmuls} also save the products" if matmuls else "") + ")"]
    if not settings.get("compile_blocks", True):
        parts.append("not compiled")
    if settings.get("reduce_dtype", "fp32") != "fp32":
        parts.append(f"{settings['reduce_dtype']} reductions")
    if settings.get("sdpa_backend", "cudnn") != "cudnn":
        parts.append(f"SDPA backend {settings['sdpa_backend']}")
    return "PyTorch-native: " + ", ".join(parts)


def _host(env: dict, world_size: int) -> dict:
    """What a step ran on, from its result's env: the GPUs ("2× H200", plural "2 H200s"), or the CPU's gloo
    processes on the smoke grid."""
    n = int(env.get("world_size") or world_size)
    gpu = env.get("gpu")
    if gpu:
        model = gpu.removeprefix("NVIDIA ").split()[0]  # "NVIDIA H100 80GB HBM3" -> "H100"
        return {"label": f"{n}\u00d7 {model}", "plural": f"{n} {model}s" if n > 1 else f"one {model}", "gpu": True}
    return {"label": f"CPU, {n} gloo processes", "plural": f"the CPU ({n} gloo processes)", "gpu": False}


def _row(job: str, name: str, r: dict, world_size: int, peak_tflops: float | None) -> tuple[dict, list[dict]]:
    """One result as a table row (and its phases): times in s, memory in GiB, model TFLOP/s and MFU."""
    st, m = r["settings"], r.get("metrics") or {}
    row = {"job": job, "name": name, "variant": st.get("variant"), "status": r["status"], "reason": r.get("reason"),
           "setup": _describe(st), "changes": _describe(st, changes_only=True),
           "with_sdpa": _describe({**st, "attention": "sdpa"}),  # the same config with SDPA's attention
           "attention": "sdpa" if st.get("variant", "ours") != "ours" else st.get("attention", "flash"),
           "host": _host(r.get("env") or {}, world_size), "size": st.get("size"),
           "context_length": st.get("context_length"), "batch_per_rank": st.get("batch_per_rank", 1),
           "checkpoint_blocks": st.get("checkpoint_blocks", "all")}
    phases = []
    row["phase_device_ms"] = {}
    if r["status"] == "ok":
        world = m.get("world_size", world_size)
        batch = world * st.get("batch_per_rank", 1)
        flops = model_flops(st["size"], batch, st["context_length"])["total"]
        palm = train_step_flops(st["size"], batch, st["context_length"])  # attention counted in full
        step_s = m["median_ms"] / 1e3
        row.update(step_s=step_s, std_s=m.get("std_ms", 0.0) / 1e3, do_bench_s=(m.get("do_bench_ms") or math.nan) / 1e3,
                   do_bench_calls=(m.get("do_bench") or {}).get("timed_calls"),
                   peak_gib=(m.get("max_peak_bytes") or math.nan) / GIB, wall_s=m.get("wall_s_to_end_of_timing"),
                   tflops_per_gpu=flops / step_s / world / 1e12,
                   mfu=flops / step_s / (world * peak_tflops * 1e12) if peak_tflops else None,
                   mfu_palm=palm / step_s / (world * peak_tflops * 1e12) if peak_tflops else None,
                   exposed_comm_ms=m.get("communication_not_overlapped_ms"))
        for phase in PHASES:
            p = (m.get("phases") or {}).get(phase)
            if p:
                row["phase_device_ms"][phase] = p.get("device_ms")
                phases.append({"job": job, "config": name, "phase": phase.replace("_", " "),
                               "device ms": p.get("device_ms"), "host ms": p.get("host_ms")})
        if m.get("communication_not_overlapped_ms") is not None:
            phases.append({"job": job, "config": name, "phase": "collectives not hidden by compute",
                           "device ms": m["communication_not_overlapped_ms"], "host ms": None})
    return row, phases


def build(paths: list[Path], out: Path, size: str | None = None, context_length: int | None = None,
          world_size: int = 2, compute_dtype: str = "bf16", peak_tflops: float | None = None,
          configs: dict | None = None, jobs: dict | None = None, flash_tuned_at: dict | None = None,
          reference: dict | None = None, **_: object) -> LeaderboardContext:
    """The section's context: the plan and the floor from the config, then from the results every point,
    ours as built and the gap to PyTorch's parts, the fastest config, our entry, the PyTorch-native points
    and the targets' verdicts, the ablation, the public reference."""
    frame = results_frame(paths)
    ctx = LeaderboardContext(env=environment_summary(frame), world_size=world_size, compute_dtype=compute_dtype,
                             peak_tflops=peak_tflops, jobs=dict(jobs or {}), flash_tuned_at=flash_tuned_at,
                             configs={name: _describe(c) for name, c in (configs or {}).items()})
    if size is not None and context_length is not None:
        _model(ctx, size, context_length, world_size, peak_tflops)
    results = _read_results(paths, ctx, out)
    if not results:
        return ctx
    hosts = {h["plural"]: h["gpu"] for h in (_host(r.get("env") or {}, world_size) for _, _, r in results)}
    ctx.limitations.append(
        f"The leaderboard runs on two B200s; ours ran on {' and '.join(hosts)}"
        + (", the only GPUs lent (compared by the share of its datasheet peak)."
           if all(hosts.values()) else ": a check of the pipeline, not a timing."))
    rows, phases = [], []
    for job, name, r in _in_job_order(results, ctx.jobs):
        row, row_phases = _row(job, name, r, world_size, peak_tflops)
        rows.append(row)
        phases += row_phases
    ctx.points = rows
    _point_tables(ctx, rows, phases, out)
    found = kernels(paths, rows)
    if found:
        ctx.kernels = found
        ctx.tables["kernels"] = kernels_table(found, out)
    _judge(ctx, rows, found, out)
    head = headline_rows(rows, ctx.verdict, ctx.entry, ctx.fastest, ctx.native)
    if head:
        ctx.tables["entry"] = save_table(pd.DataFrame(headline_cells(head)), out, "entry", digits=2,
                                         data=pd.DataFrame(head))
    _ablation_table(ctx, rows, out)
    flops = model_flops(size, world_size, context_length)["total"] if size and context_length else None
    ctx.reference = public_reference(reference, flops, world_size, peak_tflops, ctx.entry)
    ctx.not_ok = [f"{r['job']}/{r['name']}: {r['status']}" + (f" ({r['reason']})" if r["reason"] else "")
                     for r in rows if r["status"] != "ok"]
    walls = [p for p in paths if p.suffix == ".tsv"]
    if walls:
        ctx.job_wall_s = {p.stem: read_benchmark_tsv(p) for p in walls}
    ctx.summary = summary_rows(ctx.model["size"] if ctx.model else "8B", ctx.entry, ctx.fastest, ctx.natives or [],
                               ctx.verdicts, ctx.entry and why_step(rows, ctx.entry, why_kernels(ctx.gap)),
                               ctx.runner_up)
    if ctx.entry is not None and ctx.native is None:
        ctx.limitations.append(
            "The memory-matched PyTorch-native step "
            + ("waits for two GPUs (overlay `next`): no headline ratio yet." if not ctx.natives else
               f"was not found: no PyTorch-native point came within {ctx.targets['memory_match_pct']:.0f} % of "
               "the entry's peak, so the headline ratio is not given."))
    return ctx


def _model(ctx: LeaderboardContext, size: str, context_length: int, world_size: int,
           peak_tflops: float | None) -> None:
    """The model's shape and FLOPs per step (one sample per rank), and where a peak is known the FLOP
    floor of the step and the MFU the target asks for."""
    s = get_size(size)
    flops = model_flops(size, world_size, context_length)
    ctx.model = {"size": size, "context_length": context_length, "batch": world_size,
                 "d_model": s.d_model, "d_ff": s.d_ff, "layers": s.num_layers, "heads": s.num_heads,
                 "vocab": s.vocab_size,
                 "parameters_b": (flops["dense_params"] + s.vocab_size * s.d_model) / 1e9,  # + embedding
                 "flops_pf": flops["total"] / 1e15, "dense_pf": flops["dense"] / 1e15,
                 "attention_pf": flops["attention"] / 1e15,
                 "flops_palm_pf": train_step_flops(size, world_size, context_length) / 1e15}
    if peak_tflops:
        ctx.floor_s = flops["total"] / (world_size * peak_tflops * 1e12)
        ctx.target_mfu = ctx.floor_s / TARGET_STEP_S


def _read_results(paths: list[Path], ctx: LeaderboardContext, out: Path) -> list[tuple[str, str, dict]]:
    """The step results as (job, config, result) (results/leaderboard_step/<job>/<config>.json); the
    proxy's (results/leaderboard_proxy/<config>.json) go straight into their table."""
    read = [(p, read_result(p)) for p in sorted(paths) if p.suffix == ".json"]
    results = [(p.parent.name, p.stem, r) for p, r in read if r.get("problem") == "leaderboard_step"]
    proxies = [(p.stem, r) for p, r in read if r.get("problem") == "leaderboard_proxy"]
    if proxies:
        ctx.proxy_layers = sorted({r["settings"]["num_layers"] for _, r in proxies})
        proxy = proxy_table(proxies, _describe)  # the printed table names each config; its CSV also says what each runs
        ctx.tables["proxy"] = save_table(proxy.drop(columns="setup"), out, "proxy", digits=2, data=proxy)
        ctx.proxy_offload = offload_pairs(proxies)
    return results


def _in_job_order(results: list[tuple[str, str, dict]], jobs: dict) -> list[tuple[str, str, dict]]:
    """The results with the baseline's job first, then ours, each job's configs in the config's order
    (which does not survive the JSON of the rule's params)."""
    order = sorted(jobs, key=lambda j: ("pytorch_parts" not in jobs[j], "ours" not in jobs[j], j))
    return sorted(results, key=lambda t: (order.index(t[0]) if t[0] in order else len(order), t[0],
                                          jobs.get(t[0], []).index(t[1]) if t[1] in jobs.get(t[0], []) else 99))


def _point_tables(ctx: LeaderboardContext, rows: list[dict], phases: list[dict], out: Path) -> None:
    """Every point (for the appendix), the configurations and the phases of each profiled step."""
    ctx.tables["steps"] = save_table(pd.DataFrame([
        {"job": r["job"], "config": r["name"],
         "step (s)": mean_std(r["step_s"], r["std_s"], 3) if "step_s" in r else r["status"],
         "do_bench (s)": r.get("do_bench_s"), "peak (GiB/GPU)": r.get("peak_gib"),
         "MFU (%)": 100 * r["mfu"] if r.get("mfu") is not None else None,
         "PaLM's MFU (%)": 100 * r["mfu_palm"] if r.get("mfu_palm") is not None else None, "wall (s)": r.get("wall_s")}
        for r in rows]), out, "steps", digits=2)
    ctx.tables["configs"] = save_table(pd.DataFrame(
        [{"config": name, "setup": setup} for name, setup in ctx.configs.items()]), out, "configs")
    if phases:
        ctx.tables["phases"] = save_table(pd.DataFrame(phases).rename(
            columns={"device ms": "device (ms)", "host ms": "host (ms)"}), out, "phases", digits=1)


def _judge(ctx: LeaderboardContext, rows: list[dict], found: list[dict], out: Path) -> None:
    """Ours as built against PyTorch's parts with the gap between them (kernel family by family where
    both were profiled), the fastest config, our entry, the PyTorch-native points (their table) and the
    targets' verdicts; each into the context where it exists."""
    ctx.verdict = verdict = verdict_of(rows, ctx.floor_s)
    if verdict is not None:
        gap = gap_to_baseline(rows, verdict)
        if gap is not None:
            by_family = kernel_gap(found, verdict)
            if by_family is not None:
                gap["kernels"] = by_family
                gap["merged_share"] = gap_merged_share(found, verdict)
                ctx.tables["kernel_gap"] = kernel_gap_table(by_family, out)
            ctx.gap = gap
    ctx.fastest = fastest_point(rows)
    ctx.entry = entry_point(rows, ctx.floor_s)
    ctx.runner_up = runner_up(rows, ctx.entry)
    ctx.entry_time = entry_time(found, ctx.entry, rows)
    ctx.natives = native_points(rows, ctx.entry)
    ctx.native = memory_matched(ctx.natives)
    ctx.verdicts = verdicts(ctx.entry, ctx.native)
    ctx.readme_claim = readme_claim(ctx.verdicts, ctx.model["size"] if ctx.model else "8B")
    if ctx.natives:  # the printed table names each config; its CSV also says its job and policy
        native = pd.DataFrame(
            [{"config": n["config"], "job": n["job"], "policy": n["setup"].removeprefix("PyTorch-native: "),
              "step (s)": n["step_s"], "peak (GiB/GPU)": n["peak_gib"], "our entry (s)": n["entry_s"],
              "× our entry's time": n["speedup"], "matched": "yes" if n["matched"] else "no"}
             for n in ctx.natives])
        ctx.tables["native"] = save_table(native.drop(columns=["job", "policy"]), out, "native", digits=3,
                                          data=native)


def _ablation_table(ctx: LeaderboardContext, rows: list[dict], out: Path) -> None:
    """Every other config of ours against `ours` in the same job, and the largest changes among them."""
    ablation = ablation_rows(rows)
    if ablation:
        ctx.largest_change, ctx.largest_single_change, ctx.ablation_changed, ctx.tables["ablation"] = (
            ablation_table(ablation, out))
