"""The "2.7B" step with its padded heads made in one pass before the split (`projected_block` as in
padded_split.patch) against the block that let the attention pad each of q, k and v (a hand-run probe,
not a result). Run with the patch applied:

    PYTHONPATH=src python notes/runs/2026-11-27-h100-padded-split/probe.py [SIZE [CONFIGURATION]]

Per variant, in A B A B order: build the configuration (default: "2.7B" up to the compiled loss), the
first step's loss (the same weights and batch in both), then the step replayed from its graph
(median of 30 by the host clock, synchronised), then the GPU time of the Inductor kernels over three
profiled replays.
"""

from __future__ import annotations

import gc
import statistics
import sys
from collections import Counter

import torch
from torch import Tensor
from torch.profiler import ProfilerActivity, profile

from cs336sys.model import silu
from cs336sys.timing import time_steps
from cs336sys.training import optimized
from cs336sys.training.optimized import OptimizedSpec, build_optimized_step

SERIES = ("fused_adamw", "cuda_graph", "flash", "bf16_weights", "adamw_in_backward", "fused_projections",
          "compiled_loss")
PATCHED = optimized.projected_block


def unpatched_block(block):
    """`projected_block` before the patch (2a2e9cd): the attention pads each of q, k and v."""
    attention, num_heads, eps1, eps2 = block.attn.attention, block.attn.num_heads, block.ln1.eps, block.ln2.eps

    def forward(x: Tensor, ln1: Tensor, qkv: Tensor, output: Tensor, ln2: Tensor, w13: Tensor, w2: Tensor,
                cos: Tensor, sin: Tensor) -> Tensor:
        from cs336sys.leaderboard.fused_ops import rms_norm_reference, rotary_reference

        batch, seq, d = x.shape
        projected = (rms_norm_reference(x, ln1, eps1) @ qkv.T).view(batch, seq, 3, num_heads, d // num_heads)
        q, k, v = rotary_reference(projected, cos, sin).permute(2, 0, 3, 1, 4).contiguous().unbind(0)
        x = x + attention(q, k, v).transpose(1, 2).flatten(-2) @ output.T
        a, b = (rms_norm_reference(x, ln2, eps2) @ w13.T).chunk(2, dim=-1)
        return x + (silu(a) * b) @ w2.T

    return forward


def measure(size: str, last: str, variant: str) -> float:
    torch._dynamo.reset()
    optimized.projected_block = PATCHED if variant == "one pass" else unpatched_block
    step = build_optimized_step(OptimizedSpec(size, 512, techniques=SERIES[: SERIES.index(last) + 1]), "cuda")
    loss = step.run().item()
    ms = statistics.median(time_steps(step.run, 10, 30, "cuda"))
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            step.run()
        torch.cuda.synchronize()
    inductor: Counter = Counter()
    for e in prof.events():
        if e.device_type.name == "CUDA" and e.name.startswith("triton_"):
            inductor[e.name[:100]] += e.device_time / 3e3
    print(f"{size} up to {last}, {variant}: first loss {loss:.6f}, step {ms:.2f} ms, Inductor kernels "
          f"{sum(inductor.values()):.2f} ms", flush=True)
    for name, t in inductor.most_common(6):
        print(f"    {t:6.3f} ms  {name}", flush=True)
    del step
    gc.collect()
    torch.cuda.empty_cache()
    return ms


if __name__ == "__main__":
    size, last = (sys.argv[1:] + ["2.7B", "compiled_loss"][len(sys.argv) - 1:])[:2]
    print(torch.__version__, torch.cuda.get_device_name(), flush=True)
    times: dict[str, list[float]] = {"split then padded": [], "one pass": []}
    for variant in ("split then padded", "one pass") * 2:
        times[variant].append(measure(size, last, variant))
    print(", ".join(f"{v}: {statistics.fmean(t):.2f} ms" for v, t in times.items()), flush=True)
