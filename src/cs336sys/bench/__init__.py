"""Problem benchmarking_script: time forward, forward+backward and full training steps.

    python -m cs336sys.bench --size small --context-length 512 --mode train_step --dtype bf16

Every step is synchronised and timed separately; all step times are kept. Precision is fp32 or
bf16 under `torch.autocast` (problem benchmarking_mixed_precision), and the model runs eager or
compiled (problem torch_compile): `blocks` compiles each TransformerBlock (they share one compiled
graph, so compile time does not grow with depth); `full` compiles the whole model. The model,
optimizer and data come from the one step builder, `cs336sys.training.step`.

The GPU's SM clock and power are sampled over the timed steps (`step_clocks`, `gpu_clocks.ClockSampler`'s
medians), and a bf16 point on CUDA times the bf16 8192-cube product after its steps, in the same process
(`matmul_bf16_tflops`, `CEILING_REPEATS` products, with `matmul_clocks`): its MFU's ceiling, measured in the
job it bounds rather than on another day.

After the timed steps, two more passes of the same steps (never mixed into the step times):
- phases: a device synchronisation around each phase (forward, backward, optimizer step), so the
  backward is timed alone, not as forward+backward less forward;
- GPU busy time (CUDA only): the steps under torch.profiler, the union of their kernels' intervals
  per step. A step whose wall time is far above its busy time is waiting on the host (Python and
  kernel launches), and its trend across sizes is the CPU's, not the GPU's.
"""

from __future__ import annotations

import contextlib
import gc
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch

from cs336sys.gpu_clocks import ClockSampler
from cs336sys.jobs import Run
from cs336sys.peak import matmul_tflops
from cs336sys.timing import peak_memory_bytes, peak_rss_bytes, reset_peak_memory, summarize_ms, synchronize, time_steps
from cs336sys.training.step import StepSpec, build_step

CLOCK_MS = 20  # nvidia-smi's sampling period over the timed steps
CEILING_N, CEILING_REPEATS = 8192, 200  # the bf16 ceiling timed in the job: ~0.3 s of products on an H200


@dataclass(frozen=True)
class BenchSettings:
    size: str
    """Model size, a name in `cs336sys.sizes.SIZES` (small, medium, large, xl, 2.7B, ...)."""
    context_length: int
    """Sequence length of each sample, in tokens."""
    mode: str = "forward_backward"
    """What one step runs: forward | forward_backward | train_step (adds the optimizer step)."""
    dtype: str = "fp32"
    """Autocast dtype: fp32 (no autocast) | bf16 | fp16; parameters stay fp32."""
    compile: str = "eager"
    """torch.compile: eager (none) | blocks (each TransformerBlock) | full (the whole model)."""
    warmup: int = 5
    """Untimed steps before the timed ones."""
    steps: int = 10
    """Timed steps, each bracketed by a device synchronisation; also the steps of the phase pass."""
    optimizer: str = "ours"
    """AdamW of train_step: ours (assignment 1's) | torch_fused (torch.optim.AdamW, fused=True)."""
    attention: str = "naive"
    """Attention function of the model: naive | sdpa."""
    checkpoint_blocks: int = 0
    """Activation checkpointing: k > 0 blocks per checkpointed group; 0 = none."""
    batch_size: int | None = None
    """Sequences per batch; None: the size's default batch size."""
    seed: int = 0
    """Seed of the model's initial parameters and of the random batch."""
    device: str = "cuda"
    """Device kind: cuda | cpu (the grid's `device`); the job runner picks this rank's GPU."""

    def spec(self) -> StepSpec:
        return StepSpec(size=self.size, context_length=self.context_length, batch_size=self.batch_size,
                        mode=self.mode, dtype=self.dtype, compile=self.compile, attention=self.attention,
                        checkpoint_blocks=self.checkpoint_blocks, optimizer=self.optimizer, seed=self.seed)


@dataclass(frozen=True)
class WarmupSettings:
    """The warm-up sweep: one cold process times `steps` steps from the very first one."""

    size: str
    """Model size, a name in `cs336sys.sizes.SIZES` (small, medium, large, xl, 2.7B, ...)."""
    context_length: int
    """Sequence length of each sample, in tokens."""
    mode: str
    """What one step runs: forward | forward_backward | train_step (adds the optimizer step)."""
    steps: int
    """Steps timed one by one from the process's first (no untimed warm-up): max(warmups) + measured_steps."""
    warmups: tuple[int, ...]
    """The warm-up counts the report slices out of the step sequence."""
    measured_steps: int
    """Steps the report averages after each warm-up count w: step_ms[w:w + measured_steps]."""
    order_in_process: int = 0
    """This point's position in its job's process (0: first, pays the start-up costs); recorded only."""
    dtype: str = "fp32"
    """Autocast dtype: fp32 (no autocast) | bf16 | fp16; parameters stay fp32."""
    compile: str = "eager"
    """torch.compile: eager (none) | blocks (each TransformerBlock) | full (the whole model)."""
    optimizer: str = "ours"
    """AdamW of train_step: ours (assignment 1's) | torch_fused (torch.optim.AdamW, fused=True)."""
    device: str = "cuda"
    """Device kind: cuda | cpu (the grid's `device`); the job runner picks this rank's GPU."""


