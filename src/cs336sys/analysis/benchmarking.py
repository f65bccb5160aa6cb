"""Section: benchmarking (problem 1), bf16 autocast timings (4c), compiled model (8b), MFU, and
the pipeline's own overhead."""

from __future__ import annotations

import statistics
from pathlib import Path

import pandas as pd

from cs336sys.analysis.benchmarking_runs import MODE_LABEL, overhead, warmup
from cs336sys.analysis.common import (
    environment_summary,
    figure,
    log_axis,
    results_frame,
    save_csv,
    save_figure,
    save_table,
    size_key,
    sort_rows,
)
from cs336sys.analysis.formatting import mean_std
from cs336sys.analysis.optimized_step import optimized_step, summary_rows

HOST_BOUND_BUSY = 0.8  # a step whose kernels fill less of its wall time than this waits on the host


def _cell(row) -> str:
    if row["status"] != "ok":
        return row["status"]
    return mean_std(row["mean_ms"], row["std_ms"])


def _pivot_cells(df: pd.DataFrame, index: list[str], column: str) -> pd.DataFrame:
    df = df.assign(cell=df.apply(_cell, axis=1))
    wide = df.pivot_table(index=index, columns=column, values="cell", aggfunc="first").reset_index()
    wide.columns.name = None
    return sort_rows(wide, *index)


def build(paths: list[Path], out: Path, **_: object) -> dict:
    """The section's context: every point, the timing tables, the bf16 and compiled speed-ups, host-bound
    points, MFU, the spread, the cold start, the pipeline's overhead and the optimized step."""
    frame = results_frame(paths)
    if "context_length" in frame:
        frame["context_length"] = frame["context_length"].astype("Int64")
    bench = frame[frame.problem == "benchmarking"].copy()
    warm = frame[frame.problem == "warmup"].copy()
    peak = frame[frame.problem == "matmul_peak"].copy()
    ctx: dict = {"env": environment_summary(frame), "tables": {}, "figures": {}}
    peaks = {r["dtype"]: r["tflops"] for _, r in peak.iterrows() if r["status"] == "ok"}
    ctx["peak_tflops"] = peaks

    ok = bench[bench.status == "ok"].copy()
    if not ok.empty:
        ok["peak_tflops"] = ok["dtype"].map(peaks)
        ok["mfu_pct"] = 100 * ok.achieved_tflops / ok.peak_tflops
        ok["peak_memory_gib"] = ok.peak_memory_bytes / 2**30

    _all_points(bench, ok, out, ctx)
    _grid(bench, ok, ctx)
    eager = bench[bench["compile"] == "eager"] if not bench.empty else bench
    _timing_tables(eager, out, ctx)
    # 4(c): fp32 vs bf16 autocast.
    ctx.update(_precision_speedups(ok, out, ctx))
    # wall time against the GPU's busy time: which points wait on the host
    ctx.update(_busy(ok, out, ctx))
    # 8(b): eager vs compiled.
    ctx.update(_compile_speedups(ok, bench, out, ctx))
    _mfu(ok, out, ctx)
    _spread(ok, bench, ctx)
    ctx.update(warmup(warm, out))
    ctx.update(overhead(paths, bench, warm, out))
    ctx.update(optimized_step(frame, peaks, out))  # nothing without the series' results
    if not ok.empty:
        ctx["figures"]["times"] = _times_figure(ok, out)
    ctx["summary"] = _summary(ctx)
    ctx["limitations"] = _limitations(ctx)
    return ctx


def _all_points(bench: pd.DataFrame, ok: pd.DataFrame, out: Path, ctx: dict) -> None:
    """All points, numeric: 13 columns, too wide to print, so a CSV file that the report links, and
    a printed summary per size and context length."""
    cols = ["size", "context_length", "mode", "dtype", "compile", "status", "mean_ms", "std_ms", "median_ms",
            "min_ms", "achieved_tflops", "mfu_pct", "peak_memory_gib"]
    full = bench[["size", "context_length", "mode", "dtype", "compile", "status"]].join(
        ok[[c for c in cols[6:] if c in ok]]) if not bench.empty else pd.DataFrame(columns=cols)
    full = sort_rows(full, "size", "context_length", "mode", "dtype", "compile")
    ctx["tables"]["all_points_csv"] = save_csv(full, out, "all_points")
    if not full.empty:
        ctx["tables"]["points_summary"] = save_table(_points_summary(full), out, "points_summary", digits=1)


