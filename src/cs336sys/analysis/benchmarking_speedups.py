"""The benchmarking section's comparisons of one point against another: bf16 autocast against fp32
(benchmarking_mixed_precision c), the wall time against the GPU's busy time (which points wait on the
host), and the compiled model against eager (torch_compile b). Each sets its fields of the context."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from cs336sys.analysis.benchmarking_runs import MODE_LABEL
from cs336sys.analysis.common import figure, gpu_model, rises, save_figure, save_table, sort_rows

if TYPE_CHECKING:
    from cs336sys.analysis.benchmarking_context import BenchmarkingContext

HOST_BOUND_BUSY = 0.8  # a step whose kernels fill less of its wall time than this waits on the host


def busy(ctx: BenchmarkingContext, ok: pd.DataFrame, out: Path) -> None:
    """Wall time beside the GPU's busy time (the union of its kernels per step, from a profiled pass)
    for the eager points: where the GPU idles, the wall time is the host's."""
    if ok.empty or "gpu_busy_median_ms" not in ok or ok["gpu_busy_median_ms"].isna().all():
        return
    e = ok[(ok["compile"] == "eager") & ok["gpu_busy_median_ms"].notna()].copy()
    e["busy_pct"] = 100 * e.gpu_busy_median_ms / e.median_ms
    host = sort_rows(e[e.busy_pct < 100 * HOST_BOUND_BUSY], "size", "context_length", "mode", "dtype")
    c = max(ctx.context_lengths)
    at = e[e.context_length == c]
    wide = at.pivot_table(index=["size", "mode"], columns="dtype", values=["median_ms", "gpu_busy_median_ms"])
    wide.columns = [f"{dtype} {'wall' if what == 'median_ms' else 'GPU busy'} (ms)" for what, dtype in wide.columns]
    wide = wide.reset_index()
    order = [f"{d} {w} (ms)" for d in ("fp32", "bf16") for w in ("wall", "GPU busy") if f"{d} {w} (ms)" in wide]
    if {"fp32 GPU busy (ms)", "bf16 GPU busy (ms)"} <= set(wide.columns):
        wide["bf16 speed-up, GPU busy (×)"] = wide["fp32 GPU busy (ms)"] / wide["bf16 GPU busy (ms)"]
        order.append("bf16 speed-up, GPU busy (×)")
    wide = sort_rows(wide, "size", "mode")
    wide = wide[["size", "mode", *order]].assign(mode=wide["mode"].map(MODE_LABEL))
    every = host[["size", "context_length", "mode", "dtype", "median_ms", "gpu_busy_median_ms", "busy_pct"]].rename(
        columns={"context_length": "context", "median_ms": "wall (ms)", "gpu_busy_median_ms": "GPU busy (ms)",
                 "busy_pct": "busy (%)"})
    ctx.tables_busy = save_table(wide, out, "gpu_busy")
    ctx.busy_context = c
    ctx.host_bound_busy_pct = 100 * HOST_BOUND_BUSY
    ctx.host_bound = [f"{r['size']} {MODE_LABEL[r['mode']]} {r['dtype']} ctx {r['context_length']}"
                      for _, r in host.iterrows()]
    ctx.busy_pct_range = [float(e.busy_pct.min()), float(e.busy_pct.max())]
    if not every.empty:
        ctx.tables_host_bound = save_table(every.assign(mode=every["mode"].map(MODE_LABEL)), out, "host_bound",
                                           digits=1)
    if "bf16 speed-up, GPU busy (×)" in wide:
        train = wide[wide["mode"] == MODE_LABEL["train_step"]].dropna(subset=["bf16 speed-up, GPU busy (×)"])
        ctx.bf16_busy_train_speedup = {r["size"]: float(r["bf16 speed-up, GPU busy (×)"])
                                       for _, r in train.iterrows()}
    bf16_train = at[(at["mode"] == "train_step") & (at["dtype"] == "bf16")]
    ctx.bf16_trend = {
        "busy_rises": rises(list((ctx.bf16_busy_train_speedup or {}).values())),
        "wall_rises": rises(list((ctx.bf16_train_speedup or {}).values())),
        "host_bound_train": [r["size"] for _, r in sort_rows(bf16_train, "size").iterrows()
                             if r.busy_pct < 100 * HOST_BOUND_BUSY],
        "slower_host_bound": _slower_host_bound(e)}


def _slower_host_bound(e: pd.DataFrame) -> int:
    """How many eager bf16 points slower than their fp32 twin (mean times, as the bf16 table) are host-bound."""
    keys = ["size", "context_length", "mode"]
    pair = e[e["dtype"] == "bf16"].merge(e[e["dtype"] == "fp32"][keys + ["mean_ms"]], on=keys, suffixes=("", "_fp32"))
    slower = pair[pair.mean_ms_fp32 < pair.mean_ms]
    return int((slower.busy_pct < 100 * HOST_BOUND_BUSY).sum())


