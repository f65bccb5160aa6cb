"""The ddp section's all-reduce benchmark (problem 12): every point's table, the bus bandwidth against size
drawn per backend and rank count, the latency-bandwidth fit of each curve and what it says of the curve's
shape, NCCL against gloo and gloo across rank counts, and NCCL's bus bandwidth at 1 GiB against its targets
(the best any size reaches, and NCCL alone as measured outside the pipeline, a figure the configuration
records); the gloo points' environment line where they come from a CPU-only host."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd
from matplotlib.ticker import FixedLocator, NullLocator

from cs336sys.analysis.common import environment_summary, figure, log_axis, rises, save_figure, save_table
from cs336sys.analysis.ddp_model import fit_latency_bandwidth
from cs336sys.analysis.formatting import human_bytes, significant

if TYPE_CHECKING:
    from cs336sys.analysis.ddp_context import DDPContext

TARGET_SIZE_BYTES = 2**30  # the all-reduce target's size: 1 GiB per rank
BUSBW_TARGET_FRACTION = 0.9  # ... reaching this share of the best bus bandwidth any size reaches
ALLREDUCE_REFERENCE_SHARE = 0.95  # NCCL's bus bandwidth at 1 GiB within 5 % of NCCL measured alone
BACKEND_ORDER = ["nccl", "gloo"]
LATENCY_BOUND_SHARE = 0.5  # a sweep's smallest call is "mostly fixed cost" where the fit's o is this share of it


def against_reference(ctx: DDPContext) -> None:
    """Each rank count's bus bandwidth at 1 GiB against NCCL measured alone (the all-reduce target)."""
    for t in ctx.allreduce_targets or []:
        ref = (ctx.allreduce_reference or {}).get(str(t["world"]))
        if ref and "busbw" in t:
            t.update(reference=ref, of_reference=t["busbw"] / ref,
                     reference_ok=bool(t["busbw"] >= ALLREDUCE_REFERENCE_SHARE * ref))


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
        rows.append(row | {"median (ms)": significant(r["median_ms"]),
                           "min–max (ms)": f"{significant(r['min_ms'])}–{significant(r['max_ms'])}",
                           "calls": len(r["times_ms"]) if isinstance(r.get("times_ms"), list) else None,
                           "algbw (GB/s)": significant(r["algbw_gbps"]), "busbw (GB/s)": significant(r["busbw_gbps"])})
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
        facts.append(_curve(backend, int(world), g, o))
    ctx.allreduce_fits = fits
    ctx.allreduce_fit_table = save_table(pd.DataFrame(fit_rows), out, "allreduce_latency_bandwidth", digits=1)
    ctx.allreduce_facts = facts
    ctx.allreduce_shape = _shape(facts)
    worlds = {b: sorted(int(w) for w in g["world_size"].unique()) for b, g in ok.groupby("backend")}
    if "nccl" in worlds:  # the handout's rank counts NCCL could not run: one GPU per rank
        missing = sorted(set(worlds.get("gloo", [])) - set(worlds["nccl"]))
        ctx.allreduce_nccl_worlds = {"measured": worlds["nccl"], "missing": missing}
    ctx.allreduce_compare = _compare_backends(ok, other_host=bool(ctx.gloo_env and not ctx.gloo_env["host_gpus"]))


def _curve(backend: str, world: int, g: pd.DataFrame, o_s: float) -> dict:
    """One backend's and rank count's sweep, sizes ascending: its bus bandwidth at each size, whether it rises
    at every step in size, and the share of the smallest size's median time that the fit's fixed cost `o_s`
    explains (the latency a small all-reduce costs, where the fit finds one)."""
    small, large = g.iloc[0], g.iloc[-1]
    busbw = [float(b) for b in g["busbw_gbps"]]
    return {"backend": backend, "world": world, "label": f"{backend} with {world} ranks",
            "small": human_bytes(small["size_bytes"]), "large": human_bytes(large["size_bytes"]),
            "small_busbw": busbw[0], "large_busbw": busbw[-1], "best_busbw": max(busbw), "busbw": busbw,
            "small_ms": float(small["median_ms"]), "large_ms": float(large["median_ms"]),
            "rises": rises(busbw),
            "o_share": o_s * 1e3 / float(small["median_ms"]) if small["median_ms"] > 0 else None}


def _shape(facts: list[dict]) -> dict:
    """The curves by shape, for the prose: those whose bus bandwidth rises at every step in size, those that
    do not (with their bus bandwidths), and by what the fit t = o + size/w says of the smallest size: mostly
    its fixed cost (o at least `LATENCY_BOUND_SHARE` of its time), no fixed cost at all, or some."""
    def share(f: dict) -> float:
        return f["o_share"] or 0.0
    return {"rising": [f["label"] for f in facts if f["rises"]],
            "not_rising": [{"label": f["label"], "busbw": f["busbw"]} for f in facts if not f["rises"]],
            "latency_bound": [f["label"] for f in facts if share(f) >= LATENCY_BOUND_SHARE],
            "no_fixed_cost": [f["label"] for f in facts if share(f) <= 0.0],
            "some_fixed_cost": [f["label"] for f in facts if 0.0 < share(f) < LATENCY_BOUND_SHARE]}


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


def _compare_backends(ok: pd.DataFrame, other_host: bool = False) -> dict:
    """NCCL against gloo at the largest size both measured with the same ranks (`other_host`: gloo ran on
    another host than NCCL, so the ratio compares the hosts as much as the backends, and it is rounded to two
    significant digits, "rounded", as befits a comparison of two machines); gloo across rank counts at the
    largest size they all measured."""
    out: dict = {}
    both = ok.pivot_table(index=["world_size", "size_bytes"], columns="backend", values="busbw_gbps")
    if {"nccl", "gloo"} <= set(both.columns):
        both = both.dropna()
        if not both.empty:
            world, size = both.index[-1]
            ratio = float(both.loc[(world, size), "nccl"] / both.loc[(world, size), "gloo"])
            out["nccl_over_gloo"] = {"world": int(world), "size": human_bytes(size), "ratio": ratio,
                                     "rounded": float(f"{ratio:.2g}"), "other_host": other_host}
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
