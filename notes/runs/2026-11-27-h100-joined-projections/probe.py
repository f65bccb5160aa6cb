"""Why joined projections (`fused_projections`) slow the optimised step at small to large: per size, the
forward+backward with and without them (fused AdamW, flash, bf16 weights; no graph, no updates in the
backward), one pass under the profiler each: kernel time by name, the largest differences, and the
graph-replayed forward+backward's CUDA-event median. A hand-run probe on the GPU host, not a result.

    PYTHONPATH=src python notes/runs/2026-11-27-h100-joined-projections/probe.py small large
"""

from __future__ import annotations

import statistics
import sys
from collections import Counter

import torch
from torch.profiler import ProfilerActivity, profile

from cs336sys.training.optimized import OptimizedSpec, build_optimized_step

BASE = ("fused_adamw", "flash", "bf16_weights")


def kernels(size: str, techniques: tuple[str, ...]) -> Counter:
    step = build_optimized_step(OptimizedSpec(size, 512, techniques=techniques), "cuda")
    for _ in range(3):
        step.run()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step.forward_backward()
        torch.cuda.synchronize()
    by_name: Counter = Counter()
    for e in prof.events():
        if e.device_type.name == "CUDA":
            by_name[e.name[:100]] += e.device_time / 1e3
    del step
    torch.cuda.empty_cache()
    return by_name


def replayed_ms(size: str, techniques: tuple[str, ...]) -> float:
    step = build_optimized_step(OptimizedSpec(size, 512, techniques=techniques + ("cuda_graph",)), "cuda")
    times = []
    for i in range(25):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step.forward_backward()
        end.record()
        torch.cuda.synchronize()
        if i >= 5:
            times.append(start.elapsed_time(end))
    del step
    torch.cuda.empty_cache()
    return statistics.median(times)


def main(sizes: list[str]) -> None:
    joined = BASE + ("fused_projections",)
    for size in sizes:
        a, b = kernels(size, BASE), kernels(size, joined)
        print(f"== {size}: kernels {sum(a.values()):.2f} ms separate, {sum(b.values()):.2f} ms joined; "
              f"replayed fwd+bwd {replayed_ms(size, BASE):.2f} ms separate, {replayed_ms(size, joined):.2f} joined")
        for label, c in (("separate", a), ("joined", b)):
            families: Counter = Counter()
            for name, ms in c.items():
                families["matmul" if name.startswith(("nvjet", "cutlass", "sm90")) else
                         "triton (Inductor)" if name.startswith("triton_") else "other"] += ms
            print(f"  {label}: " + ", ".join(f"{k} {v:.2f}" for k, v in families.most_common()))
            for name, ms in c.most_common(12):
                print(f"    {ms:.3f} ms  {name}")
        diff = Counter({k: b.get(k, 0.0) - a.get(k, 0.0) for k in set(a) | set(b)})
        for name, ms in sorted(diff.items(), key=lambda kv: -abs(kv[1]))[:14]:
            print(f"  {ms:+.3f} ms  (separate {a.get(name, 0.0):.3f}, joined {b.get(name, 0.0):.3f})  {name}")


if __name__ == "__main__":
    main(sys.argv[1:] or ["small", "large"])
