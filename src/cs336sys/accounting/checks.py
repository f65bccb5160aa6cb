"""Predicted against measured: the formulas of this package next to what the model's tensors, the
FLOP counter and the experiments report.

Every check returns rows {quantity, unit, predicted, measured, ratio, basis}, ratio = measured /
predicted. A check whose results are absent returns the prediction for the experiment's standard
point with measured = "not yet measured". The measured checks read a DataFrame of
`cs336sys.results.load_results` with these columns (settings and metrics flattened):

* allreduce: backend, world_size, size_bytes, median_ms, busbw_gbps;
* ddp_step: size, world_size, variant (none is the no-communication baseline), mean_ms, grad_bytes, and
  comm_ms or sync_wait_ms (communication waited for after backward);
* sharding_memory: size, variant (unsharded, sharded, zero), world_size, param_bytes, grad_bytes,
  optimizer_state_bytes, peak_after_step_bytes;
* fsdp_step: size, world_size, compute_dtype, variant, peak_bytes, sharded_param_bytes (and comm_ms,
  batch_size, context_length when present);
* matmul_peak: dtype, tflops (against the C of the GPU's preset, which copies one such measurement).
"""

from __future__ import annotations

import pandas as pd
import sympy as sp

from cs336sys.accounting import communication as comm
from cs336sys.accounting import compute, memory
from cs336sys.accounting.hardware import PRESETS, preset_for_gpu
from cs336sys.accounting.symbols import N, W, evaluate
from cs336sys.sizes import parameter_count
from cs336sys.units import GB, GIB  # memory in GiB, as the rest of the report

NOT_MEASURED = "not yet measured"
COLUMNS = ["quantity", "unit", "predicted", "measured", "ratio", "basis"]


def _row(quantity: str, unit: str, predicted, measured, basis: str = "") -> dict:
    ratio = measured / predicted if isinstance(measured, int | float) and predicted else None
    return {"quantity": quantity, "unit": unit, "predicted": predicted, "measured": measured, "ratio": ratio,
            "basis": basis}


def _ok(frame: pd.DataFrame, problem: str) -> pd.DataFrame:
    if frame is None or frame.empty or "problem" not in frame:
        return pd.DataFrame()
    return frame[(frame.problem == problem) & (frame.status == "ok")]


def _class_values(size: str, world: int) -> dict:
    v = compute.model_values(size)
    out = {c: evaluate(e, v) for c, e in memory.PARAMETER_CLASSES.items()}
    out[N] = world
    return out


