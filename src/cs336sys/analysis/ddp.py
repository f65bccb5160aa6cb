"""Section: ddp — the all-reduce benchmark (problem 12), the DDP variants' training steps against no
communication and PyTorch's DDP (14, 15, 17a, 19a; `ddp_steps`), the bucket overhead model and its fit
(19b; `ddp_model`), one profiled step of naive, overlapped and bucketed DDP drawn on one time axis
(17b), and the grid's machine time from Snakemake's timing records."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pandas as pd
from matplotlib.patches import Patch
from matplotlib.ticker import FixedLocator, NullLocator

from cs336sys.analysis import ddp_steps
from cs336sys.analysis.common import (
    environment_summary,
    figure,
    log_axis,
    read_benchmark_tsv,
    results_frame,
    save_figure,
    save_table,
)
from cs336sys.analysis.ddp_model import fit_latency_bandwidth, formulas
from cs336sys.analysis.verdicts import at_most

TARGET_SIZE_BYTES = 2**30  # the all-reduce target's size: 1 GiB per rank
BUSBW_TARGET_FRACTION = 0.9  # ... reaching this share of the best bus bandwidth any size reaches
GRID_TARGET_S = 600.0  # the whole DDP grid's machine time
BACKEND_ORDER = ["nccl", "gloo"]
TRACE_ORDER = ["naive", "flat", "overlap", "bucketed"]


def build(paths: list[Path], out: Path, **_: object) -> dict:
    frame = results_frame(paths)
    ctx: dict = {"env": environment_summary(frame), "tables": {}, "figures": {}, "model_formulas": formulas()}
    ctx.update(gloo_environment(frame))
    if not frame.empty:
        ar = allreduce(frame[frame.problem == "allreduce"], out)
        ctx.update(ar)
        steps = frame[frame.problem == "ddp_step"]
        host = ddp_steps.is_host(steps)  # the host-overhead jobs: shown apart, never mixed into the grid's
        ctx.update(ddp_steps.jobs(steps[~host], out, ar.get("allreduce_fits")))
        ctx.update(ddp_steps.host_jobs(steps[host], out))
        ctx.update(trace(frame[frame.problem == "ddp_trace"], out))
        ctx.update(trace_against_benchmark(ctx, frame.drop(index=steps.index[host]), out))
    walls = grid_time([p for p in paths if p.suffix == ".tsv"])
    if walls:
        ctx["grid_time"] = walls
    ctx["summary"] = _summary(ctx)
    missing = (ctx.get("allreduce_nccl_worlds") or {}).get("missing")
    ctx["limitations"] = [f"The NCCL all-reduce at {' and '.join(str(n) for n in missing)} GPUs was not run: no "
                          "machine with that many GPUs was lent."] if missing else []
    return ctx


def gloo_environment(frame: pd.DataFrame) -> dict:
    """gloo all-reduce points need only CPUs and may come from another host than the GPU points:
    when the section holds both, the section's environment line describes the GPU points and the
    gloo points get their own, with the host's core count (more ranks than cores take turns)."""
    if frame.empty or "device" not in frame:
        return {}
    is_gloo = (frame["problem"] == "allreduce") & (frame["device"] == "cpu")
    if not is_gloo.any() or is_gloo.all():
        return {}
    gloo = frame[is_gloo]
    cores = sorted({int(c) for c in gloo.get("env.cpu_count", pd.Series(dtype=float)).dropna()})
    worlds = pd.concat([gloo[c] for c in ("world_size", "env.world_size") if c in gloo]).dropna().astype(int)
    max_world = int(worlds.max()) if not worlds.empty else None
    env = environment_summary(gloo)
    cpus = sorted({str(c) for c in gloo.get("env.cpu", pd.Series(dtype=object)).dropna()})
    host_gpus = env["device"] if env["is_gpu"] else None
    env.update(device=f"CPU ({', '.join(cpus) or 'unknown'})", host_gpus=host_gpus, cores=cores, max_world=max_world,
               oversubscribed=bool(cores and max_world is not None and max_world > min(cores)))
    return {"env": environment_summary(frame[~is_gloo]), "gloo_env": env}


# --- all-reduce -------------------------------------------------------------------------------------

def human_bytes(n: float) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:g} {unit}"
    return f"{n:g} B"


