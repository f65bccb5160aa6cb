"""The Triton source Inductor generates for the optimised step's compiled functions (a hand-run probe,
not a result): the step is built with every technique at one size in a fresh Inductor cache, and every
generated module is copied out, with the step's kernel list (three profiled replays, GPU time by name) so
that each elementwise kernel can be read beside what it costs.

    TORCHINDUCTOR_CACHE_DIR=$(mktemp -d) PYTHONPATH=src \
        python notes/runs/2026-11-28-h100-inductor-kernels/probe.py medium OUTDIR
"""

from __future__ import annotations

import os
import shutil
import sys
from collections import Counter
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from cs336sys.training.optimized import OptimizedSpec, build_optimized_step

TECHNIQUES = ("fused_adamw", "cuda_graph", "flash", "bf16_weights", "adamw_in_backward", "fused_projections",
              "compiled_loss")

if __name__ == "__main__":
    size, out = sys.argv[1], Path(sys.argv[2])
    step = build_optimized_step(OptimizedSpec(size, 512, techniques=TECHNIQUES), "cuda")
    for _ in range(5):
        step.run()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            step.run()
        torch.cuda.synchronize()
    times, counts = Counter(), Counter()
    for e in prof.events():
        if e.device_type.name == "CUDA":
            times[e.name] += e.device_time / 3e3
            counts[e.name] += 1
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "kernels.txt", "w") as f:
        for name, t in times.most_common():
            f.write(f"{t:8.3f} ms  x{counts[name] // 3:4d}  {name}\n")
    cache = Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])
    for p in cache.rglob("*.py"):
        text = p.read_text(errors="replace")
        if "@triton.jit" in text or "def call(" in text:
            shutil.copy(p, out / p.name)
    print(f"{len(list(out.glob('*.py')))} modules, {len(times)} kernels", flush=True)
