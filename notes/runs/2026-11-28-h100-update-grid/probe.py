"""The optimised step with the updates' kernel on a capped grid (a hand-run probe, not a result).

Beside the backward, the AdamW updates (one `adamw_kernel` per parameter, one 1024-element block per
program, as many programs as blocks) slow the attention's kernels to twice their time alone
(notes/runs/2026-11-27-h100-kernel-lists). Here the same update runs with at most CAP programs, each
looping over blocks, so that the updates hold fewer SMs and less bandwidth at a time while the
backward runs, at the price of a longer tail. The kernel is this file's (the same math as
`adamw_kernel`, bitwise: checked against it first); the step's `fused_adamw_` is replaced before the
step is built. Per size and cap: the step replayed from its graph (median of 30, synchronised host
clock) and, over three profiled replays, the GPU time by kernel family.

    PYTHONPATH=src python notes/runs/2026-11-28-h100-update-grid/probe.py medium large --caps 0 264 132 66 0
(cap 0: the project's kernel as it is; --backward kv32x64/q64x32/w4/s3/split: the step with other d-64
backward tiles, here the two launches whose dQ programs compute D, instead of D's own kernel)
"""

from __future__ import annotations

import argparse
import gc
import statistics
from collections import Counter

import torch
import triton
import triton.language as tl
from torch.profiler import ProfilerActivity, profile

import cs336sys.training.optimized as optimized
from cs336sys.leaderboard import adamw
from cs336sys.leaderboard.adamw import _round_to_bf16
from cs336sys.timing import time_steps
from cs336sys.training.optimized import OptimizedSpec, build_optimized_step

TECHNIQUES = ("fused_adamw", "cuda_graph", "flash", "bf16_weights", "adamw_in_backward", "fused_projections",
              "compiled_loss")
ORIGINAL = adamw.fused_adamw_
STEP_TILES_64 = optimized.STEP_TILES[64]


@triton.jit
def capped_kernel(P, G, M, V, OUT, n, beta1, one_minus_beta1, beta2, one_minus_beta2, step_size, eps, decay,
                  HAS_OUT: tl.constexpr, OUT_BF16: tl.constexpr, BLOCK: tl.constexpr,
                  STEP_SIZE_IN_MEMORY: tl.constexpr):
    if STEP_SIZE_IN_MEMORY:
        step_size = tl.load(step_size)
    for b in range(tl.program_id(0), tl.cdiv(n, BLOCK), tl.num_programs(0)):
        offs = b * BLOCK + tl.arange(0, BLOCK)  # (int32: every parameter here has < 2**31 elements)
        mask = offs < n
        p = tl.load(P + offs, mask=mask, other=0.0).to(tl.float32)
        g = tl.load(G + offs, mask=mask, other=0.0).to(tl.float32)
        m = tl.load(M + offs, mask=mask, other=0.0).to(tl.float32)
        v = tl.load(V + offs, mask=mask, other=0.0).to(tl.float32)
        m = m * beta1 + one_minus_beta1 * g
        v = v * beta2 + one_minus_beta2 * (g * g)
        p = p - step_size * tl.div_rn(m, tl.sqrt_rn(v) + eps)
        p = p * decay
        tl.store(P + offs, p.to(P.dtype.element_ty), mask=mask)
        tl.store(M + offs, m.to(M.dtype.element_ty), mask=mask)
        tl.store(V + offs, v.to(V.dtype.element_ty), mask=mask)
        if HAS_OUT:
            if OUT_BF16:
                tl.store(OUT + offs, _round_to_bf16(p), mask=mask)
            else:
                tl.store(OUT + offs, p.to(OUT.dtype.element_ty), mask=mask)


