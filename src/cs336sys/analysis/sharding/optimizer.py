"""Optimizer state sharding (problems optimizer_state_sharding and its accounting): per size, each
variant's memory by what holds it against the accounting's prediction per term and rank, step times
against ZeroRedundancyOptimizer, the saving and the bytes sent per step."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd

from cs336sys.accounting import communication as comm
from cs336sys.accounting import memory
from cs336sys.accounting.compute import model_values
from cs336sys.accounting.symbols import N, evaluate
from cs336sys.analysis.rounds import paired_ratio
from cs336sys.analysis.sharding.shared import (
    DTYPE_BYTES,
    PEAK_FIT_TOLERANCE,
    POINTS,
    STRATEGY,
    TARGETS,
    VARIANT_LABEL,
    VARIANTS,
    cell,
    class_values,
    in_unit,
    number,
    predict,
    slug,
    steady_state_peak,
    table,
    target,
    timing_of,
    world_size,
)
from cs336sys.analysis.verdicts import against_limit, compare_times, within_tolerance


@dataclass
class OptimizerRows:
    """The rows of one size's four tables, filled variant by variant."""

    allocator: list[dict] = field(default_factory=list)
    breakdown: list[dict] = field(default_factory=list)
    prediction: list[dict] = field(default_factory=list)
    time: list[dict] = field(default_factory=list)


def readings(r: pd.Series | dict) -> dict:
    """One rank's readings in bytes: tensor sums at each point and the allocator's (None on the CPU)."""
    get = r.get
    params, grads, state = (number(get(k)) for k in ("param_bytes", "grad_bytes", "optimizer_state_bytes"))
    tensors = {"after init": params,
               "before step": None if None in (params, grads) else params + grads,
               "after step": None if None in (params, grads, state) else params + grads + state}
    keys = {"after init": "after_init", "before step": "before_step", "after step": "after_step"}
    return {"params": params, "grads": grads, "state": state, "tensors": tensors,
            "allocated": {p: number(get(f"{keys[p]}_allocated_bytes")) for p in POINTS},
            "peak": {p: number(get(f"{keys[p]}_peak_bytes")) for p in POINTS}}


def _rank_rows(r: pd.Series) -> list[dict]:
    """Each rank's readings where the result holds them, else the result's own (rank 0's)."""
    ranks = r.get("ranks")
    if isinstance(ranks, list) and ranks and all(isinstance(x, dict) for x in ranks):
        return ranks
    return [r.to_dict()]


def optimizer_size(size: str, g: pd.DataFrame, out: Path, targets: list[dict], u: dict) -> dict:
    """One size's sharding_memory job: allocator readings, the breakdown by what holds the memory, the
    accounting's prediction per term and rank, step times; the two targets of the size."""
    world = world_size(g)
    g = g.assign(_order=g["variant"].map(lambda v: VARIANTS.index(v) if v in VARIANTS else len(VARIANTS)))
    g = g.sort_values("_order")
    ok = g[g.status == "ok"]
    info = _job_info(size, world, g, ok, u)
    rows = OptimizerRows()
    for _, r in ok.iterrows():
        e = _variant_entry(r, u)
        rows.allocator.append(_allocator_row(e, u["name"]))
        rows.breakdown += _breakdown_rows(e, u["name"])
        if e["strategy"]:
            _predicted_by_rank(e, r, size, world, u, rows.prediction)
            tol = TARGETS["model_state_tolerance"]
            targets.append(target("model_state", size,
                                  f"parameters + gradients + optimizer state, {e['label']}: worst rank ÷ accounting",
                                  e["worst_ratio"], tol, within_tolerance(e["worst_ratio"], tol), world=world))
        info["variants"][r["variant"]] = e
    _step_times(info, rows.time)
    info["forward_peak_fit"] = _forward_peak_fit(info)
    info["rounds_measured"] = max((e["rounds"] for e in info["variants"].values()), default=1)
    info["saving"] = _sharding_saving(info["variants"], size, world, u)
    worst = [e["worst_ratio"] for e in info["variants"].values() if e.get("worst_ratio") is not None]
    info["tensors_match"] = bool(worst) and all(within_tolerance(r, TARGETS["model_state_tolerance"]) for r in worst)
    limit = TARGETS["sharded_vs_zero"]
    pr = paired_ratio(info["variants"].get("sharded"), info["variants"].get("zero"))
    info["sharded_vs_zero"] = pr["ratio"] if pr else None
    info["sharded_vs_zero_range"] = pr
    targets.append(target("sharded_vs_zero", size, "step time, ours (sharded) ÷ torch ZeRO", info["sharded_vs_zero"],
                          limit, against_limit(pr["lo"], pr["hi"], limit) if pr else None, world=world, spread=pr))
    _save_tables(info, rows, size, world, out)
    info["communication"] = _communication_volume(size, world, u)
    return info


