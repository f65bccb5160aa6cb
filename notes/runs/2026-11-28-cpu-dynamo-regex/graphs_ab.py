"""A GPU probe (written on the CPU): the optimised step with each d 64 block
compiled as one graph (as built since 61ebc28) against two (the backward tiles traced with `re`'s cache
empty, as before it), and one graph with Inductor's GEMM templates (max-autotune, epilogues such as
SwiGLU's product and the residual adds fused into the products), in one process with alternating builds
(a hand-run probe, not a result): the step replayed from its graph, median of 30 steps, and the kernel
count and GPU time of one profiled replay.

    PYTHONPATH=src python notes/runs/2026-11-28-cpu-dynamo-regex/graphs_ab.py medium small
    PYTHONPATH=src python notes/runs/2026-11-28-cpu-dynamo-regex/graphs_ab.py medium:gemm,one   # these, once

eagercopy: one graph, with the attention's output gradient left as it comes (a transposed view, which
the kernels' backward copies eagerly), as before dfe06aa (../2026-11-28-cpu-contiguous-grad).

Run on the H100 at 506f754: ../2026-11-28-h100-one-graph.
"""

from __future__ import annotations

import gc
import re
import statistics
import sys
import time

import torch
from torch.profiler import ProfilerActivity, profile

import cs336sys.training.optimized as optimized
from cs336sys.timing import time_steps
from cs336sys.training.optimized import OptimizedSpec, build_optimized_step

TECHNIQUES = ("fused_adamw", "cuda_graph", "flash", "bf16_weights", "adamw_in_backward", "fused_projections",
              "compiled_loss")
UNTRACED, OPTIONS, CONTIGUOUS = optimized.parsed_untraced, dict(optimized.INDUCTOR_OPTIONS), optimized._ContiguousGrad


class AsItComes:  # eagercopy: the output's gradient left as a transposed view, as before dfe06aa
    apply = staticmethod(lambda x: x)


VARIANTS = {  # (the tiles' parse, Inductor's options, the output's gradient)
    "one": (UNTRACED, OPTIONS, CONTIGUOUS),
    "two": (lambda tiles: tiles, OPTIONS, CONTIGUOUS),
    "gemm": (UNTRACED, OPTIONS | {"max_autotune_gemm": True, "max_autotune_gemm_backends": "TRITON,ATEN"},
             CONTIGUOUS),
    "eagercopy": (UNTRACED, OPTIONS, AsItComes),
}


def measure(size: str, variant: str) -> None:
    optimized.parsed_untraced, options, optimized._ContiguousGrad = VARIANTS[variant]
    optimized.INDUCTOR_OPTIONS.clear()
    optimized.INDUCTOR_OPTIONS.update(options)
    torch._dynamo.reset()
    re.purge()  # as a fresh process finds it: the backward tiles' pattern not cached
    start = time.perf_counter()
    step = build_optimized_step(OptimizedSpec(size, 512, techniques=TECHNIQUES), "cuda")
    print(f"{size:7s} {variant:9s}: built in {time.perf_counter() - start:.0f} s", flush=True)
    times = time_steps(step.run, 10, 30, "cuda")
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step.run()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type.name == "CUDA"]
    inductor = sum(e.device_time for e in kernels if e.name.startswith("triton_")) / 1e3
    print(f"{size:7s} {variant:9s}: step median {statistics.median(times):7.3f} ms (min {min(times):7.3f}); "
          f"{len(kernels)} kernels, Inductor's {inductor:.2f} ms", flush=True)
    del step
    gc.collect()
    torch.cuda.empty_cache()


if __name__ == "__main__":
    print(torch.__version__, torch.cuda.get_device_name(), flush=True)
    for arg in sys.argv[1:]:
        size, _, chosen = arg.partition(":")
        for variant in chosen.split(",") if chosen else ("one", "two", "gemm", "one", "two", "gemm"):
            measure(size, variant)