def _grid(bench: pd.DataFrame, ok: pd.DataFrame, ctx: dict) -> None:
    """The protocol as the result files record it, and the context lengths and sizes of the grid."""
    if not ok.empty:
        ctx["protocol"] = {"warmup": sorted({int(v) for v in bench["warmup"]}),
                           "steps": sorted({int(v) for v in bench["steps"]}),
                           "batch": sorted({int(v) for v in ok.get("metric_batch_size", pd.Series()).dropna()})}
    eager = bench[bench["compile"] == "eager"] if not bench.empty else bench
    ctx["context_lengths"] = sorted(int(c) for c in eager.context_length.unique()) if not eager.empty else []
    ctx["sizes"] = sorted(bench["size"].unique(), key=lambda s: size_key(pd.Series([s]))[0]) \
        if not bench.empty else []


def _timing_tables(eager: pd.DataFrame, out: Path, ctx: dict) -> None:
    """1(b): mean ± std per size and mode, fp32 eager, one table per context length; the backward's time
    against the forward's at the longest context."""
    ctx["tables"]["timing"] = {}
    for c in ctx["context_lengths"]:
        sel = eager[(eager["dtype"] == "fp32") & (eager.context_length == c)]
        wide = _pivot_cells(sel, ["size"], "mode")
        cells, alone = _backward_cells(sel, wide["size"])
        ctx["backward_timed_alone"] = ctx.get("backward_timed_alone", True) and alone
        wide.insert(wide.columns.get_loc("forward_backward") + 1 if "forward_backward" in wide else len(wide.columns),
                    "backward", cells)
        wide = wide.rename(columns={**{m: f"{v} (ms)" for m, v in MODE_LABEL.items()},
                                    "backward": "backward (ms, timed alone)" if alone else "backward (ms, difference)"})
        ctx["tables"]["timing"][str(c)] = save_table(wide, out, f"timing_fp32_ctx{c}")  # JSON keys are strings
    if ctx["context_lengths"]:
        c = ctx["timing_context_main"] = max(ctx["context_lengths"])
        means = eager[(eager["dtype"] == "fp32") & (eager.context_length == c) & (eager.status == "ok")].pivot_table(
            index="size", columns="mode", values="mean_ms")
        if {"forward", "forward_backward"} <= set(means.columns):
            ratio = ((means.forward_backward - means.forward) / means.forward).dropna()
            if not ratio.empty:
                ctx["backward_ratio"] = [float(ratio.min()), float(ratio.max())]


def _mfu(ok: pd.DataFrame, out: Path, ctx: dict) -> None:
    """MFU for every train-step row, a compact table at the longest context, the best point."""
    train = ok[ok["mode"] == "train_step"] if not ok.empty else ok
    if not train.empty:
        mfu = sort_rows(train[["size", "context_length", "dtype", "compile", "median_ms", "achieved_tflops",
                             "peak_tflops", "mfu_pct"]], "size", "context_length", "dtype", "compile")
        mfu = mfu.rename(columns={"context_length": "context", "median_ms": "median (ms)", "achieved_tflops": "TFLOP/s",
                                  "peak_tflops": "ceiling (TFLOP/s)", "mfu_pct": "MFU (%)"})
        ctx["tables"]["mfu"] = save_table(mfu, out, "mfu", digits=1)
        c = int(train.context_length.max())
        at = train[train.context_length == c].assign(what=lambda d: d["dtype"] + ", " + d["compile"] + " (%)")
        compact = at.pivot_table(index="size", columns="what", values="mfu_pct").reset_index()
        compact.columns.name = None
        ctx["tables"]["mfu_compact"] = save_table(sort_rows(compact, "size"), out, "mfu_compact", digits=1)
        ctx["mfu_context"] = c
        best = train.loc[train.mfu_pct.idxmax()]
        ctx["best_mfu"] = {"pct": float(best.mfu_pct), "size": best["size"], "dtype": best["dtype"],
                           "compile": best["compile"], "context_length": int(best.context_length)}


