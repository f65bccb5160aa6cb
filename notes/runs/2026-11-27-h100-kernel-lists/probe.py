"""Kernel lists of the optimised step's configurations (a hand-run probe, not a result): per size and
configuration, the step replayed from its CUDA graph (median of 30 by the host clock, synchronised) and
the GPU time of every kernel over three profiled replays, by family and the largest ones.

    PYTHONPATH=src python notes/runs/2026-11-27-h100-kernel-lists/probe.py 2.7B:adamw_in_backward ...

A configuration is the series' name of its last technique (config/main.yaml's order).
"""

from __future__ import annotations

import gc
import statistics
import sys
from collections import Counter

import torch
from torch.profiler import ProfilerActivity, profile

from cs336sys.timing import time_steps
from cs336sys.training.optimized import OptimizedSpec, build_optimized_step

SERIES = ("fused_adamw", "cuda_graph", "flash", "bf16_weights", "adamw_in_backward", "fused_projections",
          "compiled_loss")


def family(name: str) -> str:
    if name.startswith("nvjet") or "gemm" in name or "cutlass" in name:
        return "matmul"
    if name.startswith(("flash_", "backward_kernel", "backward_delta")):
        return "attention"
    if name.startswith("adamw"):
        return "adamw"
    return "inductor" if name.startswith("triton_") else "aten"


def measure(size: str, last: str, top: int = 30) -> None:
    torch._dynamo.reset()
    techniques = SERIES[: SERIES.index(last) + 1]
    step = build_optimized_step(OptimizedSpec(size, 512, techniques=techniques), "cuda")
    ms = statistics.median(time_steps(step.run, 10, 30, "cuda"))
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            step.run()
        torch.cuda.synchronize()
    kernels: Counter = Counter()
    counts: Counter = Counter()
    for e in prof.events():
        if e.device_type.name == "CUDA":
            kernels[e.name[:110]] += e.device_time / 3e3
            counts[e.name[:110]] += 1
    families: Counter = Counter()
    for name, t in kernels.items():
        families[family(name)] += t
    print(f"\n{size} up to {last}: step {ms:.2f} ms; kernels " + ", ".join(f"{f} {t:.2f}" for f, t in
                                                                             families.most_common()), flush=True)
    for name, t in kernels.most_common(top):
        print(f"  {t:7.3f} ms  x{counts[name] // 3:4d}  {name}", flush=True)
    del step
    gc.collect()
    torch.cuda.empty_cache()


if __name__ == "__main__":
    print(torch.__version__, torch.cuda.get_device_name(), flush=True)
    for arg in sys.argv[1:]:
        measure(*arg.split(":"))
