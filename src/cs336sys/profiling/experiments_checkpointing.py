"""Problem 6 (gradient_checkpointing, 2026) as an experiment: one level of checkpointing over groups
of k blocks (the model's `checkpoint_blocks=k`, 0 = none), peak memory and time of a train step.

One point is (size, context length, batch, dtype, k). Before the step runs, the numbers the sqrt(N)
prediction needs are measured on the same model: the bytes one TransformerBlock saves for its
backward at this shape (`saved_tensor_accounting`), and one residual-stream activation (a group's
kept input). Then `warmup` train steps, the peak counter reset, and `steps` timed steps. Running
out of memory is a result: it propagates and the runner records `oom`.

Peak memory: on a GPU the caching allocator's peak of allocated bytes over the timed steps; on a
CPU (smoke grid) the peak of one more step's profiler memory events, labelled as such.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from cs336sys.dtypes import autocast
from cs336sys.jobs import Run
from cs336sys.profiling.checkpointing import checkpoint_memory
from cs336sys.profiling.memory import cpu_snapshot, summarize_snapshot
from cs336sys.profiling.saved_tensors import parameter_gradient_bytes, residual_stream_bytes, saved_tensor_accounting
from cs336sys.sizes import get_size
from cs336sys.timing import peak_memory_bytes, reset_peak_memory, summarize_ms, synchronize, time_steps
from cs336sys.training.step import StepSpec, build_step

GPU_PEAK = "torch.cuda.max_memory_allocated over the timed steps"
CPU_PEAK = "torch.profiler CPU memory events of one step (not a GPU allocator)"


@dataclass(frozen=True)
class CheckpointingSettings:
    size: str
    """Model size, a name in `cs336sys.sizes.SIZES` (small, medium, large, xl, 2.7B, ...)."""
    context_length: int
    """Sequence length of each sample, in tokens."""
    checkpoint_blocks: int
    """k: blocks per checkpointed group; 0 = no checkpointing."""
    batch_size: int | None = None
    """Sequences per batch; None: the size's default batch size."""
    dtype: str = "fp32"
    """Autocast dtype: fp32 (no autocast) | bf16 | fp16; parameters stay fp32."""
    warmup: int = 1
    """Untimed train steps before the peak counter is reset."""
    steps: int = 2
    """Timed train steps; on a GPU the peak memory is over them."""
    seed: int = 0
    """Seed of the model's initial parameters, the batch and the block's random input."""
    device: str = "cuda"
    """Device kind: cuda | cpu (the grid's `device`); the job runner picks this rank's GPU."""


def block_saved_bytes(block: torch.nn.Module, shape: tuple[int, ...], dtype: str, device: str, seed: int) -> int:
    """Bytes one block saves for its backward on a random input of `shape` (parameters excluded)."""
    generator = torch.Generator(device="cpu").manual_seed(seed)
    x = torch.randn(shape, generator=generator).to(device).requires_grad_()
    with autocast(dtype, device):
        total = saved_tensor_accounting(block, x)["total_bytes"]
    block.zero_grad(set_to_none=True)
    return total


def run_checkpointing(settings: CheckpointingSettings, run: Run) -> dict:
    size = get_size(settings.size)
    k = settings.checkpoint_blocks
    spec = StepSpec(size=settings.size, context_length=settings.context_length, batch_size=settings.batch_size,
                    mode="train_step", dtype=settings.dtype, checkpoint_blocks=k, seed=settings.seed)
    step = build_step(spec, run.device)
    shape = (spec.batch, settings.context_length, size.d_model)
    block_bytes = block_saved_bytes(step.model.layers[0], shape, settings.dtype, run.device, settings.seed)
    boundary = residual_stream_bytes(*shape, 4)  # the residual stream stays fp32 under autocast

    for _ in range(settings.warmup):
        step.run()
    synchronize(run.device)
    baseline = torch.cuda.memory_allocated(run.device) if run.is_cuda else None  # weights + optimizer state
    reset_peak_memory(run.device)
    times = time_steps(step.run, 0, settings.steps, run.device)
    if run.is_cuda:
        peak, source = peak_memory_bytes(run.device), GPU_PEAK
    else:
        summary = summarize_snapshot(cpu_snapshot(step.run))
        peak, source, baseline = summary["peak_bytes"], CPU_PEAK, summary["baseline_bytes"]

    n = size.num_layers
    return {
        "batch_size": spec.batch,
        "num_layers": n,
        "groups": math.ceil(n / k) if k else 0,
        "block_saved_bytes": block_bytes,
        "boundary_bytes": boundary,
        "gradient_bytes": parameter_gradient_bytes(step.model),
        "baseline_bytes": baseline,
        "peak_memory_bytes": peak,
        "peak_source": source,
        "predicted_activation_bytes": checkpoint_memory(n, k, block_bytes, boundary),
        "step_ms": summarize_ms(times),
        "step_times_ms": times,
        "flops_per_step": step.info["flops_per_step"],
    }
