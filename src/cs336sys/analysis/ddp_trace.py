"""The ddp section's profiled steps (17b): one step of naive, flat, overlapped and bucketed DDP from
each `ddp_trace` point's timeline, drawn on one time axis, and the traced steps set against the step
benchmark of the same configuration."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd
from matplotlib.patches import Patch

from cs336sys.analysis import ddp_steps
from cs336sys.analysis.common import figure, save_figure, save_table
from cs336sys.analysis.formatting import number

if TYPE_CHECKING:
    from cs336sys.analysis.ddp_context import DDPContext

TRACE_ORDER = ["naive", "flat", "overlap", "bucketed"]


def trace(ctx: DDPContext, df: pd.DataFrame, out: Path) -> None:
    """The traced variants in order: each step's phases and communication (a table) and their timelines
    drawn on one axis."""
    ok = df[df.status == "ok"]
    if ok.empty:
        return
    ok = ok.assign(_v=ok["variant"].map(lambda v: TRACE_ORDER.index(v) if v in TRACE_ORDER else len(TRACE_ORDER)))
    rows, table, summaries, titles = [], [], [], []
    for _, r in ok.sort_values(["_v", "bucket_size_mb"]).iterrows():
        b = number(r.get("bucket_size_mb"))
        label = ddp_steps.variant_label(r["variant"], b)
        t = r["totals"]
        comm, overlapped = t["communication_us"] / 1e3, t["communication_overlapped_us"] / 1e3
        row = {"variant": r["variant"], "label": label, "bucket_mb": b, "span_ms": t["span_us"] / 1e3,
               "compute_ms": t["compute_us"] / 1e3,
               "comm_ms": comm, "overlapped_ms": overlapped, "exposed_ms": comm - overlapped,
               "overlapped_share": overlapped / comm if comm > 0 else None}
        rows.append(row)
        table.append({"variant": label, "step span (ms)": row["span_ms"], "compute (ms)": row["compute_ms"],
                      "comm. (ms)": comm, "under compute (ms)": overlapped,
                      "share under compute": "" if row["overlapped_share"] is None
                      else f"{100 * row['overlapped_share']:.0f}%", "exposed comm. (ms)": row["exposed_ms"]})
        timeline = Path(str(r["path"]).removesuffix(".json")) / "timeline.json"
        if timeline.is_file():
            summaries.append(json.loads(timeline.read_text()))
            titles.append(label)
    first = ok.iloc[0]
    naive = next((r for r in rows if r["variant"] == "naive" and r["overlapped_share"] is not None), None)
    others = [r for r in rows if r["variant"] != "naive" and r["overlapped_share"] is not None]
    verdict: dict | None = None  # without both naive and another variant to compare
    if naive is not None and others:
        # what the profiled steps show beside the shares: a variant whose profiled step is longer than naive's,
        # or whose exposed communication is more than naive's, did not gain in the trace what it overlapped
        verdict = {"naive_share": naive["overlapped_share"], "naive_span_ms": naive["span_ms"],
                   "naive_exposed_ms": naive["exposed_ms"],
                   "others": [{"label": r["label"], "share": r["overlapped_share"]} for r in others],
                   "separates": all(r["overlapped_share"] > naive["overlapped_share"] for r in others),
                   "longer_than_naive": [{"label": r["label"], "span_ms": r["span_ms"]} for r in others
                                         if r["span_ms"] > naive["span_ms"]],
                   "more_exposed_than_naive": [{"label": r["label"], "exposed_ms": r["exposed_ms"]} for r in others
                                               if r["exposed_ms"] > naive["exposed_ms"]]}
    frame = pd.DataFrame(table)
    none_overlapped = all(r["overlapped_ms"] == 0 for r in rows)
    if none_overlapped:  # no variant ran any communication under compute: the text says so, no zero columns
        frame = frame.drop(columns=["under compute (ms)", "share under compute"])
    ctx.trace_rows, ctx.trace_verdict, ctx.trace_none_overlapped = rows, verdict, none_overlapped
    ctx.trace_table = save_table(frame, out, "ddp_trace_overlap", digits=2)
    ctx.trace_settings = {"size": first["size"], "dtype": first["dtype"], "tool": first.get("tool"),
                          "context_length": int(first["context_length"]), "batch_size": int(first["batch_size"]),
                          "date": str(first.get("env.timestamp") or "")[:10] or None}
    if summaries:
        ctx.trace_figure = timeline_figure(summaries, titles, out)
        ctx.trace_settings["source"] = summaries[0].get("source")


def trace_against_benchmark(ctx: DDPContext, frame: pd.DataFrame, out: Path) -> None:
    """The profiled step beside the benchmark's steps of the same variant (size, dtype, bucket), and
    each trace's NCCL kernel time beside the time the all-reduce of the gradients needs at the measured
    bus bandwidth. A profiled step is one step with the profiler's per-operator cost on the host, so its
    span is not a step time; an NCCL kernel's time is its time resident on the GPU, waiting for the
    other rank and sharing the GPU with compute, so it is not a transfer time."""
    rows, settings = ctx.trace_rows, ctx.trace_settings
    steps = frame[(frame.problem == "ddp_step") & (frame.status == "ok")] if not frame.empty else frame
    if not rows or steps.empty:
        return
    steps = steps[(steps["size"] == settings["size"]) & (steps["dtype"] == settings["dtype"])]
    ar = frame[(frame.problem == "allreduce") & (frame.status == "ok")]
    nccl = ar[ar.get("backend", pd.Series(index=ar.index, dtype=object)).fillna("") == "nccl"] if not ar.empty else ar
    nccl = nccl[nccl["world_size"] == nccl["world_size"].min()] if not nccl.empty else nccl  # the traced ranks: 2
    largest = nccl.sort_values("size_bytes").iloc[-1] if not nccl.empty else None
    busbw = float(largest["busbw_gbps"]) if largest is not None else None
    ranks = int(largest["world_size"]) if largest is not None else None
    if ranks is not None and "world_size" in steps:  # the benchmark's job on as many ranks as the trace's
        steps = steps[steps["world_size"] == ranks]
    table, facts, bench_dates = [], [], set()
    for r in rows:
        same = steps[steps["variant"] == r["variant"]]
        if r["bucket_mb"] is not None:
            same = same[same["bucket_size_mb"] == r["bucket_mb"]]
        if same.empty:
            continue
        b = same.iloc[0]
        bench_dates.add(str(b.get("env.timestamp") or "")[:10])
        row = {"variant": r["label"], "profiled step (ms)": r["span_ms"],
               "benchmark step (ms)": f"{b['mean_ms']:.2f} ± {b['std_ms']:.2f}",
               "profiled / benchmark (×)": r["span_ms"] / b["mean_ms"], "NCCL kernels (ms)": r["comm_ms"]}
        fact = {"label": r["label"], "ratio": r["span_ms"] / b["mean_ms"], "comm_ms": r["comm_ms"],
                "grad_gib": float(b["grad_bytes"]) / 2**30, "span_ms": r["span_ms"], "bench_ms": float(b["mean_ms"])}
        if busbw:
            # a ring all-reduce of S bytes over r ranks moves 2(r-1)/r S per rank: t = that / busbw
            bound = 2 * (ranks - 1) / ranks * float(b["grad_bytes"]) / (busbw * 1e9) * 1e3
            row["at the bus bandwidth (ms)"] = bound
            row["kernels / bound (×)"] = r["comm_ms"] / bound
            fact |= {"bound_ms": bound, "stretch": r["comm_ms"] / bound, "under_ms": r["overlapped_ms"]}
        table.append(row)
        facts.append(fact)
    if not table:
        return
    ctx.trace_vs_bench_table = save_table(pd.DataFrame(table), out, "ddp_trace_vs_benchmark", digits=2)
    ctx.trace_vs_bench = facts
    ctx.trace_order = trace_order(facts, sorted(bench_dates - {""}))
    ctx.trace_busbw_gbps = busbw or None  # None without NCCL points
    ctx.trace_busbw_ranks = ranks


def trace_order(facts: list[dict], bench_dates: list[str]) -> dict:
    """How much profiling lengthened the step ("slowdown": the lowest and highest profiled span over the
    benchmark's mean of the same variant), and the variants ordered fastest first by the profiled span and by
    the benchmark's mean: "differs" where the orders disagree, so the traces do not rank the variants."""
    by_span = [f["label"] for f in sorted(facts, key=lambda f: f["span_ms"])]
    by_bench = [f["label"] for f in sorted(facts, key=lambda f: f["bench_ms"])]
    ratios = [f["ratio"] for f in facts]
    return {"slowdown": [min(ratios), max(ratios)], "profiled": by_span, "benchmark": by_bench,
            "differs": by_span != by_bench, "bench_dates": bench_dates}


def timeline_figure(summaries: list[dict], titles: list[str], out: Path, name: str = "ddp_timeline") -> str:
    """The summaries (`cs336sys.profiling.timeline.summarize_timeline`) stacked on one time axis, in the
    report's figure style: a row per lane, device work coloured by category, the step's phases as
    bands. (`render_timeline` draws the same at its own size and fonts, for looking at one trace.)"""
    from cs336sys.profiling.annotate import PHASES
    from cs336sys.profiling.timeline import CATEGORIES, COLORS, SHADES

    heights = [0.3 * max(len(s["lanes"]), 1) + 0.5 for s in summaries]
    fig, axes = figure(sum(heights) + 0.6, len(summaries), 1, sharex=True, squeeze=False,
                       gridspec_kw={"height_ratios": heights})
    for ax, s, title in zip(axes[:, 0], summaries, titles, strict=True):
        ev = s["events"]
        for lane in range(len(s["lanes"])):
            for category in CATEGORIES:
                bars = [(st / 1e3, max(d / 1e3, 1e-6)) for st, d, ln, c in
                        zip(ev["start_us"], ev["dur_us"], ev["lane"], ev["category"], strict=True)
                        if ln == lane and c == category]
                if bars:
                    ax.broken_barh(bars, (lane - 0.38, 0.76), facecolors=COLORS[category], linewidth=0, zorder=3)
        for r in s["ranges"]:
            if r["name"] in PHASES:
                start, dur = ((r["device_start_us"], r["device_dur_us"]) if r["device_start_us"] is not None
                              else (r["host_start_us"], r["host_dur_us"]))
                ax.axvspan(start / 1e3, (start + dur) / 1e3, color=SHADES.get(r["name"], "#dddddd"), alpha=0.35,
                           lw=0, zorder=1)
        ax.set_yticks(range(len(s["lanes"])), [lane["label"] for lane in s["lanes"]])
        ax.set_ylim(len(s["lanes"]) - 0.5, -0.5)
        ax.grid(False)
        t = s["totals"]
        ax.set_title(f"{title}: communication {t['communication_us'] / 1e3:.1f} ms, "
                     f"{t['communication_overlapped_us'] / 1e3:.1f} ms of it under compute", loc="left")
    axes[-1, 0].set_xlabel("time from the step's start (ms)")
    present = {c for s in summaries for c in s["events"]["category"]}
    handles = [Patch(color=COLORS[c], label=c) for c in CATEGORIES if c in present]
    handles += [Patch(color=SHADES.get(n, "#dddddd"), alpha=0.35, label=n.replace("_", " ")) for n in PHASES
                if any(r["name"] == n for s in summaries for r in s["ranges"])]
    fig.legend(handles=handles, loc="outside lower center", ncol=min(len(handles), 6), frameon=False)
    return save_figure(fig, out, name)
