"""The optimised step with `backward_kernels` against without, in one process with alternating builds (a
hand-run GPU probe, not a result): every technique up to `compiled_loss` (+ `backward_kernels`), the CUDA
graph captured; the step replayed from its graph, median of 30 steps, then three profiled replays whose
kernels (GPU time by name) go to OUTDIR/SIZE_VARIANT_kernels.txt for each variant's first build.
A variant is `with` or `without`, then options: `-tN` the norm kernel's tile of N elements, `-pN` its programs
an SM, `-wN` its warps, `-solo` the updates after the backward (no `adamw_in_backward`: each kernel's time
with nothing beside it).

    PYTHONPATH=src python notes/runs/2026-11-28-h100-backward-kernels/ab.py OUTDIR medium:with,without,with,without
"""

from __future__ import annotations

import gc
import statistics
import sys
from collections import Counter
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from cs336sys.timing import time_steps
from cs336sys.training import step_kernels
from cs336sys.training.optimized import OptimizedSpec, build_optimized_step

BEST = ("fused_adamw", "cuda_graph", "flash", "bf16_weights", "adamw_in_backward", "fused_projections",
        "compiled_loss")


def measure(out: Path, size: str, variant: str, listed: set[str]) -> None:
    name, *options = variant.split("-")
    knobs = {"t": 4096, "p": 4, "w": 8} | {o[0]: int(o[1:]) for o in options if o != "solo"}
    step_kernels.NORM_TILE, step_kernels.NORM_PROGRAMS_PER_SM = knobs["t"], knobs["p"]
    step_kernels.NORM_WARPS = knobs["w"]
    techniques = BEST + (("backward_kernels",) if name == "with" else ())
    if "solo" in options:
        techniques = tuple(t for t in techniques if t != "adamw_in_backward")
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
    line = (f"{size:7s} {variant:12s}: step median {statistics.median(times):7.3f} ms (min {min(times):7.3f}); "
            f"{sum(counts.values()) // 3} kernels, {sum(total.values()):.2f} ms of kernel time")
    print(line, flush=True)
    if variant not in listed:
        listed.add(variant)
        with open(out / f"{size}_{variant}_kernels.txt", "w") as f:
            f.write(f"# {line}\n")
            for kernel, t in total.most_common():
                f.write(f"{t:8.3f} ms  x{counts[kernel] // 3:4d}  {kernel[:160]}\n")
    del step
    gc.collect()
    torch.cuda.empty_cache()


if __name__ == "__main__":
    # the variants change the norm kernel's launch, which Inductor's cache of compiled graphs (keyed by the
    # graph, not by our module's constants) would otherwise take from the build before
    torch._inductor.config.fx_graph_cache = False
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    print(torch.__version__, torch.cuda.get_device_name(), flush=True)
    for arg in sys.argv[2:]:
        size, _, chosen = arg.partition(":")
        listed: set[str] = set()
        for variant in chosen.split(",") if chosen else ("with", "without", "with", "without"):
            measure(out, size, variant, listed)