def _sig(x: float) -> str:
    """About three significant digits, never in exponent notation (milliseconds, GB/s)."""
    if x >= 100:
        return f"{x:.0f}"
    if x >= 1 or x <= 0:
        return f"{x:.1f}" if x >= 10 else f"{x:.2f}"
    return f"{x:.{2 - math.floor(math.log10(x))}f}"


def _backend_sort(df: pd.DataFrame) -> pd.DataFrame:
    key = df["backend"].map(lambda b: BACKEND_ORDER.index(b) if b in BACKEND_ORDER else len(BACKEND_ORDER))
    return df.assign(_b=key).sort_values(["_b", "world_size", "size_bytes"]).drop(columns="_b")


def allreduce(df: pd.DataFrame, out: Path) -> dict:
    if df.empty:
        return {}
    df = df.copy()
    if "backend" not in df:  # a grid whose every point failed: the backend follows from the device
        df["backend"] = None
    df["backend"] = df["backend"].fillna(df["device"].map({"cuda": "nccl", "cpu": "gloo"}))
    df["world_size"] = df["world_size"].fillna(df.get("env.world_size")).astype(int)
    df = _backend_sort(df)
    rows = []
    for _, r in df.iterrows():
        row = {"backend": r["backend"], "ranks": r["world_size"], "size": human_bytes(r["size_bytes"])}
        if r["status"] != "ok":
            rows.append(row | {"median (ms)": r["status"]})
            continue
        rows.append(row | {"median (ms)": _sig(r["median_ms"]),
                           "min–max (ms)": f"{_sig(r['min_ms'])}–{_sig(r['max_ms'])}",
                           "calls": len(r["times_ms"]) if isinstance(r.get("times_ms"), list) else None,
                           "algbw (GB/s)": _sig(r["algbw_gbps"]), "busbw (GB/s)": _sig(r["busbw_gbps"])})
    ok = df[df.status == "ok"]
    ctx: dict = {"allreduce_table": save_table(pd.DataFrame(rows), out, "allreduce", digits=3),
                 "allreduce_busbw_factor": "2(r-1)/r"}  # no fraction in running text
    if ok.empty:
        return ctx
    nominal = ok["nvlink_nominal_gbps"].dropna() if "nvlink_nominal_gbps" in ok else pd.Series(dtype=float)
    ctx["allreduce_nominal_gbps"] = float(nominal.iloc[0]) if not nominal.empty else None
    ctx["allreduce_calls"] = int(ok["iters"].min()) if "iters" in ok else None
    ctx["allreduce_warmup"] = int(ok["warmup"].min()) if "warmup" in ok else None
    ctx["allreduce_figure"] = _allreduce_figure(ok, out, ctx["allreduce_nominal_gbps"])
    ctx["allreduce_targets"] = _busbw_targets(ok)
    ctx["allreduce_target_values"] = {"fraction": BUSBW_TARGET_FRACTION, "size": human_bytes(TARGET_SIZE_BYTES)}
    fits, fit_rows, facts = {}, [], []
    for (backend, world), g in ok.groupby(["backend", "world_size"], sort=False):
        g = g.sort_values("size_bytes")
        o, inv_w = fit_latency_bandwidth(list(g["size_bytes"]), list(g["median_ms"] / 1e3))
        fits[f"{backend}-{world}"] = {"o_s": o, "inv_w": inv_w}
        fit_rows.append({"backend": backend, "ranks": int(world), "sizes": len(g), "o (µs)": o * 1e6,
                         "w (GB/s)": 1e-9 / inv_w if inv_w > 0 else None})
        small, large = g.iloc[0], g.iloc[-1]
        facts.append({"backend": backend, "world": int(world), "small": human_bytes(small["size_bytes"]),
                      "large": human_bytes(large["size_bytes"]), "small_busbw": float(small["busbw_gbps"]),
                      "large_busbw": float(large["busbw_gbps"]), "best_busbw": float(g["busbw_gbps"].max()),
                      "small_ms": float(small["median_ms"]), "large_ms": float(large["median_ms"]),
                      "grows": bool(large["busbw_gbps"] > small["busbw_gbps"])})
    ctx["allreduce_fits"] = fits
    ctx["allreduce_fit_table"] = save_table(pd.DataFrame(fit_rows), out, "allreduce_latency_bandwidth", digits=1)
    ctx["allreduce_facts"] = facts
    ctx["allreduce_all_grow"] = all(f["grows"] for f in facts)
    flat = [f"{f['backend']} with {f['world']} ranks" for f in facts if not f["grows"]]
    ctx["allreduce_flat_curves"] = {"labels": flat, "verb": "does" if len(flat) == 1 else "do"}
    worlds = {b: sorted(int(w) for w in g["world_size"].unique()) for b, g in ok.groupby("backend")}
    if "nccl" in worlds:  # the handout's rank counts NCCL could not run: one GPU per rank
        missing = sorted(set(worlds.get("gloo", [])) - set(worlds["nccl"]))
        ctx["allreduce_nccl_worlds"] = {"measured": worlds["nccl"], "missing": missing}
    ctx["allreduce_compare"] = _compare_backends(ok)
    return ctx