def _spread(ok: pd.DataFrame, bench: pd.DataFrame, ctx: dict) -> None:
    """The timings' coefficient of variation (median and worst point) and the points out of memory."""
    if not ok.empty:
        cv = 100 * ok.std_ms / ok.mean_ms
        worst = ok.loc[cv.idxmax()]
        ctx["cv"] = {"median_pct": float(cv.median()), "max_pct": float(cv.max()),
                     "max_what": f"{worst['size']} {MODE_LABEL[worst['mode']]} {worst['dtype']} {worst['compile']}"}
    ctx["oom_points"] = [f"{r['size']} {MODE_LABEL[r['mode']]} {r['dtype']} {r['compile']} ctx {r['context_length']}"
                         for _, r in bench[bench.status == "oom"].iterrows()]


def _limitations(ctx: dict) -> list[str]:
    """What the wall times cannot say where the host, not the GPU, sets them."""
    limitations = []
    if ctx.get("host_bound"):
        limitations.append(
            f"{len(ctx['host_bound'])} eager points keep the GPU busy less than {HOST_BOUND_BUSY:.0%} of their wall "
            "time: their wall times measure the host (Python and kernel launches), so their trends across sizes, "
            "contexts and dtypes are the CPU's; the GPU-busy times beside them give the GPU's.")
    elif ctx.get("bf16_slower"):
        limitations.append(
            f"{len(ctx['bf16_slower'])} of the eager bf16 points are slower than fp32: at these sizes and contexts the "
            "step time is the host's (Python and kernel launches), not the GPU's, so these wall times say little "
            "about the GPU.")
    return limitations


def _summary(ctx: dict) -> list[dict]:
    rows = []
    if "best_mfu" in ctx:
        b = ctx["best_mfu"]
        rows.append({"part": "Best MFU of a train step", "result": f"{b['pct']:.1f} % ({b['size']}, {b['dtype']}, "
                     f"{b['compile']}, context {b['context_length']})", "target": None, "met": None,
                     "ref": "bench-mfu"})
    if ctx.get("bf16_train_speedup"):
        size, speedup = list(ctx["bf16_train_speedup"].items())[-1]
        rows.append({"part": "bf16 autocast against fp32", "result": f"{speedup:.2f}× faster train step ({size}, "
                     f"context {ctx['bf16_context_length']})", "target": None, "met": None, "ref": "bench-bf16"})
    if ctx.get("compile_speedup_range"):
        low, high = ctx["compile_speedup_range"]
        said = f"{low:.2f}×" if f"{low:.2f}" == f"{high:.2f}" else f"{low:.2f}× to {high:.2f}×"
        rows.append({"part": "torch.compile against eager", "result": f"{said} faster",
                     "target": None, "met": None, "ref": "bench-compile"})
    return rows + summary_rows(ctx.get("optimized", {}))


def _backward_cells(sel: pd.DataFrame, sizes: pd.Series) -> tuple[list[str], bool]:
    """Backward time per step: timed alone (a synchronisation around each phase) where the result
    files have it, else forward+backward less forward, means of two separately timed modes, so their
    standard deviations add. Returns the cells and whether every one was timed alone."""
    cells, alone = [], True
    for size in sizes:
        by = {r["mode"]: r for _, r in sel[sel["size"] == size].iterrows()}
        f, fb = by.get("forward"), by.get("forward_backward")
        if fb is not None and fb["status"] == "ok" and isinstance(fb.get("phase_ms"), dict):
            t = fb["phase_ms"]["backward"]
            cells.append(mean_std(statistics.fmean(t), statistics.stdev(t) if len(t) > 1 else 0.0))
            continue
        if f is None or fb is None or f["status"] != "ok" or fb["status"] != "ok":
            cells.append(fb["status"] if fb is not None and fb["status"] != "ok" else "")
            continue
        alone = False
        cells.append(mean_std(fb["mean_ms"] - f["mean_ms"], fb["std_ms"] + f["std_ms"]))
    return cells, alone


