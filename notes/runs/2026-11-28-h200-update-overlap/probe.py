"""How much of the AdamW updates can hide under the backward (a hand-run GPU probe, not a result).

The optimised step with every technique up to `backward_kernels`, the CUDA graph captured, the updates
inside the backward on their side stream (`adamw_in_backward`). Each variant replaces the in-backward
update's launch: `base` the fused AdamW kernel as built (one program per 1024 elements), `cN-wW-bB` a
persistent form of the same update with at most N programs of W warps, each looping over tiles of B
elements, so that the updates hold at most N program slots while the backward's products run beside them;
`solo` leaves the updates after the backward (no `adamw_in_backward`). Each persistent form is first
checked bitwise against the built kernel on random tensors. Step median of 30 replays, one process,
alternating builds; three profiled replays give the kernel list of each variant's first build.

    PYTHONPATH=src python notes/runs/2026-11-28-h200-update-overlap/probe.py OUTDIR medium:base,c32-w4-b1024,base
"""

from __future__ import annotations

import gc
import statistics
import sys
from collections import Counter
from pathlib import Path

import torch
import triton
import triton.language as tl
from torch.profiler import ProfilerActivity, profile

from cs336sys.leaderboard import adamw
from cs336sys.timing import time_steps
from cs336sys.training import optimized
from cs336sys.training.optimized import OptimizedSpec, build_optimized_step

BEST = ("fused_adamw", "cuda_graph", "flash", "bf16_weights", "adamw_in_backward", "fused_projections",
        "compiled_loss", "backward_kernels")
BUILT = optimized.fused_adamw_


@triton.jit
def persistent_adamw_kernel(P, G, M, V, OUT, n, beta1, one_minus_beta1, beta2, one_minus_beta2, step_size, eps,
                            decay, HAS_OUT: tl.constexpr, OUT_BF16: tl.constexpr, BLOCK: tl.constexpr,
                            STEP_SIZE_IN_MEMORY: tl.constexpr):
    if STEP_SIZE_IN_MEMORY:
        step_size = tl.load(step_size)
    first = tl.program_id(0).to(tl.int64) * BLOCK
    stride = tl.num_programs(0).to(tl.int64) * BLOCK
    for start in range(first, n, stride):
        offs = start + tl.arange(0, BLOCK)
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
                tl.store(OUT + offs, adamw._round_to_bf16(p), mask=mask)
            else:
                tl.store(OUT + offs, p.to(OUT.dtype.element_ty), mask=mask)


def persistent(cap: int, warps: int, block: int):
    def update(param, grad, exp_avg, exp_avg_sq, *, step_size, lr, eps, weight_decay, beta1, beta2, out_lowp=None):
        n = param.numel()
        in_memory = isinstance(step_size, torch.Tensor)
        persistent_adamw_kernel[(min(triton.cdiv(n, block), cap),)](
            param, grad, exp_avg, exp_avg_sq, out_lowp if out_lowp is not None else param, n,
            beta1, 1.0 - beta1, beta2, 1.0 - beta2, step_size, eps, 1.0 - lr * weight_decay,
            HAS_OUT=out_lowp is not None, OUT_BF16=out_lowp is not None and out_lowp.dtype == torch.bfloat16,
            BLOCK=block, STEP_SIZE_IN_MEMORY=in_memory, num_warps=warps)
    return update


def check(update) -> None:
    n = 3 * 1024 * 1024 + 77
    base = [torch.randn(n, device="cuda"), torch.randn(n, device="cuda", dtype=torch.bfloat16),
            torch.randn(n, device="cuda"), torch.rand(n, device="cuda")]
    outs = []
    for fn in (BUILT, update):
        p, g, m, v = (t.clone() for t in base)
        low = torch.empty(n, device="cuda", dtype=torch.bfloat16)
        fn(p, g, m, v, step_size=torch.tensor([1e-3], device="cuda"), lr=1e-3, eps=1e-8, weight_decay=0.1,
           beta1=0.9, beta2=0.95, out_lowp=low)
        outs.append((p, m, v, low))
    for a, b in zip(*outs, strict=True):
        assert torch.equal(a, b), "persistent update differs from the built kernel"


def measure(out: Path, size: str, variant: str, listed: set[str]) -> None:
    techniques = BEST
    optimized.fused_adamw_ = BUILT
    if variant == "solo":
        techniques = tuple(t for t in BEST if t != "adamw_in_backward")
    elif variant != "base":
        knobs = {o[0]: int(o[1:]) for o in variant.split("-")}
        update = persistent(knobs["c"], knobs.get("w", 4), knobs.get("b", 1024))
        check(update)
        optimized.fused_adamw_ = update
    torch._dynamo.reset()
    step = build_optimized_step(OptimizedSpec(size, 512, techniques=techniques), "cuda")
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
    line = (f"{size:7s} {variant:16s}: step median {statistics.median(times):7.3f} ms (min {min(times):7.3f}); "
            f"{sum(counts.values()) // 3} kernels, {sum(total.values()):.2f} ms of kernel time")
    print(line, flush=True)
    if variant not in listed:
        listed.add(variant)
        with open(out / f"{size}_{variant}_kernels.txt", "w") as f:
            f.write(f"# {line}\n")
            for kernel, t in total.most_common(25):
                f.write(f"{t:8.3f} ms  x{counts[kernel] // 3:4d}  {kernel[:160]}\n")
    del step
    gc.collect()
    torch.cuda.empty_cache()


if __name__ == "__main__":
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    print(torch.__version__, torch.cuda.get_device_name(), triton.__version__, flush=True)
    for arg in sys.argv[2:]:
        size, _, chosen = arg.partition(":")
        listed: set[str] = set()
        for variant in chosen.split(","):
            measure(out, size, variant, listed)
