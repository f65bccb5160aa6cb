"""Section: benchmarking (problem 1), bf16 autocast timings (4c), compiled model (8b), MFU, and
the pipeline's own overhead."""

from __future__ import annotations

import statistics
from pathlib import Path

import pandas as pd

from cs336sys.accounting.hardware import preset_for_gpu
from cs336sys.analysis.benchmarking_context import BenchmarkingContext
from cs336sys.analysis.benchmarking_runs import MODE_LABEL, overhead, warmup
from cs336sys.analysis.benchmarking_speedups import HOST_BOUND_BUSY, busy, compile_speedups, precision_speedups
from cs336sys.analysis.common import (
    environment_summary,
    figure,
    gpu_model,
    log_axis,
    ran_on,
    results_frame,
    save_csv,
    save_figure,
    save_table,
    size_key,
    sm_clock,
    sort_rows,
)
from cs336sys.analysis.formatting import mean_std
from cs336sys.analysis.optimized_rounds import optimized_rounds
from cs336sys.analysis.optimized_step import optimized_step, summary_rows


def _cell(row) -> str:
    if row["status"] != "ok":
        return row["status"]
    return mean_std(row["mean_ms"], row["std_ms"])


def _pivot_cells(df: pd.DataFrame, index: list[str], column: str) -> pd.DataFrame:
    df = df.assign(cell=df.apply(_cell, axis=1))
    wide = df.pivot_table(index=index, columns=column, values="cell", aggfunc="first").reset_index()
    wide.columns.name = None
    return sort_rows(wide, *index)


def build(paths: list[Path], out: Path, **_: object) -> BenchmarkingContext:
    """The section's context: every point, the timing tables, the bf16 and compiled speed-ups, host-bound
    points, MFU, the spread, the cold start, the pipeline's overhead and the optimized step."""
    frame = results_frame(paths)
    ctx = BenchmarkingContext(env=environment_summary(frame))
    if frame.empty:  # nothing measured: the parts are absent
        return ctx
    if "context_length" in frame:
        frame["context_length"] = frame["context_length"].astype("Int64")
    # the GPU model a point ran on, "" for none (the CPU smoke grid): what ceilings and ratios are paired by
    frame["gpu"] = [g if isinstance(g, str) else "" for g in frame.get("env.gpu", pd.Series(None, index=frame.index))]
    bench = frame[frame.problem == "benchmarking"].copy()
    warm = frame[frame.problem == "warmup"].copy()
    peak = frame[frame.problem == "matmul_peak"].copy()
    ctx.peak_tflops = {r["dtype"]: r["tflops"] for _, r in peak.iterrows() if r["status"] == "ok"}
    ctx.peak_rounds = {r["dtype"]: _rounds(r) for _, r in peak.iterrows()
                       if r["status"] == "ok" and isinstance(r.get("tflops_rounds"), list)}
    _ceilings(ctx, peak, frame)

    ok = bench[bench.status == "ok"].copy()
    if not ok.empty:
        # each point against the ceiling of the GPU model it ran on
        ok["peak_tflops"] = [ctx.ceilings.get(g, {}).get(d) for g, d in zip(ok["gpu"], ok["dtype"], strict=True)]
        ok["peak_tflops"] = ok["peak_tflops"].astype(float)
        _own_ceilings(ctx, ok)
        ok["mfu_pct"] = 100 * ok.achieved_tflops / ok.peak_tflops
        ok["peak_memory_gib"] = ok.peak_memory_bytes / 2**30

    _all_points(ctx, bench, ok, out)
    _grid(ctx, bench, ok)
    eager = bench[bench["compile"] == "eager"] if not bench.empty else bench
    ctx.on_eager = ran_on(eager["gpu"])
    _timing_tables(ctx, eager, out)
    precision_speedups(ctx, ok, out)  # 4(c): fp32 vs bf16 autocast
    busy(ctx, ok, out)  # wall time against the GPU's busy time: which points wait on the host
    compile_speedups(ctx, ok, bench, out)  # 8(b): eager vs compiled
    _mfu(ctx, ok, out)
    _spread(ctx, ok, bench)
    warmup(ctx, warm, out)
    overhead(ctx, paths, bench, warm, out)
    ctx.optimized = optimized_step(frame, ctx.ceilings, out)  # None without the series' results
    ctx.optimized_rounds = optimized_rounds(frame, out)  # None without the series in rounds
    if not ok.empty:
        ctx.figures["times"] = _times_figure(ok, out)
    ctx.summary = _summary(ctx)
    ctx.limitations = _limitations(ctx)
    return ctx


