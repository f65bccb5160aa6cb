"""The optimised step's best configuration with the compiled loss, then Inductor's coordinate-descent
tuning of the compiled functions, then the two streams at different priorities (the updates' side
stream first, or the backward's stream first): per size and variant, the whole step replayed from its
CUDA graph (CUDA-event median of 40) and the GPU time by kernel family in three profiled replays.
A hand-run probe, not a result.

    PYTHONPATH=src python notes/runs/2026-11-27-h100-loss-and-layout/priority.py SIZE...
"""

from __future__ import annotations

import gc
import statistics
import sys
from collections import Counter

import torch
from torch.profiler import ProfilerActivity, profile

from cs336sys.training.optimized import OptimizedSpec, build_optimized_step, head_loss, projected_block

BEST = ("fused_adamw", "flash", "bf16_weights", "adamw_in_backward", "fused_projections", "compiled_loss")
VARIANTS = ("compiled loss", "+ coordinate descent", "+ cd, updates first", "+ cd, backward first")


def family(name: str) -> str:
    if name.startswith("nvjet") or "gemm" in name or "cutlass" in name:
        return "matmul"
    if name.startswith(("flash_", "backward_kernel", "backward_delta")):
        return "attention"
    if name.startswith("adamw"):
        return "adamw"
    return "inductor" if name.startswith("triton_") else "aten"


def capture_on(step, stream: torch.cuda.Stream, warmup: int = 3) -> None:
    """`OptimizedStep.capture`, capturing on `stream` (a priority of its own) instead of a default one."""
    step.in_backward.armed = False
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(warmup):
            step._forward_backward()
            step._clear_grads()
    torch.cuda.current_stream().wait_stream(stream)
    step._clear_grads()
    step.in_backward.armed = True
    step.graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(step.graph, stream=stream):
        step.graph_loss = step._forward_backward()


def build(size: str, variant: str):
    torch._dynamo.reset()
    if variant == "compiled loss":
        return build_optimized_step(OptimizedSpec(size, 512, techniques=BEST + ("cuda_graph",)), "cuda")
    step = build_optimized_step(OptimizedSpec(size, 512, techniques=BEST), "cuda")
    options = {"coordinate_descent_tuning": True}
    step.block_fn = torch.compile(projected_block(step.model.layers[0]), options=options)
    step.loss_fn = torch.compile(head_loss(step.model.ln_final.eps), options=options)
    low, high = torch.cuda.Stream(priority=0), torch.cuda.Stream(priority=-1)
    if variant == "+ cd, updates first":
        step.in_backward.side = high
        capture_on(step, low)
    elif variant == "+ cd, backward first":
        step.in_backward.side = low
        capture_on(step, high)
    else:
        step.capture()
    return step


def measure(size: str, variant: str) -> str:
    step = build(size, variant)
    times = []
    for i in range(50):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step.run()
        end.record()
        torch.cuda.synchronize()
        if i >= 10:
            times.append(start.elapsed_time(end))
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            step.run()
        torch.cuda.synchronize()
    families: Counter = Counter()
    for e in prof.events():
        if e.device_type.name == "CUDA":
            families[family(e.name)] += e.device_time / 3e3
    loss = step.graph_loss.item()
    del step
    gc.collect()
    torch.cuda.empty_cache()
    return (f"{size} {variant:22s} step {statistics.median(times):.2f} ms (min {min(times):.2f}); kernels "
            + ", ".join(f"{k} {v:.2f}" for k, v in families.most_common()) + f", sum {sum(families.values()):.2f}"
            + f"; loss {loss:.4f}")


if __name__ == "__main__":
    print(torch.__version__, torch.cuda.get_device_name(), getattr(torch.cuda.Stream, "priority_range", lambda: None)(),
          flush=True)
    for size in sys.argv[1:]:
        for variant in VARIANTS:
            print(measure(size, variant), flush=True)
