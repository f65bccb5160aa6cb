"""What would the step gain without the attention's two transposing copies, or without the norms' weight
sums? Upper bounds, from steps that skip the work and so compute wrong values (a hand-run GPU probe, not
a result; no numbers it prints are losses or gradients of the model).

The optimised step with every technique up to `backward_kernels`, the CUDA graph captured. Variants:
`base` as built; `nocopy` the attention's output read as (batch, seq, d) where it is (batch, heads, seq,
d_head), so that neither its forward copy into the projection's layout nor the backward's copy of its
gradient back is made (what an attention that wrote O and read dO in the projection's layout would
save); `nosum` each norm's weight gradient taken as its first program's partial, not their sum (what
summing the partials inside the norm's kernel would save at most); `both`. Step median of 30 replays,
alternating builds in one process; three profiled replays give each variant's kernel count.

    PYTHONPATH=src python notes/runs/2026-11-28-h200-copy-bounds/probe.py medium:base,nocopy,nosum,both,base
"""

from __future__ import annotations

import gc
import statistics
import sys

import torch
from torch.profiler import ProfilerActivity, profile

from cs336sys.model import silu
from cs336sys.timing import time_steps
from cs336sys.training import optimized, step_blocks, step_kernels
from cs336sys.training.optimized import OptimizedSpec, build_optimized_step

BEST = ("fused_adamw", "cuda_graph", "flash", "bf16_weights", "adamw_in_backward", "fused_projections",
        "compiled_loss", "backward_kernels")
BUILT_BLOCK, BUILT_NORM = step_blocks.kernel_block, step_kernels.residual_rms_norm_backward


def block_without_copies(block):
    """`kernel_block` with the attention's output reshaped, not transposed (wrong values, no copies)."""
    attention, num_heads, eps1, eps2 = block.attn.attention, block.attn.num_heads, block.ln1.eps, block.ln2.eps

    def forward(x, branch, ln1, qkv, output, ln2, w13, w2, cos, sin):
        batch, seq, d = x.shape
        x, h = step_blocks.residual_rms_norm(x, branch, ln1, eps1)
        q, k, v = step_blocks._RotaryHeads.apply((h @ qkv.T).view(batch, seq, 3, num_heads, d // num_heads), cos,
                                                 sin)
        x, h = step_blocks.residual_rms_norm(x, attention(q, k, v).reshape(batch, seq, d) @ output.T, ln2, eps2)
        a, b = (h @ w13.T).chunk(2, dim=-1)
        return x, (silu(a) * b) @ w2.T

    return forward


def norm_without_sum(dh, x, weight, rstd, g):
    launch = (step_kernels._residual_rms_norm_backward_op if torch.compiler.is_compiling()
              else step_kernels._launch_residual_rms_norm_backward)
    dx, dx_low, partial = launch(dh, x, weight, rstd, g)
    return dx, dx_low, partial[0]


def measure(size: str, variant: str) -> None:
    optimized.kernel_block = block_without_copies if variant in ("nocopy", "both") else BUILT_BLOCK
    step_kernels.residual_rms_norm_backward = norm_without_sum if variant in ("nosum", "both") else BUILT_NORM
    torch._dynamo.reset()
    step = build_optimized_step(OptimizedSpec(size, 512, techniques=BEST), "cuda")
    times = time_steps(step.run, 10, 30, "cuda")
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            step.run()
        torch.cuda.synchronize()
    kernels = sum(1 for e in prof.events() if e.device_type.name == "CUDA") // 3
    print(f"{size:7s} {variant:8s}: step median {statistics.median(times):7.3f} ms (min {min(times):7.3f}); "
          f"{kernels} kernels", flush=True)
    del step
    gc.collect()
    torch.cuda.empty_cache()


if __name__ == "__main__":
    print(torch.__version__, torch.cuda.get_device_name(), flush=True)
    for arg in sys.argv[1:]:
        size, _, chosen = arg.partition(":")
        for variant in chosen.split(","):
            measure(size, variant)
