"""The optimised step's kernel list at one size (a hand-run GPU probe, not a result), twice: with every
technique up to `compiled_loss`, and without `adamw_in_backward` (the updates then run after the backward,
so the forward's and backward's kernels are timed with no update beside them). GPU time by name over three
profiled replays; the first build's generated Inductor modules are copied to OUTDIR too.

    TORCHINDUCTOR_CACHE_DIR=$(mktemp -d) PYTHONPATH=src \
        python notes/runs/2026-11-28-h100-contiguous-grad/kernels.py medium OUTDIR
"""

from __future__ import annotations

import gc
import os
import shutil
import statistics
import sys
from collections import Counter
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile

from cs336sys.timing import time_steps
from cs336sys.training.optimized import OptimizedSpec, build_optimized_step

ALL = ("fused_adamw", "cuda_graph", "flash", "bf16_weights", "adamw_in_backward", "fused_projections",
       "compiled_loss")


def kernel_list(size: str, techniques: tuple[str, ...], path: Path) -> None:
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
    with open(path, "w") as f:
        f.write(f"# {size} {'+'.join(techniques)}: step median {statistics.median(times):.3f} ms, "
                f"kernel time {sum(total.values()):.3f} ms\n")
        for name, t in total.most_common():
            f.write(f"{t:8.3f} ms  x{counts[name] // 3:4d}  {name[:160]}\n")
    print(open(path).readline().strip(), flush=True)
    del step
    gc.collect()
    torch.cuda.empty_cache()


if __name__ == "__main__":
    size, out = sys.argv[1], Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    print(torch.__version__, torch.cuda.get_device_name(), flush=True)
    kernel_list(size, ALL, out / f"{size}_kernels.txt")
    cache = Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])
    for p in cache.rglob("*.py"):
        text = p.read_text(errors="replace")
        if "@triton.jit" in text or "def call(" in text:
            shutil.copy(p, out / p.name)
    kernel_list(size, tuple(t for t in ALL if t != "adamw_in_backward"), out / f"{size}_kernels_no_overlap.txt")
