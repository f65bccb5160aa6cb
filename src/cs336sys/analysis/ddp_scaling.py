"""From 2 ranks to more (problems 12 and 14): for each (size, dtype) whose DDP job ran at several rank
counts, each variant's step and the time communication costs it (its step less the step without
communication, *none*, of the same job) side by side, with what the ring all-reduce predicts.

A ring all-reduce of S bytes over n ranks sends 2(n-1)/n · S bytes per rank, so at the bus bandwidth B the
all-reduce measured for n ranks (the `allreduce` benchmark at its largest size) it takes 2(n-1)/n · S / B:
from 2 to 4 ranks the bytes per rank grow by 1.5× while each rank's own compute (its batch) stays the same.
That time is what flat DDP's one all-reduce after the backward should add to the step; the overlapping
variants hide part of it under the backward."""

from __future__ import annotations

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


def scaling(jobs: list[dict], busbw: dict[int, float], out: Path) -> list[dict]:
    """Per (size, dtype) with jobs at two or more rank counts: the table and the facts the prose reads.
    `busbw`: NCCL's bus bandwidth per rank count at the benchmark's largest size (GB/s)."""
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
            comm = [s["flat"]["mean_ms"] - s["none"]["mean_ms"] for s in shown]
            facts["flat_comm_ms"] = {str(n): c for n, c in zip(worlds, comm, strict=True)}
            if len(predicted) == len(worlds) and comm[0] > 0:
                facts["flat_growth"] = comm[-1] / comm[0]
                facts["predicted_growth"] = predicted[worlds[-1]] / predicted[worlds[0]]
        if "none" in shown[0]:
            facts["none_ms"] = {str(n): s["none"]["mean_ms"] for n, s in zip(worlds, shown, strict=True)}
        result.append(facts)
    return result
