"""Where the optimised step's forward+backward loses to its roofline, per size (a hand-run probe, not a result).

    python notes/runs/2026-11-25-h100-step-gap/step_gap_probe.py --sizes small medium large xl 2.7B --out rows.jsonl
    python notes/runs/2026-11-25-h100-step-gap/step_gap_probe.py --sizes small --autotune     # also blocks compiled by max-autotune

For each size, with the series' best configuration (fused AdamW, CUDA graph, our flash, bf16 weights),
on one GPU:
  - the forward+backward replayed from the graph (CUDA-event median) and the whole step;
  - one forward+backward without the graph under the profiler: GPU time by kernel family (matmul,
    attention, the rest) and the largest kernels;
  - the matmul floor at the step's own shapes: every product of the forward and backward (a linear's
    Y = X W^T, dX = dY W, dW = dY^T X; the LM head's too), each distinct shape timed alone by cuBLAS
    (`torch.mm`, bf16, CUDA-event median) and summed with its count, beside the FLOPs at the 8192-cube
    ceiling that `accounting.roofline` uses. It says how much of the gap the shapes themselves cost;
  - with --autotune: the same step with every block compiled with `mode="max-autotune-no-cudagraphs"`
    (Inductor's Triton GEMM templates tried against cuBLAS at each shape).
One JSON row per size and variant. The numbers guide `cs336sys.training.optimized`; the committed
series is made by the pipeline (`optimized_step` jobs), not by this.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import Counter

import torch

from cs336sys.sizes import get_size
from cs336sys.training.optimized import OptimizedSpec, build_optimized_step

BEST = ("fused_adamw", "cuda_graph", "flash", "bf16_weights")
MATMUL_WORDS = ("gemm", "nvjet", "xmma", "cutlass", "wgmma")
BACK_TO_BACK = 50


def _median_ms(fn, repeats: int = 20, warmup: int = 3) -> float:
    times = []
    for i in range(warmup + repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        if i >= warmup:
            times.append(start.elapsed_time(end))
    return statistics.median(times)


def matmul_shapes(size_name: str, batch: int, context: int) -> Counter:
    """(m, k, n) -> count for every product of one forward+backward: A (m x k) @ B (k x n)."""
    size = get_size(size_name)
    tokens, d, dff = batch * context, size.d_model, size.d_ff
    linears = [(d, d)] * 4 + [(d, dff)] * 2 + [(dff, d)]  # (in, out): q, k, v, output; w1, w3; w2
    shapes: Counter = Counter()
    for fan_in, fan_out in linears:
        shapes[(tokens, fan_in, fan_out)] += size.num_layers      # Y = X W^T
        shapes[(tokens, fan_out, fan_in)] += size.num_layers      # dX = dY W
        shapes[(fan_out, tokens, fan_in)] += size.num_layers      # dW = dY^T X
    vocab = size.vocab_size
    shapes[(tokens, d, vocab)] += 1
    shapes[(tokens, vocab, d)] += 1
    shapes[(vocab, tokens, d)] += 1
    return shapes


def matmul_floor(size_name: str, batch: int, context: int) -> dict:
    rows, total_ms, total_flops = [], 0.0, 0
    for (m, k, n), count in sorted(matmul_shapes(size_name, batch, context).items()):
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        out = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)

        def back_to_back(a=a, b=b, out=out):  # one event pair around many launches: no launch gaps timed
            for _ in range(BACK_TO_BACK):
                torch.mm(a, b, out=out)

        ms = _median_ms(back_to_back) / BACK_TO_BACK
        flops = 2 * m * k * n
        rows.append({"m": m, "k": k, "n": n, "count": count, "ms": ms, "tflops": flops / ms / 1e9})
        total_ms += count * ms
        total_flops += count * flops
    return {"shapes": rows, "total_ms": total_ms, "flops": total_flops, "tflops": total_flops / total_ms / 1e9}


def family(name: str) -> str:
    low = name.lower()
    if any(w in low for w in MATMUL_WORDS):
        return "matmul"
    if "flash" in low or "attn" in low:
        return "attention"
    if "adamw" in low:
        return "optimizer"
    if low.startswith("triton_") or "triton" in low:
        return "inductor/triton"
    return "other"


def kernel_families(size_name: str, context: int) -> dict:
    from torch.profiler import ProfilerActivity, profile

    spec = OptimizedSpec(size_name, context, techniques=tuple(t for t in BEST if t != "cuda_graph"))
    step = build_optimized_step(spec, "cuda")
    for _ in range(3):
        step.run()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        step.forward_backward()
        torch.cuda.synchronize()
    by_family: Counter = Counter()
    by_name: Counter = Counter()
    for e in prof.events():
        if e.device_type.name != "CUDA":
            continue
        us = e.device_time if hasattr(e, "device_time") else e.cuda_time
        by_family[family(e.name)] += us / 1e3
        by_name[e.name[:90]] += us / 1e3
    step.zero_grad()
    del step
    torch.cuda.empty_cache()
    return {"families_ms": dict(by_family), "top_kernels_ms": by_name.most_common(15)}


def timed_step(size_name: str, context: int, autotune: bool) -> dict:
    original = torch.nn.Module.compile
    if autotune:
        def compile_autotuned(self, *args, **kwargs):
            kwargs.setdefault("mode", "max-autotune-no-cudagraphs")
            return original(self, *args, **kwargs)
        torch.nn.Module.compile = compile_autotuned
    try:
        step = build_optimized_step(OptimizedSpec(size_name, context, techniques=BEST), "cuda")
    finally:
        torch.nn.Module.compile = original
    for _ in range(5):
        step.run()
    forward_backward = _median_ms(step.forward_backward, repeats=10, warmup=1)
    optimizer = _median_ms(step.optimizer_step, repeats=10, warmup=1)
    whole = _median_ms(step.run, repeats=10, warmup=1)
    out = {"forward_backward_ms": forward_backward, "optimizer_ms": optimizer, "step_ms": whole,
           "flops": step.info["flops_per_step"], "batch": step.spec.batch}
    del step
    torch.cuda.empty_cache()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--sizes", nargs="+", default=["small", "medium", "large", "xl", "2.7B"])
    parser.add_argument("--context", type=int, default=512)
    parser.add_argument("--autotune", action="store_true")
    parser.add_argument("--out", default="-")
    args = parser.parse_args(argv)
    out = sys.stdout if args.out == "-" else open(args.out, "a")
    for size in args.sizes:
        row = {"size": size, "gpu": torch.cuda.get_device_name(), "torch": torch.__version__}
        row["step"] = timed_step(size, args.context, autotune=False)
        row["matmul_floor"] = matmul_floor(size, row["step"]["batch"], args.context)
        row["profile"] = kernel_families(size, args.context)
        if args.autotune:
            try:
                row["autotuned_step"] = timed_step(size, args.context, autotune=True)
            except Exception as error:  # a probe: record and go on
                row["autotuned_step"] = {"error": repr(error)[:500]}
        print(json.dumps(row), file=out, flush=True)
        floor = row["matmul_floor"]
        print(f"{size}: fwd+bwd {row['step']['forward_backward_ms']:.2f} ms, step {row['step']['step_ms']:.2f} ms; "
              f"cuBLAS at the step's shapes {floor['total_ms']:.2f} ms ({floor['tflops']:.0f} TFLOP/s); "
              f"families {({k: round(v, 2) for k, v in row['profile']['families_ms'].items()})}; "
              f"autotuned {row.get('autotuned_step')}", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
