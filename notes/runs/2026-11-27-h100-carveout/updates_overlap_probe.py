"""Leave some SMs to the AdamW updates that run beside the backward (a hand-run probe, not a result).

    python notes/runs/2026-11-27-h100-carveout/updates_overlap_probe.py large medium --carveouts 0 8 16 24 32 48 [--launches]

Inside the optimised step's backward the updates (memory-bound, about 28 B per parameter) run on a side
stream beside the products (compute-bound), yet they add most of their own time to the step (6.7 ms of
about 10 at "large" on one H100, notes/runs/2026-11-27-h100-dw-adamw). The guess this tests: a Hopper
cuBLAS block holds most of an SM's registers, so a product's blocks leave no room for the updates' and
the two take the SMs in turns. PyTorch's experimental SM carveout makes
cuBLASLt target fewer SMs (`torch._C._set_sm_carveout_experimental`), which leaves the rest to whatever
else is running: here, the updates. It reaches the cuBLASLt path only, so the probe prefers cuBLASLt
for every product (`torch.backends.cuda.preferred_blas_library`), and first checks that the carveout
takes effect: a bf16 8192-cube product timed with none and with half the SMs carved out.

Then, per size and carveout, the series' best configuration (fused AdamW, CUDA graph, flash, bf16
weights, AdamW inside the backward, joined projections, compiled loss) is built, captured and timed
over 40 steps. It is timed once with its updates and once re-captured without them
(forward+backward alone, which the carveout slows). The carveout in force at capture is the one the
graph's products keep. Times are medians of the host clock around each step, synchronised
(`cs336sys.timing.time_steps`, as the pipeline times its points).

With --launches, first the updates' own kernel at a few blocks and warps against a copy of as many
bytes: it ran at 2.6-2.7 TB/s beside the copy's 3.0 (notes/runs/2026-11-25-h100-step-gap).
"""

from __future__ import annotations

import argparse
import gc
import statistics

import torch
import triton

from cs336sys.timing import time_steps
from cs336sys.training.optimized import OptimizedSpec, build_optimized_step

BEST = ("fused_adamw", "flash", "bf16_weights", "adamw_in_backward", "fused_projections", "compiled_loss")


def median_ms(fn, repeats: int = 40, warmup: int = 10) -> float:
    return statistics.median(time_steps(fn, warmup, repeats, "cuda"))


def carve(sms: int) -> None:
    torch._C._set_sm_carveout_experimental(sms or None)


def check_carveout() -> None:
    a, b = (torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    half = torch.cuda.get_device_properties(0).multi_processor_count // 2
    for sms in (0, half):
        carve(sms)
        ms = median_ms(lambda: a @ b, repeats=20, warmup=5)
        print(f"8192-cube bf16 product, {sms} SMs carved out: {ms:.3f} ms ({2 * 8192**3 / ms / 1e9:.0f} TFLOP/s)",
              flush=True)
    carve(0)


def step_ms(size: str, sms: int, with_updates: bool) -> float:
    torch._dynamo.reset()
    carve(sms)
    step = build_optimized_step(OptimizedSpec(size, 512, techniques=BEST), "cuda")
    updates = step.in_backward
    if not with_updates:  # the hooks do nothing, and nothing joins their stream
        step.in_backward, updates.armed = None, False
    step.capture()
    step.in_backward = updates  # (the optimizer's own step stays empty; begin_step writes the step size)
    ms = median_ms(step.run)
    del step, updates
    gc.collect()
    torch.cuda.empty_cache()
    carve(0)
    return ms


def update_launches(elements: int = 10240 * 1280) -> None:
    """The updates' own kernel (`adamw_kernel`, bf16 gradient in, bf16 copy out: 28 B an element) at
    other blocks and warps than `fused_adamw_`'s (BLOCK 1024, 4 warps), against a copy of as many bytes."""
    from cs336sys.leaderboard.adamw import adamw_kernel

    p, m, v = (torch.rand(elements, device="cuda") for _ in range(3))
    g, out = torch.rand(elements, device="cuda").to(torch.bfloat16), torch.empty(elements, device="cuda",
                                                                                dtype=torch.bfloat16)
    src = torch.empty(7 * elements, device="cuda")  # 28 B an element: 14 read, 14 written
    dst = torch.empty(src.numel() // 2, device="cuda")
    copy_ms = median_ms(lambda: dst.copy_(src[: dst.numel()]))
    print(f"copy of {28 * elements / 1e9:.2f} GB: {copy_ms:.3f} ms ({28 * elements / copy_ms / 1e9:.2f} TB/s)")
    for block in (1024, 2048, 4096):
        for warps in (4, 8):
            def launch(block=block, warps=warps):
                adamw_kernel[(triton.cdiv(elements, block),)](p, g, m, v, out, elements, 0.9, 0.1, 0.999, 0.001, 1e-4,
                                                              1e-8, 1.0, HAS_OUT=True, OUT_BF16=True, BLOCK=block,
                                                              num_warps=warps)
            ms = median_ms(launch)
            print(f"adamw_kernel BLOCK {block} {warps} warps: {ms:.3f} ms ({28 * elements / ms / 1e9:.2f} TB/s)",
                  flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("sizes", nargs="+")
    parser.add_argument("--carveouts", nargs="+", type=int, default=[0, 8, 16, 24, 32, 48])
    parser.add_argument("--blas", default="cublaslt", choices=["cublas", "cublaslt"])
    parser.add_argument("--launches", action="store_true", help="also time the updates' kernel's launch shapes")
    args = parser.parse_args()
    print(torch.__version__, torch.cuda.get_device_name(), flush=True)
    if args.launches:
        update_launches()
    torch.backends.cuda.preferred_blas_library(args.blas)
    check_carveout()
    for size in args.sizes:
        for sms in args.carveouts:
            step, alone = step_ms(size, sms, True), step_ms(size, sms, False)
            print(f"{size} carveout {sms:3d} SMs ({args.blas}): step {step:.2f} ms, forward+backward alone "
                  f"{alone:.2f} ms, the updates add {step - alone:.2f} ms", flush=True)


if __name__ == "__main__":
    main()
