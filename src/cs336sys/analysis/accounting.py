"""Section: parallelism accounting (problem 20: communication_accounting and the 2026 analysis
problems, with fsdp_accounting (a)) and the predicted-vs-measured checks.

The answers do not depend on results: they are the formulas of `cs336sys.accounting`, printed as
LaTeX, and their numbers for the handout's constants and our hardware presets. The results, when
present (all-reduce, DDP, sharding and FSDP experiments, matmul peaks), fill the measured column of
the checks.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd
import sympy as sp

from cs336sys.accounting import checks, communication_accounting, questions, ring
from cs336sys.accounting import communication as comm
from cs336sys.accounting.compute import matmul_flops, model_values
from cs336sys.accounting.hardware import PRESETS, Hardware, preset_for_gpu
from cs336sys.accounting.memory import P_NORM, PARAMETER_CLASSES
from cs336sys.accounting.symbols import D_FF, N_DP, N_FSDP, N_TP, B, C, D, N, S, W, evaluate, latex
from cs336sys.analysis.common import environment_summary, results_frame, save_table
from cs336sys.analysis.context import SectionContext
from cs336sys.analysis.rounds import with_rounds_pooled

# The example the 2026 FFN answers are evaluated for: the 2026 handout's xl model (our 2.7B) at the
# batch of its section 3.2 (4 sequences of 2,048 tokens), B = 8,192 rows.
EXAMPLE = {"model": "2.7B", "batch": 4, "context": 2048}
EXAMPLE_DEVICES = 8  # N for the table of times
PRESET_ORDER = ("tpu-v5p", "h100", "h200")
MODEL_CHECKS = (("small", 4, 512), ("xl", 4, 512), ("2.7B", 4, 512))
SIM = {"n": 4, "elements": 1024}  # ring simulator: 4 devices, 1,024 float32 values each
EDITIONS = {"old": 2025, "new": 2026}
REFERENCES = {"gpipe": "GPipe, Huang et al., 2019",
              "megatron": "Megatron-LM with interleaved 1F1B schedules, Narayanan et al., 2021"}


def _latex_tree(answers: dict) -> dict:
    return {k: {kk: latex(vv) for kk, vv in v.items()} for k, v in answers.items()}


def measured_presets(frame: pd.DataFrame) -> dict[str, Hardware]:
    """The presets the section uses, in PRESET_ORDER: a GPU's with its C and memory read from the current
    bf16 `matmul_peak` result measured on that GPU (the result's rate and its env's total memory) where one
    exists; else the preset's constants, each with the source `cs336sys.accounting.hardware` gives it."""
    out = {name: PRESETS[name] for name in PRESET_ORDER}
    if frame.empty or "problem" not in frame or "dtype" not in frame:
        return out
    peaks = frame[(frame["problem"] == "matmul_peak") & (frame["dtype"] == "bf16") & (frame["status"] == "ok")]
    for _, r in peaks.iterrows():
        gpu = r.get("env.gpu")
        preset = preset_for_gpu(gpu)
        if preset is None or preset.name not in out or not r.get("tflops"):
            continue
        path = str(r.get("path", ""))
        path = path[path.find("results/"):] if "results/" in path else path
        day = str(r.get("env.timestamp") or "")[:10]
        rounds = r.get("rounds")
        how = f"median of {int(rounds)} rounds, " if isinstance(rounds, int | float) and rounds == rounds else ""
        hw = replace(out[preset.name], flops=float(r["tflops"]) * 1e12,
                     flops_source=f"measured on an {gpu} ({day}): bf16 8192-cube product, {how}{path}")
        memory = r.get("env.gpu_memory_bytes")
        if isinstance(memory, int | float) and memory == memory and memory > 0:
            hw = replace(hw, memory=float(memory), memory_source="measured: total_memory in that result's env")
        out[preset.name] = hw
    return out


def _hardware_values(hw: Hardware) -> dict:
    return {C: hw.flops, W: hw.bandwidth}


def _example_values() -> dict:
    m = model_values(EXAMPLE["model"])
    from cs336sys.accounting.symbols import d, f

    return {D: m[d], D_FF: m[f], B: EXAMPLE["batch"] * EXAMPLE["context"]}


