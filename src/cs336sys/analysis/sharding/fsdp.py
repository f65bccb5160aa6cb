"""FSDP (problems fsdp and fsdp_accounting): per size and compute dtype, ours (per layer, and with
other units where they ran) against FSDP2 in time and memory, the accounting's parameters and
optimizer state next to the measured, and the expected and measured saving of the peak; the
single-rank proxy points."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from cs336sys.accounting import memory, questions
from cs336sys.accounting.compute import model_values
from cs336sys.accounting.symbols import evaluate
from cs336sys.analysis.rounds import paired_ratio
from cs336sys.analysis.sharding.shared import (
    DTYPE_BYTES,
    FSDP_LABEL,
    PEAK_FIT_TOLERANCE,
    TARGETS,
    cell,
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
from cs336sys.analysis.verdicts import against_limit, slower, within_tolerance


@dataclass(frozen=True)
class Predicted:
    """The accounting's bytes per rank for FSDP at one size and world: sharded parameters, sharded
    optimizer state, and the model state FSDP saves against DDP."""

    params: float
    state: float
    state_saving: float


def _baseline(size: str, shard: pd.DataFrame, batch: int | None, context: int | None, u: dict) -> dict:
    """The unsharded peak FSDP's saving is measured against: the `unsharded` sharding_memory point of the
    same size and batch shape where it has allocator readings (the highest of its three peaks), else the
    accounting's prediction (DDP's fp32 model state plus fp32 saved activations)."""
    if not shard.empty:
        same = shard[(shard["size"] == size) & (shard["variant"] == "unsharded") & (shard.status == "ok")]
        if batch is not None and "batch_size" in same:
            same = same[(same["batch_size"] == batch) & (same["context_length"] == context)]
        for _, r in same.iterrows():
            steady = steady_state_peak({"before step": number(r.get("before_step_peak_bytes")),
                                        "after step": number(r.get("after_step_peak_bytes"))},
                                       number(r.get("optimizer_state_bytes")))
            if steady is not None:
                return {"source": "measured", "peak": steady / u["bytes"]}
    if batch is None or context is None:
        return {"source": "none", "peak": None}
    state = predict(memory.model_state_bytes("ddp"), size, 1)
    acts = evaluate(memory.model_activation_bytes(4), model_values(size, batch, context))
    return {"source": "predicted", "peak": (state + acts) / u["bytes"], "model_state": state / u["bytes"],
            "activations": acts / u["bytes"]}


def is_proxy(df: pd.DataFrame) -> pd.Series:
    """The single-rank proxy points (results from before the setting existed are not)."""
    if "single_rank_proxy" not in df:
        return pd.Series(False, index=df.index)
    return df["single_rank_proxy"].eq(True)


def _unit_of(r: pd.Series) -> str:
    """A point's FSDP unit: "layer" (also for results from before the setting existed), "block" or k."""
    unit = r.get("unit")
    return "layer" if unit is None or (isinstance(unit, float) and pd.isna(unit)) else str(unit)


def _fsdp_variant(r: pd.Series) -> str:
    """The variant a point stands for in the tables: ours per layer is "ours", ours per block "ours-block"."""
    unit = _unit_of(r)
    return r["variant"] if r["variant"] != "ours" or unit == "layer" else f"ours-{unit}"


def _unit_phrase(v: str) -> str:
    """How the prose names the unit of an "ours-<unit>" variant."""
    unit = v.removeprefix("ours-")
    return "block units" if unit == "block" else f"{unit} blocks per unit"


def _fsdp_label(v: str) -> str:
    """A variant's name in the tables."""
    return FSDP_LABEL[v] if v in FSDP_LABEL else f"ours, {_unit_phrase(v)}"


def _variant_order(v: str) -> tuple:
    """Ours per layer first, ours with other units next, FSDP2 last."""
    return (v == "fsdp2", v != "ours", v)


def fsdp_proxy(g: pd.DataFrame, out: Path) -> dict:
    """Our FSDP on one rank, per size, compute dtype and unit: the step time with nothing communicated."""
    rows = []
    for _, r in g.sort_values(["size", "compute_dtype"]).iterrows():
        ok = r["status"] == "ok"
        units = number(r.get("fsdp_units"))
        rows.append({"size": r["size"], "compute": r["compute_dtype"], "unit": _unit_of(r),
                     "all-gathers per forward": "" if units is None else f"{int(units)}",
                     "step (ms)": cell(number(r.get("mean_ms")), 2) if ok else r["status"],
                     "std (ms)": cell(number(r.get("std_ms")), 2) if ok else ""})
    return {"table": table(rows, out, "fsdp_single_rank_proxy"), "sizes": sorted(set(g["size"]))}


