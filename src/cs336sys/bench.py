"""Problem benchmarking_script: time forward, forward+backward and full training steps.

    python -m cs336sys.bench --size small --context-length 512 --mode train_step --dtype bf16

Every step is synchronised and timed separately; all step times are kept. Precision is fp32 or
bf16 under `torch.autocast` (problem benchmarking_mixed_precision), and the model runs eager or
compiled (problem torch_compile): `blocks` compiles each TransformerBlock (they share one compiled
graph, so compile time does not grow with depth); `full` compiles the whole model. The model,
optimizer and data come from the one step builder, `cs336sys.training.step`.

After the timed steps, two more passes of the same steps (never mixed into the step times):
- phases: a device synchronisation around each phase (forward, backward, optimizer step), so the
  backward is timed alone, not as forward+backward less forward;
- GPU busy time (CUDA only): the steps under torch.profiler, the union of their kernels' intervals
  per step. A step whose wall time is far above its busy time is waiting on the host (Python and
  kernel launches), and its trend across sizes is the CPU's, not the GPU's.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass

import torch

from cs336sys.dtypes import DTYPE_NAMES
from cs336sys.jobs import Run
from cs336sys.sizes import SIZES, get_size
from cs336sys.timing import peak_memory_bytes, peak_rss_bytes, reset_peak_memory, summarize_ms, synchronize, time_steps
from cs336sys.training.step import COMPILE, MODES, StepSpec, build_step


@dataclass(frozen=True)
class BenchSettings:
    size: str
    context_length: int
    mode: str = "forward_backward"
    dtype: str = "fp32"
    compile: str = "eager"
    warmup: int = 5
    steps: int = 10
    optimizer: str = "ours"
    attention: str = "naive"
    checkpoint_blocks: int = 0
    batch_size: int | None = None
    seed: int = 0
    device: str = "cuda"

    def spec(self) -> StepSpec:
        return StepSpec(size=self.size, context_length=self.context_length, batch_size=self.batch_size,
                        mode=self.mode, dtype=self.dtype, compile=self.compile, attention=self.attention,
                        checkpoint_blocks=self.checkpoint_blocks, optimizer=self.optimizer, seed=self.seed)


@dataclass(frozen=True)
class WarmupSettings:
    """The warm-up sweep: one cold process times `steps` steps from the very first one."""

    size: str
    context_length: int
    mode: str
    steps: int
    warmups: tuple[int, ...]  # the warm-up counts the report slices out of the step sequence
    measured_steps: int
    order_in_process: int = 0
    dtype: str = "fp32"
    compile: str = "eager"
    optimizer: str = "ours"
    device: str = "cuda"


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


def measure(settings: BenchSettings, device: str, progress: bool = False, extra_passes: bool = True) -> dict:
    """Warm up, then time `steps` steps; metrics include every step's time and peak memory, then (with
    `extra_passes`) each phase timed alone and, on CUDA, the GPU's busy time per step."""
    reset_peak_memory(device)
    build_start = time.perf_counter()
    step = build_step(settings.spec(), device)
    synchronize(device)
    build_s = time.perf_counter() - build_start
    run = Progress(step.run, settings.warmup, settings.steps) if progress else step.run
    times = time_steps(run, settings.warmup, settings.steps, device)
    if progress:
        print(file=sys.stderr)
    metrics = {**summarize_ms(times), "step_ms": times, "build_s": build_s, **step.info}
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
    return measure(settings, run.device)


def run_warmup_point(settings: WarmupSettings, run: Run) -> dict:
    """Running w untimed warm-up steps then n timed steps is the same as timing steps w..w+n-1 of one
    cold sequence, so one sequence of max(w)+n steps serves every w; the report slices it."""
    bench = BenchSettings(size=settings.size, context_length=settings.context_length, mode=settings.mode,
                          dtype=settings.dtype, compile=settings.compile, warmup=0, steps=settings.steps,
                          optimizer=settings.optimizer, device=settings.device)
    return measure(bench, run.device, extra_passes=False)  # the cold sequence is what this point is for


def memory_estimate(settings: BenchSettings) -> dict[str, float]:
    """Bytes the point needs, by part, from the accounting's formulas: parameters always; gradients
    and saved activations when there is a backward; AdamW's two moments for a train step."""
    from cs336sys.accounting.plan import make_setup, plan

    p = plan(make_setup(settings.size, 1, "single", batch_size=settings.spec().batch,
                        context_length=settings.context_length, master_dtype="fp32",
                        compute_dtype=settings.dtype if settings.dtype != "tf32" else "fp32",
                        attention="flash" if settings.attention == "sdpa" else "naive"))
    row = {r.quantity: r.value for r in p.rows if r.group == "memory per GPU"}
    parts = {"parameters": row["parameters"]}
    if settings.mode != "forward":
        parts["gradients"] = row["gradients"]
        parts["saved activations"] = row["saved activations"]
    if settings.mode == "train_step":
        parts["optimizer state"] = row["optimizer state (AdamW)"]
    return parts


def available_bytes(device: str) -> tuple[float, str] | None:
    """(free bytes, where) on the device the point would run on; None where it cannot be told."""
    if torch.device(device).type == "cuda":
        free, _ = torch.cuda.mem_get_info(torch.device(device))
        return float(free), f"free on {torch.cuda.get_device_name(torch.device(device))}"
    try:
        with open("/proc/meminfo") as f:
            info = dict(line.split(":", 1) for line in f)
        return float(info["MemAvailable"].split()[0]) * 1024, "available host memory (MemAvailable)"
    except (OSError, KeyError, ValueError):
        return None


