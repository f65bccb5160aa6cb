"""Section: memory (problems 5, memory_profiling, and 6, gradient_checkpointing).

From the memory_snapshot results: peak memory per context, mode and dtype; the active-memory
timelines (re-drawn here from each point's committed summary JSON, in the report's figure style);
the largest allocations and the code that made them; the residual-stream size derived from the
config and checked against the allocation sizes seen. From saved_tensors: what one TransformerBlock
saves for its backward (top five ops), RMSNorm eager against compiled, gradient bytes per block.
From checkpointing: peak memory and step time over the group size k, against the sqrt(N)
prediction made from the measured per-block numbers; the nested schemes' costs for our N.
"""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from cs336sys.analysis.common import (
    environment_summary,
    figure,
    read_benchmark_tsv,
    results_frame,
    rises,
    save_figure,
    save_table,
)
from cs336sys.analysis.memory_context import MemoryContext
from cs336sys.analysis.memory_snapshots import from_snapshots, unit_of
from cs336sys.profiling.checkpointing import (
    bisection_cost,
    checkpoint_memory,
    optimal_group_size,
    recompute_from_input_cost,
)
from cs336sys.results import read_result
from cs336sys.sizes import parameter_count
from cs336sys.units import GIB, MIB


def _load(paths: list[Path], problem: str) -> list[dict]:
    """The results of one problem among the inputs, each with its path."""
    out = []
    for p in paths:
        if p.suffix != ".json":
            continue
        r = read_result(p)
        if r["problem"] == problem:
            r["path"] = p
            out.append(r)
    return out


def build(paths: list[Path], out: Path, **_: object) -> MemoryContext:
    """The section's context: the snapshots, the saved tensors and gradients, the checkpointing sweep,
    the machine time and the summary."""
    frame = results_frame(paths)
    ctx = MemoryContext(env=environment_summary(frame))
    timings = [p for p in paths if p.suffix == ".tsv" and p.exists()]
    if timings:
        ctx.machine_s = sum(read_benchmark_tsv(p) for p in timings)
    snapshots = _load(paths, "memory_snapshot")
    saved = _load(paths, "saved_tensors")
    sweep = _load(paths, "checkpointing")
    if snapshots:  # (d) at the context of (f)'s saved-tensor point, one the snapshot grid also runs
        from_snapshots(ctx, out, snapshots, saved[0]["settings"]["context_length"] if saved else None)
    if saved:
        _saved(ctx, out, saved)
    if snapshots and saved:
        _gradients_from_snapshot(ctx, snapshots, saved)
    if sweep:
        _checkpointing(ctx, out, sweep)
    ctx.summary = _summary(ctx)
    return ctx


def _summary(ctx: MemoryContext) -> list[dict]:
    """Page 1: what checkpointing buys at the handout's shape, and the train step's peak."""
    rows = []
    c = ctx.ckpt or {}
    if c.get("best"):
        none = c.get("none")
        without = "out of memory without it" if none and none.get("status") != "ok" else (
            f"{none['peak']:.2f} {c['unit']} without it" if none else "")
        k = c["best"]["k"]
        rows.append({"part": "Activation checkpointing, " + f"{c['size']} at context {c['context_length']}",
                     "result": f"peak {c['best']['peak']:.2f} {c['unit']} with groups of {k} "
                               f"block{'' if k == 1 else 's'}; {without}", "target": None, "met": None,
                     "ref": "mem-ckpt"})
    return rows


# --- saved tensors, gradients (problems 5f and 6) ------------------------------------------------------