def fsdp_size(size: str, g: pd.DataFrame, shard: pd.DataFrame, out: Path, targets: list[dict], u: dict) -> dict:
    """One size's fsdp_step job(s): per compute dtype, ours (per layer, and with other units where they
    ran) against FSDP2 (time, memory), the accounting's parameters and optimizer state next to the
    measured, expected and measured saving of the peak."""
    g = g.assign(variant=[_fsdp_variant(r) for _, r in g.iterrows()])
    world = world_size(g)
    batch = int(g["batch_size"].iloc[0]) if "batch_size" in g else None
    context = int(g["context_length"].iloc[0]) if "context_length" in g else None
    info: dict = {"size": size, "world": world, "batch_size": batch, "context_length": context, "tables": {},
                  "dtypes": {}, "baseline": _baseline(size, shard, batch, context, u), "measured_savings": []}
    if "parameters" in g and g["parameters"].notna().any():
        info["parameters"] = int(g["parameters"].dropna().iloc[0])
    pred = Predicted(params=predict(memory.parameter_bytes("fsdp"), size, world),
                     state=predict(memory.optimizer_state_bytes("fsdp"), size, world),
                     state_saving=predict(questions.fsdp_savings()["saved_vs_ddp"], size, world))
    # what the peak saves where no gradient is alive at it: the parameters' and the optimizer state's share
    peak_saving = (predict(memory.parameter_bytes("ddp"), size, world) - pred.params
                   + predict(memory.optimizer_state_bytes("ddp"), size, world) - pred.state)
    info["predicted"] = {"params": pred.params / u["bytes"], "state": pred.state / u["bytes"],
                         "params_state_saving": peak_saving / u["bytes"],
                         "params_state_share": peak_saving / pred.state_saving if pred.state_saving else None,
                         "model_state_saving": pred.state_saving / u["bytes"],
                         "model_state": predict(memory.model_state_bytes("fsdp"), size, world) / u["bytes"],
                         "unsharded_model_state": predict(memory.model_state_bytes("ddp"), size, world) / u["bytes"]}
    time_rows, saving_rows = [], []
    for dtype in sorted(g["compute_dtype"].unique(), key=lambda d: (d != "fp32", d)):
        per = _dtype_entry(size, g[g["compute_dtype"] == dtype], dtype, info, pred, u)
        rows = _dtype_rows(per, dtype, pred, u)
        time_rows += rows[0]
        saving_rows += rows[1]
        if dtype == "bf16":
            targets += _bf16_targets(size, world, per)
        info["dtypes"][dtype] = per
        info["measured_savings"] += [{"variant": _fsdp_label(v), "dtype": dtype, "peak": e["peak"],
                                      "saving": e["saving"], "share": e["saving_over_expected"]}
                                     for v, e in per["variants"].items() if e.get("saving") is not None]
    _judge(info)
    name = slug(size, world)
    info["allocator"] = any(e.get("peak") is not None for p in info["dtypes"].values() for e in p["variants"].values())
    if time_rows:
        info["tables"]["time_memory"] = table(time_rows, out, f"fsdp_step_{name}")
    if saving_rows:
        info["tables"]["savings"] = table(saving_rows, out, f"fsdp_savings_{name}")
    return info


