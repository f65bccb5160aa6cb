"""Section: ddp — the all-reduce benchmark (problem 12), the DDP variants' training steps against no
communication and PyTorch's DDP (14, 15, 17a, 19a; `ddp_steps`), the bucket overhead model and its fit
(19b; `ddp_model`), one profiled step of naive, overlapped and bucketed DDP drawn on one time axis
(17b), and the grid's machine time from Snakemake's timing records."""

from __future__ import annotations

import math
import re
from pathlib import Path

import pandas as pd
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
from cs336sys.analysis.ddp_context import DDPContext
from cs336sys.analysis.ddp_host import host_jobs, is_host
from cs336sys.analysis.ddp_model import fit_latency_bandwidth, formulas
from cs336sys.analysis.ddp_scaling import scaling
from cs336sys.analysis.ddp_sweep import sweep_figure, sweep_table
from cs336sys.analysis.ddp_trace import trace, trace_against_benchmark
from cs336sys.analysis.formatting import human_bytes
from cs336sys.analysis.rounds import CLOCK_TOLERANCE_MHZ, with_rounds_pooled
from cs336sys.analysis.verdicts import all_of, at_most

TARGET_SIZE_BYTES = 2**30  # the all-reduce target's size: 1 GiB per rank
BUSBW_TARGET_FRACTION = 0.9  # ... reaching this share of the best bus bandwidth any size reaches
GRID_TARGET_S = 600.0  # the whole DDP grid's machine time
ALLREDUCE_REFERENCE_SHARE = 0.95  # NCCL's bus bandwidth at 1 GiB within 5 % of NCCL measured alone
MIN_ROUNDS = 3  # a ratio the summary judges comes from a job of at least this many interleaved rounds
BACKEND_ORDER = ["nccl", "gloo"]


def build(paths: list[Path], out: Path, allreduce_reference: dict | None = None, pending: list[str] | None = None,
          **_: object) -> DDPContext:
    """The section's context: the all-reduce benchmark, the DDP steps, the traced steps, the grid's machine
    time and the summary."""
    frame = results_frame(paths)
    ctx = DDPContext(env=environment_summary(frame), model_formulas=formulas(), clock_tolerance_mhz=CLOCK_TOLERANCE_MHZ,
                     min_rounds=MIN_ROUNDS)
    if allreduce_reference:
        ctx.allreduce_reference = {str(k): float(v) for k, v in allreduce_reference["busbw_gbps"].items()}
        ctx.allreduce_reference_source = allreduce_reference["source"]
        ctx.allreduce_reference_share = ALLREDUCE_REFERENCE_SHARE
    gloo_environment(ctx, frame)
    if not frame.empty:
        allreduce(ctx, frame[frame.problem == "allreduce"], out)
        _against_reference(ctx)
        frame = with_rounds_pooled(frame)  # each DDP variant's interleaved rounds in one row (analysis.rounds)
        steps = frame[frame.problem == "ddp_step"]
        host = is_host(steps)  # the host-overhead jobs: shown apart, never mixed into the grid's
        ddp_steps.jobs(ctx, steps[~host], out, ctx.allreduce_fits)
        host_jobs(ctx, steps[host], out)
        if ctx.ddp_jobs:
            ctx.ddp_figure = sweep_figure(ctx.ddp_jobs, out)  # None where no job has a bucketed point
            ctx.ddp_bucket_table = sweep_table(ctx.ddp_jobs, out)
        _views_for_missed(ctx)
        busbw = {t["world"]: t.get("busbw", t["best_busbw"]) for t in ctx.allreduce_targets or []}
        ctx.ddp_scaling = scaling(ctx.ddp_jobs or [], busbw, out) or None
        trace(ctx, frame[frame.problem == "ddp_trace"], out)
        trace_against_benchmark(ctx, frame.drop(index=steps.index[host]), out)
    ctx.grid_time = grid_time([p for p in paths if p.suffix == ".tsv"])
    ctx.summary = _summary(ctx)
    missing = (ctx.allreduce_nccl_worlds or {}).get("missing")
    unrun = ([f"the NCCL all-reduce at {' and '.join(str(n) for n in missing)} GPUs"] if missing else []) + (
        [f"DDP {_by_world(pending)} (overlay `next`)"] if pending else [])  # config: ddp.pending
    ctx.limitations = [f"Not run (no host with the GPUs lent): {'; '.join(unrun)}."] if unrun else []
    return ctx


def _against_reference(ctx: DDPContext) -> None:
    """Each rank count's bus bandwidth at 1 GiB against NCCL measured alone (the all-reduce target)."""
    for t in ctx.allreduce_targets or []:
        ref = (ctx.allreduce_reference or {}).get(str(t["world"]))
        if ref and "busbw" in t:
            t.update(reference=ref, of_reference=t["busbw"] / ref,
                     reference_ok=bool(t["busbw"] >= ALLREDUCE_REFERENCE_SHARE * ref))


