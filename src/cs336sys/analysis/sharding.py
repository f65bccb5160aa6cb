"""Section: sharding — optimizer state sharding (problems optimizer_state_sharding and its accounting)
and FSDP (fsdp, fsdp_accounting): memory by what holds it, against the accounting package's
predictions; step times against ZeroRedundancyOptimizer and FSDP2; the gather timeline of one FSDP
step; the grid's machine time.

Inputs: `sharding_memory`, `fsdp_step` and `fsdp_trace` result files, the folder rendered beside each
`fsdp_trace` result (its `timeline.json`, `cs336sys.profiling.timeline.summarize_timeline`) and each
job's Snakemake timing record (`benchmarks/<experiment>/<job>.tsv`).

Every prediction is a formula of `cs336sys.accounting` evaluated here: `memory.parameter_bytes`,
`gradient_bytes`, `optimizer_state_bytes` and `model_activation_bytes` by strategy (unsharded = "ddp",
ours and ZeroRedundancyOptimizer = "zero1", FSDP = "fsdp"), `questions.fsdp_savings` for the saving FSDP
should bring, `communication.step_transfers` for the bytes a step sends. Bytes print in GiB, as in
the accounting section, or in MiB where every model is smaller than a GiB (the smoke grid's).
On the CPU the allocator's readings are null: tables leave out the columns that hold no value, and the
template says what is missing.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import pandas as pd
import sympy as sp

from cs336sys.accounting import communication as comm
from cs336sys.accounting import memory, questions
from cs336sys.accounting.compute import model_values
from cs336sys.accounting.symbols import N, P, evaluate
from cs336sys.analysis.common import (
    environment_summary,
    figure,
    read_benchmark_tsv,
    results_frame,
    save_figure,
    save_table,
    size_key,
)
from cs336sys.analysis.verdicts import at_most, compare_times, slower, waits, within_tolerance
from cs336sys.registry import EXPERIMENTS

# Targets of the project's sharding issue (ratios of times measured in the same job).
TARGETS = {"sharded_vs_zero": 1.05, "fsdp_vs_fsdp2_bf16": 1.10, "model_state_tolerance": 0.05}
VARIANTS = ("unsharded", "sharded", "zero")
VARIANT_LABEL = {"unsharded": "unsharded", "sharded": "ours (sharded)", "zero": "torch ZeRO"}  # short, for tables
STRATEGY = {"unsharded": "ddp", "sharded": "zero1", "zero": "zero1"}  # cs336sys.accounting.memory strategies
FSDP_VARIANTS = ("ours", "fsdp2")
FSDP_LABEL = {"ours": "ours", "fsdp2": "FSDP2"}  # ours with other units: "ours-block", "ours-2", ...
DTYPE_BYTES = {"fp32": 4, "tf32": 4, "bf16": 2, "fp16": 2}
POINTS = ("after init", "before step", "after step")  # the handout's three readings
EXPERIMENT_NAMES = ("sharding_memory", "fsdp_step", "fsdp_trace")

# Timeline analysis: a gather counts as waited for when the compute lanes are idle as it ends and resume
# within this many microseconds of its end.
WAIT_SLACK_US = 50.0
GATHER = re.compile(r"all_?gather|allgather", re.I)
PHASES = ("forward", "backward")
TIMELINE_COLORS = {"compute": "#4C72B0", "all-gather": "#DD8452", "other communication": "#937860",
                   "memcpy": "#55A868", "memset": "#8172B3", "exposed": "#C44E52"}
PHASE_SHADES = {"forward": "#9ecae1", "backward": "#fdae6b", "sync": "#fc9272", "optimizer_step": "#a1d99b"}
ZOOM_GATHERS = 8  # the zoomed panel: the forward from its start to the end of its first gathers


def build(paths: list[Path], out: Path, **_: object) -> dict:
    frame = results_frame(paths)
    ctx: dict = {"env": environment_summary(frame), "tables": {}, "figures": {}, "target_values": TARGETS,
                 "formulas": _formulas()}
    walls = _machine_time(paths, frame)
    if walls:
        ctx["machine_time"] = walls
    if frame.empty:
        return ctx
    targets: list[dict] = []
    u = ctx["unit"] = _unit(frame)
    shard = frame[frame.problem == "sharding_memory"]
    if not shard.empty:
        ctx["opt"] = [_optimizer_size(size, g, out, targets, u) for size, g in _by_size(shard)]
    fsdp = frame[frame.problem == "fsdp_step"]
    proxy = fsdp[_is_proxy(fsdp)]
    fsdp = fsdp.drop(index=proxy.index)
    if not fsdp.empty:
        ctx["fsdp"] = [_fsdp_size(size, g, shard, out, targets, u) for size, g in _by_size(fsdp)]
        ctx["fsdp_allocator"] = any(f["allocator"] for f in ctx["fsdp"])
    if not proxy.empty:
        ctx["fsdp_proxy"] = _fsdp_proxy(proxy, out)
    trace = _trace(frame[frame.problem == "fsdp_trace"], paths, out)
    if trace:
        ctx["trace"] = trace
    ctx["targets"] = targets
    ctx["summary"] = [
        {"part": ("Sharded optimizer against ZeroRedundancyOptimizer" if t["target"] == "sharded_vs_zero"
                  else "Our FSDP against FSDP2, bf16 compute") + f", {t['size']}",
         "result": f"{t['value']:.3f}× its step time", "target": f"≤ {t['limit']:.2f}×", "met": t["ok"],
         "ref": "shard-targets",
         "why": None if t["ok"] else ("it gathers layer by layer from Python hooks, FSDP2 a whole block at once"
                                      if t["target"] != "sharded_vs_zero" and "block" not in t["what"] else None)}
        for t in targets if t["target"] in ("sharded_vs_zero", "fsdp_vs_fsdp2_bf16") and t["value"] is not None]
    return ctx


# --- helpers ---------------------------------------------------------------------------------------

def _by_size(df: pd.DataFrame):
    sizes = sorted(df["size"].unique(), key=lambda s: size_key(pd.Series([s])).iloc[0])
    return [(s, df[df["size"] == s]) for s in sizes]


def _num(value) -> float | None:
    """A reading as a float, or None where it is absent (an allocator reading on the CPU is null)."""
    if value is None:
        return None
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(v) else v


def _unit(frame: pd.DataFrame) -> dict:
    """GiB for real models, as the rest of the report; MiB where every model held is smaller than a GiB
    (the smoke grid's tiny ones)."""
    held = [v for c in ("param_bytes", "sharded_param_bytes") if c in frame for v in frame[c].dropna()]
    return {"name": "MiB", "bytes": 2**20} if held and max(held) < 2**30 else {"name": "GiB", "bytes": 2**30}


def _in(value, u: dict) -> float | None:
    v = _num(value)
    return None if v is None else v / u["bytes"]


def _cell(value, digits: int = 3) -> str:
    return "n/a" if value is None else f"{value:,.{digits}f}"


def _table(rows: list[dict], out: Path, name: str) -> str:
    """Save a table without the columns that hold no value in any row (the allocator's readings on
    the CPU, a ratio to a variant that failed): a column of "n/a" says nothing the prose does not."""
    df = pd.DataFrame(rows).fillna("")
    empty = [c for c in df.columns if df[c].isin(["n/a", ""]).all() and df[c].eq("n/a").any()]
    return save_table(df.drop(columns=empty), out, name)


def _class_values(size: str, world: int) -> dict:
    return {**questions.parameter_class_values(size), N: world}


def _predict(formula, size: str, world: int) -> int | float:
    return evaluate(formula, _class_values(size, world))


# In the prose's formulas: P parameters in all, of which S in the matrices FSDP shards (the blocks',
# the embedding's and the LM head's) and R in the RMSNorm gains it keeps whole. Plain letters and
# folded fractions, which print at the body's size (subscripts and stacked fractions print smaller).
S_SHARDED, R_REPLICATED = sp.symbols("S R", positive=True)


def _inline(expr, split: bool = False) -> str:
    """LaTeX of an accounting formula in P (`split`: in S and R), for inline math."""
    expr = sp.sympify(expr)
    if split:
        expr = expr.subs({memory.P_BLOCK: S_SHARDED - memory.P_EMBED, memory.P_NORM: R_REPLICATED})
    else:
        expr = expr.subs(memory.P_BLOCK, P - memory.P_EMBED - memory.P_NORM)
    return sp.latex(sp.factor(sp.simplify(expr)), mul_symbol=None, fold_short_frac=True)


def _formulas() -> dict:
    """The accounting's per-GPU formulas, for the prose: model state by strategy (fp32 parameters,
    gradients and AdamW's two moments), each term of it, and the bytes one rank sends per step (fp32
    gradients and parameters)."""
    savings = questions.fsdp_savings()
    out = {k: _inline(savings[k], split=True) for k in ("ddp", "zero1", "fsdp", "saved_vs_ddp")}
    for strategy in ("ddp", "zero1"):
        out[f"{strategy}_total"] = _inline(memory.model_state_bytes(strategy))
        out[f"{strategy}_state"] = _inline(memory.optimizer_state_bytes(strategy))
    out["params"] = _inline(memory.parameter_bytes("ddp"))
    out["state_saving"] = _inline(memory.optimizer_state_bytes("ddp") - memory.optimizer_state_bytes("zero1"))
    model = P * 4
    sent = {"ddp": comm.step_transfers("ddp", grad_bytes=4),
            "ours": comm.step_transfers("zero1", grad_bytes=4, param_bytes=4),
            "zero_paper": [comm.Transfer("gradients", "reduce_scatter", model, N),
                           comm.Transfer("updated parameters", "all_gather", model, N)]}
    for name, transfers in sent.items():
        out[f"sent_{name}"] = _inline(sum(t.bytes_sent() for t in transfers))
    return out


def _target(name: str, size: str, what: str, value: float | None, limit: float, ok: bool | None,
            note: str = "") -> dict:
    return {"target": name, "size": size, "what": what, "value": value, "limit": limit, "ok": ok,
            "status": "not measured" if ok is None else ("met" if ok else "missed"), "note": note}


# --- optimizer state sharding ----------------------------------------------------------------------

def _readings(r: pd.Series | dict) -> dict:
    """One rank's readings in bytes: tensor sums at each point and the allocator's (None on the CPU)."""
    get = r.get
    params, grads, state = (_num(get(k)) for k in ("param_bytes", "grad_bytes", "optimizer_state_bytes"))
    tensors = {"after init": params,
               "before step": None if None in (params, grads) else params + grads,
               "after step": None if None in (params, grads, state) else params + grads + state}
    keys = {"after init": "after_init", "before step": "before_step", "after step": "after_step"}
    return {"params": params, "grads": grads, "state": state, "tensors": tensors,
            "allocated": {p: _num(get(f"{keys[p]}_allocated_bytes")) for p in POINTS},
            "peak": {p: _num(get(f"{keys[p]}_peak_bytes")) for p in POINTS}}


def _rank_rows(r: pd.Series) -> list[dict]:
    ranks = r.get("ranks")
    if isinstance(ranks, list) and ranks and all(isinstance(x, dict) for x in ranks):
        return ranks
    return [r.to_dict()]


def _world(g: pd.DataFrame) -> int:
    for col in ("world_size", "env.world_size"):
        if col in g and g[col].notna().any():
            return int(g[col].dropna().iloc[0])
    return 2


def _optimizer_size(size: str, g: pd.DataFrame, out: Path, targets: list[dict], u: dict) -> dict:
    """One size's sharding_memory job: allocator readings, the breakdown by what holds the memory, the
    accounting's prediction per term and rank, step times; the two targets of the size."""
    world = _world(g)
    g = g.assign(_order=g["variant"].map(lambda v: VARIANTS.index(v) if v in VARIANTS else len(VARIANTS)))
    g = g.sort_values("_order")
    ok = g[g.status == "ok"]
    info: dict = {"size": size, "world": world, "tables": {}, "variants": {},
                  "statuses": {r["variant"]: r["status"] for _, r in g[g.status != "ok"].iterrows()}}
    if "parameters" in ok and ok["parameters"].notna().any():
        info["parameters"] = int(ok["parameters"].dropna().iloc[0])
    for col in ("context_length", "batch_size", "dtype", "steps"):
        if col in g and g[col].notna().any():
            value = g[col].dropna().iloc[0]
            info[col] = value if isinstance(value, str) else int(value)
    if "batch_size" in info and "context_length" in info:  # what autograd saves, for the before-step peak
        shape = model_values(size, info["batch_size"], info["context_length"])
        per_element = DTYPE_BYTES.get(info.get("dtype", "fp32"), 4)
        info["predicted_activations"] = evaluate(memory.model_activation_bytes(per_element), shape) / u["bytes"]
    unit = u["name"]
    alloc_rows, breakdown_rows, prediction_rows, time_rows = [], [], [], []
    for _, r in ok.iterrows():
        v = r["variant"]
        strategy = STRATEGY.get(v)
        label = VARIANT_LABEL.get(v, v)
        rd = _readings(r)
        e: dict = {"label": label, "strategy": strategy, "mean_ms": _num(r.get("mean_ms")),
                   "std_ms": _num(r.get("std_ms")), "median_ms": _num(r.get("median_ms")),
                   "params": _in(rd["params"], u), "grads": _in(rd["grads"], u), "state": _in(rd["state"], u),
                   "tensors": {p: _in(x, u) for p, x in rd["tensors"].items()},
                   "allocated": {p: _in(x, u) for p, x in rd["allocated"].items()},
                   "peak": {p: _in(x, u) for p, x in rd["peak"].items()},
                   "other": {p: _in(rd["peak"][p] - rd["tensors"][p], u)
                             if None not in (rd["peak"][p], rd["tensors"][p]) else None for p in POINTS}}
        peaks = [x for x in e["peak"].values() if x is not None]
        e["first_step_peak"] = max(peaks) if peaks else None
        e["overall_peak"] = steady_state_peak(e["peak"], e["state"])
        alloc_rows.append({"variant": label,
                           **{f"{p}: alloc. ({unit})": _cell(e["allocated"][p]) for p in POINTS},
                           **{f"{p}: peak ({unit})": _cell(e["peak"][p]) for p in POINTS}})
        for p in POINTS:
            breakdown_rows.append({
                "variant": label, "point": p, f"params ({unit})": _cell(e["params"]),
                f"grads ({unit})": _cell(e["grads"]) if p != "after init" else "",
                f"opt. state ({unit})": _cell(e["state"]) if p == "after step" else "",
                f"tensors ({unit})": _cell(e["tensors"][p]), f"allocated ({unit})": _cell(e["allocated"][p]),
                f"peak ({unit})": _cell(e["peak"][p]), f"peak − tensors ({unit})": _cell(e["other"][p])})
        if strategy:
            predicted = {"params": _predict(memory.parameter_bytes(strategy), size, world),
                         "grads": _predict(memory.gradient_bytes(strategy), size, world),
                         "state": _predict(memory.optimizer_state_bytes(strategy), size, world)}
            predicted["total"] = sum(predicted.values())
            e["predicted"] = {k: x / u["bytes"] for k, x in predicted.items()}
            worst, ranks = None, []
            for i, rank in enumerate(_rank_rows(r)):
                rr = _readings(rank)
                measured = rr["tensors"]["after step"]
                ratio = measured / predicted["total"] if measured is not None and predicted["total"] else None
                ranks.append({"rank": i, "measured": _in(measured, u), "ratio": ratio, "state": _in(rr["state"], u),
                              "allocated_after_step": _in(rr["allocated"]["after step"], u)})
                if ratio is not None and (worst is None or abs(ratio - 1) > abs(worst - 1)):
                    worst = ratio
                prediction_rows.append({
                    "variant": label, "rank": i,
                    f"params pred. ({unit})": _cell(predicted["params"] / u["bytes"]),
                    f"params ({unit})": _cell(_in(rr["params"], u)),
                    f"grads pred. ({unit})": _cell(predicted["grads"] / u["bytes"]),
                    f"grads ({unit})": _cell(_in(rr["grads"], u)),
                    f"state pred. ({unit})": _cell(predicted["state"] / u["bytes"]),
                    f"state ({unit})": _cell(_in(rr["state"], u)), "sum ÷ pred.": _cell(ratio, 4)})
            e["ranks"], e["worst_ratio"] = ranks, worst
            states = [x["state"] for x in ranks if x["state"] is not None]
            if len(states) > 1 and min(states) > 0:
                e["state_max_over_min"] = max(states) / min(states)
            tol = TARGETS["model_state_tolerance"]
            targets.append(_target("model_state", size,
                                   f"parameters + gradients + optimizer state, {label}: worst rank ÷ accounting",
                                   worst, tol, within_tolerance(worst, tol)))
        info["variants"][v] = e

    unsharded = info["variants"].get("unsharded", {}).get("mean_ms")
    zero = info["variants"].get("zero", {}).get("mean_ms")
    for e in info["variants"].values():
        e["vs_unsharded"] = e["mean_ms"] / unsharded if unsharded and e["mean_ms"] is not None else None
        e["vs_zero"] = e["mean_ms"] / zero if zero and e["mean_ms"] is not None else None
        time_rows.append({"variant": e["label"], "step (ms)": _cell(e["mean_ms"], 2), "std (ms)": _cell(e["std_ms"], 2),
                          "median (ms)": _cell(e["median_ms"], 2), "÷ unsharded": _cell(e["vs_unsharded"], 3),
                          "÷ torch ZeRO": _cell(e["vs_zero"], 3)})
    un, sh = info["variants"].get("unsharded"), info["variants"].get("sharded")
    info["sharded_vs_unsharded"] = (  # the step-time verdict of the text: None where either did not run
        compare_times(sh["mean_ms"], sh["std_ms"], un["mean_ms"], un["std_ms"]).as_dict()
        if un and sh and un["mean_ms"] is not None and sh["mean_ms"] is not None else None)
    for v, status in info["statuses"].items():
        time_rows.append({"variant": VARIANT_LABEL.get(v, v), "step (ms)": status})
    info["saving"] = _sharding_saving(info["variants"], size, world, u)
    worst = [e["worst_ratio"] for e in info["variants"].values() if e.get("worst_ratio") is not None]
    info["tensors_match"] = bool(worst) and all(within_tolerance(r, TARGETS["model_state_tolerance"]) for r in worst)
    sharded = info["variants"].get("sharded", {}).get("mean_ms")
    ratio = sharded / zero if sharded is not None and zero else None
    info["sharded_vs_zero"] = ratio
    limit = TARGETS["sharded_vs_zero"]
    targets.append(_target("sharded_vs_zero", size, "step time, ours (sharded) ÷ torch ZeRO", ratio,
                           limit, at_most(ratio, limit)))

    slug = re.sub(r"\W", "_", size)
    info["allocator"] = any(x is not None for e in info["variants"].values() for x in e["peak"].values())
    if info["allocator"]:
        info["tables"]["allocator"] = _table(alloc_rows, out, f"sharding_allocator_{slug}")
    if breakdown_rows:
        info["tables"]["breakdown"] = _table(breakdown_rows, out, f"sharding_breakdown_{slug}")
    if prediction_rows:
        info["tables"]["prediction"] = _table(prediction_rows, out, f"sharding_prediction_{slug}")
    if time_rows:
        info["tables"]["time"] = _table(time_rows, out, f"sharding_time_{slug}")
    info["communication"] = _communication_volume(size, world, u)
    return info


def steady_state_peak(peak: dict, state: float | None) -> float | None:
    """The peak of a step after the first. The readings are of the first timed point's step, whose forward
    and backward run before any optimizer state exists; every later step's run with the state allocated, so
    its forward-and-backward peak is the first one's plus the state, and the optimizer step's peak recurs."""
    candidates = [peak.get("after step")]
    if peak.get("before step") is not None and state is not None:
        candidates.append(peak["before step"] + state)
    candidates = [c for c in candidates if c is not None]
    return max(candidates) if candidates else None


def _sharding_saving(variants: dict, size: str, world: int, u: dict) -> dict:
    """What sharding the optimizer state saves per rank against the unsharded run: the accounting's
    (DDP's state minus zero1's), the state tensors' (rank 0), the allocator's highest peak."""
    expected = (_predict(memory.optimizer_state_bytes("ddp"), size, world)
                - _predict(memory.optimizer_state_bytes("zero1"), size, world)) / u["bytes"]
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
    values = _class_values(size, world)

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


# --- FSDP ------------------------------------------------------------------------------------------

def _baseline(size: str, shard: pd.DataFrame, batch: int | None, context: int | None, u: dict) -> dict:
    """The unsharded peak FSDP's saving is measured against: the `unsharded` sharding_memory point of the
    same size and batch shape where it has allocator readings (the highest of its three peaks), else the
    accounting's prediction (DDP's fp32 model state plus fp32 saved activations)."""
    if not shard.empty:
        same = shard[(shard["size"] == size) & (shard["variant"] == "unsharded") & (shard.status == "ok")]
        if batch is not None and "batch_size" in same:
            same = same[(same["batch_size"] == batch) & (same["context_length"] == context)]
        for _, r in same.iterrows():
            steady = steady_state_peak({"before step": _num(r.get("before_step_peak_bytes")),
                                        "after step": _num(r.get("after_step_peak_bytes"))},
                                       _num(r.get("optimizer_state_bytes")))
            if steady is not None:
                return {"source": "measured", "peak": steady / u["bytes"]}
    if batch is None or context is None:
        return {"source": "none", "peak": None}
    state = _predict(memory.model_state_bytes("ddp"), size, 1)
    acts = evaluate(memory.model_activation_bytes(4), model_values(size, batch, context))
    return {"source": "predicted", "peak": (state + acts) / u["bytes"], "model_state": state / u["bytes"],
            "activations": acts / u["bytes"]}


def _is_proxy(df: pd.DataFrame) -> pd.Series:
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
    unit = v.removeprefix("ours-")
    return "block units" if unit == "block" else f"{unit} blocks per unit"


def _fsdp_label(v: str) -> str:
    return FSDP_LABEL[v] if v in FSDP_LABEL else f"ours, {_unit_phrase(v)}"


def _variant_order(v: str) -> tuple:
    return (v == "fsdp2", v != "ours", v)


def _fsdp_proxy(g: pd.DataFrame, out: Path) -> dict:
    """Our FSDP on one rank, per size, compute dtype and unit: the step time with nothing communicated."""
    rows = []
    for _, r in g.sort_values(["size", "compute_dtype"]).iterrows():
        ok = r["status"] == "ok"
        units = _num(r.get("fsdp_units"))
        rows.append({"size": r["size"], "compute": r["compute_dtype"], "unit": _unit_of(r),
                     "all-gathers per forward": "" if units is None else f"{int(units)}",
                     "step (ms)": _cell(_num(r.get("mean_ms")), 2) if ok else r["status"],
                     "std (ms)": _cell(_num(r.get("std_ms")), 2) if ok else ""})
    return {"table": _table(rows, out, "fsdp_single_rank_proxy"), "sizes": sorted(set(g["size"]))}


def _fsdp_size(size: str, g: pd.DataFrame, shard: pd.DataFrame, out: Path, targets: list[dict], u: dict) -> dict:
    """One size's fsdp_step job(s): per compute dtype, ours (per layer, and with other units where they
    ran) against FSDP2 (time, memory), the accounting's parameters and optimizer state next to the
    measured, expected and measured saving of the peak."""
    g = g.assign(variant=[_fsdp_variant(r) for _, r in g.iterrows()])
    world = _world(g)
    batch = int(g["batch_size"].iloc[0]) if "batch_size" in g else None
    context = int(g["context_length"].iloc[0]) if "context_length" in g else None
    info: dict = {"size": size, "world": world, "batch_size": batch, "context_length": context, "tables": {},
                  "dtypes": {}, "baseline": _baseline(size, shard, batch, context, u), "measured_savings": []}
    if "parameters" in g and g["parameters"].notna().any():
        info["parameters"] = int(g["parameters"].dropna().iloc[0])
    base = info["baseline"]["peak"]
    state_saving = _predict(questions.fsdp_savings()["saved_vs_ddp"], size, world)
    params_pred = _predict(memory.parameter_bytes("fsdp"), size, world)
    state_pred = _predict(memory.optimizer_state_bytes("fsdp"), size, world)
    info["predicted"] = {"params": params_pred / u["bytes"], "state": state_pred / u["bytes"],
                         "model_state_saving": state_saving / u["bytes"],
                         "model_state": _predict(memory.model_state_bytes("fsdp"), size, world) / u["bytes"],
                         "unsharded_model_state": _predict(memory.model_state_bytes("ddp"), size, world) / u["bytes"]}
    unit = u["name"]
    time_rows, saving_rows = [], []
    for dtype in sorted(g["compute_dtype"].unique(), key=lambda d: (d != "fp32", d)):
        d = g[g["compute_dtype"] == dtype]
        act_saving = 0
        if batch is not None and context is not None and dtype in DTYPE_BYTES:
            shape = model_values(size, batch, context)
            act_saving = (evaluate(memory.model_activation_bytes(4), shape)
                          - evaluate(memory.model_activation_bytes(DTYPE_BYTES[dtype]), shape))
        expected = (state_saving + act_saving) / u["bytes"]
        per: dict = {"expected_saving": expected, "activation_saving": act_saving / u["bytes"],
                     "activations_save": bool(act_saving > 0), "variants": {}}
        for v in sorted(d["variant"].unique(), key=_variant_order):
            r = d[d["variant"] == v].iloc[0]
            if r["status"] != "ok":
                per["variants"][v] = {"status": r["status"]}
                continue
            e = {"status": "ok", "mean_ms": _num(r.get("mean_ms")), "std_ms": _num(r.get("std_ms")),
                 "after_init": _in(r.get("after_init_allocated_bytes"), u), "peak": _in(r.get("peak_bytes"), u),
                 "params": _in(r.get("sharded_param_bytes"), u), "state": _in(r.get("optimizer_state_bytes"), u)}
            e["saving"] = base - e["peak"] if base is not None and e["peak"] is not None else None
            e["tensors_over_pred"] = [x / y for x, y in ((e["params"], params_pred / u["bytes"]),
                                                         (e["state"], state_pred / u["bytes"])) if x is not None and y]
            e["saving_over_expected"] = e["saving"] / expected if e["saving"] is not None and expected else None
            per["variants"][v] = e
        ours, theirs = per["variants"].get("ours", {}), per["variants"].get("fsdp2", {})
        ratio = (ours["mean_ms"] / theirs["mean_ms"] if ours.get("mean_ms") is not None and theirs.get("mean_ms")
                 else None)
        per["ours_vs_fsdp2"] = ratio
        per["units_vs_fsdp2"] = {_unit_phrase(v): e["mean_ms"] / theirs["mean_ms"] for v, e in per["variants"].items()
                                 if v.startswith("ours-") and e.get("mean_ms") is not None and theirs.get("mean_ms")}
        for v, e in per["variants"].items():
            label = _fsdp_label(v)
            v_ratio = (e["mean_ms"] / theirs["mean_ms"] if v.startswith("ours") and e.get("mean_ms") is not None
                       and theirs.get("mean_ms") else None)
            if e["status"] != "ok":
                time_rows.append({"compute": dtype, "variant": label, "step (ms)": e["status"]})
                continue
            time_rows.append({"compute": dtype, "variant": label,
                              "step (ms)": _cell(e["mean_ms"], 2), "std (ms)": _cell(e["std_ms"], 2),
                              "ours ÷ FSDP2": _cell(v_ratio, 3) if v.startswith("ours") else "",
                              f"after init ({unit})": _cell(e["after_init"]), f"peak ({unit})": _cell(e["peak"]),
                              f"params ({unit})": _cell(e["params"]), f"opt. state ({unit})": _cell(e["state"])})
            saving_rows.append({"compute": dtype, "variant": label,
                                f"params pred. ({unit})": _cell(params_pred / u["bytes"]),
                                f"params ({unit})": _cell(e["params"]),
                                f"state pred. ({unit})": _cell(state_pred / u["bytes"]),
                                f"state ({unit})": _cell(e["state"]),
                                f"saving exp. ({unit})": _cell(expected), f"saving ({unit})": _cell(e["saving"])})
        if dtype == "bf16":  # the target: our best unit (per layer where no other ran)
            limit = TARGETS["fsdp_vs_fsdp2_bf16"]
            best, what = ratio, "step time at bf16 compute, ours ÷ FSDP2"
            for phrase, r in per["units_vs_fsdp2"].items():
                if best is None or r < best:
                    best, what = r, f"step time at bf16 compute, ours with {phrase} ÷ FSDP2"
            targets.append(_target("fsdp_vs_fsdp2_bf16", size, what, best, limit,
                                   at_most(best, limit)))
        info["dtypes"][dtype] = per
        info["measured_savings"] += [{"variant": _fsdp_label(v), "dtype": dtype, "peak": e["peak"],
                                      "saving": e["saving"], "share": e["saving_over_expected"]}
                                     for v, e in per["variants"].items() if e.get("saving") is not None]
    info["short_of_expected"] = any(s["share"] is not None and s["share"] < 1 for s in info["measured_savings"])
    # Where a peak sits above the model state the run holds (parameters, gradients, optimizer state, as
    # predicted: the tables show the prediction matches the tensors): the memory alive at the peak's moment
    # besides the model state. Unsharded, the peak comes when every gradient exists and the backward has
    # freed the saved activations; sharded, at the end of the forward, with the activations alive.
    if info["baseline"]["source"] == "measured":
        info["baseline"]["above_state"] = base - info["predicted"]["unsharded_model_state"]
        for saving in info["measured_savings"]:
            if saving["peak"] is not None:
                saving["above_state"] = saving["peak"] - info["predicted"]["model_state"]
    ratios = [r for p in info["dtypes"].values() for e in p["variants"].values()
              for r in e.get("tensors_over_pred", [])]
    info["worst_tensor_ratio"] = max(ratios, key=lambda r: abs(r - 1)) if ratios else None
    tol = TARGETS["model_state_tolerance"]
    info["tensors_match"] = bool(ratios) and within_tolerance(info["worst_tensor_ratio"], tol)
    info["ours_slower"] = any(slower(p["ours_vs_fsdp2"]) for p in info["dtypes"].values())
    slug = re.sub(r"\W", "_", size)
    info["allocator"] = any(e.get("peak") is not None for p in info["dtypes"].values() for e in p["variants"].values())
    if time_rows:
        info["tables"]["time_memory"] = _table(time_rows, out, f"fsdp_step_{slug}")
    if saving_rows:
        info["tables"]["savings"] = _table(saving_rows, out, f"fsdp_savings_{slug}")
    return info


# --- the FSDP timeline -----------------------------------------------------------------------------

def _intersection(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> list[tuple[float, float]]:
    from cs336sys.profiling.trace import merge_intervals

    a, b = merge_intervals(a), merge_intervals(b)
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if hi > lo:
            out.append((lo, hi))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return out


def _complement(busy: list[tuple[float, float]], lo: float, hi: float) -> list[tuple[float, float]]:
    from cs336sys.profiling.trace import merge_intervals

    gaps, t = [], lo
    for a, b in merge_intervals(busy):
        if a > t:
            gaps.append((t, min(a, hi)))
        t = max(t, b)
        if t >= hi:
            break
    if t < hi:
        gaps.append((t, hi))
    return [(a, b) for a, b in gaps if b > a]


def _length(intervals) -> float:
    from cs336sys.profiling.trace import union_length

    return union_length(intervals)


def _phase_extents(summary: dict) -> dict[str, tuple[float, float]]:
    out = {}
    for r in summary.get("ranges", []):
        if r["name"] in PHASE_SHADES and r["name"] not in out:
            start, dur = ((r["device_start_us"], r["device_dur_us"]) if r.get("device_start_us") is not None
                          else (r["host_start_us"], r["host_dur_us"]))
            out[r["name"]] = (float(start), float(start + dur))
    return out


def gather_exposure(summary: dict, slack_us: float = WAIT_SLACK_US) -> dict | None:
    """From a timeline summary: which lanes compute (their busiest category is compute), the all-gathers
    on the other lanes, and the gaps of the compute lanes (no compute, copy or memset on any of them)
    within the step. A gather's time is hidden where compute runs, exposed where the compute lanes are
    idle while it is in flight; it is waited for when the compute lanes are idle as it ends and resume
    within `slack_us`. The same split for all communication, and per phase (forward, backward)."""
    ev = summary.get("events") or {}
    if not ev.get("start_us"):
        return None
    names = summary.get("names", [])
    busy_by_lane: dict[int, dict[str, float]] = {}
    for lane, cat, dur in zip(ev["lane"], ev["category"], ev.get("busy_us", ev["dur_us"]), strict=True):
        busy_by_lane.setdefault(lane, {}).setdefault(cat, 0.0)
        busy_by_lane[lane][cat] += dur
    compute_lanes = {lane for lane, t in busy_by_lane.items() if max(t, key=t.get) == "compute"}
    if not compute_lanes:
        return None
    busy, gathers, others = [], [], []
    gather_count = 0
    for name, lane, cat, start, dur, count in zip(ev["name"], ev["lane"], ev["category"], ev["start_us"],
                                                  ev["dur_us"], ev.get("count", [1] * len(ev["lane"])), strict=True):
        interval = (float(start), float(start) + float(dur))
        if lane in compute_lanes:
            if cat != "communication":
                busy.append(interval)
        elif cat == "communication":
            label = names[name] if isinstance(name, int) and name < len(names) else str(name)
            if GATHER.search(label):
                gathers.append(interval)
                gather_count += int(count)
            else:
                others.append(interval)
    span = max(float(s) + float(d) for s, d in zip(ev["start_us"], ev["dur_us"], strict=True))
    gaps = _complement(busy, 0.0, span)

    def split(intervals, lo=0.0, hi=span) -> dict:
        clipped = _intersection(intervals, [(lo, hi)])
        total = _length(clipped)
        exposed = _length(_intersection(clipped, gaps))
        return {"total_us": total, "exposed_us": exposed, "hidden_us": total - exposed,
                "hidden_share": (total - exposed) / total if total else None}

    forward = _phase_extents(summary).get("forward")
    in_forward = sorted(x for x in gathers if forward is None or forward[0] <= x[0] <= forward[1])
    first_exposed = _length(_intersection([in_forward[0]], gaps)) if in_forward else None
    waited = [any(a < end <= b and b - end <= slack_us and b < span for a, b in gaps) for _, end in gathers]
    phases = _phase_extents(summary)

    def in_phase(lo: float, hi: float) -> dict:
        """The phase's gathers; `waited_after_first` leaves out its first, which nothing runs before
        (ours issues the forward's first gathers as the forward starts)."""
        inside = [w for (start, _), w in sorted(zip(gathers, waited, strict=True)) if lo <= start <= hi]
        return {"events": len(inside), "waited": sum(inside), "waited_after_first": sum(inside[1:]),
                **split(gathers, lo, hi)}

    out = {"compute_lanes": sorted(summary["lanes"][i]["label"] for i in compute_lanes if i < len(summary["lanes"])),
           "gathers": {"count": gather_count, "events": len(gathers), "waited": sum(waited), **split(gathers)},
           "communication": split(gathers + others),
           "phases": {p: {"start_us": lo, "end_us": hi, "gathers": in_phase(lo, hi)}
                      for p, (lo, hi) in phases.items() if p in PHASES},
           "span_us": span, "compute_idle_us": _length(gaps), "slack_us": slack_us,
           "first_forward_exposed_us": first_exposed,
           "merged": bool(summary.get("merged")),
           "_gaps": gaps, "_exposed": _intersection(gathers, gaps), "_gathers": gathers}
    return out


def forward_gathers_verdict(exposure: dict) -> dict | None:
    """Whether the forward's all-gathers after its first were complete when their layer wanted them:
    how many came after the first (`later`), how many of those were waited for (`waited`), and `waits`'
    verdict on the two. None where the forward had at most one gather, leaving nothing to judge."""
    forward = exposure["phases"].get("forward")
    if forward is None or forward["gathers"]["events"] <= 1:
        return None
    later, waited = forward["gathers"]["events"] - 1, forward["gathers"]["waited_after_first"]
    return {"later": later, "waited": waited, "verdict": waits(waited, later)}


def _timeline_dirs(paths: list[Path]) -> list[Path]:
    return [p for p in paths if p.is_dir() and (p / "timeline.json").exists()]


def _trace(df: pd.DataFrame, paths: list[Path], out: Path) -> dict | None:
    import json

    dirs = _timeline_dirs(paths)
    if not dirs and df.empty:
        return None
    info: dict = {}
    ok = df[df.status == "ok"] if not df.empty else df
    if not ok.empty:
        r = ok.iloc[0]
        info.update(size=r["size"], compute_dtype=r.get("compute_dtype"), tool=r.get("tool"),
                    totals={k: _num(v) for k, v in (r.get("totals") or {}).items()},
                    window_us=_num(r.get("window_us")))
    elif not df.empty:
        info["status"] = df.iloc[0]["status"]
    if not dirs:
        return info
    wanted = [Path(p).with_suffix("") for p in ok["path"]] if not ok.empty and "path" in ok else []
    d = next((x for x in dirs if x in wanted), dirs[0])
    summary = json.loads((d / "timeline.json").read_text())
    result = d.parent / f"{d.name}.json"
    if "size" not in info and result.exists():
        from cs336sys.results import read_result

        settings = read_result(result)["settings"]
        info.update(size=settings.get("size"), compute_dtype=settings.get("compute_dtype"))
    info.setdefault("tool", summary.get("tool"))
    info.setdefault("totals", summary.get("totals"))
    info["on_device"] = summary.get("source") == "cuda"  # CUDA kernels per stream; else CPU ops per thread
    exposure = gather_exposure(summary)
    if exposure is not None:
        info["figure"] = _timeline_figure(summary, exposure, info, out)
        info["exposure"] = {k: v for k, v in exposure.items() if not k.startswith("_")}
        info["exposure"]["forward_gathers"] = forward_gathers_verdict(exposure)
    return info


def _timeline_figure(summary: dict, exposure: dict, info: dict, out: Path) -> str:
    """The step's lanes (compute, all-gathers, other communication), the compute lanes' idle time while
    a gather is in flight as its own row, the phases shaded; below, the forward's first gathers."""
    ev = summary["events"]
    names = summary.get("names", [])
    lanes = summary["lanes"]
    rows = [lane["label"] for lane in lanes] + ["compute idle, gather in flight"]
    bars: dict[tuple[int, str], list[tuple[float, float]]] = {}
    for name, lane, cat, start, dur in zip(ev["name"], ev["lane"], ev["category"], ev["start_us"], ev["dur_us"],
                                           strict=True):
        label = names[name] if isinstance(name, int) and name < len(names) else str(name)
        kind = cat if cat != "communication" else ("all-gather" if GATHER.search(label) else "other communication")
        bars.setdefault((lane, kind), []).append((start / 1e3, max(dur / 1e3, 1e-6)))
    exposed = [(a / 1e3, (b - a) / 1e3) for a, b in exposure["_exposed"]]
    phases = _phase_extents(summary)
    forward = phases.get("forward", (0.0, exposure["span_us"]))
    firsts = sorted(g for g in exposure["_gathers"] if forward[0] <= g[0] <= forward[1])[:ZOOM_GATHERS]
    zoom = (forward[0] / 1e3, (max(e for _, e in firsts) if firsts else forward[1]) / 1e3)
    zoom = (zoom[0], zoom[1] + 0.05 * (zoom[1] - zoom[0]) + 1e-3)
    height = 0.28 * len(rows) + 0.7
    fig, axes = figure(2 * height + 0.5, 2, 1)
    for ax, (lo, hi), title in ((axes[0], (0.0, exposure["span_us"] / 1e3), "one step"),
                                (axes[1], zoom, f"the forward's first {len(firsts)} all-gathers (events on any lane)")):
        for name, (start, end) in phases.items():
            if end / 1e3 > lo and start / 1e3 < hi:
                ax.axvspan(start / 1e3, end / 1e3, color=PHASE_SHADES[name], alpha=0.35, lw=0, zorder=1)
        for (lane, kind), b in bars.items():
            ax.broken_barh(b, (lane - 0.38, 0.76), facecolors=TIMELINE_COLORS.get(kind, "#999999"), linewidth=0,
                           zorder=3)
        if exposed:
            ax.broken_barh(exposed, (len(lanes) - 0.38, 0.76), facecolors=TIMELINE_COLORS["exposed"], linewidth=0,
                           zorder=3)
        ax.set_yticks(range(len(rows)), rows)
        ax.set_ylim(len(rows) - 0.4, -0.6)
        ax.set_xlim(lo, hi)
        ax.grid(axis="y", visible=False)
        ax.set_title(title, loc="left")
    axes[-1].set_xlabel("time from the step's start (ms)")
    from matplotlib.patches import Patch

    present = {k for _, k in bars} | ({"exposed"} if exposed else set())
    handles = [Patch(color=c, label=k if k != "exposed" else "gather exposed") for k, c in TIMELINE_COLORS.items()
               if k in present]
    handles += [Patch(color=PHASE_SHADES[n], alpha=0.35, label=n.replace("_", " ")) for n in phases]
    fig.legend(handles=handles, loc="outside lower center", ncol=min(len(handles), 5), frameon=False)
    return save_figure(fig, out, "fsdp_timeline")


# --- machine time ----------------------------------------------------------------------------------

def _machine_time(paths: list[Path], frame: pd.DataFrame) -> dict | None:
    """Wall seconds of each job (Snakemake's benchmark record) by experiment, and device-seconds:
    wall time times the ranks of the job (its GPUs on the main grid)."""
    records = [p for p in paths if p.suffix == ".tsv"]
    if not records:
        return None
    ranks = {}
    if not frame.empty and "env.world_size" in frame:  # the process group's size, recorded by every rank's result
        for name, g in frame.groupby("problem"):
            if g["env.world_size"].notna().any():
                ranks[name] = int(g["env.world_size"].max())
    experiments: dict[str, dict] = {}
    for p in records:
        name = p.parent.name if p.parent.name in EXPERIMENTS else p.stem
        e = experiments.setdefault(name, {"jobs": 0, "wall_s": 0.0, "ranks": ranks.get(name, 1)})
        e["jobs"] += 1
        e["wall_s"] += read_benchmark_tsv(p)
    for e in experiments.values():
        e["device_s"] = e["wall_s"] * e["ranks"]
    order = {n: i for i, n in enumerate(EXPERIMENT_NAMES)}
    experiments = dict(sorted(experiments.items(), key=lambda kv: order.get(kv[0], len(order))))
    return {"experiments": experiments, "jobs": sum(e["jobs"] for e in experiments.values()),
            "wall_s": sum(e["wall_s"] for e in experiments.values()),
            "device_s": sum(e["device_s"] for e in experiments.values())}
