"""The optimised step's best configuration with, one at a time, the attention output's gradient made
contiguous inside the compiled backward, the final norm + LM head + loss compiled, and Inductor's
coordinate-descent tuning of the compiled functions: per size and variant, the whole step replayed
from its CUDA graph (updates inside the backward; CUDA-event median) and the GPU time by kernel in
three profiled replays. A hand-run probe, not a result.

    PYTHONPATH=src python notes/runs/2026-11-27-h100-loss-and-layout/probe.py SIZE...
"""

from __future__ import annotations

import gc
import statistics
import sys
from collections import Counter

import torch
from torch.profiler import ProfilerActivity, profile

from cs336sys.training import optimized
from cs336sys.training.optimized import OptimizedSpec, build_optimized_step, head_loss, projected_block

BEST = ("fused_adamw", "cuda_graph", "flash", "bf16_weights", "adamw_in_backward", "fused_projections")
VARIANTS = ("strided dO", "contiguous dO", "+ compiled loss", "+ coordinate descent")
CONTIGUOUS = optimized._ContiguousGradient


class _Identity:
    apply = staticmethod(lambda x: x)


def family(name: str) -> str:
    if name.startswith("nvjet") or "gemm" in name or "cutlass" in name:
        return "matmul"
    if name.startswith(("flash_", "backward_kernel", "backward_delta")):
        return "attention"
    if name.startswith("adamw"):
        return "adamw"
    return "inductor" if name.startswith("triton_") else "aten"


def build(size: str, variant: str):
    torch._dynamo.reset()  # every build compiles afresh (no cache limit reached, no reuse across variants)
    optimized._ContiguousGradient = _Identity if variant == "strided dO" else CONTIGUOUS
    techniques = BEST + (("compiled_loss",) if VARIANTS.index(variant) >= 2 else ())
    if variant != "+ coordinate descent":
        return build_optimized_step(OptimizedSpec(size, 512, techniques=techniques), "cuda")
    spec = OptimizedSpec(size, 512, techniques=tuple(t for t in techniques if t != "cuda_graph"))
    step = build_optimized_step(spec, "cuda")
    options = {"coordinate_descent_tuning": True}
    step.block_fn = torch.compile(projected_block(step.model.layers[0]), options=options)
    step.loss_fn = torch.compile(head_loss(step.model.ln_final.eps), options=options)
    step.capture()
    return step


def measure(size: str, variant: str, top: int) -> str:
    step = build(size, variant)
    times = []
    for i in range(25):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step.run()
        end.record()
        torch.cuda.synchronize()
        if i >= 5:
            times.append(start.elapsed_time(end))
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            step.run()
        torch.cuda.synchronize()
    kernels: Counter = Counter()
    for e in prof.events():
        if e.device_type.name == "CUDA":
            kernels[e.name[:100]] += e.device_time / 3e3
    families: Counter = Counter()
    for name, ms in kernels.items():
        families[family(name)] += ms
    loss = step.graph_loss.item()
    del step
    gc.collect()
    torch.cuda.empty_cache()
    return (f"{size} {variant:20s} step {statistics.median(times):.2f} ms (min {min(times):.2f}); kernels "
            + ", ".join(f"{k} {v:.2f}" for k, v in families.most_common()) + f", sum {sum(families.values()):.2f}"
            + f"; loss {loss:.4f}\n" + "".join(f"    {ms:.3f} {name}\n" for name, ms in kernels.most_common(top)))


if __name__ == "__main__":
    print(torch.__version__, torch.cuda.get_device_name(), flush=True)
    for size in sys.argv[1:]:
        for variant in VARIANTS:
            print(measure(size, variant, top=14 if variant in (VARIANTS[0], VARIANTS[-1]) else 6), flush=True)
