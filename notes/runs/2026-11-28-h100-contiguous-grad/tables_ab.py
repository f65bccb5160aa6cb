"""The optimised step with the rotary tables cast to bf16 once (as built) against the fp32 tables every
block cast again (as before), in one process with alternating builds (a hand-run GPU probe, not a
result): every technique up to `compiled_loss`, the graph captured after the tables are chosen; the
step replayed from its graph, median of 30 steps, and the kernel count of one profiled replay.

    PYTHONPATH=src python notes/runs/2026-11-28-h100-contiguous-grad/tables_ab.py medium:bf16,fp32,bf16,fp32
"""

from __future__ import annotations

import gc
import statistics
import sys

import torch
from torch.profiler import ProfilerActivity, profile

from cs336sys.timing import time_steps
from cs336sys.training.optimized import OptimizedSpec, build_optimized_step, joined_rotary_tables

TECHNIQUES = ("fused_adamw", "flash", "bf16_weights", "adamw_in_backward", "fused_projections", "compiled_loss")


def measure(size: str, variant: str) -> None:
    torch._dynamo.reset()
    step = build_optimized_step(OptimizedSpec(size, 512, techniques=TECHNIQUES), "cuda")
    if variant == "fp32":
        rope = step.model.layers[0].attn.rope
        step.rotary_tables = joined_rotary_tables(rope.cos[:512], rope.sin[:512])
    step.capture()  # (cuda_graph, as the series adds it)
    times = time_steps(step.run, 10, 30, "cuda")
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step.run()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type.name == "CUDA"]
    print(f"{size:7s} {variant:5s}: step median {statistics.median(times):7.3f} ms (min {min(times):7.3f}); "
          f"{len(kernels)} kernels, {sum(e.device_time for e in kernels) / 1e3:.2f} ms of kernel time", flush=True)
    del step
    gc.collect()
    torch.cuda.empty_cache()


if __name__ == "__main__":
    print(torch.__version__, torch.cuda.get_device_name(), flush=True)
    for arg in sys.argv[1:]:
        size, _, chosen = arg.partition(":")
        for variant in chosen.split(",") if chosen else ("bf16", "fp32", "bf16", "fp32"):
            measure(size, variant)