class PhaseTimer:
    """`Step.phase` that synchronises the device around each phase and records its time (ms)."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.ms: dict[str, list[float]] = {}

    @contextlib.contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        synchronize(self.device)
        start = time.perf_counter()
        yield
        synchronize(self.device)
        self.ms.setdefault(name, []).append((time.perf_counter() - start) * 1e3)


def phase_times(step, steps: int, device: str) -> dict[str, list[float]]:
    """Each phase of `steps` more steps timed alone (a synchronisation at every phase boundary)."""
    timer = PhaseTimer(device)
    plain, step.phase = step.phase, timer
    try:
        for _ in range(steps):
            step.run()
    finally:
        step.phase = plain
    return timer.ms


def gpu_busy_ms(step, steps: int, device: str) -> list[float]:
    """Per step, the time the GPU ran kernels (the union of kernel intervals, overlaps once)."""
    from cs336sys.profiling.trace import parse_trace, record_trace, union_length

    prof = record_trace(step.run, steps, 0, device)
    parsed = parse_trace(prof)
    steps_ranges = [r for r in parsed.ranges if r.name == "step"]
    return [union_length((w.start, w.start + w.dur) for w in parsed.work if r.start <= w.launch <= r.end) / 1e3
            for r in steps_ranges]


class Progress:
    """Wraps a step to print, on stderr, where the run is: warm-up i/n, then timed i/n with the
    running median of the steps so far (times from call to call, a few microseconds of printing
    included; the recorded step times are time_steps's own)."""

    def __init__(self, run: Callable[[], None], warmup: int, steps: int) -> None:
        self.run, self.warmup, self.steps = run, warmup, steps
        self.calls, self.last, self.seen = 0, None, []

    def __call__(self) -> None:
        now = time.perf_counter()
        if self.last is not None and self.calls > self.warmup:
            self.seen.append((now - self.last) * 1e3)
        self.calls += 1
        if self.calls <= self.warmup:
            line = f"warm-up {self.calls}/{self.warmup}"
        else:
            median = f", median so far {statistics.median(self.seen):.2f} ms" if self.seen else ""
            line = f"step {self.calls - self.warmup}/{self.steps}{median}"
        print(f"\r{line:<60}", end="", file=sys.stderr, flush=True)
        self.last = time.perf_counter()
        self.run()


def measure(settings: BenchSettings, device: str, progress: bool = False, extra_passes: bool = True,
            clocks: ClockSampler | None = None) -> dict:
    """Warm up, then time `steps` steps; metrics include every step's time and peak memory, the SM clock over
    the timed steps (from `clocks`, a running sampler), then (with `extra_passes`) each phase timed alone and,
    on CUDA, the GPU's busy time per step."""
    reset_peak_memory(device)
    build_start = time.perf_counter()
    step = build_step(settings.spec(), device)
    synchronize(device)
    build_s = time.perf_counter() - build_start
    run = Progress(step.run, settings.warmup, settings.steps) if progress else step.run
    times = time_steps(run, settings.warmup, settings.steps, device)
    timed_to = time.perf_counter()  # the timed steps ran back to back just before: their window
    if progress:
        print(file=sys.stderr)
    metrics = {**summarize_ms(times), "step_ms": times, "build_s": build_s, **step.info}
    if clocks is not None:
        metrics["step_clocks"] = clocks.summary(timed_to - sum(times) / 1e3, timed_to)
    metrics["peak_memory_bytes"] = peak_memory_bytes(device)  # GPU allocator peak; None on the CPU
    if torch.device(device).type != "cuda":  # no allocator statistics: the process's resident-set high-water mark
        metrics["peak_rss_bytes"] = peak_rss_bytes()
    metrics["achieved_tflops"] = step.info["flops_per_step"] / (metrics["median_ms"] * 1e-3) / 1e12
    if extra_passes and settings.mode != "forward":  # the forward alone is the step itself
        phases = phase_times(step, settings.steps, device)
        metrics["phase_ms"] = phases
        metrics["phase_median_ms"] = {k: statistics.median(v) for k, v in phases.items()}
    if extra_passes and torch.device(device).type == "cuda":
        busy = gpu_busy_ms(step, min(settings.steps, 3), device)
        metrics["gpu_busy_ms"] = busy
        metrics["gpu_busy_median_ms"] = statistics.median(busy) if busy else None
    return metrics


def run_point(settings: BenchSettings, run: Run) -> dict:
    with ClockSampler(run.device, interval_ms=CLOCK_MS) as clocks:
        metrics = measure(settings, run.device, clocks=clocks)
        if run.is_cuda and settings.dtype == "bf16":  # the step is freed first: the product needs 0.4 GB
            gc.collect()
            torch.cuda.empty_cache()
            began = time.perf_counter()
            metrics["matmul_bf16_tflops"] = matmul_tflops("bf16", CEILING_N, run.device, CEILING_REPEATS)
            metrics["matmul_clocks"] = clocks.summary(began, time.perf_counter())
    return metrics


def run_warmup_point(settings: WarmupSettings, run: Run) -> dict:
    """Running w untimed warm-up steps then n timed steps is the same as timing steps w..w+n-1 of one
    cold sequence, so one sequence of max(w)+n steps serves every w; the report slices it."""
    bench = BenchSettings(size=settings.size, context_length=settings.context_length, mode=settings.mode,
                          dtype=settings.dtype, compile=settings.compile, warmup=0, steps=settings.steps,
                          optimizer=settings.optimizer, device=settings.device)
    return measure(bench, run.device, extra_passes=False)  # the cold sequence is what this point is for