def _views_for_missed(ctx: DDPContext) -> None:
    """A grid job that misses a target gets the bucket views' result of its own 2-rank host job (same
    size and dtype), which the section and the summary quote."""
    views = {(h["size"], h["dtype"]): h["views"]
             for h in ctx.ddp_host_jobs or [] if not h["proxy"] and (h["world_size"] or 0) > 1 and "views" in h}
    for j in ctx.ddp_jobs or []:
        if j.get("missed") and (j["size"], j["dtype"]) in views:
            j["missed"]["views"] = views[j["size"], j["dtype"]]


def _views_said(v: dict | None) -> str:
    """The bucket views' 2-rank result in words, or that it has not run."""
    if v is None:
        return "their 2-GPU run has not been made"
    said = f"in their own 2-rank job they take {v['ratio']:.3f}× PyTorch's step at {v['bucket_mb']:g} MiB"
    if "bucketed_ratio" in v:
        said += f" (our bucketed wrapper {v['bucketed_ratio']:.3f}×)"
    return said


def gloo_environment(ctx: DDPContext, frame: pd.DataFrame) -> None:
    """gloo all-reduce points need only CPUs and may come from another host than the GPU points:
    when the section holds both, the section's environment line describes the GPU points and the
    gloo points get their own, with the host's core count (more ranks than cores take turns)."""
    if frame.empty or "device" not in frame:
        return
    is_gloo = (frame["problem"] == "allreduce") & (frame["device"] == "cpu")
    if not is_gloo.any() or is_gloo.all():
        return
    gloo = frame[is_gloo]
    cores = sorted({int(c) for c in gloo.get("env.cpu_count", pd.Series(dtype=float)).dropna()})
    worlds = pd.concat([gloo[c] for c in ("world_size", "env.world_size") if c in gloo]).dropna().astype(int)
    max_world = int(worlds.max()) if not worlds.empty else None
    env = environment_summary(gloo)
    cpus = sorted({str(c) for c in gloo.get("env.cpu", pd.Series(dtype=object)).dropna()})
    host_gpus = env["device"] if env["is_gpu"] else None
    env.update(device=f"CPU ({', '.join(cpus) or 'unknown'})", host_gpus=host_gpus, cores=cores, max_world=max_world,
               oversubscribed=bool(cores and max_world is not None and max_world > min(cores)))
    ctx.env, ctx.gloo_env = environment_summary(frame[~is_gloo]), env


# --- all-reduce -------------------------------------------------------------------------------------

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


def allreduce(ctx: DDPContext, df: pd.DataFrame, out: Path) -> None:
    """(12) The all-reduce benchmark: its table, figure, bus bandwidth targets and latency-bandwidth fits."""
    if df.empty:
        return
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
    ctx.allreduce_table = save_table(pd.DataFrame(rows), out, "allreduce", digits=3)
    ctx.allreduce_busbw_factor = "2(r-1)/r"  # no fraction in running text
    if ok.empty:
        return
    nominal = ok["nvlink_nominal_gbps"].dropna() if "nvlink_nominal_gbps" in ok else pd.Series(dtype=float)
    ctx.allreduce_nominal_gbps = float(nominal.iloc[0]) if not nominal.empty and nominal.iloc[0] > 0 else None
    ctx.allreduce_calls = int(ok["iters"].min()) if "iters" in ok else None
    ctx.allreduce_warmup = int(ok["warmup"].min()) if "warmup" in ok else None
    ctx.allreduce_figure = _allreduce_figure(ok, out, ctx.allreduce_nominal_gbps)
    ctx.allreduce_targets = _busbw_targets(ok)
    ctx.allreduce_target_values = {"fraction": BUSBW_TARGET_FRACTION, "size": human_bytes(TARGET_SIZE_BYTES)}
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
    ctx.allreduce_fits = fits
    ctx.allreduce_fit_table = save_table(pd.DataFrame(fit_rows), out, "allreduce_latency_bandwidth", digits=1)
    ctx.allreduce_facts = facts
    ctx.allreduce_all_grow = all(f["grows"] for f in facts)
    flat = [f"{f['backend']} with {f['world']} ranks" for f in facts if not f["grows"]]
    ctx.allreduce_flat_curves = {"labels": flat, "verb": "does" if len(flat) == 1 else "do"}
    worlds = {b: sorted(int(w) for w in g["world_size"].unique()) for b, g in ok.groupby("backend")}
    if "nccl" in worlds:  # the handout's rank counts NCCL could not run: one GPU per rank
        missing = sorted(set(worlds.get("gloo", [])) - set(worlds["nccl"]))
        ctx.allreduce_nccl_worlds = {"measured": worlds["nccl"], "missing": missing}
    ctx.allreduce_compare = _compare_backends(ok)


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


