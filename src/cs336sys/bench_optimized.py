"""The optimised-step series: the handout's bf16 train step with the project's techniques added one at
a time (`cs336sys.training.optimized`), each configuration one point of a job that runs a size's series
in one process.

Per point: build, `warmup` untimed steps, then `steps` steps each bracketed by CUDA events (forward +
backward, optimizer step, zero_grad; a device synchronisation after each step, as `time_steps` does),
with the GPU's SM clock and power sampled over them (`step_clocks`, `gpu_clocks.ClockSampler`'s medians:
under the larger sizes' steps an H100 runs at its power cap, and its clock then differs between
machines), and the device's copy bandwidth measured in the same process (a `copy_` of `COPY_BYTES` between two
buffers: bytes read plus written over the median time), the roofline's memory ceiling, and on CUDA its
matmul ceiling too (`cs336sys.peak.matmul_tflops`: the bf16 8192-cube product, `CEILING_REPEATS` of them,
with the clocks they ran at), so that the step and the roofline it is held to are measured in one job. The
loss of every timed step is kept (the configurations of a series train the same model on the same batch).
"""

from __future__ import annotations

import gc
import shutil
import statistics
import time
from dataclasses import dataclass

import torch

from cs336sys.gpu_clocks import ClockSampler
from cs336sys.jobs import Run
from cs336sys.peak import matmul_tflops
from cs336sys.timing import peak_memory_bytes, reset_peak_memory, summarize_ms, synchronize
from cs336sys.training.optimized import OptimizedSpec, build_optimized_step

COPY_BYTES = 2 * 1024**3
COPY_REPEATS = 20
CLOCK_MS = 20  # nvidia-smi's sampling period over the timed steps
CEILING_N, CEILING_REPEATS = 8192, 200  # the matmul ceiling measured in the job: ~0.3 s of products on an H200


@dataclass(frozen=True)
class OptimizedStepSettings:
    size: str
    """Model size, a name in `cs336sys.sizes.SIZES` (small, medium, large, xl, 2.7B, ...)."""
    context_length: int
    """Sequence length of each sample, in tokens."""
    configuration: str
    """The name the report gives this point ("plain", "+ fused AdamW", ...)."""
    techniques: tuple[str, ...] = ()
    """Speed-ups applied: any of fused_adamw | fused_elementwise | flash | bf16_weights | cuda_graph |
    adamw_in_backward | fused_projections | compiled_loss | backward_kernels
    (`cs336sys.training.optimized.TECHNIQUES`)."""
    compile: str = "blocks"
    """torch.compile of the model's own forward (without fused_elementwise): eager | blocks | full."""
    batch_size: int | None = None
    """Sequences per batch; None: the size's default batch size."""
    warmup: int = 5
    """Untimed steps before the timed ones."""
    steps: int = 30
    """Timed steps; each phase bracketed by CUDA events (host clock on the CPU). Of ten, one to three ran
    5-15 % slower at xl and "2.7B", where the GPU reaches its power cap and lowers its clock (`step_clocks`):
    enough to move a median of ten."""
    seed: int = 0
    """Seed of the model's initial parameters and of the random batch."""
    device: str = "cuda"
    """Device kind: cuda | cpu (the grid's `device`); the job runner picks this rank's GPU."""


class _Clock:
    """CUDA events on a GPU, the host clock (after a no-op synchronisation) on the CPU."""

    def __init__(self, device: str) -> None:
        self.cuda = torch.device(device).type == "cuda"

    def mark(self):
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def ms(self, start, end) -> float:
        return start.elapsed_time(end) if self.cuda else (end - start) * 1e3


def copy_bandwidth(device: str) -> float | None:
    """Bytes/s of a device-to-device `copy_` (read + write), the median of COPY_REPEATS; None off CUDA."""
    if torch.device(device).type != "cuda":
        return None
    n = COPY_BYTES // 4
    src, dst = torch.empty(n, device=device), torch.empty(n, device=device)
    clock, times = _Clock(device), []
    for i in range(COPY_REPEATS + 3):
        start = clock.mark()
        dst.copy_(src)
        end = clock.mark()
        synchronize(device)
        if i >= 3:
            times.append(clock.ms(start, end))
    del src, dst
    return 2 * COPY_BYTES / (statistics.median(times) * 1e-3)


def _first_sample(clocks: ClockSampler, timeout_s: float = 2.0) -> None:
    """Wait for the sampler's first sample (nvidia-smi takes a moment to start), so that it samples the
    timed steps from their start; at most `timeout_s`, and not at all where nothing samples."""
    deadline = time.perf_counter() + timeout_s
    while clocks.selector is not None and shutil.which("nvidia-smi") and not clocks.samples:
        if time.perf_counter() > deadline:
            return
        time.sleep(0.01)


def run_point(settings: OptimizedStepSettings, run: Run) -> dict:
    device = run.device
    reset_peak_memory(device)
    spec = OptimizedSpec(settings.size, settings.context_length, settings.batch_size, settings.techniques,
                         settings.compile, settings.seed)
    build_start = time.perf_counter()
    step = build_optimized_step(spec, device)
    synchronize(device)
    build_s = time.perf_counter() - build_start
    clock = _Clock(device)
    phases: dict[str, list[float]] = {"forward_backward": [], "optimizer_step": [], "zero_grad": []}
    step_ms, losses = [], []
    with ClockSampler(device, interval_ms=CLOCK_MS) as clocks:
        _first_sample(clocks)
        for _ in range(settings.warmup):
            step.run()
        synchronize(device)
        timed_from = time.perf_counter()
        for _ in range(settings.steps):
            marks = [clock.mark()]
            loss = step.forward_backward()
            marks.append(clock.mark())
            step.optimizer_step()
            marks.append(clock.mark())
            step.zero_grad()
            marks.append(clock.mark())
            synchronize(device)
            for name, a, b in zip(phases, marks, marks[1:], strict=False):
                phases[name].append(clock.ms(a, b))
            step_ms.append(clock.ms(marks[0], marks[-1]))
            losses.append(loss.item())
        timed_to = time.perf_counter()
    metrics = {**summarize_ms(step_ms), "step_ms": step_ms, "phase_ms": phases,
               "step_clocks": clocks.summary(timed_from, timed_to),
               "phase_median_ms": {k: statistics.median(v) for k, v in phases.items()}, "losses": losses,
               "build_s": build_s, **step.info, "peak_memory_bytes": peak_memory_bytes(device)}
    metrics["achieved_tflops"] = step.info["flops_per_step"] / (metrics["median_ms"] * 1e-3) / 1e12
    del step, loss
    gc.collect()
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()
    metrics["copy_bytes_per_s"] = copy_bandwidth(device)
    if run.is_cuda:
        with ClockSampler(device, interval_ms=CLOCK_MS) as clocks:
            _first_sample(clocks)
            began = time.perf_counter()
            metrics["matmul_bf16_tflops"] = matmul_tflops("bf16", CEILING_N, device, CEILING_REPEATS)
            metrics["matmul_clocks"] = clocks.summary(began, time.perf_counter())
    return metrics