def _dtype_entry(size: str, d: pd.DataFrame, dtype: str, info: dict, pred: Predicted, u: dict) -> dict:
    """One compute dtype's variants: step time, memory, measured saving against the expected (the model
    state FSDP saves plus the activations a narrower dtype saves), ours ÷ FSDP2 per unit."""
    batch, context, base = info["batch_size"], info["context_length"], info["baseline"]["peak"]
    act_saving = 0
    if batch is not None and context is not None and dtype in DTYPE_BYTES:
        shape = model_values(size, batch, context)
        act_saving = (evaluate(memory.model_activation_bytes(4), shape)
                      - evaluate(memory.model_activation_bytes(DTYPE_BYTES[dtype]), shape))
    expected = (pred.state_saving + act_saving) / u["bytes"]
    per: dict = {"expected_saving": expected, "activation_saving": act_saving / u["bytes"],
                 "activations_save": bool(act_saving > 0), "variants": {}}
    for v in sorted(d["variant"].unique(), key=_variant_order):
        r = d[d["variant"] == v].iloc[0]
        if r["status"] != "ok":
            per["variants"][v] = {"status": r["status"]}
            continue
        e = {"status": "ok", "mean_ms": number(r.get("mean_ms")), "std_ms": number(r.get("std_ms")), **timing_of(r),
             "gathers": number(r.get("fsdp_units")),  # all-gathers per forward (ours: one a unit)
             "after_init": in_unit(r.get("after_init_allocated_bytes"), u), "peak": in_unit(r.get("peak_bytes"), u),
             "params": in_unit(r.get("sharded_param_bytes"), u), "state": in_unit(r.get("optimizer_state_bytes"), u)}
        e["saving"] = base - e["peak"] if base is not None and e["peak"] is not None else None
        e["tensors_over_pred"] = [x / y for x, y in ((e["params"], pred.params / u["bytes"]),
                                                     (e["state"], pred.state / u["bytes"])) if x is not None and y]
        e["saving_over_expected"] = e["saving"] / expected if e["saving"] is not None and expected else None
        per["variants"][v] = e
    theirs = per["variants"].get("fsdp2", {})
    ranges = {v: paired_ratio(e, theirs) for v, e in per["variants"].items()
              if v.startswith("ours") and e.get("mean_ms") is not None and theirs.get("mean_ms")}
    per["ours_vs_fsdp2"] = ranges["ours"]["ratio"] if ranges.get("ours") else None
    per["ours_vs_fsdp2_range"] = ranges.get("ours")
    per["units_vs_fsdp2"] = {_unit_phrase(v): r["ratio"] for v, r in ranges.items() if v != "ours"}
    per["units_vs_fsdp2_range"] = {_unit_phrase(v): r for v, r in ranges.items() if v != "ours"}
    return per


def _dtype_rows(per: dict, dtype: str, pred: Predicted, u: dict) -> tuple[list[dict], list[dict]]:
    """One compute dtype's rows of the time-and-memory table and of the savings table."""
    unit = u["name"]
    time_rows, saving_rows = [], []
    for v, e in per["variants"].items():
        label = _fsdp_label(v)
        r = per["ours_vs_fsdp2_range"] if v == "ours" else per["units_vs_fsdp2_range"].get(_unit_phrase(v))
        v_ratio = f"{r['ratio']:.3f} ({r['lo']:.3f}–{r['hi']:.3f})" if v.startswith("ours") and r else ""
        if e["status"] != "ok":
            time_rows.append({"compute": dtype, "variant": label, "step (ms)": e["status"]})
            continue
        time_rows.append({"compute": dtype, "variant": label,
                          "step (ms)": cell(e["mean_ms"], 2), "÷ FSDP2": v_ratio,
                          "round means (ms)": ", ".join(f"{m:.1f}" for m in e["round_ms"]) if e["rounds"] > 1 else "",
                          f"peak ({unit})": cell(e["peak"]),
                          f"params ({unit})": cell(e["params"]), f"opt. state ({unit})": cell(e["state"])})
        saving_rows.append({"compute": dtype, "variant": label,
                            f"params pred. ({unit})": cell(pred.params / u["bytes"]),
                            f"params ({unit})": cell(e["params"]),
                            f"state pred. ({unit})": cell(pred.state / u["bytes"]),
                            f"state ({unit})": cell(e["state"]),
                            f"saving exp. ({unit})": cell(per["expected_saving"]),
                            f"saving ({unit})": cell(e["saving"])})
    return time_rows, saving_rows


def _bf16_targets(size: str, world: int, per: dict) -> list[dict]:
    """The bf16 target judged for each unit of ours that ran, per layer (the default, the course adapter's)
    first: each on the range of its ratio across the job's rounds, with its all-gathers per forward. The
    verdicts also go into `per["verdicts"]` (unit phrase, "layer" for the default -> verdict) for the table."""
    limit = TARGETS["fsdp_vs_fsdp2_bf16"]
    out, per["verdicts"] = [], {}
    for variant in sorted((v for v in per["variants"] if v.startswith("ours")), key=_variant_order):
        unit = "layer" if variant == "ours" else _unit_phrase(variant)
        r = per["ours_vs_fsdp2_range"] if variant == "ours" else per["units_vs_fsdp2_range"].get(unit)
        what = ("step time at bf16 compute, ours per layer (the default) ÷ FSDP2" if unit == "layer"
                else f"step time at bf16 compute, ours with {unit} ÷ FSDP2")
        ok = against_limit(r["lo"], r["hi"], limit) if r else None
        t = target("fsdp_vs_fsdp2_bf16", size, what, r["ratio"] if r else None, limit, ok, world=world, spread=r)
        out.append(t | {"unit": unit, "gathers": per["variants"].get(variant, {}).get("gathers")})
        per["verdicts"][unit] = ok
    return out