def _summary(ctx: DDPContext) -> list[dict]:
    """Page 1, two rows: NCCL's bus bandwidth at each rank count against NCCL measured alone on the same
    kind of host, and our bucketed DDP against PyTorch's in the jobs measured in interleaved rounds (one
    verdict over them: met only if every job's range of per-round ratios is within the target)."""
    rows = []
    measured = [t for t in ctx.allreduce_targets or [] if "busbw" in t]
    if measured:
        refs = ctx.allreduce_reference or {}
        ts = sorted(measured, key=lambda t: -t["world"])
        said = ", ".join(f"{t['busbw']:.0f} GB/s ({t['world']} GPUs)" for t in ts)
        shares = [t["of_reference"] for t in ts if "of_reference" in t]
        if shares:
            said += ": " + " and ".join(f"{100 * x:.0f} %" for x in shares) + " of NCCL alone"
        rows.append({"part": f"NCCL all-reduce, bus bandwidth at {ctx.allreduce_target_values['size']}",
                     "result": said, "target": f"≥ {100 * ALLREDUCE_REFERENCE_SHARE:.0f} % of NCCL alone" if refs
                     else None, "met": all_of([t.get("reference_ok") for t in ts]) if refs else None,
                     "ref": "ddp-allreduce-target"})
    limits = ctx.ddp_targets or {}
    judged = [j for j in ctx.ddp_jobs or [] if j["rounds"] >= MIN_ROUNDS and "ok" in j["targets"].get("bucketed", {})]
    if judged:
        parts = [f"{j['targets']['bucketed']['ratio']:.2f}× ({j['size']} {j['dtype']}, {j['world_size']} GPUs)"
                 for j in judged]
        parts.append(f"slowest round {max(j['targets']['bucketed']['hi'] for j in judged):.2f}×")
        met = all_of([j["targets"]["bucketed"]["ok"] for j in judged])
        missed = next((j for j in judged if j["targets"]["bucketed"]["ok"] is False), None)
        rows.append({"part": f"Bucketed DDP against PyTorch's DDP ({judged[0]['rounds']} rounds)",
                     "result": "; ".join(parts), "target": f"≤ {limits['bucketed_vs_torch']:.2f}× its step",
                     "met": met, "ref": "ddp-targets",
                     "why": None if missed is None else "the step is bound by the host, whose hook and launch work "
                            "bucketing adds; bucket views remove the copies out of the buckets: "
                            + _views_said((missed.get("missed") or {}).get("views"))})
    # Past the summary's quota (report.SUMMARY_ROWS): the conclusions count it with the targets, the summary
    # page does not show it. The overlap target is the section's as much as the bucketed one is.
    overlapped = [j for j in judged if "ok" in j["targets"].get("overlap", {})]
    if overlapped:
        ratios = [j["targets"]["overlap"]["ratio"] for j in overlapped]
        jobs = ", ".join(f"{j['size']} {j['dtype']} {j['world_size']} GPUs" for j in overlapped)
        parts = [f"{min(ratios):.2f}–{max(ratios):.2f}× ({jobs})",
                 f"fastest round {min(j['targets']['overlap']['lo'] for j in overlapped):.2f}×"]
        met = all_of([j["targets"]["overlap"]["ok"] for j in overlapped])
        rows.append({"part": f"Overlapped DDP (a collective per tensor) against PyTorch's DDP "
                             f"({overlapped[0]['rounds']} rounds)",
                     "result": "; ".join(parts), "target": f"≤ {limits['overlap_vs_torch']:.2f}× its step",
                     "met": met, "ref": "ddp-targets",
                     "why": None if met is not False else "a hook and a collective per tensor add host work to a "
                            "host-bound step"})
    return rows


def _by_world(jobs: list[str]) -> str:
    """Pending DDP jobs grouped by world size: "at 4 ranks (2.7B-fp32, xl-fp32) and 6 ranks (...)"; a name
    without a world size (a 2-rank job of one round) is listed as it is."""
    groups: dict[int, list[str]] = {}
    plain = []
    for job in sorted(jobs):
        m = re.fullmatch(r"(.+)-ws(\d+)", job)
        if m:
            groups.setdefault(int(m.group(2)), []).append(m.group(1))
        else:
            plain.append(job)
    said = [f"{w} ranks ({', '.join(names)})" for w, names in sorted(groups.items())]
    parts = ([f"jobs {', '.join(plain)}"] if plain else []) + ([f"at {' and '.join(said)}"] if said else [])
    return " and ".join(parts)
