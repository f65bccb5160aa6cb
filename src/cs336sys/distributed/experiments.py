"""The distributed-data-parallel experiments (problems 12-19), run on every rank by the job runner.

    run_allreduce_point   all-reduce of one fp32 size: per-call times, algorithm and bus bandwidth
    run_ddp_step_point    one DDP variant's training step of a model: step time, exposed communication
                          (or, `single_rank_proxy`, the same step on a one-rank group: the host's share)
    run_ddp_trace_point   one profiled step of a variant: a per-stream timeline summary (overlap, seen)

All ranks of a job run each point together (the runner starts them with torchrun). A DDP job's
points share one model size and precision, so the variants, the no-communication baseline
(`none`) and PyTorch's `DistributedDataParallel` are compared within one job on the same GPUs.
"""

from __future__ import annotations

import contextlib
import re
import statistics
import subprocess
import time
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from cs336sys.distributed.allreduce import algorithm_bandwidth, bus_bandwidth, max_across_ranks, time_all_reduce
from cs336sys.distributed.clocks import clock_metrics, clock_sampler
from cs336sys.distributed.ddp import VARIANTS, build_ddp
from cs336sys.distributed.ddp_views import BucketViewDDP
from cs336sys.jobs import Run, Unsupported
from cs336sys.timing import summarize_ms, synchronize
from cs336sys.training.step import Step, StepSpec, build_step

BASELINES = ("none", "torch_ddp")  # local training without communication; PyTorch's own DDP
VIEW_VARIANTS = ("bucket_view",)  # cs336sys.distributed.ddp_views
TORCH_DDP_DEFAULT_BUCKET_MB = 25.0  # DistributedDataParallel's bucket_cap_mb default


# --- all-reduce -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class AllReduceSettings:
    size_bytes: int
    """Bytes of the fp32 tensor each rank all-reduces (a positive multiple of 4)."""
    warmup: int = 5
    """Untimed all-reduce calls before the timed ones."""
    iters: int = 20
    """Timed all-reduce calls, each after a barrier; a call's time is the maximum over the ranks."""
    device: str = "cuda"
    """Device kind: cuda (NCCL, one GPU per rank) | cpu (gloo); the grid's `device`."""