def _rounds(r: pd.Series) -> dict:
    clocks = [c["sm_clock_mhz"] for c in r.get("round_clocks") or [] if c and c.get("sm_clock_mhz")]
    return {"min": min(r["tflops_rounds"]), "max": max(r["tflops_rounds"]), "n": len(r["tflops_rounds"]),
            "sm_clock_mhz": statistics.median(clocks) if clocks else None}


def _ceilings(ctx: BenchmarkingContext, peak: pd.DataFrame, frame: pd.DataFrame) -> None:
    """The matmul ceiling of every GPU model with points here: measured in `matmul_peak`'s results, or for a
    GPU those results are not from, its preset's ceiling where the project measured it (so a point is never
    divided by another GPU model's rate)."""
    ok = peak[peak.status == "ok"] if not peak.empty else peak
    for _, r in ok.iterrows():
        ctx.ceilings.setdefault(r["gpu"], {})[r["dtype"]] = float(r["tflops"])
    gpus = sorted(ok["gpu"].unique()) if not ok.empty else []
    ctx.peak_gpu = gpu_model(gpus[0]) if len(gpus) == 1 and gpus[0] else None
    for gpu in sorted({g for g in frame["gpu"] if g} - set(ctx.ceilings)):
        preset = preset_for_gpu(gpu)
        if preset is not None and preset.flops_source.startswith("measured"):
            ctx.ceilings[gpu] = {"bf16": preset.flops / 1e12}
            note = f"the {gpu_model(gpu)}'s points: its bf16 {preset.flops / 1e12:.0f}, measured earlier"
            ctx.ceiling_notes.append(note)


def _own_ceilings(ctx: BenchmarkingContext, ok: pd.DataFrame) -> None:
    """A bf16 point that timed the 8192-cube product in its own job (`matmul_bf16_tflops`) is set against that
    one, not `matmul_peak`'s (another job, host and day, at another clock): `peak_tflops` replaced in place,
    `ctx.own_ceiling` said."""
    if "matmul_bf16_tflops" not in ok:
        return
    own = ok["matmul_bf16_tflops"].astype(float).where(ok["dtype"] == "bf16")
    if own.isna().all():
        return
    ok.loc[own.notna(), "peak_tflops"] = own[own.notna()]
    ok["ceiling_source"] = ["own job" if v == v else "matmul_peak" for v in own]

    def span(column: str) -> tuple[float, float] | None:
        values = [c["sm_clock_mhz"] for c in ok.loc[own.notna(), column].dropna() if c and c.get("sm_clock_mhz")] \
            if column in ok else []
        return (min(values), max(values)) if values else None

    ctx.own_ceiling = {"points": int(own.notna().sum()), "of": int((ok["dtype"] == "bf16").sum()),
                       "tflops": (float(own.min()), float(own.max())),
                       "ceiling_mhz": span("matmul_clocks"), "step_mhz": span("step_clocks")}


def _all_points(ctx: BenchmarkingContext, bench: pd.DataFrame, ok: pd.DataFrame, out: Path) -> None:
    """All points, numeric: 13 columns, too wide to print, so a CSV file that the report links, and
    a printed summary per size and context length."""
    cols = ["size", "context_length", "mode", "dtype", "compile", "status", "mean_ms", "std_ms", "median_ms",
            "min_ms", "achieved_tflops", "mfu_pct", "peak_memory_gib"]
    full = bench[["size", "context_length", "mode", "dtype", "compile", "status"]].join(
        ok[[c for c in cols[6:] if c in ok]]) if not bench.empty else pd.DataFrame(columns=cols)
    full = sort_rows(full, "size", "context_length", "mode", "dtype", "compile")
    ctx.tables["all_points_csv"] = save_csv(full, out, "all_points")
    if not full.empty:
        ctx.tables["points_summary"] = save_table(_points_summary(full), out, "points_summary", digits=1)


