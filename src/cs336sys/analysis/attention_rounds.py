"""The leaderboard shapes in interleaved rounds (`flash_leaderboard_rounds`): each implementation's times
pooled over its rounds, its time over cuDNN's per part (forward, backward, both) with the range of the
per-round ratios (`rounds.paired_ratio`), and the verdict on "at most cuDNN's time" per part
(`verdicts.against_limit`: a range that contains 1.00 is within the noise). The summary's two attention
rows are made from these where the job has results (`summary_row`)."""

from __future__ import annotations

import statistics
from pathlib import Path

import pandas as pd

from cs336sys.analysis.common import gpu_model, save_table
from cs336sys.analysis.formatting import number
from cs336sys.analysis.rounds import CLOCK_TOLERANCE_MHZ, clocks_differ, paired_ratio
from cs336sys.analysis.verdicts import Verdict, against_limit, all_of

BASELINE = "sdpa_cudnn"  # every ratio is an implementation's time over SDPA's cuDNN backend's
LIMIT = 1.0  # the target: at most cuDNN's time, forward and backward
PARTS = ("fwd", "bwd", "fwd_bwd")
JUDGED = ("fwd", "bwd")
MIN_ROUNDS = 3  # a ratio the summary judges comes from a job of at least this many rounds
LABELS = {"ours": "ours (Triton)", "sdpa_cudnn": "SDPA cuDNN", "sdpa_flash": "SDPA FlashAttention-2",
          "sdpa_efficient": "SDPA memory-efficient", "sdpa_math": "SDPA math", "gluon": "Gluon forward, tl backward",
          "gluon_bwd": "Gluon forward and backward"}


def _gpu(r: pd.Series) -> str:
    name = next((str(v) for v in (r.get("env.gpu"), r.get("gpu_model")) if isinstance(v, str) and v), "")
    return gpu_model(name) if name else "CPU"


def _ms(r: pd.Series, part: str) -> float | None:
    """A round's time of `part`; None where missing or not positive (a backward within the noise)."""
    v = number(r.get(f"{part}_ms"))
    return v if v is not None and v > 0 else None


def pool(rows: pd.DataFrame) -> dict:
    """One implementation's rounds at one shape: its status (the first failing round's, else ok), the number
    of rounds, and per part the mean over the rounds and each round's time (`paired_ratio`'s `mean_ms` and
    `round_ms`), and each round's SM clock over the forward+backward (`round_clock_mhz`)."""
    rows = rows.sort_values("round")
    failed = rows[rows["status"] != "ok"]
    if not failed.empty:
        return {"status": str(failed.iloc[0]["status"]), "rounds": len(rows)}
    parts = {}
    for part in PARTS:
        times = [_ms(r, part) for _, r in rows.iterrows()]
        if all(t is not None for t in times):
            parts[part] = {"mean_ms": statistics.fmean(times), "round_ms": times}
    clocks = [number(r.get("sm_clock_mhz")) for _, r in rows.iterrows()]
    return {"status": "ok", "rounds": len(rows), "parts": parts, "round_clock_mhz": [c for c in clocks if c]}


def compare(impl: dict, base: dict) -> dict:
    """`impl` against the baseline at one shape: per part the paired ratio (None where either lacks the
    part), a verdict per judged part, one verdict over them (`met`), both sides' median SM clocks and
    whether they differ (`rounds.clocks_differ`)."""
    ratios = {p: paired_ratio(impl["parts"].get(p), base["parts"].get(p)) for p in PARTS}
    verdicts = {p: against_limit(r and r["lo"], r and r["hi"], LIMIT) for p, r in ratios.items() if p in JUDGED}
    clock = {side: statistics.median(x["round_clock_mhz"]) if x["round_clock_mhz"] else None
             for side, x in (("impl", impl), ("baseline", base))}
    return {"ratios": ratios, "verdicts": verdicts, "met": all_of(list(verdicts.values())), "clock_mhz": clock,
            "clocks_differ": clocks_differ(impl, base)}


def _cell(r: dict | None) -> str:
    return "" if r is None else f"{r['ratio']:.2f}× ({r['lo']:.2f}–{r['hi']:.2f})"