def _job_info(size: str, world: int, g: pd.DataFrame, ok: pd.DataFrame, u: dict) -> dict:
    """The job's settings (parameters, batch shape, dtype, steps), the failed variants' statuses and
    the activations the accounting predicts autograd saves (for the before-step peak)."""
    info: dict = {"size": size, "world": world, "tables": {}, "variants": {},
                  "statuses": {r["variant"]: r["status"] for _, r in g[g.status != "ok"].iterrows()}}
    if "parameters" in ok and ok["parameters"].notna().any():
        info["parameters"] = int(ok["parameters"].dropna().iloc[0])
    for col in ("context_length", "batch_size", "dtype", "steps"):
        if col in g and g[col].notna().any():
            value = g[col].dropna().iloc[0]
            info[col] = value if isinstance(value, str) else int(value)
    if "batch_size" in info and "context_length" in info:
        shape = model_values(size, info["batch_size"], info["context_length"])
        per_element = DTYPE_BYTES.get(info.get("dtype", "fp32"), 4)
        info["predicted_activations"] = evaluate(memory.model_activation_bytes(per_element), shape) / u["bytes"]
    return info


def _variant_entry(r: pd.Series, u: dict) -> dict:
    """One variant's step time and rank 0's memory in the section's unit: tensors, allocated and peak
    at each point, the peak above the tensors, the first step's and a later step's peak."""
    v = r["variant"]
    rd = readings(r)
    e: dict = {"label": VARIANT_LABEL.get(v, v), "strategy": STRATEGY.get(v), "mean_ms": number(r.get("mean_ms")),
               "std_ms": number(r.get("std_ms")), "median_ms": number(r.get("median_ms")),
               **timing_of(r),
               "params": in_unit(rd["params"], u), "grads": in_unit(rd["grads"], u), "state": in_unit(rd["state"], u),
               "tensors": {p: in_unit(x, u) for p, x in rd["tensors"].items()},
               "allocated": {p: in_unit(x, u) for p, x in rd["allocated"].items()},
               "peak": {p: in_unit(x, u) for p, x in rd["peak"].items()},
               "other": {p: in_unit(rd["peak"][p] - rd["tensors"][p], u)
                         if None not in (rd["peak"][p], rd["tensors"][p]) else None for p in POINTS}}
    peaks = [x for x in e["peak"].values() if x is not None]
    e["first_step_peak"] = max(peaks) if peaks else None
    e["overall_peak"] = steady_state_peak(e["peak"], e["state"])
    return e


def _forward_peak_fit(info: dict) -> dict | None:
    """What the unsharded first step's peak up to the optimizer step holds, from the readings alone (no
    timeline of the memory was recorded): the peak against the parameters plus the saved activations the
    accounting counts for the batch. `no_gradients`: the peak is within `PEAK_FIT_TOLERANCE` of that sum and
    below the sum with the gradients added, as a peak at the forward's end would be, before any gradient."""
    un, acts = info["variants"].get("unsharded"), info.get("predicted_activations")
    if not un or acts is None or None in (un["peak"]["before step"], un["params"], un["grads"]):
        return None
    peak = un["peak"]["before step"]
    residual = peak - un["params"] - acts
    return {"peak": peak, "params": un["params"], "grads": un["grads"], "activations": acts, "residual": residual,
            "no_gradients": bool(0 <= residual <= PEAK_FIT_TOLERANCE * peak and residual < un["grads"])}


def _allocator_row(e: dict, unit: str) -> dict:
    """The allocator table's row of a variant: allocated and peak at each point."""
    return {"variant": e["label"],
            **{f"{p}: alloc. ({unit})": cell(e["allocated"][p]) for p in POINTS},
            **{f"{p}: peak ({unit})": cell(e["peak"][p]) for p in POINTS}}