def precision_speedups(ctx: BenchmarkingContext, ok: pd.DataFrame, out: Path) -> None:
    """benchmarking_mixed_precision (c): fp32 time over bf16-autocast time of every eager point, a compact
    table and a figure at the longest context, the train step's speed-up per size, the points bf16 slows."""
    e = ok[ok["compile"] == "eager"] if not ok.empty else ok
    if e.empty or not {"fp32", "bf16"} <= set(e["dtype"]):
        return
    wide = e.pivot_table(index=["size", "context_length", "mode"], columns="dtype", values="mean_ms").reset_index()
    wide = wide.dropna(subset=["fp32", "bf16"])
    wide["speedup"] = wide.fp32 / wide.bf16
    wide = sort_rows(wide, "size", "context_length", "mode")
    wide.columns.name = None
    table = wide[["size", "context_length", "mode", "fp32", "bf16", "speedup"]].rename(columns={
        "context_length": "context", "fp32": "fp32 (ms)", "bf16": "bf16 autocast (ms)", "speedup": "speed-up (×)"})
    ctx.tables_bf16 = save_table(table.assign(mode=table["mode"].map(MODE_LABEL)), out, "bf16_speedup")
    c = max(ctx.context_lengths)
    compact = wide[wide.context_length == c].pivot_table(index="size", columns="mode", values="speedup").reset_index()
    compact.columns.name = None
    compact = sort_rows(compact, "size").rename(columns={m: f"{v} (×)" for m, v in MODE_LABEL.items()})
    ctx.tables_bf16_compact = save_table(compact, out, "bf16_speedup_compact")
    at = wide[(wide.context_length == c) & (wide["mode"] == "train_step")]
    fig, ax = figure(2.8)
    sizes = [s for s in ctx.sizes if s in set(wide["size"])]
    width = 0.8 / 3
    for i, mode in enumerate(MODE_LABEL):
        sel = wide[(wide.context_length == c) & (wide["mode"] == mode)].set_index("size").reindex(sizes)
        ax.bar([x + (i - 1) * width for x in range(len(sizes))], sel.speedup, width, label=MODE_LABEL[mode])
    ax.axhline(1, color="grey", lw=0.8)
    ax.set_xticks(range(len(sizes)), sizes)
    ax.set_xlabel("model size")
    ax.set_ylabel("fp32 time / bf16 autocast time (×)")
    ax.set_title(f"bf16 autocast speed-up, context {c}")
    ax.grid(axis="x", visible=False)
    ax.legend(ncol=3)
    ctx.figure_bf16 = save_figure(fig, out, "bf16_speedup")
    ctx.bf16_train_speedup = {r["size"]: float(r.speedup) for _, r in at.iterrows()}
    ctx.bf16_slower = sorted({f"{r['size']} {MODE_LABEL[r['mode']]} (context {r['context_length']})"
                              for _, r in wide[wide.speedup < 1].iterrows()})
    ctx.bf16_context_length = c