def _busy(ok: pd.DataFrame, out: Path, ctx: dict) -> dict:
    """Wall time beside the GPU's busy time (the union of its kernels per step, from a profiled pass)
    for the eager points: where the GPU idles, the wall time is the host's."""
    if ok.empty or "gpu_busy_median_ms" not in ok or ok["gpu_busy_median_ms"].isna().all():
        return {}
    e = ok[(ok["compile"] == "eager") & ok["gpu_busy_median_ms"].notna()].copy()
    e["busy_pct"] = 100 * e.gpu_busy_median_ms / e.median_ms
    host = sort_rows(e[e.busy_pct < 100 * HOST_BOUND_BUSY], "size", "context_length", "mode", "dtype")
    c = max(ctx["context_lengths"])
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
    result = {"tables_busy": save_table(wide, out, "gpu_busy"), "busy_context": c,
              "host_bound_busy_pct": 100 * HOST_BOUND_BUSY,
              "host_bound": [f"{r['size']} {MODE_LABEL[r['mode']]} {r['dtype']} ctx {r['context_length']}"
                             for _, r in host.iterrows()],
              "busy_pct_range": [float(e.busy_pct.min()), float(e.busy_pct.max())]}
    if not every.empty:
        result["tables_host_bound"] = save_table(every.assign(mode=every["mode"].map(MODE_LABEL)), out,
                                                 "host_bound", digits=1)
    if "bf16 speed-up, GPU busy (×)" in wide:
        train = wide[wide["mode"] == MODE_LABEL["train_step"]].dropna(subset=["bf16 speed-up, GPU busy (×)"])
        result["bf16_busy_train_speedup"] = {r["size"]: float(r["bf16 speed-up, GPU busy (×)"])
                                             for _, r in train.iterrows()}
    return result


def _precision_speedups(ok: pd.DataFrame, out: Path, ctx: dict) -> dict:
    e = ok[ok["compile"] == "eager"] if not ok.empty else ok
    if e.empty or not {"fp32", "bf16"} <= set(e["dtype"]):
        return {}
    wide = e.pivot_table(index=["size", "context_length", "mode"], columns="dtype", values="mean_ms").reset_index()
    wide = wide.dropna(subset=["fp32", "bf16"])
    wide["speedup"] = wide.fp32 / wide.bf16
    wide = sort_rows(wide, "size", "context_length", "mode")
    wide.columns.name = None
    table = wide[["size", "context_length", "mode", "fp32", "bf16", "speedup"]].rename(columns={
        "context_length": "context", "fp32": "fp32 (ms)", "bf16": "bf16 autocast (ms)", "speedup": "speed-up (×)"})
    md = save_table(table.assign(mode=table["mode"].map(MODE_LABEL)), out, "bf16_speedup")
    c = max(ctx["context_lengths"])
    compact = wide[wide.context_length == c].pivot_table(index="size", columns="mode", values="speedup").reset_index()
    compact.columns.name = None
    compact = sort_rows(compact, "size").rename(columns={m: f"{v} (×)" for m, v in MODE_LABEL.items()})
    md_compact = save_table(compact, out, "bf16_speedup_compact")
    at = wide[(wide.context_length == c) & (wide["mode"] == "train_step")]
    fig, ax = figure(2.8)
    sizes = [s for s in ctx["sizes"] if s in set(wide["size"])]
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
    return {"tables_bf16": md, "tables_bf16_compact": md_compact, "figure_bf16": save_figure(fig, out, "bf16_speedup"),
            "bf16_train_speedup": {r["size"]: float(r.speedup) for _, r in at.iterrows()},
            "bf16_slower": sorted({f"{r['size']} {MODE_LABEL[r['mode']]} (context {r['context_length']})"
                                   for _, r in wide[wide.speedup < 1].iterrows()}),
            "bf16_context_length": c}