def _breakdown_rows(e: dict, unit: str) -> list[dict]:
    """The breakdown table's rows of a variant, one per point: what the tensors hold against the allocator."""
    return [{"variant": e["label"], "point": p, f"params ({unit})": cell(e["params"]),
             f"grads ({unit})": cell(e["grads"]) if p != "after init" else "",
             f"opt. state ({unit})": cell(e["state"]) if p == "after step" else "",
             f"tensors ({unit})": cell(e["tensors"][p]), f"allocated ({unit})": cell(e["allocated"][p]),
             f"peak ({unit})": cell(e["peak"][p]), f"peak − tensors ({unit})": cell(e["other"][p])}
            for p in POINTS]


def _predicted_by_rank(e: dict, r: pd.Series, size: str, world: int, u: dict, rows: list[dict]) -> None:
    """Add to the variant's entry the accounting's prediction per term, each rank's model state against
    it and the worst rank's ratio, the spread of the state over ranks; one prediction row per rank."""
    strategy = e["strategy"]
    predicted = {"params": predict(memory.parameter_bytes(strategy), size, world),
                 "grads": predict(memory.gradient_bytes(strategy), size, world),
                 "state": predict(memory.optimizer_state_bytes(strategy), size, world)}
    predicted["total"] = sum(predicted.values())
    e["predicted"] = {k: x / u["bytes"] for k, x in predicted.items()}
    worst, ranks, unit = None, [], u["name"]
    for i, rank in enumerate(_rank_rows(r)):
        rr = readings(rank)
        measured = rr["tensors"]["after step"]
        ratio = measured / predicted["total"] if measured is not None and predicted["total"] else None
        ranks.append({"rank": i, "measured": in_unit(measured, u), "ratio": ratio, "state": in_unit(rr["state"], u),
                      "allocated_after_step": in_unit(rr["allocated"]["after step"], u)})
        if ratio is not None and (worst is None or abs(ratio - 1) > abs(worst - 1)):
            worst = ratio
        rows.append({
            "variant": e["label"], "rank": i,
            f"params pred. ({unit})": cell(predicted["params"] / u["bytes"]),
            f"params ({unit})": cell(in_unit(rr["params"], u)),
            f"grads pred. ({unit})": cell(predicted["grads"] / u["bytes"]),
            f"grads ({unit})": cell(in_unit(rr["grads"], u)),
            f"state pred. ({unit})": cell(predicted["state"] / u["bytes"]),
            f"state ({unit})": cell(in_unit(rr["state"], u)), "sum ÷ pred.": cell(ratio, 4)})
    e["ranks"], e["worst_ratio"] = ranks, worst
    states = [x["state"] for x in ranks if x["state"] is not None]
    if len(states) > 1 and min(states) > 0:
        e["state_max_over_min"] = max(states) / min(states)


def _step_times(info: dict, rows: list[dict]) -> None:
    """Each variant's step time against the unsharded and ZeroRedundancyOptimizer's, the text's verdict
    on sharded against unsharded, and the time table's rows (the failed variants' statuses last)."""
    unsharded = info["variants"].get("unsharded", {}).get("mean_ms")
    zero = info["variants"].get("zero", {}).get("mean_ms")
    for e in info["variants"].values():
        e["vs_unsharded"] = e["mean_ms"] / unsharded if unsharded and e["mean_ms"] is not None else None
        e["vs_zero"] = e["mean_ms"] / zero if zero and e["mean_ms"] is not None else None
        rows.append({"variant": e["label"], "step (ms)": cell(e["mean_ms"], 2), "std (ms)": cell(e["std_ms"], 2),
                     "median (ms)": cell(e["median_ms"], 2),
                     "round means (ms)": ", ".join(f"{m:.1f}" for m in e["round_ms"]) if e["rounds"] > 1 else "",
                     "÷ unsharded": cell(e["vs_unsharded"], 3), "÷ torch ZeRO": cell(e["vs_zero"], 3)})
    un = info["variants"].get("unsharded")
    for v in ("sharded", "zero"):  # None where either did not run
        e = info["variants"].get(v)
        info[f"{v}_vs_unsharded"] = (
            compare_times(e["mean_ms"], e["std_ms"], un["mean_ms"], un["std_ms"]).as_dict()
            if un and e and un["mean_ms"] is not None and e["mean_ms"] is not None else None)
    for v, status in info["statuses"].items():
        rows.append({"variant": VARIANT_LABEL.get(v, v), "step (ms)": status})


