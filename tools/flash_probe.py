"""Where the time of our FlashAttention goes, in one GPU call (notes/flash_attention.md, run 5).

    PYTHONPATH=src python tools/flash_probe.py --out DIR [--phases host,kernels]

Phases:
  host     host (CPU) cost per call at a size where the GPU work is negligible (batch 1, 1 head,
           seq 128, d 64, bf16, causal): each layer of our call path, from a bare Triton launch
           to forward+backward through autograd, next to SDPA; microseconds per call from a loop
           of calls with one synchronisation at the end, then a cProfile of forward+backward.
  maxnreg  register caps (more programs per multiprocessor) for each kernel, leaderboard shape
  backward the whole backward per launch layout, and the leaderboard measurement (twice)
  kernels  every kernel variant alone (forward; dK/dV and dQ launches of the backward, each
           with its own warps and stages), checked against float64 first, then timed with
           do_bench at the leaderboard shape and at batch 1, 1 head, seq 16384.
Rows go to DIR/probe.jsonl; a summary is printed last.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import math
import pstats
import time
from functools import partial
from pathlib import Path

import torch
import torch.nn.functional as F
import triton
import triton.testing

from cs336sys.attention import flash_triton_backward as bwd
from cs336sys.attention import flash_triton_forward as fwd
from cs336sys.attention.bench import bench_ms
from cs336sys.attention.flash_configs import Tiles
from cs336sys.attention.flash_triton import FlashAttention2Triton, flash_attention_triton_forward
from cs336sys.attention.inputs import check_attention_inputs
from cs336sys.attention.naive import naive_attention
from cs336sys.jobs import free_device_memory
from cs336sys.numerics import rel_err

LOG: list[dict] = []
OUT = Path(".")
LOG2E = 1.4426950408889634


def record(**row) -> dict:
    LOG.append(row)
    with open(OUT / "probe.jsonl", "a") as f:
        f.write(json.dumps(row) + "\n")
    print(row, flush=True)
    return row


def per_call_us(fn, calls: int = 400) -> float:
    """Host microseconds per call: the GPU work here is far shorter than the host's."""
    for _ in range(20):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e6


