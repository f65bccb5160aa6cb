"""Do tensor-descriptor (TMA) loads and Triton's warp specialisation make our FlashAttention-2
faster on Hopper? One GPU, one call, both leaderboard shapes (issue 23, notes/flash_attention.md).

    PYTHONPATH=src python notes/runs/2026-11-24-h100/flash_hopper_probe.py --out DIR [--shapes lb25,lb26]

For each shape (lb25: the 2025 harness's q, k, v of (16, 16384, 64), heads folded into the batch;
lb26: the 8B step's (1, 32, 32768, 128)), bf16, causal:
  1. SDPA's cuDNN and flash backends: forward alone, forward + backward (loss O.sum() as the
     harness; backward = the difference), do_bench medians;
  2. our present kernels with the table's tiles (and the 8B tiles at d 128): forward alone, the
     backward's launches timed alone;
  3. each `flash_triton_tma` candidate (tiles x warps x stages x warp_specialize), first checked
     against float64 at a small ragged shape, then each launch timed alone; for every compiled
     candidate what the compiler made of it: registers, spills, and counts in its TTGIR/PTX of
     warp-specialised regions, TMA copies, wgmma and setmaxnreg.
Rows go to DIR/probe.jsonl; the TTGIR of each shape's fastest warp-specialised forward to DIR.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

import torch
import triton.testing

from cs336sys.attention import flash_triton_backward as ptr_bwd
from cs336sys.attention import flash_triton_forward as ptr_fwd
from cs336sys.attention import flash_triton_tma as tma
from cs336sys.attention.bench import attention_flops
from cs336sys.attention.flash_configs import BackwardConfig, Tiles, backward_config, forward_config
from cs336sys.numerics import rel_err

SHAPES = {"lb25": (16, 16384, 64), "lb26": (1, 32, 32768, 128)}
C = tma.TmaConfig
# (rows, keys or rows per step, warps, stages): around each kind's fastest pointer tiles (notes/).
FORWARD = {64: [(128, 64, 8, 3), (128, 64, 4, 3), (128, 128, 8, 2), (64, 64, 4, 3), (128, 64, 8, 4)],
           128: [(128, 64, 8, 3), (128, 128, 8, 2), (256, 64, 8, 3), (128, 64, 4, 3), (128, 64, 8, 2)]}
DQ = {64: [(64, 64, 4, 3), (128, 64, 8, 3), (128, 32, 4, 3)],
      128: [(64, 64, 4, 3), (128, 64, 8, 3), (128, 64, 8, 2)]}
DKDV = {64: [(64, 64, 4, 3), (64, 128, 8, 3), (32, 64, 4, 3)],
        128: [(32, 64, 4, 3), (64, 128, 8, 3), (64, 128, 8, 2)]}
OUT: Path


def record(**row) -> dict:
    row["time"] = time.strftime("%H:%M:%S")
    with open(OUT / "probe.jsonl", "a") as f:
        f.write(json.dumps(row) + "\n")
    print(json.dumps(row), flush=True)
    return row


def bench(fn) -> float:
    return float(triton.testing.do_bench(fn, warmup=25, rep=100, return_mode="median"))


def compiled_facts(handle) -> dict:
    """What the compiler made of a launch: the evidence for or against warp specialisation."""
    if handle is None or not hasattr(handle, "asm"):
        return {}
    ttgir, ptx = handle.asm.get("ttgir", ""), handle.asm.get("ptx", "")
    return {"regs": getattr(handle, "n_regs", None), "spills": getattr(handle, "n_spills", None),
            "ttgir_warp_specialize": ttgir.count("ttg.warp_specialize"),
            "ttgir_tma_loads": ttgir.count("async_tma_copy_global_to_local"),
            "ttgir_warp_group_dot": ttgir.count("warp_group_dot"),
            "ptx_tma": ptx.count("cp.async.bulk.tensor"), "ptx_wgmma": ptx.count("wgmma.mma_async"),
            "ptx_setmaxnreg": ptx.count("setmaxnreg")}


def inputs(shape, dtype=torch.bfloat16, seed=0):
    g = torch.Generator(device="cuda").manual_seed(seed)
    return [torch.randn(shape, device="cuda", dtype=dtype, generator=g) for _ in range(4)]


def check(config: tma.TmaConfig, d: int) -> float:
    """Largest relative error (O, dQ, dK, dV) against float64 at a small ragged shape, bf16."""
    q, k, v, do = inputs((2, 3, 1000, d), seed=1)
    o, lse = tma.tma_forward(q, k, v, True, config)
    dq, dk, dv = tma.tma_backward(q, k, v, o, lse, do, True, config)
    q64, k64, v64 = (t.double().requires_grad_() for t in (q, k, v))
    ref = torch.nn.functional.scaled_dot_product_attention(q64, k64, v64, is_causal=True)
    ref.backward(do.double())
    return max(rel_err(a.double(), b) for a, b in ((o, ref), (dq, q64.grad), (dk, k64.grad), (dv, v64.grad)))


def sdpa(shape_name, q, k, v, do, flops) -> dict:
    from torch.nn.attention import SDPBackend, sdpa_kernel
    if q.dim() == 3:  # the 2025 harness folds heads into the batch; SDPA's fused kernels want 4-D
        q, k, v, do = (t.unsqueeze(1) for t in (q, k, v, do))
    out = {}
    for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
        qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
        with sdpa_kernel(backend):
            fwd = bench(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True))

            def both(qg=qg, kg=kg, vg=vg):
                qg.grad = kg.grad = vg.grad = None
                torch.nn.functional.scaled_dot_product_attention(qg, kg, vg, is_causal=True).backward(do)
            fb = bench(both)
        out[name] = record(shape=shape_name, impl=f"sdpa_{name}", fwd_ms=fwd, fwd_bwd_ms=fb, bwd_ms=fb - fwd,
                           fwd_tflops=flops["forward"] / fwd / 1e9, bwd_tflops=flops["backward"] / (fb - fwd) / 1e9)
    return out


def present(shape_name, q, k, v, do, d, bh, seq) -> None:
    """Our pointer kernels: the table's tiles, and at d 128 the 8B tiles from notes/leaderboard.md."""
    configs = [("table", forward_config(d, q.dtype, seq, bh, True), backward_config(d, q.dtype, seq, bh, True))]
    if d == 128:
        configs.append(("8B tiles", Tiles(256, 64, 8, 3), BackwardConfig(64, 128, 128, 64, 8, 3, fused=False)))
    for label, ft, bc in configs:
        fwd = bench(lambda ft=ft: ptr_fwd.flash_forward(q, k, v, True, ft))
        o, lse = ptr_fwd.flash_forward(q, k, v, True, ft)
        bwd = bench(lambda ft=ft, bc=bc, o=o, lse=lse: ptr_bwd.flash_backward(q, k, v, o, lse, do, True, bc))
        record(shape=shape_name, impl="ours_pointer", tiles=label, forward=str(ft), backward=str(bc),
               fwd_ms=fwd, bwd_ms=bwd)