def nvlink_nominal_gbps() -> float | None:
    """Per-GPU NVLink bandwidth, one direction, from `nvidia-smi nvlink -s` (sum over active
    links of GPU 0), in GB/s; None where it cannot be read."""
    try:
        out = subprocess.run(["nvidia-smi", "nvlink", "-s", "-i", "0"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    speeds = [float(x) for x in re.findall(r"Link \d+: ([\d.]+) GB/s", out.stdout)]
    return sum(speeds) or None


def run_allreduce_point(settings: AllReduceSettings, run: Run) -> dict:
    run.require_ranks("a distributed experiment")
    times = max_across_ranks(time_all_reduce(settings.size_bytes, warmup=settings.warmup, iters=settings.iters,
                                             device=run.device), device=run.device)
    ms = [t * 1e3 for t in times]
    median_s = statistics.median(times)
    metrics = {**summarize_ms(ms), "times_ms": ms, "backend": run.backend, "world_size": run.world_size,
               "algbw_gbps": algorithm_bandwidth(settings.size_bytes, median_s) / 1e9,
               "busbw_gbps": bus_bandwidth(settings.size_bytes, median_s, run.world_size) / 1e9}
    if run.is_cuda:
        metrics["nvlink_nominal_gbps"] = nvlink_nominal_gbps()
    return metrics


# --- DDP training step --------------------------------------------------------------------------------

@dataclass(frozen=True)
class DDPStepSettings:
    size: str
    """Model size, a name in `cs336sys.sizes.SIZES` (small, medium, large, xl, 2.7B, ...)."""
    variant: str
    """Gradient sync: none (local only) | naive | flat | overlap | bucketed | bucket_view | torch_ddp."""
    bucket_size_mb: float | None = None
    """Bucket cap in MiB of bucketed, bucket_view (both need it) and torch_ddp (None: PyTorch's 25)."""
    context_length: int = 512
    """Sequence length of each sample, in tokens."""
    batch_size: int = 4
    """Sequences per rank per step."""
    dtype: str = "fp32"
    """Autocast dtype (fp32: none); parameters and gradients are fp32."""
    warmup: int = 2
    """Untimed steps before the timed ones."""
    steps: int = 10
    """Timed steps (host clock, device synchronised before and after each)."""
    device: str = "cuda"
    """Device kind: cuda (NCCL, one GPU per rank) | cpu (gloo); the grid's `device`."""
    series: str | None = None
    """Job series with its own baselines ("host": bucket_view's host-overhead jobs); None: the DDP grid's."""
    single_rank_proxy: bool = False
    """True: one rank, a group of one (every hook and launch, no transfer): a host-overhead proxy."""
    round: int = 0
    """Which of its job's interleaved rounds this point is (a job runs each variant once a round): a label."""


def _wrap(settings: DDPStepSettings, run: Run):
    """The parallel wrapper to apply from outside the model, or None for `none`."""
    variant = settings.variant
    if variant == "none":
        return None
    if variant == "torch_ddp":
        bucket = settings.bucket_size_mb or TORCH_DDP_DEFAULT_BUCKET_MB
        ids = [run.local_rank] if run.is_cuda else None
        return lambda m: nn.parallel.DistributedDataParallel(m, device_ids=ids, bucket_cap_mb=bucket)
    if variant == "bucket_view":
        if settings.bucket_size_mb is None:
            raise ValueError("the bucket_view variant needs bucket_size_mb")
        return lambda m: BucketViewDDP(m, settings.bucket_size_mb)
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; known: {', '.join(BASELINES + VARIANTS + VIEW_VARIANTS)}")
    return lambda m: build_ddp(variant, m, settings.bucket_size_mb)


def build_ddp_step(settings: DDPStepSettings, run: Run) -> Step:
    spec = StepSpec(size=settings.size, context_length=settings.context_length, batch_size=settings.batch_size,
                    mode="train_step", dtype=settings.dtype)
    # Every rank builds the same model (same seed); each trains on its own batch.
    return build_step(spec, run.device, parallelize=_wrap(settings, run), data_seed=1000 + run.rank)


def gradient_bytes(model: nn.Module) -> int:
    return sum(p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)


@contextlib.contextmanager
def one_rank_group(run: Run):
    """A process group of this process alone (NCCL on a GPU, gloo on the CPU), for the single-rank
    proxy: the job runner makes none for one rank."""
    if run.world_size != 1 or dist.is_initialized():
        raise Unsupported("a single-rank proxy runs in a job of one rank (register the job with ranks 1)")
    backend = "nccl" if run.is_cuda else "gloo"
    kwargs = {"device_id": torch.device(run.device)} if run.is_cuda else {}
    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, **kwargs)
    try:
        yield
    finally:
        dist.destroy_process_group()


def run_ddp_step_point(settings: DDPStepSettings, run: Run) -> dict:
    """Step time (host clock, device synchronised after each step, as in the benchmarking script),
    and the exposed communication: on the compute stream, the time from the end of backward to the
    end of `finish_gradient_synchronization()` (CUDA events; it waits for the all-reduces that
    have not finished). PyTorch's DDP waits inside backward, so for it (and for every variant) the
    analysis also compares the step with the `none` baseline of the same job."""
    if settings.single_rank_proxy:
        with one_rank_group(run):
            return {**_ddp_step(settings, run), "backend": dist.get_backend()}
    run.require_ranks("a distributed experiment")
    return _ddp_step(settings, run)


def _ddp_step(settings: DDPStepSettings, run: Run) -> dict:
    step = build_ddp_step(settings, run)
    on_cuda = run.is_cuda
    step_ms, wait_ms = [], []
    with clock_sampler(run.device) as clocks:
        for i in range(settings.warmup + settings.steps):
            synchronize(run.device)
            start = time.perf_counter()
            if i == settings.warmup:
                timed_from = start
            step.forward_backward()
            if on_cuda:
                backward_done, sync_done = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                backward_done.record()
            t_sync = time.perf_counter()
            step.sync()
            if on_cuda:
                sync_done.record()
            else:
                wait = (time.perf_counter() - t_sync) * 1e3
            step.optimizer_step()
            step.zero_grad()
            synchronize(run.device)
            if i >= settings.warmup:
                step_ms.append((time.perf_counter() - start) * 1e3)
                wait_ms.append(backward_done.elapsed_time(sync_done) if on_cuda else wait)
        timed_to = time.perf_counter()
    clock = clocks.summary(timed_from, timed_to)  # the timed steps' SM clock and power ({} without nvidia-smi)
    # After the steps every rank must hold the same parameters (except `none`, which does not
    # communicate): a check of the wrapper on NCCL at full size, beside the gloo tests.
    with torch.no_grad():
        checksum = float(sum(p.double().sum() for p in step.model.parameters()))
    per_rank = [None] * run.world_size
    dist.all_gather_object(per_rank, {"mean_ms": statistics.fmean(step_ms), "wait_ms": statistics.fmean(wait_ms),
                                      "peak_memory_bytes": torch.cuda.max_memory_allocated() if on_cuda else None,
                                      "parameter_checksum": checksum, **clock})
    checksums = [r["parameter_checksum"] for r in per_rank]
    if settings.variant != "none" and max(checksums) != min(checksums):
        raise RuntimeError(f"{settings.variant}: ranks disagree on the parameters after training: {checksums}")
    wrapper = step.module
    groups = getattr(wrapper, "gradient_groups", None)
    return {**summarize_ms(step_ms), "step_ms": step_ms, "sync_wait_ms": statistics.fmean(wait_ms),
            "sync_wait_step_ms": wait_ms, "ranks": per_rank,
            "slowest_rank_mean_ms": max(r["mean_ms"] for r in per_rank),
            "grad_bytes": gradient_bytes(step.model), "parameters": step.info["parameters"],
            "all_reduces_per_step": len(groups) if groups is not None else None,
            "launched_in_backward": getattr(wrapper, "groups_launched_in_backward", None),
            "peak_memory_bytes": per_rank[run.rank]["peak_memory_bytes"], "world_size": run.world_size,
            **clock_metrics(per_rank)}



# --- one profiled step: the overlap, seen ------------------------------------------------------------

@dataclass(frozen=True)
class DDPTraceSettings:
    size: str
    """Model size, a name in `cs336sys.sizes.SIZES` (small, medium, large, xl, 2.7B, ...)."""
    variant: str
    """Gradient sync: none (local only) | naive | flat | overlap | bucketed | bucket_view | torch_ddp."""
    bucket_size_mb: float | None = None
    """Bucket cap in MiB of bucketed, bucket_view (both need it) and torch_ddp (None: PyTorch's 25)."""
    context_length: int = 512
    """Sequence length of each sample, in tokens."""
    batch_size: int = 4
    """Sequences per rank per step."""
    dtype: str = "bf16"
    """Autocast dtype (fp32: none); parameters and gradients are fp32."""
    warmup: int = 2
    """Unprofiled steps before the one profiled step."""
    device: str = "cuda"
    """Device kind: cuda (NCCL, one GPU per rank) | cpu (gloo); the grid's `device`."""


def run_ddp_trace_point(settings: DDPTraceSettings, run: Run) -> dict:
    """Profile one step after warm-up on every rank; rank 0's trace is reduced to a per-stream
    timeline summary (compute and NCCL streams, phases) in the rendered folder; the raw trace stays
    in the artifact folder. The report draws the variants' timelines on one time axis."""
    from cs336sys.profiling.annotate import annotations_enabled, phase
    from cs336sys.profiling.timeline import save_summary, summarize_timeline
    from cs336sys.profiling.trace import record_trace

    run.require_ranks("a distributed experiment")
    step = build_ddp_step(DDPStepSettings(size=settings.size, variant=settings.variant,
                                          bucket_size_mb=settings.bucket_size_mb,
                                          context_length=settings.context_length, batch_size=settings.batch_size,
                                          dtype=settings.dtype, device=settings.device), run)
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
