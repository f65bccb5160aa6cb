"""Probe, not a result: the PyTorch-native step (the overlay `next`'s memory-matched baseline, never run on a
GPU at the 8B's widths) built and timed on one H200 at the 8B's widths and 32,768-token sample with 12 of its
34 blocks, in a process group of one, beside our entry's settings on the same blocks. It checks that the
native step's policies compile and run there before a 2-GPU host is spent on them, and what they cost in
compile time and memory. One process, configs in turn; prints a JSON line per config.

    python notes/runs/2026-12-03-h200-native-probe/probe.py > probe.jsonl
"""

import dataclasses
import json
import time

import torch

from cs336sys.leaderboard.native import NativeOptions, build_pytorch_native_step
from cs336sys.leaderboard.proxy import _group_of_one
from cs336sys.leaderboard.step import LeaderboardSpec, build_leaderboard_step
from cs336sys.sizes import get_size
from cs336sys.timing import peak_memory_bytes, reset_peak_memory, synchronize, time_steps

BASE = get_size("8B")
SIZE = dataclasses.replace(BASE, name="8B (12 layers)", num_layers=12)
# 8 of 12 blocks checkpointed (24 of 34 in our entry): the kept, recomputed, attention-saving and
# products-saving block policies all appear
CONFIGS = {
    "native_recompute_8": ({"checkpoint_blocks": 8}, NativeOptions()),
    "native_attention_8_matmuls_3": ({"checkpoint_blocks": 8}, NativeOptions(checkpoint_saves="attention",
                                                                             matmul_blocks=3)),
    "ours_gluon_fused_keep_attention_8": ({"checkpoint_blocks": 8, "attention": "gluon", "fused_elementwise": True,
                                           "keep_attention": True}, None),
}


def main() -> None:
    device = "cuda:0"
    torch.cuda.set_device(0)  # as the job runner's process_group.init does: the peak counters need it
    with _group_of_one(device):
        for name, (spec_kw, options) in CONFIGS.items():
            spec = LeaderboardSpec(size=SIZE, world_size=1, **{"attention": "sdpa", **spec_kw})
            torch.cuda.empty_cache()
            reset_peak_memory(device)
            start = time.perf_counter()
            try:
                if options is None:
                    step = build_leaderboard_step(spec, device, data_seed=4000)
                else:
                    step = build_pytorch_native_step(spec, device, options, data_seed=4000)
                synchronize(device)
                built = time.perf_counter()
                first = time_steps(step.run, 0, 1, device)  # compiles (Inductor, Triton) on the native step
                time_steps(step.run, 1, 0, device)
                reset_peak_memory(device)
                times = time_steps(step.run, 0, 5, device)
                out = {"config": name, "status": "ok", "build_s": built - start, "first_step_ms": first[0],
                       "step_ms": sorted(times), "peak_gib": peak_memory_bytes(device) / 2**30,
                       "policies": getattr(step, "policies", None)}
            except torch.cuda.OutOfMemoryError as e:
                out = {"config": name, "status": "oom", "reason": str(e).splitlines()[0]}
            print(json.dumps(out), flush=True)
            step = None
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