def _saved(ctx: MemoryContext, out: Path, saved: list[dict]) -> None:
    ok = [r for r in saved if r["status"] == "ok"]
    if not ok:
        return
    r = max(ok, key=lambda r: (r["settings"]["dtype"] == "fp32", r["metrics"]["num_layers"],
                               r["settings"]["context_length"]))
    m = r["metrics"]
    block = m["block"]
    ctx.saved = {
        "size": r["settings"]["size"], "context_length": r["settings"]["context_length"],
        "dtype": r["settings"]["dtype"], "batch_size": m["batch_size"], "d_model": m["d_model"], "d_ff": m["d_ff"],
        "num_heads": m["num_heads"], "num_layers": m["num_layers"],
        "total_mib": block["total_bytes"] / MIB, "tensor_mib": block["tensor_bytes"] / MIB,
        "saved": block["saved"], "unique": block["unique"],
        "input_mib": block["input_bytes"] / MIB, "residual_mib": m["residual_bytes"] / MIB,
        "per_residual": block["total_bytes"] / m["residual_bytes"],
        "model_gib": block["total_bytes"] * m["num_layers"] / GIB,
        "top5_share": 100 * sum(t["share"] for t in block["top"]),
        "gradient_mib": m["gradient_bytes_per_block"] / MIB,
        "gradient_measured_mib": m["gradient_bytes_measured"] / MIB,
        "gradient_match": m["gradient_bytes_measured"] == m["gradient_bytes_per_block"],
        "gradient_blocks_equal": m["gradient_bytes_blocks_equal"],
        "parameters_per_block": m["gradient_bytes_per_block"] // 4,
    }
    # the FFN's d_ff-wide activations among the saved storages (a shared tensor counted once: bytes 0)
    wide = [t for t in block.get("tensors", []) if t["bytes"] and t["shape"] and t["shape"][-1] == m["d_ff"]]
    ctx.saved.update(ffn_wide=len(wide), ffn_wide_mib=sum(t["bytes"] for t in wide) / MIB)
    rows = [{"op (module/function)": f"`{t['op']}`", "saved (MiB)": t["bytes"] / MIB, "share (%)": 100 * t["share"],
             "tensors": t["tensors"]} for t in block["top"]]
    ctx.tables["block_top"] = save_table(pd.DataFrame(rows), out, "block_saved_top5", digits=2)

    rms = m["rmsnorm"]
    rows = []
    for variant in ("eager", "compiled"):
        v = rms.get(variant)
        if v is None:
            continue
        full = sum(1 for t in v["tensors"] if t["bytes"] and len(t["shape"]) == 3 and t["shape"][-1] == m["d_model"])
        rows.append({"RMSNorm": variant, "tensors saved": v["saved"], "storages": v["unique"],
                     "full-size storages": full, "saved (MiB)": v["total_bytes"] / MIB})
    ctx.tables["rmsnorm"] = save_table(pd.DataFrame(rows), out, "rmsnorm_saved", digits=2)
    ctx.rmsnorm = {"eager_mib": rms["eager"]["total_bytes"] / MIB,
                      "compiled_mib": rms["compiled"]["total_bytes"] / MIB if rms.get("compiled") else None,
                      "skipped": rms.get("compiled_skipped")}
    if rms.get("compiled"):
        ctx.rmsnorm["ratio"] = rms["eager"]["total_bytes"] / rms["compiled"]["total_bytes"]


def _gradients_from_snapshot(ctx: MemoryContext, snapshots: list[dict], saved: list[dict]) -> None:
    """Problem 5f's arithmetic on a train-step snapshot at the saved-tensor point's shape: memory
    added by the forward (saved for backward), dropped by the backward (saved freed, gradients
    made), and what the gradients must then be."""
    s = ctx.saved
    if s is None:
        return
    match = [r for r in snapshots if r["status"] == "ok" and r["settings"]["mode"] == "train_step"
             and r["settings"]["size"] == s["size"] and r["settings"]["context_length"] == s["context_length"]
             and r["settings"]["dtype"] == s["dtype"] and r["metrics"].get("phase_end_bytes")]
    if not match:
        return
    m = match[0]["metrics"]
    levels = m["phase_end_bytes"]
    if not {"start", "forward", "backward"} <= set(levels):
        return
    n = m["num_layers"]
    forward_added = levels["forward"] - levels["start"]
    backward_drop = levels["forward"] - levels["backward"]
    gradients_total = levels["backward"] - levels["start"]
    block_saved = s["total_mib"] * MIB
    ctx.snapshot_gradients = {
        "forward_added_gib": forward_added / GIB, "backward_drop_gib": backward_drop / GIB,
        "gradients_total_gib": gradients_total / GIB, "parameters_gib": 4 * m["parameters"] / GIB,
        "per_block_change_mib": backward_drop / n / MIB,
        "gradient_per_block_mib": (block_saved - backward_drop / n) / MIB,
        "saved_blocks_gib": n * block_saved / GIB,
    }


# --- checkpointing (problem 6) -------------------------------------------------------------------------

def predicted_peak(n: int, k: int, block: float, boundary: float, baseline: float, gradients: float) -> float:
    """Weights and optimizer state, plus M(k) (cs336sys.profiling.checkpointing), plus, with
    checkpointing, every gradient: the first group is recomputed last, when nearly all gradients
    exist. Without checkpointing the peak is at the end of the forward, before any gradient."""
    return baseline + checkpoint_memory(n, k, block, boundary) + (gradients if k else 0)



