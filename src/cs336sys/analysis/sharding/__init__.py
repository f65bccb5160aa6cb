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

The section's parts: `shared` (variants, targets, units, cells), `optimizer` (sharding_memory),
`fsdp` (fsdp_step), `timeline` (fsdp_trace); this module builds the section's context from them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import pandas as pd
import sympy as sp

from cs336sys.accounting import communication as comm
from cs336sys.accounting import memory, questions
from cs336sys.accounting.symbols import N, P
from cs336sys.analysis.common import environment_summary, read_benchmark_tsv, results_frame
from cs336sys.analysis.context import SectionContext
from cs336sys.analysis.rounds import with_rounds_pooled
from cs336sys.analysis.sharding.fsdp import bf16_overview, fsdp_proxy, fsdp_size, is_proxy, saving_overview
from cs336sys.analysis.sharding.optimizer import broadcast_cost, optimizer_size
from cs336sys.analysis.sharding.shared import STRATEGY, TARGETS, by_size, predict, steady_state_peak, unit_of_bytes
from cs336sys.analysis.sharding.timeline import forward_gathers_verdict, gather_exposure, timed_step, trace
from cs336sys.analysis.verdicts import all_of
from cs336sys.registry import EXPERIMENTS

__all__ = ["STRATEGY", "ShardingContext", "build", "forward_gathers_verdict", "gather_exposure", "predict",
           "steady_state_peak"]

EXPERIMENT_NAMES = ("sharding_memory", "fsdp_step", "fsdp_trace")
MIN_ROUNDS = 3  # a ratio the summary judges comes from a job of at least this many rounds


@dataclass
class ShardingContext(SectionContext):
    """What the sharding template reads, by part (optimizer_state_sharding_accounting a-c, fsdp_accounting a-b)."""

    figures: dict[str, str] = field(default_factory=dict)
    """Figure name -> its file (none at the top level: the trace's figure is `trace["figure"]`)."""
    min_rounds: int = MIN_ROUNDS
    """A ratio of two variants' times gets a verdict from a job of at least this many interleaved rounds."""
    target_values: dict[str, float] = field(default_factory=lambda: dict(TARGETS))
    """The sharding issue's targets: step-time ratios' limits and the model state's tolerance (`shared.TARGETS`)."""
    formulas: dict[str, str] = field(default_factory=dict)
    """The accounting's per-GPU formulas as inline LaTeX: model state by strategy, its terms, bytes sent per step."""
    machine_time: dict | None = None
    """Wall and device seconds of the jobs (Snakemake's timing records), by experiment and in all."""
    unit: dict | None = None
    """The section's byte unit, {"name", "bytes"}: GiB, or MiB where every model is smaller than a GiB."""
    opt: list[dict] | None = None
    """(optimizer_state_sharding_accounting a-c) Per size, smallest first: memory by variant against the
    accounting, step times against ZeroRedundancyOptimizer, the saving, the bytes sent, the tables."""
    broadcast: dict | None = None
    """(optimizer_state_sharding_accounting b) Ours and ZeroRedundancyOptimizer against unsharded, per job
    (`optimizer.broadcast_cost`): whether the broadcasts' volume or our implementation costs the time."""
    fsdp: list[dict] | None = None
    """(fsdp_accounting a) Per size, smallest first: ours against FSDP2 per compute dtype in time and
    memory, the accounting's prediction, the expected and measured savings, the tables."""
    fsdp_bf16: dict | None = None
    """(fsdp) Ours per unit against FSDP2 at bf16 over every job, and FSDP2's own spread (`fsdp.bf16_overview`)."""
    fsdp_saving: dict | None = None
    """(fsdp_accounting a) The fp32 savings over every job against the model state's (`fsdp.saving_overview`)."""
    fsdp_allocator: bool | None = None
    """(fsdp_accounting a) Whether any FSDP point has the allocator's readings (none on the CPU)."""
    fsdp_proxy: dict | None = None
    """(fsdp) Our FSDP on one rank, nothing communicated: its table and sizes."""
    trace: dict | None = None
    """(fsdp_accounting b) The profiled step: settings and totals (or its status), the gathers' exposure, the figure."""
    targets: list[dict] | None = None
    """The targets' records (`shared.target`): model state per variant, step-time ratios, met or missed."""
    summary: list[dict] | None = None
    """The section's lines of the report's summary page (the step-time targets that were measured)."""
    limitations: list[str] | None = None
    """Jobs left out until measured (the conclusions list them)."""


