"""The ddp section's series "host" (problem 19's host overhead): gradients as bucket views beside ours and
PyTorch's DDP, and single-rank proxies, each job with its own baselines, shown apart from the grid's jobs."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd

from cs336sys.analysis.common import save_table
from cs336sys.analysis.ddp_steps import (
    HOST_SERIES,
    TORCH_DDP_DEFAULT_MB,
    VARIANT_ORDER,
    _point,
    _ratio,
    variant_key,
)
from cs336sys.analysis.formatting import fixed, mean_std
from cs336sys.analysis.rounds import ratio_cell

if TYPE_CHECKING:
    from cs336sys.analysis.ddp_context import DDPContext


def is_host(df: pd.DataFrame) -> pd.Series:
    """Which rows belong to the series "host" (their own jobs; kept out of `jobs`)."""
    if "series" not in df.columns:
        return pd.Series(False, index=df.index)
    return df["series"] == HOST_SERIES


def host_jobs(ctx: DDPContext, df: pd.DataFrame, out: Path) -> None:
    """Each "host" job (size, dtype, and 2 ranks or a single-rank proxy): every variant's step against
    PyTorch DDP's at its default bucket size and against `none`, all of the same job."""
    if df.empty:
        return
    proxy = df["single_rank_proxy"].fillna(False).astype(bool) if "single_rank_proxy" in df else False
    df = df.assign(_proxy=proxy)
    result = []
    for (size, dtype, is_proxy), g in df.groupby(["size", "dtype", "_proxy"], sort=True):
        points = [_point(r) for _, r in g.iterrows()]
        points.sort(key=lambda p: (VARIANT_ORDER.index(p["variant"]) if p["variant"] in VARIANT_ORDER else 99,
                                   p["bucket_mb"] or 0.0))
        by = {p["key"]: p for p in points if p["status"] == "ok"}
        default, none = by.get(variant_key("torch_ddp", TORCH_DDP_DEFAULT_MB)), by.get("none")
        rows, ratios = [], {}
        for p in points:
            if p["status"] != "ok":
                rows.append({"variant": p["label"], "step (ms)": p["status"]})
                continue
            r = _ratio(p, default) if p["variant"] != "torch_ddp" else None
            if r:
                ratios[p["key"]] = {k: r[k] for k in ("ratio", "lo", "hi", "rounds")}
            calls = "" if p.get("all_reduces") is None else (
                f"{p['all_reduces']}" + (f" ({p['in_backward']})" if p.get("in_backward") is not None else ""))
            rows.append({"variant": p["label"], "step (ms)": mean_std(p["mean_ms"], p["std_ms"], 1),
                         "× DDP default": ratio_cell(r),
                         "− none (ms)": "" if none is None or p is none else f"{p['mean_ms'] - none['mean_ms']:.1f}",
                         "wait (ms)": fixed(p.get("sync_wait_ms"), 1), "all-reduces (in bwd)": calls})
        ok = g[g.status == "ok"]
        world = int(ok["world_size"].iloc[0]) if not ok.empty else (1 if is_proxy else None)
        name = f"ddp_host_{size}_{dtype}_" + ("proxy1" if is_proxy else f"ws{world}")
        stamps = g["env.timestamp"].dropna() if "env.timestamp" in g else pd.Series(dtype=object)
        result.append({"size": size, "dtype": dtype, "proxy": bool(is_proxy), "world_size": world,
                       "ratios": ratios, "dates": sorted({str(t)[:10] for t in stamps}),
                       "none_ms": none["mean_ms"] if none is not None else None,
                       "table": save_table(pd.DataFrame(rows), out, name, digits=2)}
                      | ({"views": views} if (views := fastest_views(by, default)) else {}))
    ctx.ddp_host_jobs = result


def fastest_views(by: dict[str, dict], default: dict | None) -> dict | None:
    """The fastest bucket-view point of a host job over PyTorch DDP's default in the same job, with our
    bucketed wrapper at the same bucket size and overlap beside it where they ran."""
    views = [p for p in by.values() if p["variant"] == "bucket_view"]
    if default is None or not views:
        return None
    best = min(views, key=lambda p: p["mean_ms"])
    out = {"bucket_mb": best["bucket_mb"], "ratio": best["mean_ms"] / default["mean_ms"]}
    bucketed = by.get(variant_key("bucketed", best["bucket_mb"]))
    if bucketed is not None:
        out["bucketed_ratio"] = bucketed["mean_ms"] / default["mean_ms"]
    if "overlap" in by:
        out["overlap_ratio"] = by["overlap"]["mean_ms"] / default["mean_ms"]
    return out