def bounds_table(answers: dict, presets: dict[str, Hardware] | None = None) -> pd.DataFrame:
    """Largest device counts before each pass turns communication-bound, per hardware preset."""
    ex = _example_values()
    presets = presets or {name: PRESETS[name] for name in PRESET_ORDER}
    rows = []
    for name, hw in presets.items():
        v = {**ex, **_hardware_values(hw)}
        q = answers
        rows.append({
            "hardware": name, "C/W (tokens)": v[C] / v[W],
            "N_DP": evaluate(q["data_parallel_calcs"]["bound"].rhs, v),
            "N_FSDP": evaluate(q["fsdp_calcs"]["backward_bound"].rhs, v),
            "N_TP fwd": evaluate(q["tp_calcs"]["forward_bound"].rhs, v),
            "N_TP bwd": evaluate(q["tp_calcs"]["backward_bound"].rhs, v),
            "N, 2D overlapped": evaluate(q["fsdp_tp_calcs"]["overlap_bound"].rhs, v),
            "N, 2D shared": evaluate(q["fsdp_tp_calcs"]["shared_bound"].rhs, v),
        })
    return pd.DataFrame(rows)


def times_table(answers: dict, hardware: str = "h100", n: int = EXAMPLE_DEVICES) -> pd.DataFrame:
    """One FFN layer of the example on n devices: compute and communication time of each pass."""
    v = {**_example_values(), **_hardware_values(PRESETS[hardware]), N_DP: n, N_FSDP: n, N_TP: n}
    q = answers
    dp = q["data_parallel_calcs"]
    entries = [("DP", "backward", dp["backward_flops"], dp["backward_comm_time"]),
               ("FSDP", "forward", q["fsdp_calcs"]["forward_flops"], q["fsdp_calcs"]["forward_comm_time"]),
               ("FSDP", "backward", q["fsdp_calcs"]["backward_flops"], q["fsdp_calcs"]["backward_comm_time"]),
               ("TP", "forward", q["tp_calcs"]["forward_flops"], q["tp_calcs"]["forward_comm_time"]),
               ("TP", "backward", q["tp_calcs"]["backward_flops"], q["tp_calcs"]["backward_comm_time"])]
    two_d = {**v, N_FSDP: n // 2, N_TP: 2}
    rows = []
    for strategy, pass_, flops, time in entries:
        compute_us = evaluate(flops / C, v) * 1e6
        comm_us = evaluate(time, v) * 1e6
        rows.append({"strategy": strategy, "pass": pass_, "compute (µs)": compute_us, "communication (µs)": comm_us,
                     "comm / compute": comm_us / compute_us})
    f2 = q["fsdp_tp_calcs"]
    compute_us = evaluate(f2["forward_flops"] / C, two_d) * 1e6
    comm_us = evaluate(f2["comm_time"], two_d) * 1e6
    rows.append({"strategy": f"FSDP {n // 2} x TP 2", "pass": "forward", "compute (µs)": compute_us,
                 "communication (µs)": comm_us, "comm / compute": comm_us / compute_us})
    return pd.DataFrame(rows)


def ring_simulation() -> dict:
    """Run both all-reduces on integer-valued float32 arrays (sums are exact) and compare with the formulas."""
    n, elements = SIM["n"], SIM["elements"]
    rng = np.random.default_rng(0)
    xs = [rng.integers(-1000, 1000, elements).astype(np.float32) for _ in range(n)]
    total = np.sum(xs, axis=0)
    size = xs[0].nbytes
    out: dict = {"n": n, "elements": elements, "bytes": size}
    for name, run, collective in (("ring", ring.ring_all_reduce, "all_reduce"),
                                  ("alternate", ring.alternate_all_reduce, "alternate_all_reduce")):
        result, trace = run(xs)
        per_link = set(trace.bytes_per_link_per_step().values())
        out[name] = {
            "steps": trace.steps, "formula_steps": evaluate(comm.steps(collective), {N: n}),
            "bytes_per_link_step": max(per_link), "uniform": len(per_link) == 1,
            "sent_per_device": trace.bytes_sent(0),
            "formula_sent": evaluate(comm.bytes_sent_per_device(collective, S), {N: n, S: size}),
            "time_units": trace.time(1.0) / size,  # in units of S/W
            "formula_time_units": evaluate(comm.collective_time(collective, S), {N: n, S: 1, W: 1}),
            "max_error": float(max(np.abs(r - total).max() for r in result)),
        }
    return out


def fsdp_accounting_numbers(answers: dict, size: str = "2.7B", world: int = 2) -> dict:
    v = model_values(size)
    counts = {c: evaluate(e, v) for c, e in PARAMETER_CLASSES.items()}
    vals = {**counts, N: world}
    q = answers["fsdp_accounting"]
    return {"size": size, "world": world, "parameters": sum(counts.values()),
            "norm_parameters": counts[P_NORM],
            **{k: evaluate(q[k], vals) / 2**30 for k in ("ddp", "zero1", "fsdp", "saved_vs_ddp", "saved_vs_zero1")}}


def hardware_context(presets: dict[str, Hardware] | None = None) -> dict:
    """Each preset's figures and their sources; `flops_kind`: how C was had ("measured" from a current
    result, "kept" a constant from an earlier measurement, "datasheet", "handout")."""
    presets = presets or {name: PRESETS[name] for name in PRESET_ORDER}

    def kind(source: str) -> str:
        return ("kept" if "a constant since" in source else "measured" if source.startswith("measured")
                else "datasheet" if "datasheet" in source else "handout")

    return {name: {"flops_tflops": hw.flops / 1e12, "bandwidth_gbps": hw.bandwidth / 1e9,
                   "memory_gib": hw.memory / 2**30, "flops_source": hw.flops_source,
                   "flops_kind": kind(hw.flops_source),
                   "bandwidth_source": hw.bandwidth_source, "memory_source": hw.memory_source}
            for name, hw in presets.items()}


@dataclass
class AccountingContext(SectionContext):
    q: dict = field(default_factory=dict)
    """Each question's answers (`accounting.questions.all_answers`) as LaTeX, by question and part."""
    collectives: dict[str, str] = field(default_factory=dict)
    """Each collective -> its time formula in S (bytes per device), LaTeX."""
    busbw_factor: str = ""
    """The all-reduce's bus-bandwidth factor, LaTeX."""
    example: dict = field(default_factory=dict)
    """The model, batch and context the FFN answers are evaluated for, with D, D_FF, B and the devices."""
    hardware: dict = field(default_factory=dict)
    """Each hardware preset -> its TFLOP/s, GB/s, GiB, their sources and how C was had (`hardware_context`):
    a GPU's figures from a current matmul_peak result of that GPU where one exists (`measured_presets`)."""
    bounds: dict = field(default_factory=dict)
    """Each preset -> the largest device counts before each pass is communication-bound."""
    times: list[dict] = field(default_factory=list)
    """The example FFN layer on EXAMPLE_DEVICES H100s: compute and communication time of each pass."""
    shared_over_overlap: str = ""
    """The 2-D bound with shared links over the overlapped one, for large N, LaTeX."""
    ring_factor: str = ""
    """(N - 1) / N, LaTeX."""
    fp16_bytes: int = 2
    """Bytes of an fp16 value, as the handout counts weights."""
    ffn_weight_elements: str = ""
    """An FFN layer's weight elements, LaTeX."""
    ffn_weight_elements_tp: str = ""
    """An FFN layer's weight elements per tensor-parallel device, LaTeX."""
    matmul_flops: str = ""
    """FLOPs of an (m x k) @ (k x n) product, LaTeX."""
    editions: dict = field(default_factory=dict)
    """Edition key -> the handout's year."""
    references: dict = field(default_factory=dict)
    """Paper key -> its citation."""
    ring_sim: dict = field(default_factory=dict)
    """The ring and alternate all-reduces simulated, against their formulas (`ring_simulation`)."""
    fsdp_accounting: dict = field(default_factory=dict)
    """fsdp_accounting (a): DDP, ZeRO-1 and FSDP state per device in GiB for the 2.7B model on 2 devices."""
    xxl: dict = field(default_factory=dict)
    """communication_accounting's numbers (`accounting.communication_accounting.numbers`)."""
    xxl_q: dict = field(default_factory=dict)
    """communication_accounting's parts a-d as LaTeX."""
    model_checks_max_error: float = 0.0
    """Largest relative error of the accounting's FLOPs and bytes against the model built on meta."""
    measured: dict[str, bool] = field(default_factory=dict)
    """Each measured check's problem -> whether every row of it has a measurement."""
    summary: list[dict] = field(default_factory=list)
    """The section's lines of the report's summary page."""


def _formulas(ctx: AccountingContext, answers: dict) -> None:
    """The answers and formulas the text prints, as LaTeX."""
    ctx.q = _latex_tree(answers)
    ctx.q["tp_calcs"]["backward_equations"] = questions.TP_BACKWARD
    ctx.collectives = {c: latex(sp.factor(comm.collective_time(c, S))) for c in
                       ("all_gather", "reduce_scatter", "all_reduce", "alternate_all_reduce")}
    ctx.busbw_factor = latex(comm.bus_bandwidth_factor("all_reduce"))
    f2 = answers["fsdp_tp_calcs"]
    ctx.shared_over_overlap = latex(sp.simplify(f2["shared_bound_large_n"].rhs / f2["overlap_bound_large_n"].rhs))
    ctx.ring_factor = latex((N - 1) / N)
    ctx.fp16_bytes = questions.FP16
    ctx.ffn_weight_elements = latex(questions.FFN_WEIGHT_BYTES / questions.FP16)
    ctx.ffn_weight_elements_tp = latex(questions.FFN_WEIGHT_BYTES / questions.FP16 / N_TP)
    m, k, n = sp.symbols("m k n", positive=True)
    ctx.matmul_flops = latex(matmul_flops(m, k, n))


def _ffn_example(ctx: AccountingContext, answers: dict, out: Path, presets: dict[str, Hardware]) -> None:
    """The 2026 FFN answers evaluated for the example on each hardware preset."""
    ex = _example_values()
    ctx.example = {**EXAMPLE, "D": ex[D], "D_FF": ex[D_FF], "B": ex[B], "devices": EXAMPLE_DEVICES}
    ctx.hardware = hardware_context(presets)
    bounds = bounds_table(answers, presets)
    ctx.bounds = {r["hardware"]: {k: v for k, v in r.items() if k != "hardware"} for r in bounds.to_dict("records")}
    ctx.tables["bounds"] = save_table(bounds, out, "ffn_bounds", digits=1)
    times = times_table(answers)
    ctx.times = times.to_dict("records")
    ctx.tables["times"] = save_table(times, out, "ffn_times_h100", digits=2)


def _communication_accounting(ctx: AccountingContext, out: Path) -> None:
    """communication_accounting (2025, the XXL model): its numbers, formulas and FSDP table."""
    xxl = communication_accounting
    ctx.xxl = xxl.numbers()
    ctx.xxl_q = {part: {k: latex(v) for k, v in fn().items()}
                 for part, fn in (("a", xxl.part_a), ("b", xxl.part_b), ("c", xxl.part_c), ("d", xxl.part_d))}
    rows = pd.DataFrame([{"tokens": r["tokens"], "activations (GiB)": r["activation_bytes"] / 2**30,
                          "N_FSDP (real)": r["n_fsdp_real"], "N_FSDP": r["n_fsdp"] if r["n_fsdp"] else "none"}
                         for r in ctx.xxl["fsdp_rows"]])
    ctx.tables["xxl_fsdp"] = save_table(rows, out, "xxl_fsdp_devices", digits=2)


def _checks(ctx: AccountingContext, frame: pd.DataFrame, out: Path) -> None:
    """The accounting against the model built on meta, and against the measured results where present."""
    model_rows = [r for size, batch, context in MODEL_CHECKS for r in checks.model_tensor_rows(size, batch, context)]
    ctx.model_checks_max_error = max(abs(r["ratio"] - 1) for r in model_rows)
    ctx.tables["model_checks"] = save_table(pd.DataFrame(model_rows, columns=checks.COLUMNS), out,
                                            "checks_model", digits=3)
    measured_rows = []
    for problem, fn in checks.MEASURED_CHECKS.items():
        rows_ = fn(frame)
        ctx.measured[problem] = not any(r["measured"] == checks.NOT_MEASURED for r in rows_)
        measured_rows += rows_
    ctx.tables["measured_checks"] = save_table(pd.DataFrame(measured_rows, columns=checks.COLUMNS), out,
                                               "checks_measured", digits=3)
    error = ctx.model_checks_max_error
    ctx.summary = [{"part": "Accounting formulas against the real model", "target": None, "met": None,
                    "result": ("FLOPs and state bytes match exactly" if error < 1e-9 else
                               f"FLOPs and state bytes within {100 * error:.2g} %")
                    + " (the model built on the meta device)", "ref": "acct-checks"}]


def build(paths: list[Path], out: Path, **_: object) -> AccountingContext:
    frame = with_rounds_pooled(results_frame(paths))  # a point of interleaved rounds is one row
    answers = questions.all_answers()
    ctx = AccountingContext(env=environment_summary(frame), editions=EDITIONS, references=REFERENCES)
    _formulas(ctx, answers)
    _ffn_example(ctx, answers, out, measured_presets(frame))
    ctx.ring_sim = ring_simulation()
    ctx.fsdp_accounting = fsdp_accounting_numbers(answers)
    _communication_accounting(ctx, out)
    _checks(ctx, frame, out)
    return ctx