def _prediction_against_measured(sweep: list[dict], n: int, block: float, boundary: float, base: float,
                                 grads: float, scale: float, capacity: float | None) -> dict:
    """How far the predicted peak (first point's allocator baseline, as the table) is from each measured one,
    and with each point's own baseline; whether the baseline rises with k; the points out of memory that the
    prediction puts below the GPU's memory, even with the largest baseline measured; the step times."""
    ok = sorted((r for r in sweep if r["status"] == "ok" and r["settings"]["checkpoint_blocks"]),
                key=lambda r: r["settings"]["checkpoint_blocks"])
    if not ok:
        return {}
    gap, own = [], []
    for r in ok:
        k, m = r["settings"]["checkpoint_blocks"], r["metrics"]
        gap.append((m["peak_memory_bytes"] - predicted_peak(n, k, block, boundary, base, grads)) / scale)
        own.append((m["peak_memory_bytes"] - predicted_peak(n, k, block, boundary, m["baseline_bytes"], grads)) / scale)
    bases = [r["metrics"]["baseline_bytes"] for r in ok]
    steps = [r["metrics"]["step_ms"]["mean_ms"] for r in ok]
    largest = max(bases)
    missed = [{"k": r["settings"]["checkpoint_blocks"],
               "predicted": predicted_peak(n, r["settings"]["checkpoint_blocks"], block, boundary, base, grads) / scale,
               "predicted_largest": predicted_peak(n, r["settings"]["checkpoint_blocks"], block, boundary, largest,
                                                   grads) / scale}
              for r in sweep if r["status"] == "oom" and capacity]
    return {"ks": [r["settings"]["checkpoint_blocks"] for r in ok], "gap": gap, "own_gap": own,
            "gap_grows": rises(gap),
            "above": all(g > 0 for g in gap + own),
            "baseline_rises": rises(bases),
            "largest_baseline_k": ok[bases.index(largest)]["settings"]["checkpoint_blocks"],
            "capacity": capacity / scale if capacity else None,
            "oom_predicted_to_fit": [p for p in missed if p["predicted_largest"] * scale < capacity],
            "steps": [min(steps), max(steps)], "steps_rise": rises(steps)}


def _point_of(r: dict, scale: float) -> dict:
    """A checkpointing point as the template reads it: k, status, peak (in the section's unit), step."""
    peak = r["metrics"].get("peak_memory_bytes") if r["status"] == "ok" else None
    return {"k": r["settings"]["checkpoint_blocks"], "status": r["status"],
            "peak": None if peak is None else peak / scale,
            "step_ms": r["metrics"]["step_ms"]["mean_ms"] if r["status"] == "ok" else None}

