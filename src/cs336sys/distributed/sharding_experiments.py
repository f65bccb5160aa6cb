"""The sharding experiments (problems 22 and 24), run on every rank by the job runner.

    run_sharding_memory_point   optimizer state sharded or not (and ZeroRedundancyOptimizer): memory
                                after init, before and after the optimizer step, by what holds it;
                                step time
    run_fsdp_step_point         our FSDP (per-layer or per-block units) against PyTorch's FSDP2
                                (`fully_shard`): step time, memory; or ours alone on one rank, a proxy
                                for its host-side overhead
    run_fsdp_trace_point        one profiled FSDP step: do the all-gathers finish before their layer?

Points of one job share a model size, so the variants are compared within one job on the same GPUs.
Memory is read from the allocator (`torch.cuda.memory_allocated` / `max_memory_allocated`) and,
separately, summed over the tensors that hold it (parameters, gradients, optimizer state), so the
report can reconcile the two.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from cs336sys.distributed.clocks import clock_metrics, clock_sampler
from cs336sys.distributed.ddp import OverlappedDDP
from cs336sys.distributed.fsdp import FSDP
from cs336sys.distributed.sharded_optimizer import ShardedOptimizer
from cs336sys.dtypes import torch_dtype
from cs336sys.jobs import Run, Unsupported
from cs336sys.optim import AdamW
from cs336sys.timing import summarize_ms, synchronize
from cs336sys.training.step import Step, StepSpec, build_step

SHARDING_VARIANTS = ("unsharded", "sharded", "zero")
FSDP_VARIANTS = ("ours", "fsdp2")


def tensor_bytes(tensors) -> int:
    seen, total = set(), 0
    for t in tensors:
        if t is None:
            continue
        local = t.to_local() if hasattr(t, "to_local") else t  # DTensor: this rank's shard
        key = (local.untyped_storage().data_ptr(), local.storage_offset(), local.numel())
        if key not in seen:
            seen.add(key)
            total += local.numel() * local.element_size()
    return total


def optimizer_state_bytes(optimizer: torch.optim.Optimizer) -> int:
    inner = getattr(optimizer, "optim", None)  # ZeroRedundancyOptimizer keeps its shard's optimizer here
    states = (inner or optimizer).state.values()
    return tensor_bytes(v for s in states for v in s.values() if torch.is_tensor(v) and v.dim() > 0)


class _Memory:
    """Allocator readings on CUDA; None on the CPU, where the tensor sums still stand."""

    def __init__(self, device: str):
        self.cuda = torch.device(device).type == "cuda"

    def reset_peak(self) -> None:
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()

    def allocated(self) -> int | None:
        return torch.cuda.memory_allocated() if self.cuda else None

    def peak(self) -> int | None:
        return torch.cuda.max_memory_allocated() if self.cuda else None


def _time_steps(step: Step, warmup: int, steps: int, device: str) -> tuple[list[float], dict]:
    """Each timed step's milliseconds (host clock, the device synchronised around it), and the SM clock
    and power over the timed steps ({} on the CPU or without nvidia-smi)."""
    times = []
    with clock_sampler(device) as clocks:
        for i in range(warmup + steps):
            synchronize(device)
            start = time.perf_counter()
            if i == warmup:
                timed_from = start
            step.run()
            synchronize(device)
            if i >= warmup:
                times.append((time.perf_counter() - start) * 1e3)
        timed_to = time.perf_counter()
    return times, clocks.summary(timed_from, timed_to)


def _gather_per_rank(run: Run, values: dict) -> list[dict]:
    if run.world_size == 1:
        return [values]
    per_rank = [None] * run.world_size
    dist.all_gather_object(per_rank, values)
    return per_rank


# --- optimizer state sharding ----------------------------------------------------------------------

@dataclass(frozen=True)
class ShardingSettings:
    size: str
    """Model size, a name in `cs336sys.sizes.SIZES` (small, medium, large, xl, 2.7B, ...)."""
    variant: str
    """unsharded | sharded (ours) | zero (torch's ZeroRedundancyOptimizer)."""
    context_length: int = 512
    """Sequence length of each sample, in tokens."""
    batch_size: int = 4
    """Sequences per rank per step."""
    dtype: str = "fp32"
    """Autocast dtype (fp32: none); parameters, gradients and optimizer state are fp32."""
    warmup: int = 2
    """Untimed steps before the timed ones, the first (memory-measured) step included."""
    steps: int = 6
    """Timed steps (host clock, device synchronised before and after each)."""
    device: str = "cuda"
    """Device kind: cuda (NCCL, one GPU per rank) | cpu (gloo); the grid's `device`."""
    round: int = 0
    """Which of its job's interleaved rounds this point is (a job runs each variant once a round): a label."""


def _sharding_optimizer(variant: str):
    if variant == "unsharded":
        return lambda params: AdamW(params)
    if variant == "sharded":
        return lambda params: ShardedOptimizer(params, AdamW)
    if variant == "zero":
        from torch.distributed.optim import ZeroRedundancyOptimizer

        return lambda params: ZeroRedundancyOptimizer(params, optimizer_class=AdamW)
    raise ValueError(f"unknown variant {variant!r}; known: {', '.join(SHARDING_VARIANTS)}")


def run_sharding_memory_point(settings: ShardingSettings, run: Run) -> dict:
    """Every variant averages gradients with our overlapped DDP (in place: no bucket buffers to
    count) and runs our AdamW, sharded or not. Memory at the three points the handout names, first
    on the first step (when the optimizer state is created), then the step time in steady state."""
    run.require_ranks("a sharding experiment")
    memory = _Memory(run.device)
    memory.reset_peak()
    spec = StepSpec(size=settings.size, context_length=settings.context_length, batch_size=settings.batch_size,
                    mode="train_step", dtype=settings.dtype)
    step = build_step(spec, run.device, parallelize=OverlappedDDP,
                      optimizer_factory=_sharding_optimizer(settings.variant), data_seed=2000 + run.rank)
    synchronize(run.device)
    params = list(step.model.parameters())
    readings = {"after_init_allocated_bytes": memory.allocated(), "after_init_peak_bytes": memory.peak()}
    step.forward_backward()
    step.sync()
    synchronize(run.device)
    readings.update(before_step_allocated_bytes=memory.allocated(), before_step_peak_bytes=memory.peak())
    grad_bytes = tensor_bytes(p.grad for p in params)
    memory.reset_peak()
    step.optimizer_step()
    synchronize(run.device)
    readings.update(after_step_allocated_bytes=memory.allocated(), after_step_peak_bytes=memory.peak())
    state_bytes = optimizer_state_bytes(step.optimizer)
    step.zero_grad()
    times, clock = _time_steps(step, max(settings.warmup - 1, 0), settings.steps, run.device)
    breakdown = {"param_bytes": tensor_bytes(params), "grad_bytes": grad_bytes,
                 "optimizer_state_bytes": state_bytes}
    per_rank = _gather_per_rank(run, {**readings, **breakdown, "mean_ms": statistics.fmean(times), **clock})
    return {**summarize_ms(times), "step_ms": times, **readings, **breakdown, "ranks": per_rank,
            "parameters": step.info["parameters"], "world_size": run.world_size,
            "peak_after_step_bytes": readings["after_step_peak_bytes"], **clock_metrics(per_rank)}


# --- FSDP ------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class FSDPSettings:
    """`unit` (ours only): what one all-gather fetches, "layer", "block" or a number of blocks (see
    `cs336sys.distributed.fsdp`); FSDP2 always shards per block. `single_rank_proxy`: run on one rank
    (world size 1), where no collective communicates: the step is the compute plus FSDP's host-side
    work (hooks, gathers that are copies), a proxy for that overhead and not a distributed result."""

    size: str
    """Model size, a name in `cs336sys.sizes.SIZES` (small, medium, large, xl, 2.7B, ...)."""
    variant: str
    """ours | fsdp2 (PyTorch's fully_shard, one unit per block)."""
    compute_dtype: str = "bf16"
    """fp32 | bf16: parameters gathered and computed in it; fp32 master weights."""
    unit: str | int = "layer"
    """Ours only: what one all-gather fetches: "layer" | "block" | k (blocks per unit)."""
    single_rank_proxy: bool = False
    """Ours on one rank (no collective communicates): a proxy for FSDP's host-side overhead."""
    context_length: int = 512
    """Sequence length of each sample, in tokens."""
    batch_size: int = 4
    """Sequences per rank per step."""
    warmup: int = 2
    """Untimed steps before the timed ones."""
    steps: int = 6
    """Timed steps (host clock, device synchronised before and after each)."""
    device: str = "cuda"
    """Device kind: cuda (NCCL, one GPU per rank) | cpu (gloo); the grid's `device`."""
    round: int = 0
    """Which of its job's interleaved rounds this point is (a job runs each variant once a round): a label."""


def _fsdp_wrapper(settings: FSDPSettings):
    compute = torch_dtype(settings.compute_dtype)
    if settings.variant == "ours":
        return lambda model: FSDP(model, compute_dtype=None if compute == torch.float32 else compute,
                                  unit=settings.unit)
    if settings.unit != "layer":
        raise ValueError(f"unit={settings.unit!r} is for variant 'ours' (FSDP2 shards per block)")
    if settings.variant == "fsdp2":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        policy = MixedPrecisionPolicy(param_dtype=compute, reduce_dtype=torch.float32)

        def shard(model: nn.Module) -> nn.Module:
            for block in model.layers:  # one unit per block, then the rest (embedding, head, final norm)
                fully_shard(block, mp_policy=policy)
            return fully_shard(model, mp_policy=policy)

        return shard
    raise ValueError(f"unknown variant {settings.variant!r}; known: {', '.join(FSDP_VARIANTS)}")


def build_fsdp_step(settings: FSDPSettings, run: Run) -> Step:
    spec = StepSpec(size=settings.size, context_length=settings.context_length, batch_size=settings.batch_size,
                    mode="train_step", dtype="fp32", optimizer="torch_adamw")
    # The same optimizer for both: torch.optim.AdamW over each rank's shards (FSDP2's are DTensors).
    return build_step(spec, run.device, parallelize=_fsdp_wrapper(settings),
                      optimizer_factory=lambda params: torch.optim.AdamW(params, foreach=True),
                      data_seed=3000 + run.rank)


def run_fsdp_step_point(settings: FSDPSettings, run: Run) -> dict:
    """Step time; memory after init (the shards), peak over the timed steps; the bytes this rank
    holds in sharded and replicated parameters, their gradients and the optimizer state."""
    if not settings.single_rank_proxy:
        run.require_ranks("a sharding experiment")
    elif run.world_size != 1 or settings.variant != "ours":
        raise Unsupported("the single-rank proxy is our FSDP on one rank (register the job with 1 GPU)")
    memory = _Memory(run.device)
    memory.reset_peak()
    step = build_fsdp_step(settings, run)
    synchronize(run.device)
    after_init = memory.allocated()
    times, clock = _time_steps(step, settings.warmup, settings.steps, run.device)
    params = list(step.module.parameters())
    held = {"sharded_param_bytes": tensor_bytes(params), "optimizer_state_bytes": optimizer_state_bytes(step.optimizer)}
    if isinstance(step.module, FSDP):
        held["fsdp_units"] = len(step.module.units)  # all-gathers per forward
    per_rank = _gather_per_rank(run, {"mean_ms": statistics.fmean(times), "peak_bytes": memory.peak(), **held,
                                      **clock})
    return {**summarize_ms(times), "step_ms": times, "after_init_allocated_bytes": after_init,
            "peak_bytes": memory.peak(), **held, "ranks": per_rank, "parameters": step.info["parameters"],
            "world_size": run.world_size, "flops_per_step": step.info["flops_per_step"], **clock_metrics(per_rank)}


@dataclass(frozen=True)
class FSDPTraceSettings:
    size: str
    """Model size, a name in `cs336sys.sizes.SIZES` (small, medium, large, xl, 2.7B, ...)."""
    variant: str = "ours"
    """ours | fsdp2 (PyTorch's fully_shard, one unit per block)."""
    compute_dtype: str = "bf16"
    """fp32 | bf16: parameters gathered and computed in it; fp32 master weights."""
    context_length: int = 512
    """Sequence length of each sample, in tokens."""
    batch_size: int = 4
    """Sequences per rank per step."""
    warmup: int = 2
    """Unprofiled steps before the one profiled step."""
    device: str = "cuda"
    """Device kind: cuda (NCCL, one GPU per rank) | cpu (gloo); the grid's `device`."""


def run_fsdp_trace_point(settings: FSDPTraceSettings, run: Run) -> dict:
    """One profiled step after warm-up; rank 0's trace reduced to a per-stream timeline summary in
    the rendered folder (all-gathers on the communication stream against the compute stream)."""
    from cs336sys.profiling.annotate import annotations_enabled, phase
    from cs336sys.profiling.timeline import save_summary, summarize_timeline
    from cs336sys.profiling.trace import record_trace

    run.require_ranks("a sharding experiment")
    step = build_fsdp_step(FSDPSettings(size=settings.size, variant=settings.variant,
                                        compute_dtype=settings.compute_dtype, context_length=settings.context_length,
                                        batch_size=settings.batch_size, device=settings.device), run)
    step.phase = phase
    raw = run.artifact_dir / f"trace-rank{run.rank}.json" if run.artifact_dir else None
    if raw is not None:
        raw.parent.mkdir(parents=True, exist_ok=True)
    with annotations_enabled():
        prof = record_trace(step.run, steps=1, warmup=settings.warmup, device=run.device, path=raw)
    summary = summarize_timeline(raw if raw is not None else prof, window="step")
    if run.is_main and run.rendered_dir is not None:
        run.rendered_dir.mkdir(parents=True, exist_ok=True)
        save_summary(summary, run.rendered_dir / "timeline.json")
    return {"totals": summary["totals"], "window_us": summary["window"]["dur_us"], "tool": summary["tool"]}