def build(paths: list[Path], out: Path, pending: list[str] | None = None, **_: object) -> ShardingContext:
    """The section's context: environment, formulas, machine time, and where results exist the optimizer
    sharding and FSDP parts per size, the single-rank proxy, the trace, the targets and their summary;
    `pending`: the "<experiment>/<job>" names left out of the grid until measured (config: sharding.pending)."""
    frame = results_frame(paths)
    ctx = ShardingContext(env=environment_summary(frame), formulas=_formulas(),
                          machine_time=_machine_time(paths, frame) or None)
    if pending:
        ctx.limitations = [f"Not run (no host with the GPUs lent): {_unrun(pending)} (overlay `next`)."]
    if frame.empty:
        return ctx
    targets: list[dict] = []
    u = ctx.unit = unit_of_bytes(frame)
    frame = with_rounds_pooled(frame)  # each variant's interleaved rounds in one row (analysis.rounds)
    shard = frame[frame.problem == "sharding_memory"]
    if not shard.empty:
        ctx.opt = [optimizer_size(size, g, out, targets, u) for size, g in by_size(shard)]
        ctx.broadcast = broadcast_cost(ctx.opt)
    fsdp = frame[frame.problem == "fsdp_step"]
    proxy = fsdp[is_proxy(fsdp)]
    fsdp = fsdp.drop(index=proxy.index)
    if not fsdp.empty:
        ctx.fsdp = [fsdp_size(size, g, shard, out, targets, u) for size, g in by_size(fsdp)]
        ctx.fsdp_allocator = any(f["allocator"] for f in ctx.fsdp)
        ctx.fsdp_bf16 = bf16_overview(ctx.fsdp)
        ctx.fsdp_saving = saving_overview(ctx.fsdp)
    if not proxy.empty:
        ctx.fsdp_proxy = fsdp_proxy(proxy, out)
    ctx.trace = trace(frame[frame.problem == "fsdp_trace"], paths, out) or None
    if ctx.trace and ctx.fsdp:
        ctx.trace["timed"] = timed_step(ctx.trace, ctx.fsdp)
    ctx.targets = targets
    ctx.summary = _summary(targets)
    return ctx


def _ratio_row(judged: list[dict], part: str) -> dict:
    """One summary row over a target's judged jobs: the ratios' range, the sizes and rank counts, and the
    round that decides the verdict (the slowest where met, the fastest where missed, both within noise)."""
    values = [t["value"] for t in judged]
    met = all_of([t["ok"] for t in judged])
    lo, hi = min(t["spread"]["lo"] for t in judged), max(t["spread"]["hi"] for t in judged)
    rounds = {True: f"slowest round {hi:.2f}×", False: f"fastest round {lo:.2f}×"}.get(
        met, f"rounds {lo:.2f}–{hi:.2f}×")
    said = (f"{min(values):.2f}–{max(values):.2f}×" if len(values) > 1 else f"{values[0]:.2f}×") + (
        f" ({', '.join(sorted({t['size'] for t in judged}, key=len))}; "
        + " and ".join(str(w) for w in sorted({t['world'] for t in judged})) + " GPUs)")
    return {"part": f"{part} ({judged[0]['spread']['rounds']} rounds)", "result": f"{said}; {rounds}",
            "target": f"≤ {judged[0]['limit']:.2f}× its step", "met": met, "ref": "shard-targets"}


def _summary(targets: list[dict]) -> list[dict]:
    """Page 1: the sharded optimizer against ZeroRedundancyOptimizer, and our FSDP per layer (the default unit)
    against FSDP2 with the per-block ratio beside it, each one row and one verdict over the jobs measured in
    interleaved rounds (a job of one round is left to the section). Past the summary's quota
    (report.SUMMARY_ROWS), counted by the conclusions with the other targets: ours per block, its own verdict,
    and the tensors each rank holds."""
    def judged(name: str, unit: str | None = None) -> list[dict]:
        return [t for t in targets if t["target"] == name and t["value"] is not None and t.get("unit") == unit
                and (t.get("spread") or {}).get("rounds", 1) >= MIN_ROUNDS]

    rows = []
    zero = judged("sharded_vs_zero")
    if zero:
        rows.append(_ratio_row(zero, "Sharded optimizer against ZeRO"))
    layer, block = judged("fsdp_vs_fsdp2_bf16", "layer"), judged("fsdp_vs_fsdp2_bf16", "block units")
    if layer:
        row = _ratio_row(layer, "Our FSDP per layer (the default) against FSDP2, bf16") | {"ref": "shard-fsdp-steps"}
        if block:
            values = [t["value"] for t in block]
            row["result"] += f"; per block {min(values):.2f}–{max(values):.2f}×"
        if row["met"] is False:
            row["why"] = _why_per_layer(layer, block)
        rows.append(row)
    if block:
        rows.append(_ratio_row(block, "Our FSDP per block (not the default) against FSDP2, bf16")
                    | {"ref": "shard-fsdp-steps"})
    state = [t for t in targets if t["target"] == "model_state" and t["value"] is not None]
    if state:
        furthest = max(state, key=lambda t: abs(t["value"] - 1))
        rows.append({"part": "Tensors each rank holds against the accounting",
                     "result": f"{sum(bool(t['ok']) for t in state)} of {len(state)} readings within; "
                               f"the furthest {furthest['value']:.4f}×",
                     "target": f"within {100 * state[0]['limit']:.0f} %", "met": all_of([t["ok"] for t in state]),
                     "ref": "shard-targets"})
    return rows


