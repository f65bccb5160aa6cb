"""The DDP step benchmarks' bucket sweep against the overhead model (`cs336sys.analysis.ddp_model`): the
model fitted to the step's excess over the no-communication step and to the wait after the backward,
the best bucket sizes it predicts against the measured best, and the optimum from the all-reduce fit."""

from __future__ import annotations

import math

import pandas as pd

from cs336sys.analysis.ddp_model import Fit, fit_bucket_model, optimal_bucket_bytes
from cs336sys.units import MIB

FIT_R2_GOOD = 0.9  # below this (or with no spare degree of freedom) the report calls the fit poor


def bucket_model(by: dict, grad_bytes: int, allreduce_fit: dict | None) -> dict | None:
    """Fit T = n_b·o + (s/n_b)/w to the bucketed sweep, twice: to the step's excess over `none` (what
    communication costs the step) and to the wait after the backward (the time the model describes);
    predicted best bucket sizes against the measured best."""
    none = by.get("none")
    pts = sorted((p for p in by.values() if p["variant"] == "bucketed"), key=lambda p: p["bucket_mb"])
    if none is None or len(pts) < 2:
        return None
    s = float(grad_bytes)
    n_b = [p["all_reduces"] if p.get("all_reduces") else max(1, math.ceil(s / (p["bucket_mb"] * MIB))) for p in pts]
    # one all-reduce per gradient tensor (naive, overlap): the most buckets there can be
    n_max = max([n for n in (by.get(k, {}).get("all_reduces") for k in ("naive", "overlap")) if n] + n_b)
    measured_best = min(pts, key=lambda p: p["mean_ms"])["bucket_mb"]
    frame = pd.DataFrame({"bucket (MiB)": [f"{p['bucket_mb']:g}" for p in pts], "all-reduces": n_b})
    fits = {}
    series = {"step": [(p["mean_ms"] - none["mean_ms"]) / 1e3 for p in pts]}
    if all(p.get("sync_wait_ms") is not None for p in pts):
        series["wait"] = [p["sync_wait_ms"] / 1e3 for p in pts]
    for name, y in series.items():
        f = fit_bucket_model(n_b, s, y)
        fits[name] = _describe_fit(f, s, n_max, pts, measured_best)
        head = "Δ step" if name == "step" else "wait"
        frame[f"{head} (ms)"] = [v * 1e3 for v in y]
        if any(abs(v) > 1e-12 for v in f.predicted_s):  # a fit of zero cost (o = 0, 1/w = 0) has no column
            frame[f"{head} fit (ms)"] = [v * 1e3 for v in f.predicted_s]
        if any(fits[name]["residuals_ms"]):  # an exact fit (as many points as constants) has none to show
            frame[f"{head} resid. (ms)"] = fits[name]["residuals_ms"]
    model = {"grad_bytes": grad_bytes, "points": len(pts), "measured_best_mb": measured_best, "fits": fits,
             "n_max": n_max, "smallest_bucket_mb": s / n_max / MIB,
             "frame": frame}
    if allreduce_fit is not None:
        # inv_w 0: the sweep's times did not grow with size. Without an optimum, no bandwidth term
        # makes one bucket best, no fixed cost one all-reduce per tensor.
        inv_w = allreduce_fit.get("inv_w", 0.0)
        b = optimal_bucket_bytes(s, allreduce_fit["o_s"], 1 / inv_w if inv_w > 0 else math.inf)
        has_optimum = math.isfinite(b) and b > 0
        model["from_allreduce"] = {"o_us": allreduce_fit["o_s"] * 1e6, "w_gbps": 1e-9 / inv_w if inv_w > 0 else None,
                                   "b_star_mb": b / MIB if has_optimum else None,
                                   "nearest_measured_mb": _nearest(pts, b) if has_optimum else None,
                                   "best_without_optimum": None if has_optimum else
                                   ("one bucket" if b == math.inf else "one all-reduce per tensor")}
    return model


def _zero(x: float) -> float:
    """Rounding noise of an exact fit prints as 0.00, not -0.00."""
    return 0.0 if abs(x) < 1e-9 else x


def _nearest(pts: list[dict], b_bytes: float) -> float | None:
    """The measured bucket size nearest (in ratio) to `b_bytes`; None where there is no optimum."""
    if not math.isfinite(b_bytes) or b_bytes <= 0:
        return None
    return min(pts, key=lambda p: abs(math.log(p["bucket_mb"] * MIB / b_bytes)))["bucket_mb"]


def _describe_fit(f: Fit, s: float, n_max: int, pts: list[dict], measured_best: float) -> dict:
    """A fit's constants and quality, its optimal bucket size (and where that falls), the bucket it predicts
    best against the measured best, its residuals and predictions in ms."""
    d = f.as_dict()
    b = optimal_bucket_bytes(s, f.o_s, f.w_bytes_per_s)
    d["b_star_mb"] = b / MIB if math.isfinite(b) and b > 0 else None
    d["b_star_unbounded"] = not math.isfinite(b) or b <= 0  # o = 0 or 1/w = 0: no interior optimum
    # the term whose absence leaves no optimum (no fixed cost: more buckets never cost more)
    d["no_optimum_for_lack_of"] = ("fixed cost" if f.o_s <= 0 else "bandwidth term") if d["b_star_unbounded"] else None
    d["b_star_is_all"] = bool(math.isfinite(b) and b >= s)  # one bucket: as flat, but launched in backward
    d["b_star_below_tensor"] = bool(0 < b < s / n_max)  # finer than the tensors: one all-reduce per tensor
    pred = f.predicted_s
    d["predicted_best_mb"] = pts[min(range(len(pts)), key=pred.__getitem__)]["bucket_mb"]
    d["agrees"] = d["predicted_best_mb"] == measured_best
    d["max_abs_residual_ms"] = max(abs(r) for r in f.residuals_s) * 1e3
    d["good"] = bool(f.dof > 0 and f.r2 is not None and f.r2 >= FIT_R2_GOOD)
    d["worse_than_the_mean"] = bool(f.r2 is not None and f.r2 < 0)  # the times' mean predicts them better
    d["residuals_ms"] = [_zero(r * 1e3) for r in f.residuals_s]
    d["predicted_ms"] = [v * 1e3 for v in f.predicted_s]
    return d