def _grid(ctx: BenchmarkingContext, bench: pd.DataFrame, ok: pd.DataFrame) -> None:
    """The protocol as the result files record it, and the context lengths and sizes of the grid."""
    if not ok.empty:
        ctx.protocol = {"warmup": sorted({int(v) for v in bench["warmup"]}),
                        "steps": sorted({int(v) for v in bench["steps"]}),
                        "batch": sorted({int(v) for v in ok.get("metric_batch_size", pd.Series()).dropna()})}
    eager = bench[bench["compile"] == "eager"] if not bench.empty else bench
    ctx.context_lengths = sorted(int(c) for c in eager.context_length.unique()) if not eager.empty else []
    ctx.sizes = sorted(bench["size"].unique(), key=lambda s: size_key(pd.Series([s]))[0]) \
        if not bench.empty else []


def _timing_tables(ctx: BenchmarkingContext, eager: pd.DataFrame, out: Path) -> None:
    """1(b): mean ± std per size and mode, fp32 eager, one table per context length; the backward's time
    against the forward's at the longest context, as the table's two columns give it."""
    ctx.tables["timing"] = {}
    every_alone = True
    for c in ctx.context_lengths:
        sel = eager[(eager["dtype"] == "fp32") & (eager.context_length == c)]
        wide = _pivot_cells(sel, ["size"], "mode")
        cells, alone, backward = _backward_cells(sel, wide["size"])
        every_alone = every_alone and alone
        if c == max(ctx.context_lengths):
            _backward_ratio(ctx, sel, backward)
        wide.insert(wide.columns.get_loc("forward_backward") + 1 if "forward_backward" in wide else len(wide.columns),
                    "backward", cells)
        wide = wide.rename(columns={**{m: f"{v} (ms)" for m, v in MODE_LABEL.items()},
                                    "backward": "backward (ms, timed alone)" if alone else "backward (ms, difference)"})
        ctx.tables["timing"][str(c)] = save_table(wide, out, f"timing_fp32_ctx{c}")  # JSON keys are strings
    if ctx.context_lengths:
        ctx.backward_timed_alone = every_alone
        ctx.timing_context_main = max(ctx.context_lengths)


def _backward_ratio(ctx: BenchmarkingContext, sel: pd.DataFrame, backward: dict[str, float]) -> None:
    """The backward column's mean over the forward column's, per size: the lowest and highest, and where."""
    forward = {r["size"]: r["mean_ms"] for _, r in sel[(sel["mode"] == "forward") & (sel.status == "ok")].iterrows()}
    ratio = {size: b / forward[size] for size, b in backward.items() if forward.get(size)}
    if ratio:
        low, high = min(ratio, key=ratio.get), max(ratio, key=ratio.get)
        ctx.backward_ratio = [ratio[low], ratio[high]]
        ctx.backward_ratio_sizes = [low, high]


