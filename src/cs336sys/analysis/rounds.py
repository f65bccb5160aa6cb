"""Interleaved rounds: a comparison job runs each of its variants once a round, the rounds one after
another (A B C, A B C, A B C), each point a result with its `round`. A drift of the machine then falls on
every variant alike, and the rounds say how far a ratio of two variants moves from one round to the next.

- `pool_rounds` makes one row of a variant's rounds: its timed steps pooled (mean, standard deviation,
  median, extremes over every step), the mean of each round in round order (`round_ms`), the number of
  rounds, and the SM clock of each round (`round_clock_mhz`) with the lowest and highest any rank ran at.
  A variant that failed in any round keeps that round's status.
- `paired_ratio` divides one variant's time by another's of the same job: the ratio of their pooled means
  (a weighted mean of the rounds' ratios, so it lies within their range), and the range of the ratios
  round by round: the two ran minutes apart in each round, so the range is the comparison's own noise.
  A job of one round has no such range; its ratio gets the steps' standard error instead (two of them
  each way), which hides drifts between points and is named as such where it is shown.
- `held_out_choice` picks the fastest of several variants on some rounds and judges it on the others.
- `verdicts.against_limit` turns the range into met, missed or within noise.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path

import pandas as pd

from cs336sys.analysis.formatting import number

ROUND = "round"
# the settings that name a distributed point within its job (DDP, optimizer sharding, FSDP): its rounds are
# pooled over everything else
POINT_SETTINGS = ["size", "dtype", "compute_dtype", "variant", "bucket_size_mb", "unit", "series", "single_rank_proxy",
                  "context_length", "batch_size"]
ROUNDED = ("ddp_step", "sharding_memory", "fsdp_step")  # the experiments whose jobs run in rounds
STEP_LISTS = ("step_ms", "sync_wait_step_ms")  # per-step lists pooled across rounds
PEAKS = "peak"  # columns whose name holds this keep the highest round's value (memory)
CLOCK_TOLERANCE_MHZ = 30.0  # two variants' median SM clocks further apart than this are said to differ


def _job(path: str) -> str:
    """The job a result belongs to: its folder under results/<experiment>/."""
    return Path(path).parent.name


def _settings_key(row: pd.Series, settings: list[str]) -> tuple:
    return tuple(_hashable(row.get(c)) for c in settings)


def _hashable(v):
    if isinstance(v, list):
        return tuple(v)
    if isinstance(v, float) and math.isnan(v):
        return None
    return v


def pool_rounds(frame: pd.DataFrame, settings: list[str]) -> pd.DataFrame:
    """One row per (experiment, job, point less its round): the rounds of each point pooled. `settings` are
    the columns that name a point within its job (its variant, bucket size, dtype, ...). Rows without a
    `round` are one-round points and pass through with `rounds` 1 and `round_ms` their mean."""
    if frame.empty:
        return frame
    frame = frame.assign(_job=frame["path"].map(_job), _key=[_settings_key(r, settings) for _, r in frame.iterrows()])
    if ROUND not in frame:
        frame[ROUND] = 0
    frame[ROUND] = frame[ROUND].fillna(0).astype(int)
    pooled = [_pool(g.sort_values(ROUND)) for _, g in frame.groupby(["problem", "_job", "_key"], sort=False)]
    return pd.DataFrame(pooled).drop(columns=["_key"]).rename(columns={"_job": "job"}).reset_index(drop=True)


def _pool(g: pd.DataFrame) -> dict:
    first = g.iloc[0].to_dict()
    failed = g[g["status"] != "ok"]
    if not failed.empty:
        return failed.iloc[0].to_dict() | {"rounds": len(g), "round_ms": [], "round": None}
    row = dict(first)
    row["round_ms"], row["rounds"], row["round"] = [float(first["mean_ms"])], 1, None
    if "sm_clock_mhz" in g:
        row["round_clock_mhz"] = [number(first.get("sm_clock_mhz"))]
    if len(g) == 1:  # one round: the point as it was recorded
        return row
    for col in STEP_LISTS:
        if col in g and all(isinstance(v, list) for v in g[col]):
            row[col] = [x for v in g[col] for x in v]
    steps = row.get("step_ms")
    if isinstance(steps, list) and steps:
        row.update(mean_ms=statistics.fmean(steps), std_ms=statistics.stdev(steps) if len(steps) > 1 else 0.0,
                   median_ms=statistics.median(steps), min_ms=min(steps), max_ms=max(steps))
    waits = row.get("sync_wait_step_ms")
    if isinstance(waits, list) and waits:
        row["sync_wait_ms"] = statistics.fmean(waits)
    for col in g.columns:
        if PEAKS in col and pd.api.types.is_numeric_dtype(g[col]) and g[col].notna().any():
            row[col] = float(g[col].max())
    row["round_ms"] = [float(v) for v in g["mean_ms"]]
    row["rounds"] = len(g)
    row["round"] = None
    if "sm_clock_mhz" in g:
        row["round_clock_mhz"] = [number(v) for v in g["sm_clock_mhz"]]
        ranks = [x for v in g.get("sm_clock_ranks_mhz", []) if isinstance(v, list) for x in v]
        clocks = ranks or [c for c in row["round_clock_mhz"] if c is not None]
        row["clock_range_mhz"] = [min(clocks), max(clocks)] if clocks else None
    return row


def paired_ratio(a: dict | pd.Series, b: dict | pd.Series) -> dict | None:
    """`a`'s time over `b`'s, two pooled variants of one job: {"ratio", "lo", "hi", "rounds", "paired"}.
    Paired: the range of the per-round ratios (both ran every round); else, one round, ratio ∓ two
    standard errors of the means (steps' standard deviation over their square root, both combined)."""
    if a is None or b is None:
        return None
    ma, mb = number(a.get("mean_ms")), number(b.get("mean_ms"))
    if ma is None or not mb:
        return None
    ratio = ma / mb
    ra, rb = a.get("round_ms") or [], b.get("round_ms") or []
    if len(ra) == len(rb) >= 2 and all(rb):
        per_round = [x / y for x, y in zip(ra, rb, strict=True)]
        return {"ratio": ratio, "lo": min(per_round), "hi": max(per_round), "rounds": len(ra), "paired": True,
                "per_round": per_round}
    rel = [(number(x.get("std_ms")) or 0.0) / m for x, m in ((a, ma), (b, mb))]
    steps = [max(len(x.get("step_ms") or []), 1) for x in (a, b)]
    se = ratio * math.sqrt(sum(r * r / n for r, n in zip(rel, steps, strict=True)))
    return {"ratio": ratio, "lo": ratio - 2 * se, "hi": ratio + 2 * se, "rounds": 1, "paired": False}


def ratio_cell(r: dict | None, digits: int = 3) -> str:
    """A ratio with its range across rounds (or ∓ two standard errors for one round): "0.981 (0.95–1.01)"."""
    if not r:
        return ""
    return f"{r['ratio']:.{digits}f} ({r['lo']:.{digits}f}–{r['hi']:.{digits}f})"


def clock_cell(p: dict) -> str:
    """The SM clocks a variant's rounds ran at (each round's median over its ranks' samples), MHz."""
    clocks = [c for c in p.get("round_clock_mhz") or [] if c is not None]
    if not clocks:
        return ""
    lo, hi = min(clocks), max(clocks)
    return f"{lo:.0f}" if lo == hi else f"{lo:.0f}–{hi:.0f}"


def held_out_choice(candidates: list[dict], reference: dict) -> dict | None:
    """The fastest of `candidates` (variants of one job, each with its rounds' means `round_ms`), chosen and
    judged on different rounds: for each round, the candidate fastest over the job's other rounds, over
    `reference` in the round left out. Choosing the fastest on the rounds it is then judged on favours it (the
    winner of several noisy candidates is likely the luckiest); judged on a round it was not chosen on, it is
    not. {"ratio": the picks' round means summed over the reference's, "lo", "hi": the range of the held-out
    rounds' ratios, "picks": the candidate chosen for each round (its `bucket_mb`, else its index), "rounds",
    "paired", "held_out": True}; None with fewer than two rounds, or rounds that do not pair."""
    ref = reference.get("round_ms") or []
    n = len(ref)
    if n < 2 or not all(ref) or not candidates or any(len(c.get("round_ms") or []) != n for c in candidates):
        return None
    picks, ratios, ours = [], [], 0.0
    for r in range(n):
        best = min(candidates, key=lambda c: statistics.fmean(c["round_ms"][:r] + c["round_ms"][r + 1:]))
        picks.append(best.get("bucket_mb", candidates.index(best)))
        ratios.append(best["round_ms"][r] / ref[r])
        ours += best["round_ms"][r]
    return {"ratio": ours / sum(ref), "lo": min(ratios), "hi": max(ratios), "per_round": ratios, "picks": picks,
            "rounds": n, "paired": True, "held_out": True}


def clocks_differ(a: dict | pd.Series, b: dict | pd.Series, tolerance_mhz: float = CLOCK_TOLERANCE_MHZ) -> bool | None:
    """Whether two variants' timed steps ran at SM clocks further apart than `tolerance_mhz` (their
    median clocks, round by round); None where either has no clock recorded."""
    ca = [c for c in (a.get("round_clock_mhz") or []) if c is not None]
    cb = [c for c in (b.get("round_clock_mhz") or []) if c is not None]
    if not ca or not cb:
        return None
    return bool(abs(statistics.median(ca) - statistics.median(cb)) > tolerance_mhz)


def with_rounds_pooled(frame: pd.DataFrame) -> pd.DataFrame:
    """`frame` with the points of the experiments that run in rounds (`ROUNDED`) pooled, the rest as it is."""
    if frame.empty or "problem" not in frame:
        return frame
    rounded = frame.problem.isin(ROUNDED)
    if not rounded.any():
        return frame
    return pd.concat([frame[~rounded], pool_rounds(frame[rounded], POINT_SETTINGS)], ignore_index=True)
