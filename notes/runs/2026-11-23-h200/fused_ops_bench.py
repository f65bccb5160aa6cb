"""Time the fused RMSNorm, SwiGLU gate and RoPE against the model's torch ops at the 8B leaderboard
step's shapes (32,768 tokens per GPU, bf16), and one whole 8B block both ways, on one GPU.

    PYTHONPATH=src python notes/runs/2026-11-23-h200/fused_ops_bench.py --out DIR [--tokens 32768]

First each fused function is checked against the model's ops at that shape (largest error over the
largest value, forward and gradients). Then forward and forward+backward are timed
(triton.testing.do_bench medians, gradients by torch.autograd.grad so nothing accumulates), with
the bytes each fused kernel must move at least and the rate that implies. The block rows compare
`fused_block_forward` with `TransformerBlock.forward` (SDPA and our flash attention). A tool for
choosing what the leaderboard step uses (notes/leaderboard.md), not a result of the pipeline: the
step's own timings come from its experiment. Every row is appended to DIR/fused_ops.jsonl.
"""

from __future__ import annotations

import argparse
import json
from functools import partial
from pathlib import Path

import torch
import triton
from torch.func import functional_call

from cs336sys.attention.bench import bench_ms
from cs336sys.attention.flash_triton import flash_causal_attention
from cs336sys.leaderboard import fused_ops
from cs336sys.leaderboard.fused_block import fused_block_forward
from cs336sys.model import RotaryEmbedding, TransformerBlock
from cs336sys.profiling.kernels import kernel_tables
from cs336sys.profiling.trace import record_trace
from cs336sys.sizes import get_size

OUT = Path(".")
DEVICE = torch.device("cuda")


def record(**row) -> dict:
    with open(OUT / "fused_ops.jsonl", "a") as f:
        f.write(json.dumps(row) + "\n")
    print(json.dumps(row), flush=True)
    return row


def bench(fn) -> float:
    return bench_ms(fn, DEVICE)  # do_bench's median on CUDA


def forward_backward(fn, inputs: list[torch.Tensor], grad: torch.Tensor) -> None:
    torch.autograd.grad(fn(*inputs), inputs, grad)


def rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.float() - want.float()).abs().max() / want.float().abs().max()).item()


def compare(name: str, fused, model_ops, inputs: list[torch.Tensor], extra: tuple, bytes_fwd: int, bytes_bwd: int):
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    f = lambda *xs: fused(*xs, *extra)  # noqa: E731
    m = lambda *xs: model_ops(*xs, *extra)  # noqa: E731
    out, want = f(*leaves), m(*leaves)
    grad = torch.randn_like(want)
    got_grads = torch.autograd.grad(out, leaves, grad)
    want_grads = torch.autograd.grad(m(*leaves), leaves, grad)
    record(what="check", op=name, forward_err=rel(out, want),
           grad_err=max(rel(a, b) for a, b in zip(got_grads, want_grads, strict=True)))
    del out, want, got_grads, want_grads
    for label, fn in (("fused", f), ("model_ops", m)):
        fwd = bench(lambda fn=fn: fn(*leaves))
        both = bench(partial(forward_backward, fn, leaves, grad))
        row = dict(what="time", op=name, impl=label, forward_ms=fwd, forward_backward_ms=both)
        if label == "fused":
            row |= dict(forward_gb_s=bytes_fwd / fwd / 1e6, backward_gb_s=bytes_bwd / max(both - fwd, 1e-6) / 1e6)
        record(**row)


def ops(tokens: int) -> None:
    size = get_size("8B")
    d, d_ff, heads, d_head = size.d_model, size.d_ff, size.num_heads, size.d_head
    bf16 = dict(device=DEVICE, dtype=torch.bfloat16)
    two = 2  # bytes per bf16 element
    compare("rms_norm", fused_ops.rms_norm, fused_ops.rms_norm_reference,
            [torch.randn(tokens, d, **bf16), torch.randn(d, **bf16)], (1e-5,),
            2 * tokens * d * two, 3 * tokens * d * two)
    compare("silu_gate", fused_ops.silu_gate, fused_ops.silu_gate_reference,
            [torch.randn(tokens, d_ff, **bf16), torch.randn(tokens, d_ff, **bf16)], (),
            3 * tokens * d_ff * two, 5 * tokens * d_ff * two)
    rope = RotaryEmbedding(size.rope_theta, d_head, tokens, device=DEVICE)
    q = torch.randn(1, tokens, heads, d_head, **bf16).transpose(1, 2)  # the head split of a projection
    compare("rotary", fused_ops.rotary, fused_ops.rotary_reference, [q], (rope.cos, rope.sin),
            2 * tokens * d * two, 2 * tokens * d * two)