def _mfu(ctx: BenchmarkingContext, ok: pd.DataFrame, out: Path) -> None:
    """MFU for every train-step row, a compact table at the longest context, the best point."""
    train = ok[ok["mode"] == "train_step"] if not ok.empty else ok
    if not train.empty:
        mfu = sort_rows(train[["size", "context_length", "dtype", "compile", "median_ms", "achieved_tflops",
                             "peak_tflops", "mfu_pct"]], "size", "context_length", "dtype", "compile")
        mfu = mfu.rename(columns={"context_length": "context", "median_ms": "median (ms)", "achieved_tflops": "TFLOP/s",
                                  "peak_tflops": "ceiling (TFLOP/s)", "mfu_pct": "MFU (%)"})
        ctx.tables["mfu"] = save_table(mfu, out, "mfu", digits=1)
        c = int(train.context_length.max())
        at = train[train.context_length == c].assign(what=lambda d: d["dtype"] + ", " + d["compile"] + " (%)")
        compact = at.pivot_table(index="size", columns="what", values="mfu_pct").reset_index()
        compact.columns.name = None
        ctx.tables["mfu_compact"] = save_table(sort_rows(compact, "size"), out, "mfu_compact", digits=1)
        ctx.mfu_context = c
        ctx.best_mfu_by_dtype = {}
        for dtype, g in train.groupby("dtype"):
            if g.mfu_pct.isna().all():  # no ceiling measured for this dtype (the smoke grid's CPU: fp32 only)
                continue
            best = g.loc[g.mfu_pct.idxmax()]
            ctx.best_mfu_by_dtype[dtype] = {"pct": float(best.mfu_pct), "size": best["size"], "dtype": dtype,
                                            "ceiling": float(best.peak_tflops),
                                            "own_ceiling": best.get("ceiling_source") == "own job",
                                            "compile": best["compile"], "context_length": int(best.context_length),
                                            "gpu": best["gpu"], "achieved_tflops": float(best.achieved_tflops),
                                            **_at_step_clock(best)}
        ctx.best_mfu = max(ctx.best_mfu_by_dtype.values(), key=lambda b: b["pct"], default=None)


def _at_step_clock(point: pd.Series) -> dict:
    """A point whose job sampled the SM clock under its steps and under its own ceiling's product: the MFU
    against that ceiling scaled linearly to the steps' clock (a product's rate follows the clock), with both
    clocks; nothing where either was not sampled or the ceiling is another job's."""
    if point.get("ceiling_source") != "own job":
        return {}
    step, product = (sm_clock(point.get(k)) for k in ("step_clocks", "matmul_clocks"))
    if not step or not product:
        return {}
    return {"step_mhz": step, "ceiling_mhz": product,
            "pct_at_step_clock": float(100 * point.achieved_tflops / (point.peak_tflops * step / product))}


def _spread(ctx: BenchmarkingContext, ok: pd.DataFrame, bench: pd.DataFrame) -> None:
    """The timings' coefficient of variation (median and worst point) and the points out of memory."""
    if not ok.empty:
        cv = 100 * ok.std_ms / ok.mean_ms
        worst = ok.loc[cv.idxmax()]
        ctx.cv = {"median_pct": float(cv.median()), "max_pct": float(cv.max()),
                  "max_what": f"{worst['size']} {MODE_LABEL[worst['mode']]} {worst['dtype']} {worst['compile']}"}
    ctx.oom_points = [f"{r['size']} {MODE_LABEL[r['mode']]} {r['dtype']} {r['compile']} ctx {r['context_length']}"
                      for _, r in bench[bench.status == "oom"].iterrows()]


def _limitations(ctx: BenchmarkingContext) -> list[str]:
    """What the wall times cannot say where the host, not the GPU, sets them."""
    limitations = []
    if ctx.host_bound:
        limitations.append(
            f"{len(ctx.host_bound)} eager points' GPU-busy time is under {HOST_BOUND_BUSY:.0%} of their wall time: "
            "the wall times are the host's.")
    elif ctx.bf16_slower:
        limitations.append(
            f"{len(ctx.bf16_slower)} of the eager bf16 points are slower than fp32: at these sizes and contexts the "
            "step time is the host's (Python and kernel launches), not the GPU's, so these wall times say little "
            "about the GPU.")
    return limitations


OWN_JOB = "its job's"  # a ceiling timed in the job of the point it bounds


def _at_clock_said(best: dict) -> str:
    """The best MFU against its own ceiling scaled to the step's clock, where both clocks were sampled."""
    return f", {best['pct_at_step_clock']:.1f} % at the step's clock" if best.get("pct_at_step_clock") else ""


def _by_datasheet(best: dict) -> str:
    """The best bf16 MFU again over the GPU's datasheet peak, where its preset has one (a measured ceiling
    moves between hosts and days; the datasheet's does not)."""
    hw = preset_for_gpu(best.get("gpu"))
    if hw is None or "datasheet" not in hw.flops_source or not best.get("achieved_tflops"):
        return ""
    return f"; {100 * best['achieved_tflops'] * 1e12 / hw.flops:.1f} % of the datasheet's {hw.flops / 1e12:.0f}"


