"""Probe, not a result: what each block policy of the overlay `next`'s memory-matched baseline keeps, in bytes
a block, measured on one H200 at the 8B's widths and 32,768-token sample with 12 of its 34 blocks (a process
group of one), so that the 2-GPU native points can be placed within our entry's memory before a 2-GPU host is
spent on them (config/next.yaml gives the placement as arithmetic, not measured). Each config gives all 12
blocks one policy; the differences of their peaks are the policies' bytes a block over a recomputed block,
with what the 12 blocks' states and the loss hold cancelling out. Our entry's settings with 12 and with 8 of
the 12 blocks checkpointed give its kept block's bytes the same way. One process a config (a process that had
built earlier steps kept memory of theirs: run1/), one round, 1 untimed and 5 timed steps; prints a JSON line.

    for c in $(python calibrate.py --list); do python calibrate.py $c; done > calibrate.jsonl
    python calibrate.py --collect A B ...   # in one process, freed between configs as the job runner frees
"""

import dataclasses
import json
import sys
import time

import torch

from cs336sys.jobs import free_device_memory
from cs336sys.leaderboard.native import NativeOptions, build_pytorch_native_step
from cs336sys.leaderboard.proxy import _group_of_one
from cs336sys.leaderboard.step import LeaderboardSpec, build_leaderboard_step
from cs336sys.sizes import get_size
from cs336sys.timing import peak_memory_bytes, reset_peak_memory, synchronize, time_steps

SIZE = dataclasses.replace(get_size("8B"), name="8B (12 layers)", num_layers=12)
OURS = {"attention": "gluon", "fused_elementwise": True, "keep_attention": True}
CONFIGS = {  # name: (spec settings, native options or None for our entry's step)
    "native_recompute_12": ({"checkpoint_blocks": 12}, NativeOptions()),
    "native_save_attention_12": ({"checkpoint_blocks": 12}, NativeOptions(checkpoint_saves="attention")),
    "native_save_matmuls_12": ({"checkpoint_blocks": 12}, NativeOptions(checkpoint_saves="attention",
                                                                        matmul_blocks=12)),
    "native_kept_12": ({"checkpoint_blocks": 0}, NativeOptions()),
    # mixed blocks, as the 34-block points mix them: a policy's bytes beside recomputed or kept blocks
    "native_recompute_8_kept_4": ({"checkpoint_blocks": 8}, NativeOptions()),
    "native_save_attention_8_kept_4": ({"checkpoint_blocks": 8}, NativeOptions(checkpoint_saves="attention")),
    "native_save_matmuls_8_kept_4": ({"checkpoint_blocks": 8}, NativeOptions(checkpoint_saves="attention",
                                                                             matmul_blocks=8)),
    "native_save_attention_6_matmuls_6": ({"checkpoint_blocks": 12}, NativeOptions(checkpoint_saves="attention",
                                                                                   matmul_blocks=6)),
    "native_save_attention_5_matmuls_3_kept_4": ({"checkpoint_blocks": 8},
                                                 NativeOptions(checkpoint_saves="attention", matmul_blocks=3)),
    "ours_checkpoint_12": ({"checkpoint_blocks": 12, **OURS}, None),
    "ours_checkpoint_8": ({"checkpoint_blocks": 8, **OURS}, None),
}


def main(names: list[str], collect: bool = False) -> None:
    device = "cuda:0"
    torch.cuda.set_device(0)  # as the job runner's process_group.init does: the peak counters need it
    with _group_of_one(device):
        for name in names:
            spec_kw, options = CONFIGS[name]
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
            print(json.dumps({**out, "collected": collect}), flush=True)
            step = None
            if collect:  # gc.collect(), then empty the cache: what jobs.run_point does after every point
                free_device_memory()
            torch.cuda.empty_cache()


if __name__ == "__main__":
    if sys.argv[1:] == ["--list"]:
        print(" ".join(CONFIGS))
    else:
        collect = "--collect" in sys.argv[1:]
        main([a for a in sys.argv[1:] if a != "--collect"], collect)
