"""The optimised step with Inductor's programmatic dependent launch (PDL) or combo kernels, against as built, in
one process with alternating builds (a hand-run GPU probe, not a result): every technique up to
`backward_kernels`, the CUDA graph captured; median of 30 replays after 10, then three profiled replays
(kernel count and kernel time).

A variant is `base`, or `+`-joined Inductor options: `pdl` (`triton.enable_pdl`: each compiled kernel waits
for the one before with griddepcontrol and is launched so that it may start before that one ends),
`combo` (`combo_kernels`: independent kernels of a graph horizontally fused into one launch); and, not
Inductor's, `lt` (`torch.backends.cuda.preferred_blas_library("cublaslt")`: every product through cuBLASLt).

    PYTHONPATH=src python notes/runs/2026-11-28-h200-step-options/ab.py medium:base,pdl,base,pdl
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

BEST = ("fused_adamw", "cuda_graph", "flash", "bf16_weights", "adamw_in_backward", "fused_projections",
        "compiled_loss", "backward_kernels")
OPTIONS = {"pdl": ("triton", "enable_pdl"), "combo": (None, "combo_kernels")}


def configure(variant: str) -> None:
    chosen = set(variant.split("+")) - {"base"}
    for name, (group, key) in OPTIONS.items():
        target = getattr(torch._inductor.config, group) if group else torch._inductor.config
        setattr(target, key, name in chosen)
    torch.backends.cuda.preferred_blas_library("cublaslt" if "lt" in chosen else "cublas")


def measure(size: str, variant: str) -> None:
    configure(variant)
    torch._dynamo.reset()
    step = build_optimized_step(OptimizedSpec(size, 512, techniques=BEST), "cuda")
    times = time_steps(step.run, 10, 30, "cuda")
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            step.run()
        torch.cuda.synchronize()
    total, counts = Counter(), Counter()
    for e in prof.events():
        if e.device_type.name == "CUDA":
            total[e.name] += e.device_time / 3e3
            counts[e.name] += 1
    print(f"{size:7s} {variant:10s}: step median {statistics.median(times):7.3f} ms (min {min(times):7.3f}); "
          f"{sum(counts.values()) // 3} kernels, {sum(total.values()):.2f} ms of kernel time", flush=True)
    del step
    gc.collect()
    torch.cuda.empty_cache()


if __name__ == "__main__":
    # the variants differ only in Inductor's options; no cached graph may stand in for another's
    torch._inductor.config.fx_graph_cache = False
    print(torch.__version__, torch.cuda.get_device_name(), "enable_pdl" in dir(torch._inductor.config.triton),
          flush=True)
    for arg in sys.argv[1:]:
        size, _, chosen = arg.partition(":")
        for variant in chosen.split(","):
            measure(size, variant)