def _summary(ctx: BenchmarkingContext) -> list[dict]:
    """The section's rows of the summary page, the headline first: bf16's MFU (the rate a reader trains
    at), bf16 against fp32, the optimised step against its roofline, then the compiled model."""
    rows = []
    bf16 = (ctx.best_mfu_by_dtype or {}).get("bf16")
    if bf16 is not None:
        rows.append({"part": "MFU of a bf16 train step, the best", "result": f"{bf16['pct']:.1f} % ({bf16['size']}, "
                     f"{bf16['compile']}) of "
                     f"{OWN_JOB if bf16.get('own_ceiling') else 'the measured'} "
                     f"{bf16['ceiling']:.0f} TFLOP/s{_at_clock_said(bf16)}{_by_datasheet(bf16)}",
                     "target": None, "met": None,
                     "ref": "bench-mfu"})
    elif ctx.best_mfu is not None:  # no bf16 ceiling: the best MFU there is, with its dtype
        b = ctx.best_mfu
        rows.append({"part": f"MFU of a {b['dtype']} train step, the best", "result": f"{b['pct']:.1f} % "
                     f"({b['size']}, {b['compile']}, context {b['context_length']})", "target": None, "met": None,
                     "ref": "bench-mfu"})
    if ctx.bf16_train_speedup:
        size, speedup = list(ctx.bf16_train_speedup.items())[-1]
        # the wall-time ratio moves with the host where a step leaves the GPU idle; the busy-time one does not
        busy = (ctx.bf16_busy_train_speedup or {}).get(size) if ctx.busy_context == ctx.bf16_context_length else None
        # so the busy one leads (section 1.4 says where the wall one times the host)
        said = (f"{busy:.2f}× faster in GPU-busy time, {speedup:.2f}× in wall time"
                if busy else f"{speedup:.2f}× faster")
        rows.append({"part": "bf16 autocast against fp32 (TF32 off)", "result": f"{said} "
                     f"({size} train step, context {ctx.bf16_context_length})", "target": None, "met": None,
                     "ref": "bench-bf16"})
    rows += summary_rows(ctx.optimized or {}, ctx.optimized_rounds)
    if ctx.compile_speedup_range:
        low, high = ctx.compile_speedup_range
        said = f"{low:.2f}×" if f"{low:.2f}" == f"{high:.2f}" else f"{low:.2f}× to {high:.2f}×"
        rows.append({"part": "torch.compile against eager", "result": f"{said} faster",
                     "target": None, "met": None, "ref": "bench-compile"})
    return rows


def _backward_cells(sel: pd.DataFrame, sizes: pd.Series) -> tuple[list[str], bool, dict[str, float]]:
    """Backward time per step: timed alone (a synchronisation around each phase) where the result
    files have it, else forward+backward less forward, means of two separately timed modes, so their
    standard deviations add. Returns the cells, whether every one was timed alone, and each size's mean."""
    cells, alone, means = [], True, {}
    for size in sizes:
        by = {r["mode"]: r for _, r in sel[sel["size"] == size].iterrows()}
        f, fb = by.get("forward"), by.get("forward_backward")
        if fb is not None and fb["status"] == "ok" and isinstance(fb.get("phase_ms"), dict):
            t = fb["phase_ms"]["backward"]
            means[size] = statistics.fmean(t)
            cells.append(mean_std(means[size], statistics.stdev(t) if len(t) > 1 else 0.0))
            continue
        if f is None or fb is None or f["status"] != "ok" or fb["status"] != "ok":
            cells.append(fb["status"] if fb is not None and fb["status"] != "ok" else "")
            continue
        alone = False
        means[size] = fb["mean_ms"] - f["mean_ms"]
        cells.append(mean_std(means[size], fb["std_ms"] + f["std_ms"]))
    return cells, alone, means


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