def candidates(shape_name, q, k, v, do, d, ws_values, kinds=()) -> None:
    o_ref, lse_ref = ptr_fwd.flash_forward(q, k, v, True, forward_config(d, q.dtype, q.shape[-2], 1, True))
    _, delta = tma.tma_dq(q, k, v, o_ref, lse_ref, do, True, C())
    best_ws = (math.inf, None)
    for ws in ws_values:
        for kind, table in (("forward", FORWARD), ("forward_prefetch", FORWARD), ("dq", DQ), ("dkdv", DKDV)):
            if kinds and kind not in kinds:
                continue
            for m, n, w, s in table[d]:
                if kind.startswith("forward"):
                    c = C(block_m=m, block_n=n, num_warps=w, num_stages=s, warp_specialize=ws,
                          prefetch=kind == "forward_prefetch")
                    fn = lambda c=c: tma.tma_forward(q, k, v, True, c)  # noqa: E731
                elif kind == "dq":
                    c = C(q_m=m, q_n=n, q_warps=w, q_stages=s, warp_specialize=ws)
                    fn = lambda c=c: tma.tma_dq(q, k, v, o_ref, lse_ref, do, True, c)  # noqa: E731
                else:
                    c = C(kv_m=m, kv_n=n, kv_warps=w, kv_stages=s, warp_specialize=ws)
                    fn = lambda c=c: tma.tma_dkdv(q, k, v, lse_ref, delta, do, True, c)  # noqa: E731
                row = dict(shape=shape_name, impl="ours_tma", kind=kind, tiles=f"{m}x{n}/w{w}/s{s}", ws=ws)
                try:
                    err = check(c, d)
                    fn()
                    facts = compiled_facts(tma.LAUNCHED.get(kind.split("_")[0]))
                    if err > 2e-2:
                        record(**row, rel_err=err, status="wrong", **facts)
                        continue
                    ms = bench(fn)
                except Exception as e:  # a candidate that does not compile or run is a result too
                    record(**row, status="error", error=f"{type(e).__name__}: {str(e)[:300]}")
                    torch.cuda.empty_cache()
                    continue
                record(**row, status="ok", ms=ms, rel_err=err, **facts)
                if ws and kind == "forward" and ms < best_ws[0]:
                    best_ws = (ms, tma.LAUNCHED.get(kind))
    if best_ws[1] is not None and hasattr(best_ws[1], "asm"):
        (OUT / f"{shape_name}_forward_ws.ttgir").write_text(best_ws[1].asm.get("ttgir", ""))


