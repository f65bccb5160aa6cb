"""Would the weight gradients' products on a side stream shorten the optimised step's backward? A hand-run
GPU probe (an upper bound from the products alone), not a result.

At each size's step shapes (2048 rows: batch 4, context 512; the joined q/k/v and w1/w3 products), the
backward's products of every block, in the backward's order (w2, w13, output, qkv, last block first):
each linear's input gradient dX = dY W and weight gradient dW = dY^T X. Optionally `ew` in-place passes over
each dX on the main stream (the norms', gate's and rotary's elementwise work, which is memory-bound) and the
step's fused AdamW update of each weight from its dW on a side stream (`fused_adamw_`, as the step's
`adamw_in_backward` launches it). Variants, each captured in one CUDA graph on a high-priority stream:

- `serial`: dX then dW on the main stream (the step as built); `+upd`: each update on the side stream
  after its dW, which waits for the main stream first (the step's `StepUpdates`).
- `split`: dW (and its update) on the side stream, which waits for an event recorded on the main stream
  before each block; the main stream runs only dX and the elementwise passes.

Median of 30 replays (ms) after 5, CUDA events around each replay.

    PYTHONPATH=src python notes/runs/2026-11-28-h200-wgrad-streams/probe.py small medium large
"""

from __future__ import annotations

import statistics
import sys

import torch

from cs336sys.leaderboard.adamw import fused_adamw_
from cs336sys.sizes import get_size

ROWS = 2048


def layers(size: str) -> list[list[dict]]:
    s = get_size(size)
    d, f = s.d_model, s.d_ff
    shapes = [(d, f), (2 * f, d), (d, d), (3 * d, d)]  # (out, in): w2, w13, output, qkv (backward's order)
    out = []
    for _ in range(s.num_layers):
        block = []
        for o, i in shapes:
            w = torch.randn(o, i, device="cuda", dtype=torch.bfloat16) * i ** -0.5
            block.append({"w": w, "p": w.float(), "m": torch.zeros(o, i, device="cuda"),
                          "v": torch.zeros(o, i, device="cuda"),
                          "x": torch.randn(ROWS, i, device="cuda", dtype=torch.bfloat16),
                          "dy": torch.randn(ROWS, o, device="cuda", dtype=torch.bfloat16),
                          "dx": torch.empty(ROWS, i, device="cuda", dtype=torch.bfloat16),
                          "dw": torch.empty(o, i, device="cuda", dtype=torch.bfloat16)})
        out.append(block)
    return out


def backward(blocks, side: torch.cuda.Stream, split: bool, upd: bool, ew: int, step_size: torch.Tensor) -> None:
    main = torch.cuda.current_stream()
    side.wait_stream(main)  # the side stream joins the capture (and the end's join needs it in)
    for block in reversed(blocks):
        if split:
            side.wait_stream(main)
        for lin in block:
            torch.mm(lin["dy"], lin["w"], out=lin["dx"])
            for _ in range(ew):
                lin["dx"].mul_(0.5)
            if split:
                with torch.cuda.stream(side):
                    torch.mm(lin["dy"].t(), lin["x"], out=lin["dw"])
                    if upd:
                        fused_adamw_(lin["p"], lin["dw"], lin["m"], lin["v"], step_size=step_size, lr=1e-4,
                                     eps=1e-8, weight_decay=0.01, beta1=0.9, beta2=0.95, out_lowp=lin["w"])
            else:
                torch.mm(lin["dy"].t(), lin["x"], out=lin["dw"])
                if upd:
                    side.wait_stream(main)
                    with torch.cuda.stream(side):
                        fused_adamw_(lin["p"], lin["dw"], lin["m"], lin["v"], step_size=step_size, lr=1e-4,
                                     eps=1e-8, weight_decay=0.01, beta1=0.9, beta2=0.95, out_lowp=lin["w"])
    main.wait_stream(side)


def timed(blocks, split: bool, upd: bool, ew: int) -> float:
    capture = torch.cuda.Stream(priority=-1)
    side = torch.cuda.Stream(priority=0)
    step_size = torch.full((1,), 1e-6, device="cuda")
    capture.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(capture):
        for _ in range(2):  # warm-up outside the capture (Triton's compile)
            backward(blocks, side, split, upd, ew, step_size)
    torch.cuda.current_stream().wait_stream(capture)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=capture):
        backward(blocks, side, split, upd, ew, step_size)
    times = []
    for i in range(35):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        if i >= 5:
            times.append(a.elapsed_time(b))
    del graph
    return statistics.median(times)


def main(sizes: list[str]) -> None:
    print(torch.cuda.get_device_name(), torch.__version__, flush=True)
    for size in sizes:
        blocks = layers(size)
        flops = sum(4 * ROWS * lin["w"].numel() for block in blocks for lin in block)
        print(f"\n{size}: backward products {flops / 1e12:.3f} TFLOP", flush=True)
        for ew in (0, 4):
            for upd in (False, True):
                row = {}
                for _ in range(2):  # alternate, twice
                    for split in (False, True):
                        row.setdefault(split, []).append(timed(blocks, split, upd, ew))
                s, p = statistics.mean(row[False]), statistics.mean(row[True])
                print(f"  ew={ew} upd={int(upd)}: serial {row[False][0]:.3f} {row[False][1]:.3f}  "
                      f"split {row[True][0]:.3f} {row[True][1]:.3f}  ({100 * (p / s - 1):+.1f} %)"
                      f"  serial at {flops / s / 1e9:.0f} TFLOP/s", flush=True)
        del blocks
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main(sys.argv[1:] or ["small", "medium"])
