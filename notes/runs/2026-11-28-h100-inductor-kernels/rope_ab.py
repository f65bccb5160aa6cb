"""The optimised step with RoPE as `rotate_pairs` (x cos + swap(x) sin) against the model's even/odd slices
(as before 2026-11-28), one process, alternating builds (a hand-run probe, not a result): the step
replayed from its graph, median of 30 steps, and the kernel count and GPU time of one profiled replay.

    PYTHONPATH=src python notes/runs/2026-11-28-h100-inductor-kernels/rope_ab.py medium large
"""

from __future__ import annotations

import gc
import statistics
import sys

import torch
from torch.profiler import ProfilerActivity, profile

import cs336sys.training.optimized as optimized
from cs336sys.leaderboard.fused_ops import rotary_reference
from cs336sys.timing import time_steps
from cs336sys.training.optimized import OptimizedSpec, build_optimized_step

TECHNIQUES = ("fused_adamw", "cuda_graph", "flash", "bf16_weights", "adamw_in_backward", "fused_projections",
              "compiled_loss")
NEW = optimized.rotate_pairs, optimized.joined_rotary_tables


def slices_tables(cos, sin):
    return (torch.stack((cos, cos, torch.ones_like(cos)), dim=1).unsqueeze(2),
            torch.stack((sin, sin, torch.zeros_like(sin)), dim=1).unsqueeze(2))


OLD = rotary_reference, slices_tables


def measure(size: str, variant: str) -> None:
    optimized.rotate_pairs, optimized.joined_rotary_tables = NEW if variant == "pairs" else OLD
    torch._dynamo.reset()
    step = build_optimized_step(OptimizedSpec(size, 512, techniques=TECHNIQUES), "cuda")
    times = time_steps(step.run, 10, 30, "cuda")
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step.run()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type.name == "CUDA"]
    inductor = sum(e.device_time for e in kernels if e.name.startswith("triton_")) / 1e3
    print(f"{size:7s} {variant:7s}: step median {statistics.median(times):7.3f} ms (min {min(times):7.3f}); "
          f"{len(kernels)} kernels, Inductor's {inductor:.2f} ms", flush=True)
    del step
    gc.collect()
    torch.cuda.empty_cache()


if __name__ == "__main__":
    print(torch.__version__, torch.cuda.get_device_name(), flush=True)
    for size in sys.argv[1:]:
        for variant in ("pairs", "slices", "pairs", "slices"):
            measure(size, variant)