def _busbw_targets(ok: pd.DataFrame) -> list[dict]:
    """NCCL at 1 GiB against the best bus bandwidth any size reaches with the same ranks."""
    rows = []
    for world, g in ok[ok["backend"] == "nccl"].groupby("world_size"):
        at = g[g["size_bytes"] == TARGET_SIZE_BYTES]
        best = g.loc[g["busbw_gbps"].idxmax()]
        row = {"world": int(world), "best_busbw": float(best["busbw_gbps"]),
               "best_size": human_bytes(best["size_bytes"])}
        if not at.empty:
            busbw = float(at["busbw_gbps"].iloc[0])
            row.update(busbw=busbw, fraction=busbw / row["best_busbw"],
                       ok=bool(busbw >= BUSBW_TARGET_FRACTION * row["best_busbw"]))
            nominal = at["nvlink_nominal_gbps"].iloc[0] if "nvlink_nominal_gbps" in at else None
            if nominal is not None and pd.notna(nominal) and nominal > 0:
                row.update(nominal=float(nominal), of_nominal=busbw / float(nominal))
        rows.append(row)
    return rows


def _compare_backends(ok: pd.DataFrame) -> dict:
    """NCCL against gloo at the largest size both measured with the same ranks; gloo across rank
    counts at the largest size they all measured."""
    out: dict = {}
    both = ok.pivot_table(index=["world_size", "size_bytes"], columns="backend", values="busbw_gbps")
    if {"nccl", "gloo"} <= set(both.columns):
        both = both.dropna()
        if not both.empty:
            world, size = both.index[-1]
            out["nccl_over_gloo"] = {"world": int(world), "size": human_bytes(size),
                                     "ratio": float(both.loc[(world, size), "nccl"] / both.loc[(world, size), "gloo"])}
    gloo = ok[ok["backend"] == "gloo"]
    if gloo["world_size"].nunique() > 1:
        worlds = gloo.groupby("size_bytes")["world_size"].nunique()
        size = max(worlds[worlds == worlds.max()].index)  # the largest size every rank count measured
        at = gloo[gloo["size_bytes"] == size].sort_values("world_size")
        busbw = list(at["busbw_gbps"])
        falls = all(b < a for a, b in zip(busbw, busbw[1:], strict=False))
        out["gloo_worlds"] = {"size": human_bytes(size), "falls": falls,
                              "points": [{"world": int(r["world_size"]), "busbw": float(r["busbw_gbps"]),
                                          "median_ms": float(r["median_ms"])} for _, r in at.iterrows()]}
    return out


def _allreduce_figure(ok: pd.DataFrame, out: Path, nominal: float | None) -> str:
    fig, (bw, tm) = figure(3.3, 1, 2)
    for i, ((backend, world), g) in enumerate(ok.groupby(["backend", "world_size"], sort=False)):
        g = g.sort_values("size_bytes")
        style = dict(marker="o" if backend == "nccl" else "s", ls="-" if backend == "nccl" else "--", color=f"C{i}",
                     label=f"{backend}, {world} ranks")
        bw.plot(g["size_bytes"], g["busbw_gbps"], **style)
        tm.plot(g["size_bytes"], g["median_ms"], **style)
    if nominal:
        bw.axhline(nominal, color="grey", ls=":", lw=1.2,
                   label="NVLink nominal: GPU 0's links summed, one direction")
    sizes = sorted(ok["size_bytes"].unique())
    for ax in (bw, tm):
        ax.set_xscale("log")
        ax.xaxis.set_major_locator(FixedLocator(sizes))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xticklabels([human_bytes(s) for s in sizes], rotation=30, ha="right")
        ax.set_xlabel("size per rank (fp32)")
    log_axis(bw, "y")
    log_axis(tm, "y")
    bw.set_ylabel("bus bandwidth (GB/s)")
    tm.set_ylabel("median time per call (ms)")
    handles, labels = bw.get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside lower center", ncol=min(3, len(labels)), frameon=False)
    return save_figure(fig, out, "allreduce_bandwidth")