def ws_evidence(shape_name, q, k, v, do, d) -> None:
    """Does Triton warp-specialise our loops on this GPU? Each kind at its first tiles, causal with
    the main loop or both loops specialised, and non-causal (one loop), beside the same launch
    without: compiled or not (the compiler's error), what the TTGIR holds, and the time."""
    o_ref, lse_ref = ptr_fwd.flash_forward(q, k, v, True, forward_config(d, q.dtype, q.shape[-2], 1, True))
    _, delta = tma.tma_dq(q, k, v, o_ref, lse_ref, do, True, C())
    for causal in (True, False):
        for ws, diag in ((False, False), (True, False), (True, True)):
            if diag and not causal:
                continue
            (m, n, w, s), (qm, qn, qw, qs), (km, kn, kw, ks) = FORWARD[d][0], DQ[d][0], DKDV[d][0]
            c = C(block_m=m, block_n=n, num_warps=w, num_stages=s, q_m=qm, q_n=qn, q_warps=qw, q_stages=qs,
                  kv_m=km, kv_n=kn, kv_warps=kw, kv_stages=ks, warp_specialize=ws, ws_diagonal=diag)
            for kind, fn in (("forward", lambda c=c, causal=causal: tma.tma_forward(q, k, v, causal, c)),
                             ("dq", lambda c=c, causal=causal: tma.tma_dq(q, k, v, o_ref, lse_ref, do, causal, c)),
                             ("dkdv", lambda c=c, causal=causal: tma.tma_dkdv(q, k, v, lse_ref, delta, do, causal, c))):
                row = dict(shape=shape_name, impl="ours_tma", phase="ws_evidence", kind=kind, causal=causal,
                           ws=ws, ws_diagonal=diag, config=str(c))
                try:
                    fn()
                    torch.cuda.synchronize()
                    ms = bench(fn)
                except Exception as e:
                    record(**row, status="error", error=f"{type(e).__name__}: {str(e)[:300]}")
                    continue
                record(**row, status="ok", ms=ms, **compiled_facts(tma.LAUNCHED.get(kind)))


def main() -> None:
    global OUT
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--shapes", default="lb25,lb26")
    ap.add_argument("--ws", default="0", help="warp_specialize values for the tile sweep")
    ap.add_argument("--ws-evidence", action="store_true", help="only the warp-specialisation evidence")
    ap.add_argument("--kinds", default="", help="only these kinds (forward, forward_prefetch, dq, dkdv)")
    ap.add_argument("--no-baselines", action="store_true", help="skip SDPA and our present kernels")
    args = ap.parse_args()
    OUT = args.out
    OUT.mkdir(parents=True, exist_ok=True)
    record(kind="env", gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__)
    for name in args.shapes.split(","):
        shape = SHAPES[name]
        *lead, seq, d = shape
        q, k, v, do = inputs(shape)
        flops = attention_flops(math.prod(lead), seq, seq, d, True)
        record(shape=name, kind="flops", **flops)
        if args.ws_evidence:
            ws_evidence(name, q, k, v, do, d)
            continue
        if not args.no_baselines:
            sdpa(name, q, k, v, do, flops)
            present(name, q, k, v, do, d, math.prod(lead), seq)
        candidates(name, q, k, v, do, d, [bool(int(w)) for w in args.ws.split(",")],
                   [k for k in args.kinds.split(",") if k])
        del q, k, v, do
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