def _judge(info: dict) -> None:
    """The size's verdicts: whether a saving fell short of the expected, what sits above the model state
    at each peak, whether the tensors match the accounting, whether ours is slower than FSDP2."""
    info["short_of_expected"] = any(s["share"] is not None and s["share"] < 1 for s in info["measured_savings"])
    ratios = [r for p in info["dtypes"].values() for e in p["variants"].values()
              for r in e.get("tensors_over_pred", [])]
    info["worst_tensor_ratio"] = max(ratios, key=lambda r: abs(r - 1)) if ratios else None
    tol = TARGETS["model_state_tolerance"]
    info["tensors_match"] = bool(ratios) and within_tolerance(info["worst_tensor_ratio"], tol)
    info["ours_slower"] = any(slower(p["ours_vs_fsdp2"]) for p in info["dtypes"].values())


def bf16_overview(fsdp: list[dict]) -> dict | None:
    """Ours per unit against FSDP2 with bf16 compute over every job, for the prose: per unit ("layer", the
    default, and each other unit that ran) the ratios' range, the fastest and slowest rounds, whether ours was
    slower (or faster) in every round of every job, and its all-gathers per forward at the largest model;
    FSDP2's widest spread of round means within one job (the baseline's own noise, which the ranges carry)."""
    units: dict[str, dict] = {}
    spread = None
    for f in fsdp:
        per = f["dtypes"].get("bf16")
        if per is None:
            continue
        ranges = {"layer": per["ours_vs_fsdp2_range"], **per["units_vs_fsdp2_range"]}
        for unit, r in ranges.items():
            if r is None:
                continue
            u = units.setdefault(unit, {"ratios": [], "lo": [], "hi": [], "gathers": None, "size": None})
            u["ratios"].append(r["ratio"])
            u["lo"].append(r["lo"])
            u["hi"].append(r["hi"])
            variant = "ours" if unit == "layer" else next(v for v in per["variants"] if _unit_phrase(v) == unit)
            gathers = per["variants"][variant].get("gathers")
            if gathers is not None and (u["gathers"] is None or gathers >= u["gathers"]):
                u["gathers"], u["size"] = int(gathers), f["size"]
        rounds = per["variants"].get("fsdp2", {}).get("round_ms") or []
        if len(rounds) > 1 and min(rounds) > 0:
            s = {"size": f["size"], "world": f["world"], "lo_ms": min(rounds), "hi_ms": max(rounds),
                 "spread": max(rounds) / min(rounds) - 1}
            spread = s if spread is None or s["spread"] > spread["spread"] else spread
    if not units:
        return None
    out = {unit: {"min": min(u["ratios"]), "max": max(u["ratios"]), "fastest_round": min(u["lo"]),
                  "slowest_round": max(u["hi"]), "slower_every_round": min(u["lo"]) > 1,
                  "faster_every_round": max(u["hi"]) < 1, "gathers": u["gathers"], "size": u["size"]}
           for unit, u in units.items()}
    return {"units": out, "fsdp2_spread": spread}


def saving_overview(fsdp: list[dict]) -> dict | None:
    """The fp32 variants' measured savings over every job against the model state's saving (the accounting's
    answer) and against its parameters' and optimizer state's share of it, the saving of a peak at which no
    gradient is alive: the shares' ranges and whether every fp32 share lies within `PEAK_FIT_TOLERANCE` of
    that share (`near_params_state`)."""
    shares = [s["share"] for f in fsdp for s in f["measured_savings"]
              if s["dtype"] == "fp32" and s["share"] is not None]
    parts = [f["predicted"]["params_state_share"] for f in fsdp if f["predicted"].get("params_state_share")]
    if not shares or not parts:
        return None
    return {"fp32_min": min(shares), "fp32_max": max(shares), "params_state_share": min(parts),
            "params_state_share_max": max(parts),
            "near_params_state": all(abs(x - p) <= PEAK_FIT_TOLERANCE for x in shares for p in parts)}
