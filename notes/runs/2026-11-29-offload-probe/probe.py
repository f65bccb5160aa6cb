"""Does keeping a block's activations in host memory beat recomputing the block? (issue 59, item 2)

A hand probe, not a pipeline result. On one GPU, the 8B model's block (width 4096, 32 heads, d_ff 11008,
bf16 weights, SDPA attention) over one sequence of 32,768 tokens, a stack of `--blocks` of them, each
step's forward and backward timed by CUDA events (median of `--steps` after 2 untimed), with every block:
- `kept`: autograd keeps what the backward needs on the GPU;
- `checkpointed`: torch.utils.checkpoint (input kept, the block recomputed in the backward);
- `offloaded`: cs336sys.leaderboard.offload.HostOffload (saved tensors to pinned host memory as the forward
  makes them, back a block ahead of the backward);
- `alternate`: offloaded and kept in turn (the host link's load halved, as in a step that offloads some blocks).
Also the host link alone: pinned device-to-host and host-to-device copies of 1 GiB, and both at once.

    PYTHONPATH=src python notes/runs/2026-11-29-offload-probe/probe.py [--blocks 4] [--steps 5]
    PYTHONPATH=src python notes/runs/2026-11-29-offload-probe/probe.py --device cpu --tiny   # the code path
    ... probe.py --blocks 12 --lead 4 --policies kept,checkpointed,offloaded,kept,checkpointed,offloaded
        # only the first 4 of 12 blocks offloaded or checkpointed, as a step would treat its earliest blocks:
        # their copies out have the later blocks' forward to hide under, their copies back the later backward

Reading it: a block offloaded instead of checkpointed saves its recomputation (the step's own profile puts
that at ~18 ms a block) and costs whatever of its ~2 x 4 GB of copies the compute does not hide; the peak
columns say what it frees. The 8B step keeps 10 of 34 blocks; ~20 GB of the H200's 150 GB are unused.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
from torch.utils.checkpoint import checkpoint

from cs336sys.leaderboard.offload import HostOffload
from cs336sys.model import TransformerBlock


def link(device: str, gib: float) -> dict:
    """Pinned host <-> device copy bandwidth (GB/s): each way alone, then both at once."""
    if device == "cpu":
        return {}
    n = int(gib * 2**30)
    host_out, host_in = (torch.empty(n, dtype=torch.uint8, pin_memory=True) for _ in range(2))
    dev_out, dev_in = (torch.empty(n, dtype=torch.uint8, device=device) for _ in range(2))
    s1, s2 = torch.cuda.Stream(), torch.cuda.Stream()

    def timed(fn) -> float:
        fn()
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        return time.perf_counter() - t

    def both():
        with torch.cuda.stream(s1):
            host_out.copy_(dev_out, non_blocking=True)
        with torch.cuda.stream(s2):
            dev_in.copy_(host_in, non_blocking=True)

    d2h = timed(lambda: host_out.copy_(dev_out, non_blocking=True))
    h2d = timed(lambda: dev_in.copy_(host_in, non_blocking=True))
    duplex = timed(both)
    return {"d2h_gb_s": n / d2h / 1e9, "h2d_gb_s": n / h2d / 1e9, "both_gb_s_each": n / duplex / 1e9}


def step_times(blocks, x, policy: str, steps: int, device: str, lead: int) -> dict:
    offload = HostOffload()

    def forward():
        h = x
        for i, block in enumerate(blocks):
            mode = policy if policy != "alternate" else ("offloaded" if i % 2 == 0 else "kept")
            if i >= lead:  # only the first `lead` blocks follow the policy; the later ones keep theirs
                mode = "kept"
            if mode == "checkpointed":
                h = checkpoint(block, h, use_reentrant=False)
            elif mode == "offloaded":
                with offload.group(i), torch.autograd.graph.saved_tensors_hooks(offload.pack, offload.unpack):
                    h = block(h)
            else:
                h = block(h)
        return h

    times, peaks = [], []
    for k in range(steps + 2):
        blocks.zero_grad(set_to_none=True)
        if device != "cpu":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
        t = time.perf_counter()
        out = forward()
        offload.prefetch()
        out.float().square().mean().backward()
        offload.reset()
        if device != "cpu":
            torch.cuda.synchronize()
            peaks.append((torch.cuda.max_memory_allocated() - base) / 1e9)
        if k >= 2:
            times.append((time.perf_counter() - t) * 1e3)
    return {"policy": policy, "lead": min(lead, len(blocks)), "median_ms": statistics.median(times),
            "min_ms": min(times), "max_ms": max(times),
            "peak_gb_over_weights": max(peaks) if peaks else None, "host_gb": offload.host_bytes() / 1e9}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--device", default="cuda")
    p.add_argument("--blocks", type=int, default=4)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--lead", type=int, default=10**6,
                   help="the policy for the first LEAD blocks only, the rest kept (default: every block)")
    p.add_argument("--tiny", action="store_true", help="a small block and sequence (the code path, on the CPU)")
    p.add_argument("--policies", default="kept,checkpointed,offloaded,alternate,kept,checkpointed,offloaded,alternate")
    args = p.parse_args()
    d, heads, d_ff, seq = (64, 4, 128, 256) if args.tiny else (4096, 32, 11008, 32768)
    dtype = torch.float32 if args.device == "cpu" else torch.bfloat16
    torch.manual_seed(0)
    attention = "naive" if args.device == "cpu" else "sdpa"
    blocks = torch.nn.ModuleList(TransformerBlock(d, heads, d_ff, seq, 500000.0, attention, args.device, dtype)
                                 for _ in range(args.blocks))
    x = torch.randn(1, seq, d, device=args.device, dtype=dtype, requires_grad=True)
    env = {"device": torch.cuda.get_device_name() if args.device != "cpu" else "cpu", "torch": torch.__version__,
           "blocks": args.blocks, "width": d, "d_ff": d_ff, "seq": seq, "dtype": str(dtype)}
    print(json.dumps({"env": env, "link": link(args.device, 1.0)}))
    for policy in args.policies.split(","):  # each policy twice, in turn: a drift of the machine falls on all
        print(json.dumps(step_times(blocks, x, policy, args.steps, args.device, args.lead)), flush=True)


if __name__ == "__main__":
    main()
