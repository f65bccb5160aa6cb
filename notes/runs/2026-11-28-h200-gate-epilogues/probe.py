"""What does the SwiGLU gate in the products' epilogues buy the optimised step? A hand-run GPU probe, not a result.

1. `kernels SIZE...`: at each size's step shapes (2048 rows: batch 4, context 512), the forward's w1/w3
   product and gate, and the backward's product into the gate and its gradients, each as the step computed
   them before (cuBLAS's product, then Inductor's elementwise pass, compiled) and as our kernels with each
   candidate tiling (`gate_products.GateTiles`); do_bench medians (ms).
2. `steps SIZE:ORDER`: the optimised step with every technique up to `backward_kernels` (`base`), and the
   same with each block's SwiGLU through `gate_products.gated_mlp` (`gate`; `gatefwd`, `gatebwd`: one of its
   two kernels, the other pass Inductor's), CUDA graph captured, built alternately in one process; step
   median of 30 (after 10 warm-up steps), min, and kernel count from three profiled steps.

The runs of the README used this file at d228be2, where the gate was the step's `gate_epilogues` option; it
now swaps the step's block for `block_with_gate` itself (the same block).

    PYTHONPATH=src python notes/runs/2026-11-28-h200-gate-epilogues/probe.py kernels small medium
    PYTHONPATH=src python notes/runs/2026-11-28-h200-gate-epilogues/probe.py steps medium:base,gate,base,gate

With KERNEL_LISTS=DIR, `steps` writes each variant's kernels (GPU time by name) to DIR/SIZE_VARIANT_kernels.txt.
"""

from __future__ import annotations

import gc
import os
import statistics
import sys
from collections import Counter
from pathlib import Path

import torch
from torch.nn.functional import silu
from torch.profiler import ProfilerActivity, profile
from triton.testing import do_bench

from cs336sys.sizes import get_size
from cs336sys.timing import time_steps
from cs336sys.training import optimized, step_blocks
from cs336sys.training.optimized import OptimizedSpec, build_optimized_step

sys.path.insert(0, str(Path(__file__).parent))
import gate_products  # noqa: E402  (this run's kernels, beside this file)
from gate_products import GateTiles, _launch_gate_backward, _launch_gate_forward  # noqa: E402

BEST = ("fused_adamw", "cuda_graph", "flash", "bf16_weights", "adamw_in_backward", "fused_projections",
        "compiled_loss", "backward_kernels")
FORWARD = [GateTiles(128, 128, 64, stages=3, warps=8), GateTiles(128, 128, 64, stages=4, warps=8),
           GateTiles(128, 64, 64, stages=4, warps=4), GateTiles(128, 64, 64, stages=4, warps=8),
           GateTiles(64, 128, 64, stages=4, warps=4), GateTiles(128, 128, 64, stages=3, warps=8, specialize=True),
           GateTiles(128, 64, 64, stages=4, warps=4, specialize=True)]
BACKWARD = [GateTiles(128, 256, 64, stages=3, warps=8), GateTiles(128, 128, 64, stages=4, warps=8),
            GateTiles(128, 128, 64, stages=4, warps=4), GateTiles(256, 128, 64, stages=3, warps=8),
            GateTiles(128, 256, 64, stages=4, warps=8), GateTiles(128, 256, 64, stages=3, warps=8, specialize=True),
            GateTiles(128, 128, 64, stages=4, warps=4, specialize=True)]


@torch.compile
def gate(ab: torch.Tensor) -> torch.Tensor:
    a, b = ab.chunk(2, dim=-1)
    return silu(a) * b


@torch.compile
def gate_grads(dg: torch.Tensor, ab: torch.Tensor) -> torch.Tensor:
    a, b = ab.float().chunk(2, dim=-1)
    dg, sig = dg.float(), torch.sigmoid(a)
    return torch.cat((dg * b * sig * (1 + a * (1 - sig)), dg * a * sig), dim=-1).to(ab.dtype)