def time_block(attention: str, tokens: int) -> None:
    size = get_size("8B")
    torch.manual_seed(0)
    module = TransformerBlock(size.d_model, size.num_heads, size.d_ff, tokens, size.rope_theta,
                              flash_causal_attention if attention == "flash" else "sdpa",
                              device=DEVICE, dtype=torch.bfloat16)
    names = [n for n, _ in module.named_parameters()]
    x = torch.randn(1, tokens, size.d_model, device=DEVICE, dtype=torch.bfloat16, requires_grad=True)
    leaves = [x, *module.parameters()]

    def fused(x, *params):
        return fused_block_forward(module, dict(zip(names, params, strict=True)), x)

    def plain(x, *params):
        return functional_call(module, dict(zip(names, params, strict=True)), (x,))

    with torch.no_grad():
        record(what="check", op=f"block/{attention}", forward_err=rel(fused(*leaves), plain(*leaves)))
    grad = torch.randn_like(x)
    # each way twice, in the order fused, module, module, fused: a drift of the clock shows as a
    # difference between a way's two rows
    for rep, (label, fn) in enumerate([("fused", fused), ("module", plain), ("module", plain), ("fused", fused)]):
        if DEVICE.type == "cuda":
            torch.cuda.reset_peak_memory_stats()
        both = bench(partial(forward_backward, fn, leaves, grad))
        peak = torch.cuda.max_memory_allocated() / 1e9 if DEVICE.type == "cuda" else None
        record(what="time", op=f"block/{attention}", impl=label, rep=rep // 2, forward_backward_ms=both, peak_gb=peak)
    for label, fn in (("fused", fused), ("module", plain)):
        profile_block(f"block/{attention}", label, partial(forward_backward, fn, leaves, grad))


def profile_block(op: str, label: str, step) -> None:
    """One forward+backward under torch.profiler (cs336sys.profiling): GPU time by kernel class and
    the largest kernels, identical names summed."""
    table = kernel_tables(record_trace(step, steps=1, warmup=1, device=DEVICE), {"step": ["step"]}, top=14)
    scope = table["scopes"]["step"]
    record(what="profile", op=op, impl=label, device_ms=scope["device_us"] / 1e3,
           by_class_ms={k: round(v / 1e3, 3) for k, v in scope["by_class"].items()},
           kernels=[{"name": r["short_name"], "class": r["class"], "calls": r["calls"],
                     "ms": round(r["total_us"] / 1e3, 3)} for r in scope["top"]])


def block(tokens: int) -> None:
    for attention in ("sdpa", "flash"):
        time_block(attention, tokens)
        if DEVICE.type == "cuda":
            torch.cuda.empty_cache()


def main() -> None:
    global OUT, DEVICE
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=".")
    parser.add_argument("--tokens", type=int, default=32768)
    parser.add_argument("--parts", default="ops,block")
    parser.add_argument("--device", default="cuda",
                        help="cpu: a smoke run under TRITON_INTERPRET=1 (its times and bf16 errors mean nothing)")
    args = parser.parse_args()
    OUT, DEVICE = Path(args.out), torch.device(args.device)
    OUT.mkdir(parents=True, exist_ok=True)
    gpu = torch.cuda.get_device_properties(0).name if DEVICE.type == "cuda" else None
    record(what="env", gpu=gpu, torch=torch.__version__, triton=triton.__version__, tokens=args.tokens)
    for part in args.parts.split(","):
        {"ops": ops, "block": block}[part](args.tokens)


if __name__ == "__main__":
    main()