def _compile_speedups(ok: pd.DataFrame, bench: pd.DataFrame, out: Path, ctx: dict) -> dict:
    compiled_modes = set(bench["compile"]) - {"eager"} if not bench.empty else set()
    if ok.empty or not compiled_modes:
        return {}
    comp = ok[ok["compile"] != "eager"]
    keys = ["size", "context_length", "mode", "dtype"]
    merged = comp[keys + ["mean_ms", "compile"]].merge(
        ok[ok["compile"] == "eager"][keys + ["mean_ms"]], on=keys, suffixes=("_compiled", "_eager"))
    if merged.empty:
        return {}
    merged["speedup"] = merged.mean_ms_eager / merged.mean_ms_compiled
    merged = sort_rows(merged, *keys, "compile")
    table = merged[keys + ["compile", "mean_ms_eager", "mean_ms_compiled", "speedup"]].rename(columns={
        "context_length": "context", "compile": "compiled", "mean_ms_eager": "eager (ms)",
        "mean_ms_compiled": "compiled (ms)", "speedup": "speed-up (×)"})
    md = save_table(table.assign(mode=table["mode"].map(MODE_LABEL)), out, "compile_speedup")
    compact = merged.assign(what=merged["mode"].map(MODE_LABEL) + ", " + merged["dtype"]
                            + (", " + merged["compile"] if len(compiled_modes) > 1 else "") + " (×)").pivot_table(
        index="size", columns="what", values="speedup").reset_index()
    compact.columns.name = None
    md_compact = save_table(sort_rows(compact, "size"), out, "compile_speedup_compact")
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
    return {"tables_compile": md, "tables_compile_compact": md_compact,
            "figure_compile": save_figure(fig, out, "compile_speedup"),
            "compile_method": sorted(compiled_modes),
            "compile_speedup_range": [float(merged.speedup.min()), float(merged.speedup.max())],
            "compile_speedup_by_method": {m: [float(g.speedup.min()), float(g.speedup.max())]
                                          for m, g in merged.groupby("compile")}}


def _times_figure(ok: pd.DataFrame, out: Path) -> str:
    eager = ok[ok["compile"] == "eager"]
    c = int(eager.context_length.max())
    fig, axes = figure(3.1, 1, 3, sharey=True)
    for ax, mode in zip(axes, MODE_LABEL, strict=True):
        for dtype, g in eager[(eager.context_length == c) & (eager["mode"] == mode)].groupby("dtype"):
            g = sort_rows(g, "size")
            ax.errorbar(g["size"], g.mean_ms, yerr=g.std_ms, marker="o", capsize=3, label=dtype)
        ax.set_title(MODE_LABEL[mode])
        ax.set_xlabel("model size")
        ax.tick_params(axis="x", labelrotation=45)
        log_axis(ax, "y")
    axes[0].legend()
    axes[0].set_ylabel(f"time per step (ms), context {c}")
    return save_figure(fig, out, "times_vs_size")


def _points_summary(full: pd.DataFrame) -> pd.DataFrame:
    """Per size and context length: how many points ran or ran out of memory, the largest peak memory
    and the best rate among them (the printed digest of all_points.csv)."""
    rows = []
    for (size, context), g in full.groupby(["size", "context_length"], sort=False):
        ran = g[g.status == "ok"]
        rows.append({"size": size, "context": context, "points": len(g), "ok": len(ran),
                     "out of memory": int((g.status == "oom").sum()),
                     "other": int((~g.status.isin(["ok", "oom"])).sum()),
                     "largest peak memory (GiB)": ran["peak_memory_gib"].max() if "peak_memory_gib" in ran else None,
                     "best TFLOP/s": ran["achieved_tflops"].max() if "achieved_tflops" in ran else None})
    table = pd.DataFrame(rows)
    return table if table["other"].any() else table.drop(columns="other")