def kernels(size: str) -> None:
    config = get_size(size)
    rows, d, n = 2048, config.d_model, config.d_ff
    x, dy = (torch.randn(rows, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    w13 = torch.randn(2 * n, d, device="cuda", dtype=torch.bfloat16) / d**0.5
    w2 = torch.randn(d, n, device="cuda", dtype=torch.bfloat16) / n**0.5
    ab = x @ w13.T
    mm_f, gate_f = do_bench(lambda: x @ w13.T), do_bench(lambda: gate(ab))
    mm_b, gate_b = do_bench(lambda: dy @ w2), do_bench(lambda: gate_grads(dy @ w2, ab))
    print(f"{size} (rows {rows}, d {d}, d_ff {n}): forward cuBLAS {mm_f:.4f} + gate {gate_f:.4f} = "
          f"{mm_f + gate_f:.4f} ms; backward cuBLAS {mm_b:.4f}, with the gate's gradients {gate_b:.4f} ms",
          flush=True)
    want_ab, want_g = ab, gate(ab)
    want_dab = gate_grads(dy @ w2, ab)
    for tiles in FORWARD:
        try:
            got_ab, got_g = _launch_gate_forward(x, w13, tiles)
            err = max((got_ab.float() - want_ab.float()).abs().max().item(),
                      (got_g.float() - want_g.float()).abs().max().item())
            print(f"  forward  {tiles}: {do_bench(lambda t=tiles: _launch_gate_forward(x, w13, t)):.4f} ms "
                  f"(max diff {err:.3g})", flush=True)
        except Exception as exc:  # a tiling the compiler or the chip refuses
            print(f"  forward  {tiles}: failed: {type(exc).__name__}: {str(exc)[:200]}", flush=True)
    for tiles in BACKWARD:
        try:
            err = (_launch_gate_backward(dy, w2, ab, tiles).float() - want_dab.float()).abs().max().item()
            print(f"  backward {tiles}: {do_bench(lambda t=tiles: _launch_gate_backward(dy, w2, ab, t)):.4f} ms "
                  f"(max diff {err:.3g})", flush=True)
        except Exception as exc:
            print(f"  backward {tiles}: failed: {type(exc).__name__}: {str(exc)[:200]}", flush=True)


# KERNEL_LISTS=DIR: `steps` also writes each variant's kernels (GPU time by name, three profiled steps) there
KERNEL_LISTS = Path(os.environ["KERNEL_LISTS"]) if os.environ.get("KERNEL_LISTS") else None
LISTED: set[tuple[str, str]] = set()
BUILT = gate_products.gate_forward, gate_products.gate_backward
BUILT_BLOCK = step_blocks.kernel_block


def block_with_gate(block):
    """`step_blocks.kernel_block` with the MLP's products and gate through `gate_products.gated_mlp`."""
    attention, num_heads, eps1, eps2 = block.attn.attention, block.attn.num_heads, block.ln1.eps, block.ln2.eps

    def forward(x, branch, ln1, qkv, output, ln2, w13, w2, cos, sin):
        batch, seq, d = x.shape
        x, h = step_blocks.residual_rms_norm(x, branch, ln1, eps1)
        q, k, v = step_blocks._RotaryHeads.apply((h @ qkv.T).view(batch, seq, 3, num_heads, d // num_heads), cos,
                                                 sin)
        x, h = step_blocks.residual_rms_norm(x, attention(q, k, v).transpose(1, 2).flatten(-2) @ output.T, ln2,
                                             eps2)
        return x, gate_products.gated_mlp(h, w13, w2)

    return forward


def steps(size: str, variant: str) -> None:
    """`base`, `gate`, or `gatefwd` / `gatebwd`: the gate in the forward's (backward's) product only, the other
    pass Inductor's (the module's torch-op reference, compiled into the block's graph)."""
    torch._dynamo.reset()
    gate_products.gate_forward = gate_products.gate_forward_reference if variant == "gatebwd" else BUILT[0]
    gate_products.gate_backward = gate_products.gate_backward_reference if variant == "gatefwd" else BUILT[1]
    optimized.kernel_block = block_with_gate if variant.startswith("gate") else BUILT_BLOCK
    step = build_optimized_step(OptimizedSpec(size, 512, techniques=BEST), "cuda")
    times = time_steps(step.run, 10, 30, "cuda")
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            step.run()
        torch.cuda.synchronize()
    kernels = sum(1 for e in prof.events() if e.device_type.name == "CUDA") // 3
    line = (f"{size:7s} {variant:5s}: step median {statistics.median(times):7.3f} ms (min {min(times):7.3f}); "
            f"{kernels} kernels; tiles {gate_products.FORWARD_TILES} / {gate_products.BACKWARD_TILES}")
    print(line, flush=True)
    if KERNEL_LISTS is not None and (size, variant) not in LISTED:  # each variant's first build: GPU time by kernel
        LISTED.add((size, variant))
        total, counts = Counter(), Counter()
        for e in prof.events():
            if e.device_type.name == "CUDA":
                total[e.name] += e.device_time / 3e3
                counts[e.name] += 1
        with open(KERNEL_LISTS / f"{size}_{variant}_kernels.txt", "w") as f:
            f.write(f"# {line}\n")
            for name, t in total.most_common():
                f.write(f"{t:8.3f} ms  x{counts[name] // 3:4d}  {name[:160]}\n")
    del step
    gc.collect()
    torch.cuda.empty_cache()


if __name__ == "__main__":
    print(torch.__version__, torch.cuda.get_device_name(), flush=True)
    what, *args = sys.argv[1:]
    for arg in args:
        if what == "kernels":
            kernels(arg)
        else:
            size, _, chosen = arg.partition(":")
            for variant in chosen.split(","):
                steps(size, variant)
