"""The updates beside the backward with other launch shapes of the fused AdamW kernel (a hand-run GPU
probe, not a result): BLOCK elements a program and num_warps, against the project's 1024 and 4 (`as_built`),
in one process with alternating builds; every technique up to `compiled_loss`, the step replayed from its
graph, median of 30 steps. The kernel is the project's `adamw_kernel`, only launched on another grid; its
math is elementwise, so every shape computes the same bits.

    PYTHONPATH=src python notes/runs/2026-11-28-h100-contiguous-grad/adamw_ab.py medium:as_built,2048w4,4096w8
"""

from __future__ import annotations

import gc
import statistics
import sys

import torch
import triton

import cs336sys.training.optimized as optimized
from cs336sys.leaderboard import adamw
from cs336sys.timing import time_steps
from cs336sys.training.optimized import OptimizedSpec, build_optimized_step

TECHNIQUES = ("fused_adamw", "cuda_graph", "flash", "bf16_weights", "adamw_in_backward", "fused_projections",
              "compiled_loss")
AS_BUILT = optimized.fused_adamw_


def launch_shape(block: int, warps: int):
    def update(param, grad, exp_avg, exp_avg_sq, *, step_size, lr, eps, weight_decay, beta1, beta2, out_lowp=None):
        n = param.numel()
        adamw.adamw_kernel[(triton.cdiv(n, block),)](
            param, grad, exp_avg, exp_avg_sq, out_lowp if out_lowp is not None else param, n, beta1, 1.0 - beta1,
            beta2, 1.0 - beta2, step_size, eps, 1.0 - lr * weight_decay, HAS_OUT=out_lowp is not None,
            OUT_BF16=out_lowp is not None and out_lowp.dtype == torch.bfloat16, BLOCK=block,
            STEP_SIZE_IN_MEMORY=isinstance(step_size, torch.Tensor), num_warps=warps)
    return update


def measure(size: str, variant: str) -> None:
    if variant == "as_built":
        optimized.fused_adamw_ = AS_BUILT
    else:
        block, warps = variant.split("w")
        optimized.fused_adamw_ = launch_shape(int(block), int(warps))
    torch._dynamo.reset()
    step = build_optimized_step(OptimizedSpec(size, 512, techniques=TECHNIQUES), "cuda")
    times = time_steps(step.run, 10, 30, "cuda")
    print(f"{size:7s} {variant:9s}: step median {statistics.median(times):7.3f} ms (min {min(times):7.3f})",
          flush=True)
    del step
    gc.collect()
    torch.cuda.empty_cache()


if __name__ == "__main__":
    print(torch.__version__, torch.cuda.get_device_name(), flush=True)
    for arg in sys.argv[1:]:
        size, _, chosen = arg.partition(":")
        for variant in chosen.split(","):
            measure(size, variant)