def _save_tables(info: dict, rows: OptimizerRows, size: str, world: int, out: Path) -> None:
    """Save the job's tables that hold rows (the allocator's only where it gave readings)."""
    name = slug(size, world)
    info["allocator"] = any(x is not None for e in info["variants"].values() for x in e["peak"].values())
    if info["allocator"]:
        info["tables"]["allocator"] = table(rows.allocator, out, f"sharding_allocator_{name}")
    if rows.breakdown:
        info["tables"]["breakdown"] = table(rows.breakdown, out, f"sharding_breakdown_{name}")
    if rows.prediction:
        info["tables"]["prediction"] = table(rows.prediction, out, f"sharding_prediction_{name}")
    if rows.time:
        info["tables"]["time"] = table(rows.time, out, f"sharding_time_{name}")


def _sharding_saving(variants: dict, size: str, world: int, u: dict) -> dict:
    """What sharding the optimizer state saves per rank against the unsharded run: the accounting's
    (DDP's state minus zero1's), the state tensors' (rank 0), the allocator's highest peak."""
    expected = (predict(memory.optimizer_state_bytes("ddp"), size, world)
                - predict(memory.optimizer_state_bytes("zero1"), size, world)) / u["bytes"]
    out: dict = {"expected": expected}
    base = variants.get("unsharded")
    for v in ("sharded", "zero"):
        e = variants.get(v)
        if base is None or e is None:
            continue
        state = base["state"] - e["state"] if None not in (base["state"], e["state"]) else None
        peak = (base["overall_peak"] - e["overall_peak"]
                if None not in (base["overall_peak"], e["overall_peak"]) else None)
        out[v] = {"state": state, "peak": peak, "peak_over_expected": peak / expected if peak is not None and expected
                  else None}
    return out


def _communication_volume(size: str, world: int, u: dict) -> dict:
    """Bytes each rank sends per step (fp32 gradients and parameters), from the accounting's transfers:
    DDP's all-reduce; ours and ZeroRedundancyOptimizer (the all-reduce, then the updated parameters
    broadcast by their owners: the accounting's `zero1`); ZeRO stage 1 as its paper runs it (a
    reduce-scatter of the gradients, an all-gather of the updated parameters)."""
    values = class_values(size, world)

    def sent(transfers) -> float:
        return sum(evaluate(t.bytes_sent(), values) for t in transfers) / u["bytes"]

    model = sum(memory.PARAMETER_CLASSES) * 4  # every parameter in fp32, as the accounting's transfers count it
    paper = [comm.Transfer("gradients", "reduce_scatter", model, N),
             comm.Transfer("updated parameters", "all_gather", model, N)]
    out = {"ddp": sent(comm.step_transfers("ddp", grad_bytes=4)),
           "ours": sent(comm.step_transfers("zero1", grad_bytes=4, param_bytes=4)),
           "zero_paper": sent(paper)}
    out["ours_over_ddp"] = out["ours"] / out["ddp"] if out["ddp"] else None
    return out


def broadcast_cost(opt: list[dict]) -> dict:
    """Whether the broadcasts themselves cost the step its time: per job, ours and ZeroRedundancyOptimizer
    (which sends the same broadcasts) against the unsharded step (`compare_times`: beyond the steps' spread
    or within it). `ours_slower`: the jobs where ours is slower than unsharded; of those, `zero_faster` where
    ZeroRedundancyOptimizer is faster than unsharded in the same job (the cost is then our implementation's,
    not the broadcasts' volume), `zero_slower` where it is slower too, `zero_within` where within the spread."""
    def job(o: dict) -> dict:
        return {"size": o["size"], "world": o["world"], "ours": o["sharded_vs_unsharded"]["ratio"],
                "zero": o["zero_vs_unsharded"]["ratio"]}

    both = [o for o in opt if o.get("sharded_vs_unsharded") and o.get("zero_vs_unsharded")]
    slower = [o for o in both if o["sharded_vs_unsharded"]["slower"]]
    return {"jobs": len(both), "ours_slower": len(slower),
            "zero_faster": [job(o) for o in slower if o["zero_vs_unsharded"]["faster"]],
            "zero_slower": [job(o) for o in slower if o["zero_vs_unsharded"]["slower"]],
            "zero_within": [job(o) for o in slower if o["zero_vs_unsharded"]["within_noise"]]}
