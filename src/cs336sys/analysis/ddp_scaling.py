"""From 2 ranks to more (problems 12 and 14): for each (size, dtype) whose DDP job ran at several rank
counts, each variant's step and the time communication costs it (its step less the step without
communication, *none*, of the same job) side by side, with what the ring all-reduce predicts.

A ring all-reduce of S bytes over n ranks sends 2(n-1)/n · S bytes per rank, so at the bus bandwidth B the
all-reduce measured for n ranks (the `allreduce` benchmark at its largest size) it takes 2(n-1)/n · S / B:
from 2 to 4 ranks the bytes per rank grow by 1.5× while each rank's own compute (its batch) stays the same.
That time is what flat DDP's one all-reduce after the backward should add to the step; the overlapping
variants hide part of it under the backward."""

from __future__ import annotations

import math
from pathlib import Path

import pandas as pd

from cs336sys.analysis.common import save_table
from cs336sys.analysis.formatting import fixed, percent

RING_FORMULA = "2(r-1)/r"  # bytes each of r ranks sends in a ring all-reduce, over the tensor's (LaTeX)
SHOWN = ("none", "flat", "bucketed", "torch_ddp")  # the best bucket size for bucketed (every variant: the appendix)


def ring_factor(n: int) -> float:
    """Bytes each rank sends in a ring all-reduce, over the tensor's bytes: 2(n-1)/n."""
    return 2 * (n - 1) / n


def ring_allreduce_ms(grad_bytes: float, n: int, busbw_gbps: float) -> float:
    """The ring all-reduce of `grad_bytes` over `n` ranks at bus bandwidth `busbw_gbps` (GB/s), in ms."""
    return ring_factor(n) * grad_bytes / (busbw_gbps * 1e9) * 1e3


def _spread(a: dict, b: dict) -> tuple[float, float]:
    """The range of `a`'s step less `b`'s (two variants of one job): the differences round by round where both
    ran the same rounds (two or more), else the difference ∓ two standard errors (one round)."""
    ra, rb = a.get("round_ms") or [], b.get("round_ms") or []
    if len(ra) == len(rb) >= 2:
        diffs = [x - y for x, y in zip(ra, rb, strict=True)]
        return min(diffs), max(diffs)
    d = a["mean_ms"] - b["mean_ms"]
    se = math.sqrt(sum((p.get("std_ms") or 0.0) ** 2 / max(p.get("steps") or 1, 1) for p in (a, b)))
    return d - 2 * se, d + 2 * se


def _cost(p: dict, none: dict) -> dict:
    """What communication costs a variant's step (its step less the no-communication step of the same job),
    with that difference's range; "within_noise" where the range reaches zero: the rounds' spread exceeds the
    cost."""
    lo, hi = _spread(p, none)
    return {"ms": p["mean_ms"] - none["mean_ms"], "lo": lo, "hi": hi, "within_noise": bool(lo <= 0)}


def _round_range(p: dict) -> tuple[float, float]:
    """The lowest and highest of a variant's round means; one round: its mean ∓ two standard errors."""
    rounds = p.get("round_ms") or []
    if len(rounds) >= 2:
        return min(rounds), max(rounds)
    se = (p.get("std_ms") or 0.0) / math.sqrt(max(p.get("steps") or 1, 1))
    return p["mean_ms"] - 2 * se, p["mean_ms"] + 2 * se


def _none_across(worlds: list[int], nones: list[dict], size: str, dtype: str, host_jobs: list[dict],
                 js: list[dict]) -> dict:
    """The step without communication at each rank count: how much it changes from one to another ("change":
    the largest over the smallest, less one), whether the rank counts' round ranges overlap, and how far the
    same step moved between two jobs of one rank count (the host series' job and the grid's). The change is
    "within" the noise where the ranges overlap or it is no larger than that between-job move."""
    means = [p["mean_ms"] for p in nones]
    change = max(means) / min(means) - 1
    ranges = [_round_range(p) for p in nones]
    overlap = max(lo for lo, _ in ranges) <= min(hi for _, hi in ranges)
    between = None
    for n, j in zip(worlds, js, strict=True):
        for h in host_jobs:
            same = (h["size"], h["dtype"], h["world_size"]) == (size, dtype, n) and not h["proxy"]
            if same and h.get("none_ms") and j.get("none_ms"):
                pair = sorted([h["none_ms"], j["none_ms"]])
                move = pair[1] / pair[0] - 1
                if between is None or move > between["spread"]:
                    between = {"world": n, "ms": pair, "spread": move, "dates": sorted(set(h["dates"] + j["dates"]))}
    return {"change": change, "rounds_overlap": bool(overlap), "between_jobs": between,
            "within": bool(overlap or (between is not None and change <= between["spread"]))}