# Checks that need no GPU: our formulas against the real model, built on the meta device.
def model_tensor_rows(size: str, batch_size: int, context_length: int) -> list[dict]:
    """Train-step FLOPs against FlopCounterMode (forward and backward of the real model), and parameter,
    gradient and AdamW-state bytes against the tensors the model and `cs336sys.optim.AdamW` allocate.
    The meta device gives every shape and dtype without memory or arithmetic, so any size runs in seconds."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from cs336sys.model import build_model
    from cs336sys.optim import AdamW

    model = build_model(size, context_length, device="meta")
    tokens = torch.zeros(batch_size, context_length, dtype=torch.long, device="meta")
    counter = FlopCounterMode(display=False)
    with counter:
        model(tokens).sum().backward()
    optimizer = AdamW(model.parameters())
    optimizer.step()
    state = sum(t.numel() * t.element_size() for st in optimizer.state.values() for t in st.values()
                if torch.is_tensor(t))
    params = sum(p.numel() * p.element_size() for p in model.parameters())
    grads = sum(p.grad.numel() * p.grad.element_size() for p in model.parameters() if p.grad is not None)
    v = compute.model_values(size, batch_size, context_length)
    classes = {c: evaluate(e, v) for c, e in memory.PARAMETER_CLASSES.items()}
    basis = f"batch {batch_size} x {context_length}, meta device"
    return [
        _row(f"train-step FLOPs, {size}", "TFLOP", evaluate(compute.train_step_flops(), v) / 1e12,
             counter.get_total_flops() / 1e12, f"FlopCounterMode, {basis}"),
        _row(f"parameter bytes, {size}", "GiB", evaluate(memory.parameter_bytes("single"), classes) / GIB,
             params / GIB, "model.parameters(), fp32"),
        _row(f"gradient bytes, {size}", "GiB", evaluate(memory.gradient_bytes("single"), classes) / GIB,
             grads / GIB, "p.grad after backward"),
        _row(f"AdamW state bytes, {size}", "GiB", evaluate(memory.optimizer_state_bytes("single"), classes) / GIB,
             state / GIB, "optimizer.state after one step"),
    ]


# Bandwidth: what the measured all-reduces say W is.
def measured_bandwidth(frame: pd.DataFrame, world_size: int, backend: str = "nccl") -> float | None:
    """W (bytes/s) = the bus bandwidth of the largest all-reduce measured on `world_size` ranks."""
    ar = _ok(frame, "allreduce")
    if ar.empty:
        return None
    ar = ar[(ar.backend == backend) & (ar.world_size == world_size)]
    if ar.empty:
        return None
    return float(ar.loc[ar.size_bytes.idxmax(), "busbw_gbps"]) * GB


def _bandwidth(frame: pd.DataFrame, world_size: int, gpu: str | None) -> tuple[float, str]:
    measured = measured_bandwidth(frame, world_size)
    if measured:
        return measured, f"W = measured NCCL bus bandwidth on {world_size} GPUs, {measured / GB:.0f} GB/s"
    preset = preset_for_gpu(gpu) or PRESETS["h100"]
    return preset.bandwidth, f"W = {preset.name} preset, {preset.bandwidth / GB:.0f} GB/s"


def _binary_size(n: int) -> str:
    """1 MiB, 10 MiB, 1 GiB: the all-reduce sizes are powers of two times a round number."""
    for unit, size in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.4g} {unit}"
    return f"{n} B"


def allreduce_rows(frame: pd.DataFrame) -> list[dict]:
    """Ring all-reduce time at W = the bus bandwidth of the largest message of the same backend and
    world size; the small messages show what the bandwidth model leaves out (latency per step)."""
    ar = _ok(frame, "allreduce")
    if ar.empty:
        t = comm.collective_time("all_reduce", 1e9, 2, PRESETS["h100"].bandwidth)
        return [_row("all-reduce of 1 GB on 2 GPUs", "ms", float(t) * 1e3, NOT_MEASURED, "W = h100 preset")]
    rows = []
    for (backend, world), group in ar.groupby(["backend", "world_size"], sort=True):
        w = measured_bandwidth(frame, int(world), backend)
        for _, r in group.sort_values("size_bytes").iterrows():
            predicted = evaluate(comm.collective_time("all_reduce", int(r.size_bytes), int(world), w), {}) * 1e3
            rows.append(_row(f"all-reduce {_binary_size(int(r.size_bytes))}, {backend}, {int(world)} ranks", "ms",
                             predicted, float(r.median_ms), f"W = busbw at the largest size, {w / GB:.1f} GB/s"))
        preset = preset_for_gpu(group["env.gpu"].dropna().iloc[0] if "env.gpu" in group and
                                group["env.gpu"].notna().any() else None)
        if backend == "nccl" and preset:
            rows.append(_row(f"W: bus bandwidth, {int(world)} GPUs", "GB/s", preset.bandwidth / GB, w / GB,
                             f"the {preset.name} preset (its source: python -m cs336sys.accounting)"))
    return rows


def _exposed_comm_ms(r: pd.Series) -> float | None:
    """The communication a DDP step waited for: `comm_ms` if recorded, else the time from the end of
    backward to the end of the gradient synchronisation (`sync_wait_ms`)."""
    for key in ("comm_ms", "sync_wait_ms"):
        if key in r and pd.notna(r[key]):
            return float(r[key])
    return None


def ddp_rows(frame: pd.DataFrame) -> list[dict]:
    """Gradient bytes (fp32 gradients of every parameter) and their all-reduce time at W, against the
    communication the step waited for after backward, and against the step's excess over the job's
    no-communication baseline (`variant == "none"`, same size, shape and precision) where there is one.
    Overlapped variants (overlap, bucketed, torch_ddp) hide part of the all-reduce behind the backward,
    so for them the prediction is an upper bound of what is exposed."""
    ddp = _ok(frame, "ddp_step")
    if ddp.empty:
        grad = 4 * parameter_count("xl")
        t = evaluate(comm.collective_time("all_reduce", grad, 2, PRESETS["h100"].bandwidth), {})
        return [_row("gradient bytes, xl", "GiB", grad / GIB, NOT_MEASURED, "4 bytes x parameters"),
                _row("gradient all-reduce, xl, 2 GPUs", "ms", t * 1e3, NOT_MEASURED, "W = h100 preset")]
    # a series of jobs apart from the grid (e.g. "host") has its own baseline without communication
    ddp = ddp.assign(series=ddp["series"].fillna("") if "series" in ddp else "")
    shape = [c for c in ("size", "context_length", "batch_size", "dtype", "world_size", "series") if c in ddp]
    baselines = {tuple(r[c] for c in shape): float(r.mean_ms) for _, r in ddp[ddp.variant == "none"].iterrows()}
    rows = []
    seen: set = set()
    for _, r in ddp[ddp.variant != "none"].iterrows():
        world, grad = int(r.world_size), 4 * parameter_count(r["size"])
        bucket = f" {r['bucket_size_mb']:g} MiB" if "bucket_size_mb" in r and pd.notna(r.get("bucket_size_mb")) else ""
        dtype = f" {r['dtype']}" if "dtype" in r else ""
        series = f", {r['series']} series" if r["series"] else ""
        label = f"{r['size']}{dtype}, {r.variant}{bucket}{series}, {world} GPU{'s' if world != 1 else ''}"
        if (r["size"], world) not in seen:  # the same fp32 gradients whatever the variant
            seen.add((r["size"], world))
            gpus = f"{world} GPU{'s' if world != 1 else ''}"
            rows.append(_row(f"gradient bytes, {r['size']}, {gpus}", "GiB", grad / 2**30,
                             float(r.grad_bytes) / 2**30, "4 bytes x parameters"))
        w, basis = _bandwidth(frame, world, r.get("env.gpu"))
        t = evaluate(comm.collective_time("all_reduce", grad, world, w), {}) * 1e3
        exposed = _exposed_comm_ms(r)
        if exposed is not None:
            rows.append(_row(f"communication after backward, {label}", "ms", t, exposed, basis))
        base = baselines.get(tuple(r[c] for c in shape))
        if base is not None and pd.notna(r.get("mean_ms")):
            rows.append(_row(f"step time over no communication, {label}", "ms", t, float(r.mean_ms) - base, basis))
    return rows


def sharding_rows(frame: pd.DataFrame) -> list[dict]:
    """Per-rank parameter, gradient and AdamW-state bytes; the peak after the step against their sum."""
    sh = _ok(frame, "sharding_memory")
    if sh.empty:
        v = _class_values("xl", 2)
        return [_row(f"optimizer state per rank, xl, {strategy}", "GiB",
                     evaluate(memory.optimizer_state_bytes(strategy), v) / GIB, NOT_MEASURED, "AdamW, fp32")
                for strategy in ("ddp", "zero1")]
    rows = []
    for _, r in sh.iterrows():
        strategy = "ddp" if r.variant == "unsharded" else "zero1"
        v = _class_values(r["size"], int(r.world_size))
        label = f"{r['size']}, {r.variant}, {int(r.world_size)} ranks"
        predicted = {"param_bytes": memory.parameter_bytes(strategy), "grad_bytes": memory.gradient_bytes(strategy),
                     "optimizer_state_bytes": memory.optimizer_state_bytes(strategy)}
        for metric, formula in predicted.items():
            sharded = strategy == "zero1" and metric.startswith("opt")
            rows.append(_row(f"{metric.removesuffix('_bytes').replace('_', ' ')}, {label}", "GiB",
                             evaluate(formula, v) / GIB, float(r[metric]) / GIB,
                             "1/world of the state, balanced" if sharded else ""))
        rows.append(_row(f"peak after step, {label}", "GiB", evaluate(memory.model_state_bytes(strategy), v) / GIB,
                         float(r.peak_after_step_bytes) / GIB,
                         "parameters + gradients + state; the rest is temporaries"))
    return rows


def fsdp_rows(frame: pd.DataFrame) -> list[dict]:
    """FSDP's per-rank parameters (matrices 1/world, norms whole, fp32 masters) and its peak against the
    sharded model state (plus saved activations when the batch shape is in the settings)."""
    fs = _ok(frame, "fsdp_step")
    if fs.empty:
        v = _class_values("2.7B", 2)
        return [_row("sharded parameters per rank, 2.7B, 2 GPUs", "GiB",
                     evaluate(memory.parameter_bytes("fsdp"), v) / GIB, NOT_MEASURED, "fp32 masters"),
                _row("model state per rank, 2.7B, 2 GPUs", "GiB", evaluate(memory.model_state_bytes("fsdp"), v) / GIB,
                     NOT_MEASURED, "parameters, gradients, AdamW state")]
    rows = []
    for _, r in fs.iterrows():
        world = int(r.world_size)
        v = _class_values(r["size"], world)
        compute_dtype = f", {r['compute_dtype']} compute" if pd.notna(r.get("compute_dtype")) else ""
        unit = f", {r['unit']} units" if pd.notna(r.get("unit")) else ""  # the one-rank proxies run both
        label = f"{r['size']}, {r.variant}{compute_dtype}{unit}, {world} GPU{'s' if world != 1 else ''}"
        rows.append(_row(f"sharded parameters, {label}", "GiB", evaluate(memory.parameter_bytes("fsdp"), v) / GIB,
                         float(r.sharded_param_bytes) / GIB, "fp32 masters"))
        state = evaluate(memory.model_state_bytes("fsdp"), v)
        basis = "model state only (no batch shape in the settings)"
        compute_bytes = 2 if r.get("compute_dtype") in ("bf16", "fp16") else 4
        if pd.notna(r.get("batch_size")) and pd.notna(r.get("context_length")):
            shape = compute.model_values(r["size"], int(r.batch_size), int(r.context_length))
            state += evaluate(memory.model_activation_bytes(compute_bytes), shape)
            basis = "model state + saved activations (estimate)"
        rows.append(_row(f"peak, {label}", "GiB", state / GIB, float(r.peak_bytes) / GIB, basis))
        if pd.notna(r.get("comm_ms")):
            w, wbasis = _bandwidth(frame, world, r.get("env.gpu"))
            t = sp.Add(*(x.time() for x in comm.step_transfers("fsdp", compute_bytes=compute_bytes)))
            rows.append(_row(f"communication time, {label}", "ms", evaluate(t, {**v, W: w}) * 1e3,
                             float(r.comm_ms), wbasis))
    return rows


def peak_rows(frame: pd.DataFrame) -> list[dict]:
    """The bf16 matmul rate a preset uses as C against the measured ones: a drifted preset shows here."""
    peaks = _ok(frame, "matmul_peak")
    if not peaks.empty:
        peaks = peaks[peaks.dtype == "bf16"]
    rows = []
    for _, r in peaks.iterrows():
        preset = preset_for_gpu(r.get("env.gpu"))
        if preset is not None:
            rows.append(_row(f"C: bf16 matmul, {preset.name}", "TFLOP/s", preset.flops / 1e12, float(r.tflops),
                             f"{preset.name} preset"))
    return rows or [_row("C: bf16 matmul, h100", "TFLOP/s", PRESETS["h100"].flops / 1e12, NOT_MEASURED,
                         "h100 preset")]


MEASURED_CHECKS = {"matmul_peak": peak_rows, "allreduce": allreduce_rows, "ddp_step": ddp_rows,
                   "sharding_memory": sharding_rows, "fsdp_step": fsdp_rows}