# --- one profiled step of each variant ----------------------------------------------------------------

def trace(df: pd.DataFrame, out: Path) -> dict:
    ok = df[df.status == "ok"]
    if ok.empty:
        return {}
    ok = ok.assign(_v=ok["variant"].map(lambda v: TRACE_ORDER.index(v) if v in TRACE_ORDER else len(TRACE_ORDER)))
    rows, table, summaries, titles = [], [], [], []
    for _, r in ok.sort_values(["_v", "bucket_size_mb"]).iterrows():
        b = ddp_steps._mb(r.get("bucket_size_mb"))
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
    verdict = None
    if naive is not None and others:
        verdict = {"naive_share": naive["overlapped_share"],
                   "others": [{"label": r["label"], "share": r["overlapped_share"]} for r in others],
                   "separates": all(r["overlapped_share"] > naive["overlapped_share"] for r in others)}
    frame = pd.DataFrame(table)
    none_overlapped = all(r["overlapped_ms"] == 0 for r in rows)
    if none_overlapped:  # no variant ran any communication under compute: the text says so, no zero columns
        frame = frame.drop(columns=["under compute (ms)", "share under compute"])
    ctx = {"trace_rows": rows, "trace_verdict": verdict, "trace_none_overlapped": none_overlapped,
           "trace_table": save_table(frame, out, "ddp_trace_overlap", digits=2),
           "trace_settings": {"size": first["size"], "dtype": first["dtype"], "tool": first.get("tool"),
                              "context_length": int(first["context_length"]), "batch_size": int(first["batch_size"])}}
    if summaries:
        ctx["trace_figure"] = timeline_figure(summaries, titles, out)
        ctx["trace_settings"]["source"] = summaries[0].get("source")
    return ctx


def trace_against_benchmark(ctx: dict, frame: pd.DataFrame, out: Path) -> dict:
    """The profiled step beside the benchmark's steps of the same variant (size, dtype, bucket), and
    each trace's NCCL kernel time beside the time the all-reduce of the gradients needs at the measured
    bus bandwidth. A profiled step is one step with the profiler's per-operator cost on the host, so its
    span is not a step time; an NCCL kernel's time is its time resident on the GPU, waiting for the
    other rank and sharing the GPU with compute, so it is not a transfer time."""
    rows = ctx.get("trace_rows")
    settings = ctx.get("trace_settings")
    steps = frame[(frame.problem == "ddp_step") & (frame.status == "ok")] if not frame.empty else frame
    if not rows or steps.empty:
        return {}
    steps = steps[(steps["size"] == settings["size"]) & (steps["dtype"] == settings["dtype"])]
    ar = frame[(frame.problem == "allreduce") & (frame.status == "ok")]
    nccl = ar[ar.get("backend", pd.Series(index=ar.index, dtype=object)).fillna("") == "nccl"] if not ar.empty else ar
    nccl = nccl[nccl["world_size"] == nccl["world_size"].min()] if not nccl.empty else nccl  # the traced ranks: 2
    largest = nccl.sort_values("size_bytes").iloc[-1] if not nccl.empty else None
    busbw = float(largest["busbw_gbps"]) if largest is not None else None
    ranks = int(largest["world_size"]) if largest is not None else None
    table, facts = [], []
    for r in rows:
        same = steps[steps["variant"] == r["variant"]]
        if r["bucket_mb"] is not None:
            same = same[same["bucket_size_mb"] == r["bucket_mb"]]
        if same.empty:
            continue
        b = same.iloc[0]
        row = {"variant": r["label"], "profiled step (ms)": r["span_ms"],
               "benchmark step (ms)": f"{b['mean_ms']:.2f} ± {b['std_ms']:.2f}",
               "profiled / benchmark (×)": r["span_ms"] / b["mean_ms"], "NCCL kernels (ms)": r["comm_ms"]}
        fact = {"label": r["label"], "ratio": r["span_ms"] / b["mean_ms"], "comm_ms": r["comm_ms"],
                "grad_gib": float(b["grad_bytes"]) / 2**30}
        if busbw:
            # a ring all-reduce of S bytes over r ranks moves 2(r-1)/r S per rank: t = that / busbw
            bound = 2 * (ranks - 1) / ranks * float(b["grad_bytes"]) / (busbw * 1e9) * 1e3
            row["at the bus bandwidth (ms)"] = bound
            row["kernels / bound (×)"] = r["comm_ms"] / bound
            fact |= {"bound_ms": bound, "stretch": r["comm_ms"] / bound, "under_ms": r["overlapped_ms"]}
        table.append(row)
        facts.append(fact)
    if not table:
        return {}
    return {"trace_vs_bench_table": save_table(pd.DataFrame(table), out, "ddp_trace_vs_benchmark", digits=2),
            "trace_vs_bench": facts, "trace_busbw_gbps": busbw, "trace_busbw_ranks": ranks}


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