def _shown(j: dict) -> dict[str, dict]:
    """The job's variants the comparison shows: one point each, bucketed at its fastest bucket size."""
    ok = {k: p for k, p in j["variants"].items() if p["status"] == "ok"}
    out = {}
    for name in SHOWN:
        pts = [p for p in ok.values() if p["variant"] == name]
        if name == "torch_ddp":
            pts = [p for p in pts if p["key"] == "torch_ddp-25MB"] or pts
        if pts:
            out[name] = min(pts, key=lambda p: p["mean_ms"])
    return out


def scaling(jobs: list[dict], busbw: dict[int, float], out: Path, host_jobs: list[dict] | None = None) -> list[dict]:
    """Per (size, dtype) with jobs at two or more rank counts: the table and the facts the prose reads.
    `busbw`: NCCL's bus bandwidth per rank count at the benchmark's largest size (GB/s); `host_jobs`: the
    host series' jobs (`ddp_host.host_jobs`), whose no-communication step at a rank count the grid's job also
    ran says how far that step moves between two jobs. Each rank count is a job of its own: no ratio is taken
    across them (their rounds and days may differ, `jobs_differ`), each cost is set against its prediction."""
    groups: dict[tuple, list[dict]] = {}
    for j in jobs:
        if j.get("world_size"):
            groups.setdefault((j["size"], j["dtype"]), []).append(j)
    result = []
    for (size, dtype), js in groups.items():
        js = sorted(js, key=lambda j: j["world_size"])
        if len(js) < 2:
            continue
        worlds = [j["world_size"] for j in js]
        shown = [_shown(j) for j in js]
        grad = js[0]["grad_bytes"]
        predicted = {n: ring_allreduce_ms(grad, n, busbw[n]) for n in worlds if busbw.get(n) and grad}
        rows = []
        for name in SHOWN:
            if not all(name in s for s in shown):
                continue
            row = {"variant": shown[0][name]["label"] if name != "bucketed" else "bucketed, fastest size"}
            for n, s in zip(worlds, shown, strict=True):
                p = s[name]
                row[f"step, {n} ranks (ms)"] = fixed(p["mean_ms"], 1)
                if name != "none" and "none" in s:
                    row[f"comm., {n} ranks (ms)"] = fixed(p["mean_ms"] - s["none"]["mean_ms"], 1)
                    row[f"share, {n} ranks"] = percent((p["mean_ms"] - s["none"]["mean_ms"]) / p["mean_ms"])
            rows.append(row)
        if predicted:
            rows.append({"variant": "ring all-reduce, predicted",
                         **{f"comm., {n} ranks (ms)": fixed(ms, 1) for n, ms in predicted.items()}})
        facts = {"size": size, "dtype": dtype, "worlds": worlds, "label": f"{size}, {dtype}",
                 "rounds": [j["rounds"] for j in js], "grad_gib": grad / 2**30 if grad else None,
                 "predicted_ms": {str(n): ms for n, ms in predicted.items()},
                 "ring_factors": {str(n): ring_factor(n) for n in worlds}, "ring_formula": RING_FORMULA,
                 "table": save_table(pd.DataFrame(rows), out, f"ddp_scaling_{size}_{dtype}".replace(".", "_"))}
        if "flat" in shown[0] and "none" in shown[0]:
            facts["flat"] = [_cost(s["flat"], s["none"]) | {"world": n, "predicted_ms": predicted.get(n),
                                                            "rounds": j["rounds"]}
                             for n, s, j in zip(worlds, shown, js, strict=True)]
            facts["flat_comm_ms"] = {str(f["world"]): f["ms"] for f in facts["flat"]}
        facts["jobs"] = [{"world": n, "rounds": j["rounds"], "dates": j.get("dates") or []} for n, j in zip(worlds, js,
                                                                                                          strict=True)]
        facts["jobs_differ"] = len({(f["rounds"], tuple(f["dates"])) for f in facts["jobs"]}) > 1
        if "none" in shown[0]:
            facts["none_ms"] = {str(n): s["none"]["mean_ms"] for n, s in zip(worlds, shown, strict=True)}
            facts["none"] = _none_across(worlds, [s["none"] for s in shown], size, dtype, host_jobs or [], js)
        result.append(facts)
    return result


def none_across(scaled: list[dict]) -> dict | None:
    """Over every (size, dtype) of `scaling`: which ones' no-communication step stays within the noise from one
    rank count to another ("within", "beyond": their labels), whether every "within" one is so by its rounds'
    ranges overlapping ("by_rounds"), and the largest move of that step between two jobs of one rank count
    ("between": its label, rank count, the two means and the jobs' dates)."""
    nones = [sc for sc in scaled if "none" in sc]
    if not nones:
        return None
    within = [sc for sc in nones if sc["none"]["within"]]
    moved = [sc for sc in nones if sc["none"]["between_jobs"]]
    top = max(moved, key=lambda sc: sc["none"]["between_jobs"]["spread"]) if moved else None
    return {"within": [sc["label"] for sc in within], "beyond": [sc["label"] for sc in nones if sc not in within],
            "by_rounds": all(sc["none"]["rounds_overlap"] for sc in within),
            "between": top["none"]["between_jobs"] | {"label": top["label"]} if top else None}