def _checkpointing(ctx: MemoryContext, out: Path, sweep: list[dict]) -> None:
    sweep = sorted(sweep, key=lambda r: r["settings"]["checkpoint_blocks"])
    ok = [r for r in sweep if r["status"] == "ok"]
    first = sweep[0]["settings"]
    info = {"size": first["size"], "context_length": first["context_length"], "dtype": first["dtype"],
            "batch_size": first["batch_size"], "group_sizes": [r["settings"]["checkpoint_blocks"] for r in sweep],
            "oom": [r["settings"]["checkpoint_blocks"] for r in sweep if r["status"] == "oom"]}
    ctx.ckpt = info
    if not ok:
        return
    m0 = ok[0]["metrics"]
    n, block, boundary = m0["num_layers"], m0["block_saved_bytes"], m0["boundary_bytes"]
    base, grads = m0["baseline_bytes"] or 0, m0["gradient_bytes"]
    unit, scale = unit_of(max(r["metrics"]["peak_memory_bytes"] or 0 for r in ok))
    prediction = optimal_group_size(n, block, boundary)
    info.update(num_layers=n, block_mib=block / MIB, boundary_mib=boundary / MIB, unit=unit,
                baseline=base / scale, gradients=grads / scale, peak_source=m0["peak_source"],
                block_over_boundary=block / boundary,
                k_continuous=prediction["k_continuous"], best_k_predicted=prediction["best_k"],
                best_predicted=prediction["best_bytes"] / scale, sqrt_law=prediction["sqrt_law_bytes"] / scale,
                no_checkpoint=prediction["no_checkpoint_bytes"] / scale)
    # What the allocator held before the timed steps: the fp32 weights and AdamW's two moments (12 bytes a
    # parameter), and whatever the warm-up step left allocated; each point is its own process, so this differs.
    bases = [r["metrics"]["baseline_bytes"] for r in ok if r["metrics"].get("baseline_bytes")]
    info.update(state=12 * parameter_count(first["size"]) / scale,
                baseline_range=[min(bases) / scale, max(bases) / scale] if bases else None)
    capacity = next((r["env"].get("gpu_memory_bytes") for r in sweep if r.get("env", {}).get("gpu_memory_bytes")),
                    None)
    info["fit"] = _prediction_against_measured(sweep, n, block, boundary, base, grads, scale, capacity)

    rows, data = [], []
    for r in sweep:
        k = r["settings"]["checkpoint_blocks"]
        peak = r["metrics"].get("peak_memory_bytes") if r["status"] == "ok" else None
        step = r["metrics"]["step_ms"]["mean_ms"] if r["status"] == "ok" else None
        row = {"k": "none" if k == 0 else k, "groups": str(math.ceil(n / k)) if k else "", "status": r["status"],
               f"peak ({unit})": None if peak is None else peak / scale,
               f"predicted peak ({unit})": predicted_peak(n, k, block, boundary, base, grads) / scale,
               f"predicted M(k) ({unit})": checkpoint_memory(n, k, block, boundary) / scale}
        data.append({**row, "step (ms)": step})
        rows.append({**row, "step (ms)": "" if step is None else f"{step:,.0f}"})  # whole ms, as the prose
    ctx.tables["checkpointing"] = save_table(pd.DataFrame(rows), out, "checkpointing_sweep", digits=2,
                                             data=pd.DataFrame(data))

    by_k = {r["settings"]["checkpoint_blocks"]: r for r in sweep}
    measured = [(k, r["metrics"]["peak_memory_bytes"]) for k, r in by_k.items()
                if k > 0 and r["status"] == "ok" and r["metrics"]["peak_memory_bytes"]]
    if measured:
        best_k, best_peak = min(measured, key=lambda t: (t[1], t[0]))
        # neighbours among the group sizes; no checkpointing (k = 0, one group of all blocks) is reported apart
        ks = sorted(k for k in info["group_sizes"] if k > 0)

        def point(j: int) -> dict | None:
            return _point_of(by_k[ks[j]], scale) if 0 <= j < len(ks) else None

        i = ks.index(best_k)
        info.update(best=point(i), smaller=point(i - 1), larger=point(i + 1),
                    matches_prediction=best_k == prediction["best_k"],
                    none=_point_of(by_k[0], scale) if 0 in by_k else None)
        _checkpointing_figure(ctx, out, sweep, n, block, boundary, base, grads, unit, scale)

    recompute, bisection = recompute_from_input_cost(n), bisection_cost(n)
    info["nested"] = {  # activations in the section's unit (GiB on a GPU): four significant digits at most
        "recompute_forwards": recompute["block_forwards"], "recompute": (boundary + block) / scale,
        "bisection_forwards": bisection["block_forwards"], "bisection_boundaries": bisection["peak_boundaries"],
        "bisection": (bisection["peak_boundaries"] * boundary + block) / scale,
        "plain_forwards": n, "one_level_forwards": 2 * n, "no_checkpoint": n * block / scale,
    }


def _checkpointing_figure(ctx: MemoryContext, out: Path, sweep: list[dict], n: int, block: float, boundary: float,
                          base: float, grads: float, unit: str, scale: int) -> None:
    fig, (ax, ax_t) = figure(2.9, 1, 2)
    ks = list(range(1, n + 1))
    ax.plot(ks, [predicted_peak(n, k, block, boundary, base, grads) / scale for k in ks], color="#8C8C8C",
            label="predicted")
    ran = [r for r in sweep if r["status"] == "ok" and r["settings"]["checkpoint_blocks"]]
    ax.plot([r["settings"]["checkpoint_blocks"] for r in ran], [r["metrics"]["peak_memory_bytes"] / scale for r in ran],
            "o", color="#4C72B0", label="measured")
    failed = [r["settings"]["checkpoint_blocks"] for r in sweep if r["status"] != "ok" and r["settings"]
              ["checkpoint_blocks"]]
    if failed:  # out of memory: a marker at the GPU's capacity, which they needed more than
        capacity = next((r["env"].get("gpu_memory_bytes") for r in sweep if r.get("env", {}).get("gpu_memory_bytes")),
                        None)
        if capacity:
            ax.axhline(capacity / scale, color="#C44E52", lw=0.8, ls=":")
            ax.plot(failed, [capacity / scale] * len(failed), "x", color="#C44E52",
                    label=f"out of memory (over {capacity / scale:.0f} {unit})")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("blocks per group k")
    ax.set_ylabel(f"peak memory ({unit})")
    ax.legend()
    timed = [r for r in sweep if r["status"] == "ok"]
    ax_t.plot([r["settings"]["checkpoint_blocks"] or 0.5 for r in timed],
              [r["metrics"]["step_ms"]["mean_ms"] for r in timed], "o-", color="#55A868")
    ax_t.set_xscale("log", base=2)
    ax_t.set_xlabel("blocks per group k (none at ½)")
    ax_t.set_ylabel("train step (ms)")
    ctx.figures["checkpointing"] = save_figure(fig, out, "checkpointing_sweep")