# --- machine time ---------------------------------------------------------------------------------------

def grid_time(tsvs: list[Path]) -> dict | None:
    """Wall time of every job of the section's experiments (benchmarks/<experiment>/<job>.tsv, or
    benchmarks/<experiment>.tsv for an experiment with one job)."""
    if not tsvs:
        return None
    by: dict[str, dict] = {}
    for p in sorted(tsvs):
        experiment = p.stem if p.parent.name == "benchmarks" else p.parent.name
        e = by.setdefault(experiment, {"experiment": experiment, "jobs": 0, "wall_s": 0.0, "cpu_only_s": 0.0})
        wall = read_benchmark_tsv(p)
        e["jobs"] += 1
        e["wall_s"] += wall
        if p.stem.startswith("gloo-"):  # gloo all-reduce jobs use the host's CPUs only
            e["cpu_only_s"] += wall
    total = sum(e["wall_s"] for e in by.values())
    cpu_only = sum(e["cpu_only_s"] for e in by.values())
    return {"experiments": list(by.values()), "total_s": total, "jobs": sum(e["jobs"] for e in by.values()),
            "cpu_only_s": cpu_only, "target_s": GRID_TARGET_S,
            "has_cpu_only": bool(cpu_only > 0), "ok": at_most(total, GRID_TARGET_S), "total_min": total / 60,
            "target_min": GRID_TARGET_S / 60}


def _summary(ctx: dict) -> list[dict]:
    """Page 1: NCCL's bus bandwidth, and our bucketed and overlap DDP against PyTorch's in each job."""
    rows = []
    for t in ctx.get("allreduce_targets") or []:
        if "busbw" in t:
            nominal = f", {100 * t['of_nominal']:.0f} % of NVLink's nominal" if "of_nominal" in t else ""
            rows.append({"part": f"NCCL all-reduce, {t['world']} GPUs", "target": None, "met": None,
                         "result": f"{t['busbw']:.0f} GB/s bus bandwidth at {ctx['allreduce_target_values']['size']}"
                                   + nominal, "ref": "ddp-allreduce-target"})
    limits = ctx.get("ddp_targets") or {}
    for j in ctx.get("ddp_jobs") or []:
        t = j.get("targets") or {}
        b, o = t.get("bucketed"), t.get("overlap")
        if not t.get("has_default") or not b or "ratio" not in b or not o:
            continue
        rows.append({"part": f"DDP against PyTorch's, {j['size']} {j['dtype']}",
                     "result": f"bucketed {b['ratio']:.3f}×, overlap {o['ratio']:.3f}× its step time",
                     "target": f"≤ {limits['bucketed_vs_torch']:.2f}× and ≤ {limits['overlap_vs_torch']:.2f}×",
                     "met": bool(b["ok"] and o["ok"]), "ref": "ddp-targets",
                     "why": None if b["ok"] and o["ok"] else "the step is bound by the host, whose hook and launch "
                            "work overlap and bucketing add; on one GPU its profile shows the copies out of the "
                            "buckets (notes/ddp_host_profile.md), which bucket views remove; their 2-GPU run waits"})
    return rows