def compile_speedups(ctx: BenchmarkingContext, ok: pd.DataFrame, bench: pd.DataFrame, out: Path) -> None:
    """torch_compile (b): eager time over compiled time of every pair of points, a compact table per size,
    a figure, and the speed-up's range, over all and per way of compiling."""
    compiled_modes = set(bench["compile"]) - {"eager"} if not bench.empty else set()
    if ok.empty or not compiled_modes:
        return
    keys = ["size", "context_length", "mode", "dtype"]  # and "gpu", the model a point ran on ("": none)
    comp = ok[ok["compile"] != "eager"]
    eager = ok[ok["compile"] == "eager"]
    # a ratio only between points of one GPU model: a compiled point whose eager twin ran elsewhere is named
    busy = "gpu_busy_median_ms" if "gpu_busy_median_ms" in ok else None
    times = ["mean_ms", *([busy] if busy else [])]
    stamps = ["env.timestamp"] if "env.timestamp" in comp and "env.timestamp" in eager else []
    both = comp[keys + times + stamps + ["compile", "gpu"]].merge(eager[keys + times + stamps + ["gpu"]], on=keys,
                                                                  suffixes=("_compiled", "_eager"))
    apart = both[both.gpu_compiled != both.gpu_eager]
    ctx.cross_gpu = [f"`{c}` ({len(g)} points) ran on the {gpu_model(a)}, eager on the {gpu_model(b)}"
                     for (c, a, b), g in apart.groupby(["compile", "gpu_compiled", "gpu_eager"])]
    merged = both[both.gpu_compiled == both.gpu_eager].drop(columns=["gpu_compiled", "gpu_eager"])
    if merged.empty:
        return
    ctx.compile_days_apart = _days_apart(merged) if stamps else None
    merged["speedup"] = merged.mean_ms_eager / merged.mean_ms_compiled
    merged = sort_rows(merged, *keys, "compile")
    # every pair's times; a pair across GPU models has its GPUs and no ratio
    every = sort_rows(both.assign(speedup=both.mean_ms_eager / both.mean_ms_compiled), *keys, "compile")
    every.loc[every.gpu_compiled != every.gpu_eager, "speedup"] = float("nan")
    columns = keys + ["compile", "mean_ms_eager", "mean_ms_compiled", "speedup"]
    if not apart.empty:
        every["gpus"] = [gpu_model(e) if e == c else f"{gpu_model(e)} / {gpu_model(c)}"
                         for e, c in zip(every.gpu_eager, every.gpu_compiled, strict=True)]
        columns.append("gpus")
    table = every[columns].rename(columns={
        "context_length": "context", "compile": "compiled", "mean_ms_eager": "eager (ms)",
        "mean_ms_compiled": "compiled (ms)", "speedup": "speed-up (×)", "gpus": "GPU (eager / compiled)"})
    ctx.tables_compile = save_table(table.assign(mode=table["mode"].map(MODE_LABEL)), out, "compile_speedup")
    compact = merged.assign(what=merged["mode"].map(MODE_LABEL) + ", " + merged["dtype"]
                            + (", " + merged["compile"] if len(compiled_modes) > 1 else "") + " (×)").pivot_table(
        index="size", columns="what", values="speedup").reset_index()
    compact.columns.name = None
    ctx.tables_compile_compact = save_table(sort_rows(compact, "size"), out, "compile_speedup_compact")
    fig, ax = figure(3.0)
    for (mode, dtype, method), g in merged.groupby(["mode", "dtype", "compile"]):
        g = sort_rows(g, "size")
        ax.plot(g["size"], g.speedup, marker="o" if method == "blocks" else "s",
                ls="-" if method == "blocks" else "--", label=f"{MODE_LABEL[mode]}, {dtype}, {method}")
    ax.axhline(1, color="grey", lw=0.8)
    ax.set_xlabel("model size")
    ax.set_ylabel("eager time / compiled time (×)")
    ax.set_title("torch.compile speed-up")
    fig.legend(loc="outside right upper")
    ctx.figure_compile = save_figure(fig, out, "compile_speedup")
    ctx.compile_method = sorted(compiled_modes)
    ctx.compile_speedup_range = [float(merged.speedup.min()), float(merged.speedup.max())]
    ctx.compile_speedup_by_method = {m: [float(g.speedup.min()), float(g.speedup.max())]
                                     for m, g in merged.groupby("compile")}
    if busy:
        kernels = merged.dropna(subset=[f"{busy}_eager", f"{busy}_compiled"])
        kernels = kernels.assign(busy_speedup=kernels[f"{busy}_eager"] / kernels[f"{busy}_compiled"])
        ctx.compile_busy_by_method = {m: {d: [float(h.busy_speedup.min()), float(h.busy_speedup.max())]
                                          for d, h in g.groupby("dtype")}
                                      for m, g in kernels.groupby("compile")} or None
        by_dtype = {d: g.busy_speedup for d, g in kernels.groupby("dtype")}
        bf16 = sort_rows(kernels[kernels["dtype"] == "bf16"].groupby("size", as_index=False).busy_speedup.max(), "size")
        ctx.compile_busy_trend = {
            "bf16_above_fp32": bool({"bf16", "fp32"} <= set(by_dtype)
                                    and by_dtype["bf16"].min() > by_dtype["fp32"].max()),
            "falls_with_size": rises([-x for x in bf16.busy_speedup])}


def _days_apart(pairs: pd.DataFrame) -> dict | None:
    """Each way of compiling runs in a job of its own, so every ratio sets two jobs' points against each other:
    {"pairs", "of", "days"} counts the pairs (of one GPU model, with `env.timestamp_compiled` and `_eager`) whose
    two points ran on different days, with the days those points ran on, or None where no pair records its times."""
    pairs = pairs.dropna(subset=["env.timestamp_compiled", "env.timestamp_eager"])
    if pairs.empty:
        return None
    day_c, day_e = pairs["env.timestamp_compiled"].str[:10], pairs["env.timestamp_eager"].str[:10]
    apart = day_c != day_e
    return {"pairs": int(apart.sum()), "of": len(pairs), "days": sorted(set(day_e[apart]) | set(day_c[apart]))}