def host() -> None:
    seq, d = 128, 64
    q, k, v = (torch.randn(1, 1, seq, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    q3, k3, v3 = (t.detach().view(1, seq, d) for t in (q, k, v))
    out3, lse3 = torch.empty_like(q3), torch.empty(1, seq, device="cuda")
    tiles = Tiles(64, 64, 4, 3)
    grid = (2, 1)

    def bare_launch():
        fwd.flash_forward_kernel[grid](q3, k3, v3, out3, lse3, seq, seq, 0.18, HEAD_DIM=d, BLOCK_M=64, BLOCK_N=64,
                                       IS_CAUSAL=True, EVEN_M=True, EVEN_N=True, num_warps=4, num_stages=3)

    go = torch.ones(1, 1, seq, d, device="cuda", dtype=torch.bfloat16)

    class Floor(torch.autograd.Function):
        """The least an autograd.Function costs: one allocation, nothing launched."""

        @staticmethod
        def forward(ctx, a, b, c, causal):
            ctx.save_for_backward(a, b, c)
            return torch.empty_like(a)

        @staticmethod
        def backward(ctx, grad):
            return grad, grad, grad, None

    def ours_fwd_bwd():
        FlashAttention2Triton.apply(q, k, v, True).backward(go)

    def sdpa_fwd_bwd():
        F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(go)

    cases = {
        "empty x2": lambda: (torch.empty_like(q3), torch.empty(1, seq, device="cuda")),
        "bare triton launch (forward kernel)": bare_launch,
        "autograd.Function floor": lambda: Floor.apply(q, k, v, True),
        "autograd.Function floor fwd+bwd": lambda: Floor.apply(q, k, v, True).backward(go),
        "check_attention_inputs": partial(check_attention_inputs, q, k, v, True, for_triton=True),
        "fwd.flash_forward": partial(fwd.flash_forward, q3, k3, v3, True, tiles),
        "flash_attention_triton_forward": partial(flash_attention_triton_forward, q.detach(), k.detach(),
                                                  v.detach(), True),
        "FlashAttention2Triton.apply, no grad": lambda: FlashAttention2Triton.apply(q.detach(), k.detach(),
                                                                                    v.detach(), True),
        "FlashAttention2Triton.apply": lambda: FlashAttention2Triton.apply(q, k, v, True),
        "sdpa forward": lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True),
        "ours forward+backward": ours_fwd_bwd,
        "sdpa forward+backward": sdpa_fwd_bwd,
        "naive forward+backward": lambda: naive_attention(q, k, v, True).backward(go),
    }
    for name, fn in cases.items():
        record(phase="host", case=name, us=per_call_us(fn))
        q.grad = k.grad = v.grad = None
    for name, fn in (("ours forward", lambda: FlashAttention2Triton.apply(q, k, v, True)),
                     ("ours fwd+bwd", ours_fwd_bwd), ("sdpa fwd+bwd", sdpa_fwd_bwd)):
        ms = triton.testing.do_bench(fn, warmup=25, rep=100, grad_to_none=[q, k, v], return_mode="median")
        record(phase="host_do_bench", case=name, ms=ms)
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(300):
        ours_fwd_bwd()
    torch.cuda.synchronize()
    profile.disable()
    text = io.StringIO()
    pstats.Stats(profile, stream=text).sort_stats("tottime").print_stats(25)
    (OUT / "profile_fwd_bwd.txt").write_text(text.getvalue())
    print(text.getvalue()[:6000], flush=True)


# --- kernels --------------------------------------------------------------------------------

def bench(fn) -> float:
    return bench_ms(fn, torch.device("cuda"))


T = Tiles
FORWARD = {64: [T(128, 64, 8, 3), T(128, 64, 8, 2), T(128, 64, 8, 4), T(64, 64, 4, 3)],
           128: [T(128, 64, 8, 3), T(64, 64, 4, 3)]}
# (programs, block_m, block_n, warps, stages): dK/dV programs own block_n keys and step over
# block_m queries; dQ programs own block_m queries and step over block_n keys.
DKDV = {64: [(64, 64, 4, 3), (64, 64, 4, 2), (64, 128, 8, 2), (64, 128, 8, 3), (32, 128, 8, 3),
             (128, 128, 8, 2)],
        128: [(32, 64, 4, 2), (32, 64, 4, 3), (64, 128, 8, 2), (32, 128, 8, 2)]}
DQ = {64: [(64, 64, 4, 3), (128, 64, 8, 2), (128, 64, 8, 3), (128, 32, 4, 3), (64, 32, 4, 3), (128, 128, 8, 2)],
      128: [(64, 64, 4, 2), (64, 64, 4, 3), (128, 64, 8, 2), (64, 32, 4, 3)]}
SHAPES = [("lb", 16, 16384, 64), ("g16k64", 1, 16384, 64), ("g16k128", 1, 16384, 128), ("h16s8k128", 16, 8192, 128)]


def launch_kind(kind: str, tiles: tuple, q, k, v, out, do, lse, delta, dq, dk, dv, causal: bool = True) -> None:
    """One kind of backward program alone, reading D from `delta`."""
    bh, seq_q, d = q.shape
    seq_k = k.shape[1]
    block_m, block_n, warps, stages = tiles
    count = triton.cdiv(seq_k, block_n) if kind == "dkdv" else triton.cdiv(seq_q, block_m)
    sm_scale = 1.0 / math.sqrt(d)
    bwd.backward_kernel[(count, bh)](
        q, k, v, out, do, lse, delta, dq, dk, dv, seq_q, seq_k, sm_scale * LOG2E, sm_scale,
        HEAD_DIM=d, IS_CAUSAL=causal, PROGRAMS=kind, BLOCK_M_KV=block_m, BLOCK_N_KV=block_n,
        BLOCK_M_Q=block_m, BLOCK_N_Q=block_n,
        EVEN_M_KV=seq_q % block_m == 0, EVEN_N_KV=seq_k % block_n == 0,
        EVEN_M_Q=seq_q % block_m == 0, EVEN_N_Q=seq_k % block_n == 0, DELTA_FROM_O=False,
        num_warps=warps, num_stages=stages)


def delta_of(out, do):
    return (out.float() * do.float()).sum(-1)


def kernels() -> None:
    failed: set[str] = set()
    for d in (64, 128):
        q, k, v, do = (torch.randn(2, 1000, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
        q64, k64, v64 = (t.double().requires_grad_() for t in (q, k, v))
        ref = naive_attention(q64, k64, v64, True)
        ref.backward(do.double())
        for t in FORWARD[d]:
            try:
                out, lse = fwd.flash_forward(q, k, v, True, t)
                err = rel_err(out, ref)
            except Exception as exc:  # a variant this Triton cannot compile
                record(phase="check", kernel="forward", d=d, tiles=str(t), error=str(exc)[:300])
                failed.add(f"forward {d} {t}")
                continue
            record(phase="check", kernel="forward", d=d, tiles=str(t), err=err)
            if not err < 2e-2:
                failed.add(f"forward {d} {t}")
        out, lse = fwd.flash_forward(q, k, v, True, T(64, 64, 4, 3))
        delta = delta_of(out, do)
        for kind, table, wanted in (("dkdv", DKDV, (k64, v64)), ("dq", DQ, (q64,))):
            for tiles in table[d]:
                dq, dk, dv = (torch.full_like(q, float("nan")) for _ in range(3))
                try:
                    launch_kind(kind, tiles, q, k, v, out, do, lse, delta, dq, dk, dv)
                    got = (dk, dv) if kind == "dkdv" else (dq,)
                    err = max(rel_err(g, r.grad) for g, r in zip(got, wanted, strict=True))
                except Exception as exc:
                    record(phase="check", kernel=kind, d=d, tiles=str(tiles), error=str(exc)[:300])
                    failed.add(f"{kind} {d} {tiles}")
                    continue
                record(phase="check", kernel=kind, d=d, tiles=str(tiles), err=err)
                if not err < 2e-2:
                    failed.add(f"{kind} {d} {tiles}")
    print("failed:", sorted(failed), flush=True)
    for name, bh, seq, d in SHAPES:
        q, k, v, do = (torch.randn(bh, seq, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
        out, lse = fwd.flash_forward(q, k, v, True, T(64, 64, 4, 3))
        delta = delta_of(out, do)
        dq, dk, dv = (torch.empty_like(q) for _ in range(3))
        pair_flops = 2.0 * 2 * d * bh * seq * (seq + 1) / 2  # one product over the attended pairs
        for t in FORWARD[d]:
            if f"forward {d} {t}" in failed:
                continue
            ms = bench(partial(fwd.flash_forward, q, k, v, True, t))
            record(phase="time", shape=name, kernel="forward", tiles=str(t), ms=ms, tflops=2 * pair_flops / ms / 1e9)
        for kind, table, products in (("dkdv", DKDV, 4), ("dq", DQ, 3)):
            for tiles in table[d]:
                if f"{kind} {d} {tiles}" in failed:
                    continue
                ms = bench(partial(launch_kind, kind, tiles, q, k, v, out, do, lse, delta, dq, dk, dv))
                record(phase="time", shape=name, kernel=kind, tiles=str(tiles), ms=ms,
                       tflops=products * pair_flops / ms / 1e9)
        ms = bench(partial(bwd.backward_delta_kernel[(triton.cdiv(seq, 64), bh)], out, do, delta, seq,
                           HEAD_DIM=d, BLOCK_M=64))
        record(phase="time", shape=name, kernel="delta", tiles="64", ms=ms)
        del q, k, v, do, out, lse, delta, dq, dk, dv
        free_device_memory()


def backward() -> None:
    """The whole backward (launch layouts as the table has them) and the leaderboard measurement."""
    from cs336sys.attention.bench import LeaderboardSettings, run_leaderboard_point
    from cs336sys.attention.flash_configs import BackwardConfig
    from cs336sys.jobs import Run

    layouts = {"split": BackwardConfig(64, 64, 64, 64, 4, 3, fused=False),
               "fused": BackwardConfig(64, 64, 64, 64, 4, 3, fused=True)}
    for name, bh, seq, d in (("lb", 16, 16384, 64), ("g16k64", 1, 16384, 64), ("g8k64", 1, 8192, 64)):
        q, k, v, do = (torch.randn(bh, seq, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
        out, lse = fwd.flash_forward(q, k, v, True, T(64, 64, 4, 3))
        for layout, config in layouts.items():
            ms = bench(partial(bwd.flash_backward, q, k, v, out, lse, do, True, config))
            record(phase="time", shape=name, kernel="backward", tiles=layout, ms=ms)
        del q, k, v, do, out, lse
        free_device_memory()
    for rep in range(2):
        for impl in ("ours", "sdpa_cudnn", "sdpa_flash"):
            metrics = run_leaderboard_point(LeaderboardSettings(impl=impl), Run(device="cuda"))
            record(phase="leaderboard", impl=impl, rep=rep, **metrics)
            free_device_memory()


def maxnreg() -> None:
    """Capping registers per thread so that more programs fit on a multiprocessor, at the
    leaderboard shape: the forward (8 warps: 1 program per SM uncapped) and each backward kind."""
    bh, seq, d = 16, 16384, 64
    q, k, v, do = (torch.randn(bh, seq, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    out, lse = fwd.flash_forward(q, k, v, True, T(64, 64, 4, 3))
    delta = delta_of(out, do)
    dq, dk, dv = (torch.empty_like(q) for _ in range(3))
    scale = LOG2E / math.sqrt(d)
    for block_m, warps in ((128, 8), (64, 4)):
        for cap in (None, 168, 128):
            def launch(cap=cap, block_m=block_m, warps=warps):
                return fwd.flash_forward_kernel[(seq // block_m, bh)](
                    q, k, v, dq, lse, seq, seq, scale, HEAD_DIM=d, BLOCK_M=block_m, BLOCK_N=64, IS_CAUSAL=True,
                    EVEN_M=True, EVEN_N=True, num_warps=warps, num_stages=3, maxnreg=cap)
            compiled = launch()
            err = rel_err(dq, out)
            record(phase="maxnreg", kernel=f"forward {block_m}x64/w{warps}", cap=cap, regs=compiled.n_regs,
                   spills=compiled.n_spills, err=err, ms=bench(launch))
    sm_scale = 1.0 / math.sqrt(d)
    for kind in ("dkdv", "dq"):
        for cap in (None, 168, 128):
            def launch(cap=cap, kind=kind):
                return bwd.backward_kernel[(seq // 64, bh)](
                    q, k, v, out, do, lse, delta, dq, dk, dv, seq, seq, sm_scale * LOG2E, sm_scale,
                    HEAD_DIM=d, IS_CAUSAL=True, PROGRAMS=kind, BLOCK_M_KV=64, BLOCK_N_KV=64, BLOCK_M_Q=64,
                    BLOCK_N_Q=64, EVEN_M_KV=True, EVEN_N_KV=True, EVEN_M_Q=True, EVEN_N_Q=True, DELTA_FROM_O=False,
                    num_warps=4, num_stages=3, maxnreg=cap)
            compiled = launch()
            record(phase="maxnreg", kernel=kind, cap=cap, regs=compiled.n_regs, spills=compiled.n_spills,
                   ms=bench(launch))


def summary() -> None:
    print("\n== host, microseconds per call (seq 128, d 64, bf16, causal)")
    for r in LOG:
        if r["phase"] == "host":
            print(f"  {r['case']:40s} {r['us']:8.1f}")
        if r["phase"] == "host_do_bench":
            print(f"  do_bench {r['case']:31s} {r['ms'] * 1e3:8.1f}")
    for r in LOG:
        if r["phase"] == "maxnreg":
            print(f"  maxnreg {r['kernel']:22s} cap {r['cap']}  regs {r['regs']} spills {r['spills']}  "
                  f"{r['ms']:.4f} ms  err {r.get('err', 0):.1e}")
        if r["phase"] == "leaderboard":
            print(f"  leaderboard {r['impl']:12s} rep {r['rep']}  {r['fwd_bwd_ms']:.3f} ms")
    times = [r for r in LOG if r["phase"] == "time"]
    for name, *_ in SHAPES + [("g8k64",)]:
        rows = [r for r in times if r["shape"] == name]
        if not rows:
            continue
        print(f"\n== {name}")
        for kernel in ("forward", "dkdv", "dq", "delta", "backward"):
            for r in sorted((r for r in rows if r["kernel"] == kernel), key=lambda r: r["ms"]):
                print(f"  {kernel:8s} {r['tiles']:28s} {r['ms']:8.4f} ms  {r.get('tflops', 0):5.0f} TFLOP/s")


def main() -> None:
    global OUT
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=".")
    parser.add_argument("--phases", default="host,kernels")
    args = parser.parse_args()
    OUT = Path(args.out)
    OUT.mkdir(parents=True, exist_ok=True)
    props = torch.cuda.get_device_properties(0)
    record(phase="env", gpu=props.name, sms=props.multi_processor_count, torch=torch.__version__,
           triton=triton.__version__)
    for name in args.phases.split(","):
        start = time.perf_counter()
        try:
            {"host": host, "kernels": kernels, "backward": backward, "maxnreg": maxnreg}[name]()
        finally:
            print(f"-- phase {name}: {time.perf_counter() - start:.1f} s", flush=True)
    summary()


if __name__ == "__main__":
    main()
