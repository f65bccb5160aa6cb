"""Joined projections with the backward's concatenation of q, k and v's gradients (and of w1's and w3's)
written slice by slice instead of by one gathering kernel: per variant, the `large` forward+backward
(fused AdamW, flash, bf16 weights; no updates in the backward) replayed from a CUDA graph (CUDA-event
median) and the Inductor kernels' time in one profiled pass. A hand-run probe, not a result.

    PYTHONPATH=src python notes/runs/2026-11-27-h100-joined-projections/variants.py large [VARIANT...]

- separate: `bf16_weights` alone (the model's block, three and two products);
- joined: `fused_projections` as built (`projected_block`, Inductor's defaults);
- joined, cat by slices: the same function compiled with Inductor's pointwise concatenation off
  (`max_pointwise_cat_inputs` 0), so each gradient's producer writes its own slice;
- "slices, global": that setting patched for the whole process before compiling;
- joined, cat by slices, RoPE without stack: also the rotation written as x * cos + swap(x) * sin
  (pairs swapped and signed by a flip, no `torch.stack`, which that setting would also realise slice
  by slice).
"""

from __future__ import annotations

import statistics
import sys
from collections import Counter

import torch
from torch import Tensor
from torch.profiler import ProfilerActivity, profile

from cs336sys.leaderboard.fused_ops import rms_norm_reference
from cs336sys.model import silu
from cs336sys.training.optimized import OptimizedSpec, build_optimized_step, projected_block

BASE = ("fused_adamw", "flash", "bf16_weights")


def slices_options() -> dict:
    keys = ("max_pointwise_cat_inputs", "max_complex_pointwise_cat_inputs")
    return {k: 0 for k in keys if hasattr(torch._inductor.config, k)}


def swap_rotary(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    cos2 = cos.to(x.dtype).repeat_interleave(2, dim=-1)
    sin2 = sin.to(x.dtype).repeat_interleave(2, dim=-1)
    sign = torch.tensor([-1.0, 1.0], dtype=x.dtype, device=x.device)
    swapped = (x.unflatten(-1, (-1, 2)).flip(-1) * sign).flatten(-2)
    return x * cos2 + swapped * sin2


def projected_block_swap(block):
    attention, num_heads, eps1, eps2 = block.attn.attention, block.attn.num_heads, block.ln1.eps, block.ln2.eps

    def forward(x, ln1, qkv, output, ln2, w13, w2, cos, sin):
        *lead, seq, d = x.shape

        def heads(t):
            return t.view(*lead, seq, num_heads, d // num_heads).transpose(-3, -2)

        q, k, v = (rms_norm_reference(x, ln1, eps1) @ qkv.T).split(d, dim=-1)
        out = attention(swap_rotary(heads(q), cos, sin), swap_rotary(heads(k), cos, sin), heads(v))
        x = x + out.transpose(-3, -2).flatten(-2) @ output.T
        a, b = (rms_norm_reference(x, ln2, eps2) @ w13.T).chunk(2, dim=-1)
        return x + (silu(a) * b) @ w2.T

    return forward


def build(size: str, variant: str):
    techniques = BASE if variant == "separate" else BASE + ("fused_projections",)
    step = build_optimized_step(OptimizedSpec(size, 512, techniques=techniques), "cuda")
    if variant == "slices":
        step.block_fn = torch.compile(projected_block(step.model.layers[0]), options=slices_options())
    elif variant == "slices, global":  # the setting patched for the whole process, not per compile
        torch._inductor.config.max_pointwise_cat_inputs = 0
        step.block_fn = torch.compile(projected_block(step.model.layers[0]))
    elif variant == "slices+swap":
        step.block_fn = torch.compile(projected_block_swap(step.model.layers[0]), options=slices_options())
    return step


def measure(size: str, variant: str) -> str:
    step = build(size, variant)
    for _ in range(3):
        step.run()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step.forward_backward()
        torch.cuda.synchronize()
    kinds: Counter = Counter()
    tritons: Counter = Counter()
    for e in prof.events():
        if e.device_type.name == "CUDA" and e.name.startswith("triton_"):
            tritons[e.name[:90]] += e.device_time / 1e3
        if e.device_type.name == "CUDA":
            kind = "triton" if e.name.startswith("triton_") else "matmul" if e.name.startswith("nvjet") else "other"
            kinds[kind] += e.device_time / 1e3
    step.zero_grad()
    step.capture()
    times = []
    for i in range(25):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step.forward_backward()
        end.record()
        torch.cuda.synchronize()
        if i >= 5:
            times.append(start.elapsed_time(end))
    loss = step.graph_loss.item()
    del step
    torch.cuda.empty_cache()
    return (f"{size} {variant:12s} replayed fwd+bwd {statistics.median(times):.2f} ms; one pass: "
            + ", ".join(f"{k} {v:.2f}" for k, v in kinds.most_common()) + f"; loss {loss:.4f}\n"
            + "".join(f"    {ms:.3f} {name}\n" for name, ms in tritons.most_common(5)))


if __name__ == "__main__":
    print("options", slices_options())
    for size in sys.argv[1:2] or ["large"]:
        variants = sys.argv[2:] or ["separate", "joined", "slices", "slices+swap", "separate"]
        for variant in variants:
            print(measure(size, variant), flush=True)