def rounds(df: pd.DataFrame, out: Path) -> dict | None:
    """The rounds jobs' results: a table (per GPU, shape and implementation: pooled times, the ratios to
    cuDNN with their per-round range, the SM clock) and per (GPU, shape) each implementation's comparison
    with cuDNN (`compare`); None without results."""
    if df.empty:
        return None
    df = df.assign(gpu=[_gpu(r) for _, r in df.iterrows()], round=df["round"].fillna(0).astype(int))
    table, editions = [], []
    for (gpu, edition), part in df.groupby(["gpu", "edition"], sort=True):
        pooled = {impl: pool(g) for impl, g in part.groupby("impl", sort=False)}
        base = pooled.get(BASELINE)
        base = base if base and base["status"] == "ok" else None
        compared = {impl: compare(p, base) for impl, p in pooled.items()
                    if impl != BASELINE and base and p["status"] == "ok"}
        for impl, p in pooled.items():
            row = {"GPU": gpu, "leaderboard": edition, "implementation": LABELS.get(impl, impl),
                   "status": p["status"], "rounds": p["rounds"]}
            for name, key in (("forward (ms)", "fwd"), ("backward (ms)", "bwd"), ("fwd+bwd (ms)", "fwd_bwd")):
                row[name] = p.get("parts", {}).get(key, {}).get("mean_ms")
            c = compared.get(impl)
            row["forward / cuDNN"] = _cell(c and c["ratios"]["fwd"])
            row["backward / cuDNN"] = _cell(c and c["ratios"]["bwd"])
            clocks = p.get("round_clock_mhz") or []
            low, high = (f"{min(clocks):.0f}", f"{max(clocks):.0f}") if clocks else ("", "")
            row["SM clock (MHz)"] = low if low == high else f"{low}–{high}"
            table.append(row)
        editions.append({"gpu": gpu, "edition": edition, "rounds": max(p["rounds"] for p in pooled.values()),
                         "statuses": {impl: p["status"] for impl, p in pooled.items()}, "impls": compared})
    frame = pd.DataFrame(table)
    # a column with one value in every row goes to the caption (`gpus`, `rounds`)
    frame = frame.drop(columns=[c for c in ("status", "GPU", "rounds") if frame[c].nunique() == 1
                                and (c != "status" or (frame[c] == "ok").all())])
    # the comparisons whose two sides ran at different clocks, by the rule `rounds.clocks_differ` applies
    apart = [{"gpu": e["gpu"], "edition": e["edition"], "label": LABELS.get(impl, impl),
              "mhz": c["clock_mhz"]["impl"], "cudnn_mhz": c["clock_mhz"]["baseline"]}
             for e in editions for impl, c in e["impls"].items() if c["clocks_differ"]]
    return {"table": save_table(frame, out, "leaderboard_rounds", digits=3), "editions": editions,
            "rounds": max(e["rounds"] for e in editions), "gpus": sorted({e["gpu"] for e in editions}),
            "same_rounds": len({e["rounds"] for e in editions}) == 1,
            "clock_tolerance_mhz": CLOCK_TOLERANCE_MHZ, "clocks_apart": apart}


def summary_row(ctx_rounds: dict | None, impls: tuple[str, ...]) -> dict | None:
    """The summary's figures for the first of `impls` that every (GPU, shape) of the rounds jobs compared
    with cuDNN in at least MIN_ROUNDS rounds: "result" (the ratios' range over the shapes, the slowest round,
    the clocks where they differ), "met" (one verdict over every shape and part), "rounds" and "lows" (per
    shape, (GPU, each judged part's lowest per-round ratio)); None where no job has such results."""
    editions = [e for e in (ctx_rounds or {}).get("editions", []) if e["rounds"] >= MIN_ROUNDS]
    impl = next((i for i in impls if editions and all(i in e["impls"] for e in editions)), None)
    if impl is None:
        return None
    runs = [e["impls"][impl] for e in editions]
    said, highest = [], None
    for part, name in (("fwd", "forward"), ("bwd", "backward")):
        ratios = [r["ratios"][part] for r in runs if r["ratios"][part]]
        if ratios:
            lo, hi = min(r["ratio"] for r in ratios), max(r["ratio"] for r in ratios)
            said.append(f"{name} {lo:.2f}" + (f"–{hi:.2f}×" if f"{hi:.2f}" != f"{lo:.2f}" else "×"))
            highest = max(hi, highest or hi)
    slowest = max((r["ratios"][p]["hi"] for r in runs for p in JUDGED if r["ratios"][p]), default=None)
    result = ", ".join(said)
    if slowest is not None and f"{slowest:.2f}" != f"{highest:.2f}":  # said already when it is the highest ratio
        result += f"; slowest round {slowest:.2f}×"
    apart = sum(1 for r in runs if r["clocks_differ"])
    if apart:
        result += f"; SM clocks differ in {apart} of {len(runs)} shapes"
    met: Verdict | None = all_of([r["met"] for r in runs])
    # each shape's lowest per-round ratio per part: above the limit where that part missed in every round
    lows = [(e["gpu"], {p: (r["ratios"][p] or {}).get("lo") for p in JUDGED})
            for e, r in zip(editions, runs, strict=True)]
    return {"impl": impl, "result": result, "met": met, "rounds": min(e["rounds"] for e in editions), "lows": lows}