def _why_per_layer(layer: list[dict], block: list[dict]) -> str:
    """Why per layer misses, as measured: its all-gathers per forward against per block's, where the same
    code with a unit per block meets the target (the largest model's counts)."""
    big = max(layer, key=lambda t: (t["gathers"] or 0))
    twin = next((t for t in block if t["size"] == big["size"] and t["world"] == big["world"]), None)
    if big["gathers"] is None:
        return "a unit per Linear layer, each its own collectives"
    said = f"a unit per Linear layer, {int(big['gathers'])} all-gathers a forward at {big['size']}"
    if twin is not None and twin["gathers"] and all(t["ok"] is True for t in block):
        said += f"; the same code with a unit per block ({int(twin['gathers'])}) meets it"
    return said


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


def _machine_time(paths: list[Path], frame: pd.DataFrame) -> dict | None:
    """Wall seconds of each job (Snakemake's benchmark record) by experiment, and device-seconds:
    each job's wall time times its own ranks (its GPUs on the main grid), read from the results it wrote
    (results/<experiment>/<job>/ for benchmarks/<experiment>/<job>.tsv; one rank where none says)."""
    records = [p for p in paths if p.suffix == ".tsv"]
    if not records:
        return None
    sized = frame[frame["env.world_size"].notna()] if "env.world_size" in frame else pd.DataFrame()
    experiments: dict[str, dict] = {}
    for p in records:
        name = p.parent.name if p.parent.name in EXPERIMENTS else p.stem
        # the job's own folder or file: "xl/" must not match "xl-ws4/"
        job = f"/{name}/{p.stem}" if name != p.stem else f"/{name}"
        mine = sized[("/" + sized["path"]).str.contains(f"{job}/", regex=False)
                     | ("/" + sized["path"]).str.endswith(f"{job}.json")] if not sized.empty else sized
        ranks = int(mine["env.world_size"].max()) if not mine.empty else 1
        e = experiments.setdefault(name, {"jobs": 0, "wall_s": 0.0, "device_s": 0.0})
        wall = read_benchmark_tsv(p)
        e["jobs"] += 1
        e["wall_s"] += wall
        e["device_s"] += wall * ranks
    order = {n: i for i, n in enumerate(EXPERIMENT_NAMES)}
    experiments = dict(sorted(experiments.items(), key=lambda kv: order.get(kv[0], len(order))))
    return {"experiments": experiments, "jobs": sum(e["jobs"] for e in experiments.values()),
            "wall_s": sum(e["wall_s"] for e in experiments.values()),
            "device_s": sum(e["device_s"] for e in experiments.values())}


def _unrun(pending: list[str]) -> str:
    """"optimizer sharding and FSDP at 6 ranks (2.7B, xl)" from "<experiment>/<size>-ws<n>" names."""
    jobs: dict[tuple[str, str], list[str]] = {}
    for name in sorted(pending):
        experiment, _, job = name.partition("/")
        size, _, world = job.rpartition("-ws")
        what = {"sharding_memory": "optimizer sharding", "fsdp_step": "FSDP"}.get(experiment, experiment)
        jobs.setdefault((what, world), []).append(size if world else job)
    said: dict[tuple[str, tuple[str, ...]], list[str]] = {}  # the experiments of one world size and job list
    for (what, world), sizes in sorted(jobs.items(), key=lambda kv: (kv[0][0] != "optimizer sharding", kv[0][1])):
        said.setdefault((world, tuple(sizes)), []).append(what)
    return "; ".join(" and ".join(whats) + (f" at {world} ranks" if world else "") + f" ({', '.join(sizes)})"
                     for (world, sizes), whats in said.items())