def capped(cap: int):
    def fused(param, grad, exp_avg, exp_avg_sq, *, step_size, lr, eps, weight_decay, beta1, beta2, out_lowp=None):
        n = param.numel()
        in_memory = isinstance(step_size, torch.Tensor)
        grid = (min(triton.cdiv(n, adamw.BLOCK), cap),)
        capped_kernel[grid](param, grad, exp_avg, exp_avg_sq, out_lowp if out_lowp is not None else param, n,
                            beta1, 1.0 - beta1, beta2, 1.0 - beta2, step_size, eps, 1.0 - lr * weight_decay,
                            HAS_OUT=out_lowp is not None,
                            OUT_BF16=out_lowp is not None and out_lowp.dtype == torch.bfloat16, BLOCK=adamw.BLOCK,
                            STEP_SIZE_IN_MEMORY=in_memory)
    return fused


def check(cap: int) -> None:
    """The capped kernel leaves p, m, v and the bf16 copy bitwise as the project's does."""
    g = torch.Generator("cuda").manual_seed(0)
    n = 3 * 1024 * 1000 + 17
    ref = [torch.randn(n, device="cuda", generator=g) for _ in range(3)]
    ref[2] = ref[2].abs()
    grad = torch.randn(n, device="cuda", generator=g).bfloat16()
    ours = [t.clone() for t in ref]
    outs = [torch.empty(n, device="cuda", dtype=torch.bfloat16) for _ in range(2)]
    kw = dict(step_size=torch.tensor([1e-3], device="cuda"), lr=1e-3, eps=1e-8, weight_decay=0.1, beta1=0.9,
              beta2=0.95)
    ORIGINAL(*ref[:1], grad, *ref[1:], out_lowp=outs[0], **kw)
    capped(cap)(*ours[:1], grad, *ours[1:], out_lowp=outs[1], **kw)
    same = all(torch.equal(a, b) for a, b in zip(ref + outs[:1], ours + outs[1:], strict=True))
    assert same, f"cap {cap}: not bitwise"


def family(name: str) -> str:
    if name.startswith("nvjet") or "gemm" in name or "cutlass" in name:
        return "matmul"
    if name.startswith(("flash_", "backward_kernel", "backward_delta")):
        return "attention"
    if name.startswith(("adamw", "capped")):
        return "adamw"
    return "inductor" if name.startswith("triton_") else "aten"


def measure(size: str, cap: int, backward: str | None = None) -> None:
    optimized.fused_adamw_ = capped(cap) if cap else ORIGINAL
    optimized.STEP_TILES[64] = (STEP_TILES_64[0], backward or STEP_TILES_64[1])
    torch._dynamo.reset()
    step = build_optimized_step(OptimizedSpec(size, 512, techniques=TECHNIQUES), "cuda")
    times = time_steps(step.run, 10, 30, "cuda")
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            step.run()
        torch.cuda.synchronize()
    families: Counter = Counter()
    for e in prof.events():
        if e.device_type.name == "CUDA":
            families[family(e.name)] += e.device_time / 3e3
    print(f"{size:7s} cap {cap or 'none':>5} {backward or 'step tiles'}: "
          f"step median {statistics.median(times):7.3f} ms "
          f"(min {min(times):7.3f}); kernels " + ", ".join(f"{f} {t:.2f}" for f, t in families.most_common()),
          flush=True)
    del step
    gc.collect()
    torch.cuda.empty_cache()


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("sizes", nargs="+")
    parser.add_argument("--caps", nargs="+", type=int, default=[0, 264, 132, 66, 0])
    parser.add_argument("--backward", nargs="*", default=[], help="d-64 backward tiles to try at cap 0")
    args = parser.parse_args()
    print(torch.__version__, triton.__version__, torch.cuda.get_device_name(), flush=True)
    for cap in set(args.caps) - {0}:
        check(cap)
    print("capped kernel bitwise as adamw_kernel at caps", sorted(set(args.caps) - {0}), flush=True)
    for size in args.sizes:
        for cap in args.caps:
            measure(size, cap)
        for tiles in args.backward:
            measure(size, 0, tiles)
