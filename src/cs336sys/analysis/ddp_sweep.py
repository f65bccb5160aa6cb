"""The ddp section's bucket sweep (problem 19a): each job's step time against bucket size as a table and a
figure, with the overhead model's fit drawn over it (`ddp_buckets`, `ddp_model`)."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd
from matplotlib.ticker import FixedLocator, NullLocator

from cs336sys.analysis.common import figure, log_axis, save_figure, save_table
from cs336sys.analysis.ddp_model import exposed_time
from cs336sys.analysis.ddp_steps import LINE_STYLE, TORCH_DDP_DEFAULT_MB, variant_key
from cs336sys.units import MIB


def sweep_table(jobs: list[dict], out: Path) -> str | None:
    """(19a, the handout's table) Each job's mean step (ms) at each bucket size, then flat's (one bucket of every
    gradient: the sweep's limit past its largest size) and PyTorch DDP's at its default, the fastest size in
    bold; None where no job has a bucketed point."""
    rows = []
    for j in jobs:
        bucketed = sorted((p for p in j["variants"].values() if p["variant"] == "bucketed"),
                          key=lambda p: p["bucket_mb"])
        if not bucketed:
            continue
        ok = [p for p in bucketed if p["status"] == "ok"]
        best = min(ok, key=lambda p: p["mean_ms"]) if ok else None
        row = {"job": j["label"], "rounds": j["rounds"]}
        for p in bucketed:
            cell = f"{p['mean_ms']:.1f}" if p["status"] == "ok" else p["status"]
            row[p["bucket_mb"]] = f"**{cell}**" if p is best else cell
        flat = j["variants"].get("flat")
        row["one bucket (flat)"] = f"{flat['mean_ms']:.1f}" if flat and flat["status"] == "ok" else ""
        default = j["variants"].get(variant_key("torch_ddp", TORCH_DDP_DEFAULT_MB))
        row["PyTorch DDP"] = f"{default['mean_ms']:.1f}" if default and default["status"] == "ok" else ""
        rows.append(row)
    if not rows:
        return None
    sizes = sorted({k for r in rows for k in r if isinstance(k, float)})
    frame = pd.DataFrame(rows)[["job", "rounds", *sizes, "one bucket (flat)", "PyTorch DDP"]].fillna("")
    return save_table(frame.rename(columns={b: f"{b:g} MiB" for b in sizes}), out, "ddp_bucket_sweep", digits=1)


def sweep_figure(result: list[dict], out: Path) -> str | None:
    panels = [j for j in result
              if any(p["variant"] == "bucketed" and p["status"] == "ok" for p in j["variants"].values())]
    if not panels:
        return None
    ncols = min(2, len(panels))
    nrows = -(-len(panels) // ncols)
    fig, axes = figure(0.7 + 2.5 * nrows, nrows, ncols, squeeze=False)
    for ax, j in zip(axes.flat, panels, strict=False):
        ok = [p for p in j["variants"].values() if p["status"] == "ok"]
        bucketed = sorted((p for p in ok if p["variant"] == "bucketed"), key=lambda p: p["bucket_mb"])
        xs = [p["bucket_mb"] for p in bucketed]
        ax.errorbar(xs, [p["mean_ms"] for p in bucketed], yerr=[p["std_ms"] for p in bucketed], marker="o",
                    color="C0", capsize=2, label="bucketed (ours)", zorder=4)
        torch_pts = sorted((p for p in ok if p["variant"] == "torch_ddp"), key=lambda p: p["bucket_mb"] or 0)
        if torch_pts:
            ax.plot([p["bucket_mb"] or TORCH_DDP_DEFAULT_MB for p in torch_pts], [p["mean_ms"] for p in torch_pts],
                    marker="s", ls="none", color=LINE_STYLE["torch_ddp"][0], label="PyTorch DDP at its bucket size",
                    zorder=5)
        for p in ok:
            if p["variant"] in ("none", "naive", "flat", "overlap") or p["key"] == variant_key("torch_ddp", None):
                color, ls = LINE_STYLE[p["variant"]]
                label = "PyTorch DDP, default" if p["variant"] == "torch_ddp" else p["label"]
                ax.axhline(p["mean_ms"], color=color, ls=ls, lw=1.1, label=label)
        model, none = j.get("model"), j["variants"].get("none")
        if model and none and none["status"] == "ok":
            f = model["fits"]["step"]
            grid = [xs[0] * (xs[-1] / xs[0]) ** (i / 60) for i in range(61)]
            w = 1 / f["inv_w"] if f["inv_w"] > 0 else math.inf
            ax.plot(grid, [none["mean_ms"] + 1e3 * exposed_time(j["grad_bytes"], b * MIB, f["o_s"], w, model["n_max"])
                           for b in grid], color="C0", ls=":", lw=1.0, label=r"model fit: none + $n\,o + s/(n\,w)$")
            ax.plot(xs, [none["mean_ms"] + v for v in f["predicted_ms"]], ls="none", marker="x", color="C0",
                    label=r"model at the measured $n$", zorder=5)
        log_axis(ax, "x")
        # ticks at the measured bucket sizes only (1-2-5 ticks crowd at a half-width panel's right end)
        ticks = sorted(set(xs) | {p["bucket_mb"] or TORCH_DDP_DEFAULT_MB for p in torch_pts})
        ax.xaxis.set_major_locator(FixedLocator(ticks))
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xlabel("bucket size (MiB)")
        ax.set_ylabel("step (ms)")
        ax.set_title(f"{j['size']}, {j['dtype']}, {j['world_size']} ranks")
    for ax in axes.flat[len(panels):]:
        ax.set_visible(False)
    handles: dict = {}
    for ax in axes.flat[:len(panels)]:
        for h, lab in zip(*ax.get_legend_handles_labels(), strict=True):
            handles.setdefault(lab, h)
    first = ["bucketed (ours)", "model fit", "model at", "PyTorch DDP at", "PyTorch DDP, default", "overlap", "flat",
             "naive", "none"]
    labels = sorted(handles, key=lambda lab: next((i for i, f in enumerate(first) if lab.startswith(f)), len(first)))
    fig.legend([handles[lab] for lab in labels], labels, loc="outside lower center", ncol=3, frameon=False)
    return save_figure(fig, out, "ddp_step_vs_bucket")