def refuse_if_it_cannot_fit(settings: BenchSettings) -> str | None:
    """The message refusing a point whose estimate exceeds what the device has, else None."""
    have = available_bytes(settings.device)
    if have is None:
        return None
    parts = memory_estimate(settings)
    need = sum(parts.values())
    if need <= have[0]:
        return None
    split = ", ".join(f"{k} {v / 1e9:.1f}" for k, v in parts.items())
    return (f"--size {settings.size} {settings.mode} at batch {settings.spec().batch} x context "
            f"{settings.context_length} needs about {need / 1e9:.1f} GB ({split} GB; the accounting's count: "
            f"python -m cs336sys.accounting --model {settings.size} --gpus 1 --strategy single), but "
            f"{have[0] / 1e9:.1f} GB is {have[1]}. Use a smaller size, context or --batch-size, or --force to try "
            "anyway.")


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    pass


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m cs336sys.bench", description=__doc__, formatter_class=_HelpFormatter)
    p.add_argument("--size", default="small", help=f"one of {', '.join(SIZES)}")
    p.add_argument("--context-length", type=int, default=512, help="tokens per sequence")
    p.add_argument("--batch-size", type=int, default=None,
                   help="sequences per step (default: the size's batch: "
                   + ", ".join(f"{k} {v.batch_size}" for k, v in SIZES.items()) + ")")
    p.add_argument("--mode", choices=MODES, default="forward_backward", help="what one timed step does")
    p.add_argument("--dtype", choices=[d for d in DTYPE_NAMES if d != "tf32"], default="fp32",
                   help="fp32, or autocast to bf16/fp16 with fp32 weights")
    p.add_argument("--compile", choices=COMPILE, default="eager",
                   help="torch.compile nothing, each TransformerBlock, or the whole model")
    p.add_argument("--attention", choices=["naive", "sdpa"], default="naive", help="attention backend of the model")
    p.add_argument("--checkpoint-blocks", type=int, default=0, help="recompute groups of k blocks (0 = off)")
    p.add_argument("--warmup", type=int, default=5, help="untimed steps first")
    p.add_argument("--steps", type=int, default=10, help="timed steps")
    p.add_argument("--optimizer", choices=["ours", "torch_fused"], default="ours",
                   help="our AdamW, or torch.optim.AdamW(fused=True) (GPU)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu",
                   help="cuda or cpu (cuda when a GPU is visible here)")
    p.add_argument("--json", action="store_true", help="print the settings and every metric as JSON, nothing else")
    p.add_argument("--progress", choices=["auto", "on", "off"], default="auto",
                   help="warm-up and timed steps on stderr as they run (auto: when stderr is a terminal)")
    p.add_argument("--force", action="store_true",
                   help="run even where the memory estimate says the point cannot fit")
    return p


def main(argv: list[str] | None = None) -> None:
    p = parser()
    a = p.parse_args(argv)
    try:
        get_size(a.size)
    except ValueError as exc:
        p.error(str(exc))
    if a.device.startswith("cuda") and not torch.cuda.is_available():
        p.error(f"--device {a.device}: no CUDA GPU is visible on this host (torch {torch.__version__}); "
                "use --device cpu")
    if a.steps < 1 or a.warmup < 0:
        p.error("--steps must be at least 1 and --warmup at least 0")
    if a.batch_size is not None and a.batch_size < 1 or a.context_length < 1:
        p.error("--batch-size and --context-length must be at least 1")
    settings = BenchSettings(size=a.size, context_length=a.context_length, mode=a.mode, dtype=a.dtype,
                             compile=a.compile, attention=a.attention, checkpoint_blocks=a.checkpoint_blocks,
                             warmup=a.warmup, steps=a.steps, optimizer=a.optimizer, batch_size=a.batch_size,
                             device=a.device)
    if not a.force and (refusal := refuse_if_it_cannot_fit(settings)):
        p.exit(2, f"{p.prog}: error: {refusal}\n")
    progress = a.progress == "on" or (a.progress == "auto" and sys.stderr.isatty())
    if progress:
        print(f"building {a.size} ({a.mode}, {a.dtype}, {a.compile}) on {a.device}", file=sys.stderr, flush=True)
    m = measure(settings, a.device, progress=progress)
    if a.json:
        resolved = {**asdict(settings), "batch_size": settings.spec().batch}
        json.dump({"settings": resolved, "metrics": m}, sys.stdout, indent=1)
        sys.stdout.write("\n")
        return
    memory = (f"peak GPU memory allocated {m['peak_memory_bytes'] / 2**30:.3f} GiB" if m["peak_memory_bytes"]
              else f"peak process RSS (CPU high-water mark) {m['peak_rss_bytes'] / 2**30:.3f} GiB")
    print(f"{a.size} batch={settings.spec().batch} ctx={a.context_length} {a.mode} {a.dtype} {a.compile} on "
          f"{a.device}: {m['mean_ms']:.2f} ± {m['std_ms']:.2f} ms (median {m['median_ms']:.2f}, min {m['min_ms']:.2f}) "
          f"over {a.steps} steps after {a.warmup} warm-up; {m['achieved_tflops']:.4g} TFLOP/s; {memory}")
    if "phase_median_ms" in m:
        print("  each phase timed alone (median ms): "
              + ", ".join(f"{k} {v:.2f}" for k, v in m["phase_median_ms"].items()))
    if m.get("gpu_busy_median_ms") is not None:
        print(f"  GPU busy {m['gpu_busy_median_ms']:.2f} ms per step (kernels only; the rest is waiting on the host)")


if __name__ == "__main__":
    main()
