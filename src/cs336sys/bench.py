"""Problem benchmarking_script: time forward, forward+backward and full training steps.

    python -m cs336sys.bench --size small --context-length 512 --mode train_step --dtype bf16

Every step is synchronised and timed separately; all step times are kept. Precision is fp32 or
bf16 under `torch.autocast` (problem benchmarking_mixed_precision), and the model runs eager or
compiled (problem torch_compile): `blocks` compiles each TransformerBlock (they share one compiled
graph, so compile time does not grow with depth); `full` compiles the whole model. The model,
optimizer and data come from the one step builder, `cs336sys.training.step`.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

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


def measure(settings: BenchSettings, device: str) -> dict:
    """Warm up, then time `steps` steps; metrics include every step's time and peak memory."""
    reset_peak_memory(device)
    build_start = time.perf_counter()
    step = build_step(settings.spec(), device)
    synchronize(device)
    build_s = time.perf_counter() - build_start
    times = time_steps(step.run, settings.warmup, settings.steps, device)
    metrics = {**summarize_ms(times), "step_ms": times, "build_s": build_s, **step.info}
    metrics["peak_memory_bytes"] = peak_memory_bytes(device)  # GPU allocator peak; None on the CPU
    if torch.device(device).type != "cuda":  # no allocator statistics: the process's resident-set high-water mark
        metrics["peak_rss_bytes"] = peak_rss_bytes()
    metrics["achieved_tflops"] = step.info["flops_per_step"] / (metrics["median_ms"] * 1e-3) / 1e12
    return metrics


def run_point(settings: BenchSettings, run: Run) -> dict:
    return measure(settings, run.device)


def run_warmup_point(settings: WarmupSettings, run: Run) -> dict:
    """Running w untimed warm-up steps then n timed steps is the same as timing steps w..w+n-1 of one
    cold sequence, so one sequence of max(w)+n steps serves every w; the report slices it."""
    bench = BenchSettings(size=settings.size, context_length=settings.context_length, mode=settings.mode,
                          dtype=settings.dtype, compile=settings.compile, warmup=0, steps=settings.steps,
                          optimizer=settings.optimizer, device=settings.device)
    return measure(bench, run.device)


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    pass


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m cs336sys.bench", description=__doc__, formatter_class=_HelpFormatter)
    p.add_argument("--size", default="small", help=f"one of {', '.join(SIZES)}")
    p.add_argument("--context-length", type=int, default=512, help="tokens per sequence")
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
    settings = BenchSettings(size=a.size, context_length=a.context_length, mode=a.mode, dtype=a.dtype,
                             compile=a.compile, attention=a.attention, checkpoint_blocks=a.checkpoint_blocks,
                             warmup=a.warmup, steps=a.steps, optimizer=a.optimizer, device=a.device)
    m = measure(settings, a.device)
    memory = (f"peak GPU memory allocated {m['peak_memory_bytes'] / 2**30:.3f} GiB" if m["peak_memory_bytes"]
              else f"peak process RSS (CPU high-water mark) {m['peak_rss_bytes'] / 2**30:.3f} GiB")
    print(f"{a.size} ctx={a.context_length} {a.mode} {a.dtype} {a.compile} on {a.device}: "
          f"{m['mean_ms']:.2f} ± {m['std_ms']:.2f} ms (median {m['median_ms']:.2f}, min {m['min_ms']:.2f}) "
          f"over {a.steps} steps after {a.warmup} warm-up; {m['achieved_tflops']:.4g} TFLOP/s; {memory}")


if __name__ == "__main__":
    main()
