"""Check and time FlashAttention tile variants on one GPU, in one call (notes/flash_attention.md).

    PYTHONPATH=src python notes/runs/2026-11-23-h200/flash_tune.py --out DIR [--phases ceilings,sweep,compare,leaderboard]

Phases:
  ceilings     the machine's two roofs: a large bf16 matrix product and a device-to-device copy
  sweep        each candidate tile shape of each kernel (forward, dK/dV, dQ, atomic dK/dV/dQ):
               first checked against float64 at a small shape, then timed alone at the key shapes
  compare      the table's choice (cs336sys.attention.flash_configs) through the benchmark point
               function, against SDPA's backends and naive attention: forward, backward, both
  leaderboard  the 2025 leaderboard measurement for ours and SDPA's backends
  lb26         the 2026 leaderboard's attention (batch 1, 32 heads, seq 32,768, d 128, bf16, causal:
               the 8B step's shape): the wider d=128 candidates (WIDE_128) checked, then each kernel
               timed alone, then ours with the table's tiles against SDPA's cuDNN and flash backends
  lb26_kinds   the same shape: the split backward's two launches (dQ programs, dK/dV programs) each
               timed alone over its own tiles and warps (does either kind want other tiles?)
Every measurement is appended to DIR/tune.jsonl; a short table is printed last.
"""

from __future__ import annotations

import argparse
import json
import time
from functools import partial
from pathlib import Path

import torch
import triton
import triton.testing

from cs336sys.attention import bench as flash_bench
from cs336sys.attention import flash_triton_backward as bwd
from cs336sys.attention import flash_triton_forward as fwd
from cs336sys.attention.bench import attention_flops, bench_ms
from cs336sys.attention.flash_configs import BackwardConfig, Tiles, backward_config, forward_config
from cs336sys.attention.naive import naive_attention
from cs336sys.jobs import Run, Unsupported, free_device_memory, is_oom
from cs336sys.numerics import rel_err

T, B = Tiles, BackwardConfig
FORWARD = {64: [T(128, 64, 8, 3), T(64, 64, 4, 3)], 128: [T(128, 64, 8, 3), T(64, 64, 4, 3)]}
BACKWARD = {64: [B(64, 64, 64, 64, 4, 3, fused=False), B(64, 64, 64, 64, 4, 4, fused=False),
                 B(64, 64, 64, 64, 4, 3, fused=True)],
            128: [B(32, 64, 64, 64, 4, 2, fused=False), B(32, 64, 64, 64, 4, 3, fused=False),
                  B(32, 64, 64, 64, 4, 2, fused=True), B(32, 64, 64, 64, 4, 3, fused=True)]}

# More d=128 shapes for the 8B step's attention (lb26), where ours takes 1.40x cuDNN's time forward and
# 1.51x backward with the table's tiles (notes/leaderboard.md): larger key steps, 8 warps, deeper
# pipelines forward; 64-row dK/dV tiles, 8 warps and one launch per kind backward.
WIDE_128 = {
    "forward": [T(128, 64, 8, 3), T(128, 64, 8, 2), T(128, 64, 8, 4), T(128, 128, 8, 2), T(128, 128, 8, 3),
                T(128, 32, 4, 3), T(128, 64, 4, 3), T(64, 64, 4, 3), T(64, 64, 4, 4), T(256, 64, 8, 3),
                # second round (the first's fastest on an H200 was 256x64/w8/s3)
                T(256, 64, 8, 2), T(256, 64, 8, 4), T(256, 128, 8, 2), T(256, 32, 8, 3), T(128, 128, 8, 4)],
    "backward": [B(32, 64, 64, 64, 4, 2, fused=True), B(32, 64, 64, 64, 4, 2, fused=False),
                 B(32, 64, 64, 64, 4, 3, fused=False), B(64, 64, 64, 64, 4, 2, fused=False),
                 B(64, 64, 64, 64, 8, 2, fused=False), B(64, 128, 128, 64, 8, 2, fused=False),
                 B(32, 128, 128, 32, 8, 2, fused=False), B(64, 128, 128, 64, 8, 3, fused=False),
                 B(32, 64, 64, 32, 4, 3, fused=False), B(16, 64, 64, 16, 4, 3, fused=False),
                 # second round (the first's fastest on an H200 was kv64x128/q128x64/w8/s3/split)
                 B(64, 128, 128, 64, 8, 4, fused=False), B(32, 128, 128, 32, 8, 3, fused=False),
                 B(64, 128, 128, 64, 8, 3, fused=True), B(128, 128, 128, 128, 8, 2, fused=False)],
}
LB26 = ("lb26", 32, 32768, 128)

# Each launch of the split backward alone at lb26: (block_m, block_n, warps, stages). dQ programs: query
# rows per program x keys per step; dK/dV programs: query rows per step x keys per program.
KIND_TILES = {
    "dq": [(128, 64, 8, 3), (128, 64, 8, 4), (128, 32, 8, 3), (128, 32, 8, 4), (64, 64, 8, 3), (64, 64, 4, 3),
           (64, 32, 8, 3), (64, 32, 4, 3), (128, 128, 8, 2)],
    "dkdv": [(64, 128, 8, 3), (64, 128, 8, 4), (64, 64, 4, 3), (64, 64, 4, 4), (32, 64, 4, 3), (32, 128, 8, 3),
             (16, 128, 8, 3), (64, 64, 8, 3), (32, 64, 8, 3)],
}


def run_flash_point(settings: dict) -> dict:
    """The pipeline's problem-11 point function on this process's GPU, settings as a dict."""
    run = Run(device=settings.get("device", "cuda"))
    return flash_bench.run_flash_point(flash_bench.FlashSettings(**settings), run)


def run_leaderboard_point(settings: dict) -> dict:
    """The pipeline's 2025 leaderboard point function on this process's GPU, settings as a dict."""
    return flash_bench.run_leaderboard_point(flash_bench.LeaderboardSettings(**settings), Run(device="cuda"))

# (name, batch*heads, seq, d): the leaderboard shape, a many-heads d=128 shape, and the grid's
# long sequences (batch 1, 1 head), where there are few programs
SHAPES = [("lb", 16, 16384, 64), ("h16s8k128", 16, 8192, 128), ("g8k64", 1, 8192, 64),
          ("g16k128", 1, 16384, 128)]

LOG: list[dict] = []
FAILED: set[tuple[str, int, str]] = set()
OUT: Path = Path(".")


def record(**row) -> dict:
    LOG.append(row)
    with open(OUT / "tune.jsonl", "a") as f:
        f.write(json.dumps(row) + "\n")
    return row


def bench(fn) -> float:
    return bench_ms(fn, torch.device("cuda"))


def ceilings() -> None:
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    ms = bench(partial(torch.matmul, a, b))
    record(phase="ceilings", what="bf16 matmul 8192^3", ms=ms, tflops=2 * 8192**3 / ms / 1e9)
    src = torch.randn(2**30 // 4, device="cuda")  # 1 GiB
    dst = torch.empty_like(src)
    ms = bench(partial(dst.copy_, src))
    record(phase="ceilings", what="copy 1 GiB d2d", ms=ms, tb_s=2 * 2**30 / ms / 1e9)


def inputs(bh: int, seq: int, d: int, dtype=torch.bfloat16):
    q, k, v, do = (torch.randn(bh, seq, d, device="cuda", dtype=dtype) for _ in range(4))
    return q, k, v, do


def check_candidates(d: int, forward: list, backward: list) -> None:
    """Each candidate against float64 at a small causal shape with partial tiles; failures are not timed."""
    q, k, v, do = inputs(2, 1000, d)
    q64, k64, v64 = (t.double().requires_grad_() for t in (q, k, v))
    ref = naive_attention(q64, k64, v64, True)
    ref.backward(do.double())
    out = lse = None
    for t in forward:
        try:  # a tile that needs more shared memory than the GPU has fails to compile: not timed
            out_t, lse_t = fwd.flash_forward(q, k, v, True, t)
            record(phase="check", kernel="forward", d=d, tiles=str(t), err=rel_err(out_t, ref))
            if out is None:  # the first candidate that runs gives the backward its O and L
                out, lse = out_t, lse_t
        except Exception as exc:  # any failure marks the candidate; the sweep goes on
            record(phase="check", kernel="forward", d=d, tiles=str(t), err=float("nan"), error=repr(exc)[:300])
    for c in backward:
        try:
            grads = bwd.flash_backward(q, k, v, out, lse, do, True, c)
            record(phase="check", kernel="backward", d=d, tiles=str(c), err=max(
                rel_err(g, r.grad) for g, r in zip(grads, (q64, k64, v64), strict=True)))
        except Exception as exc:
            record(phase="check", kernel="backward", d=d, tiles=str(c), err=float("nan"), error=repr(exc)[:300])
    for r in LOG:
        if r.get("phase") == "check" and not r["err"] < 2e-2:  # NaN fails too
            FAILED.add((r["kernel"], r["d"], r["tiles"]))


def launch_kind(kind: str, tiles: tuple, q, k, v, o, lse, do, delta, dq, dk, dv) -> None:
    """One launch of the split backward: the dQ programs (which also store D) or the dK/dV programs."""
    bm, bn, warps, stages = tiles
    bh, seq, d = q.shape
    sm_scale = d**-0.5
    kv, qt = ((64, 128), (bm, bn)) if kind == "dq" else ((bm, bn), (128, 64))  # the other kind's: unused
    count = triton.cdiv(seq, bm if kind == "dq" else bn)
    bwd.backward_kernel[(count, bh)](
        q, k, v, o, do, lse, delta, dq, dk, dv, seq, seq, sm_scale * bwd.LOG2E, sm_scale, HEAD_DIM=d,
        IS_CAUSAL=True, PROGRAMS=kind, BLOCK_M_KV=kv[0], BLOCK_N_KV=kv[1], BLOCK_M_Q=qt[0], BLOCK_N_Q=qt[1],
        EVEN_M_KV=seq % kv[0] == 0, EVEN_N_KV=seq % kv[1] == 0, EVEN_M_Q=seq % qt[0] == 0,
        EVEN_N_Q=seq % qt[1] == 0, DELTA_FROM_O=kind == "dq", num_warps=warps, num_stages=stages)


def kind_label(kind: str, tiles: tuple) -> str:
    bm, bn, warps, stages = tiles
    return f"{kind}/{bm}x{bn}/w{warps}/s{stages}"


def lb26_kinds() -> None:
    """The split backward's two kinds of launch, each over its own tiles, checked then timed alone."""
    q, k, v, do = inputs(2, 1024, 128)
    q64, k64, v64 = (t.double().requires_grad_() for t in (q, k, v))
    naive_attention(q64, k64, v64, True).backward(do.double())
    o, lse = fwd.flash_forward(q, k, v, True, T(128, 64, 8, 3))
    for kind, candidates in KIND_TILES.items():
        for tiles in candidates:
            label = kind_label(kind, tiles)
            delta, grads = torch.empty_like(lse), [torch.zeros_like(t) for t in (q, k, v)]
            try:
                if kind == "dkdv":  # D from the reference dQ launch first
                    launch_kind("dq", KIND_TILES["dq"][0], q, k, v, o, lse, do, delta, *grads)
                launch_kind(kind, tiles, q, k, v, o, lse, do, delta, *grads)
                pairs = [(grads[0], q64)] if kind == "dq" else [(grads[1], k64), (grads[2], v64)]
                record(phase="check", kernel=kind, d=128, tiles=label, err=max(rel_err(g, r.grad) for g, r in pairs))
            except Exception as exc:
                record(phase="check", kernel=kind, d=128, tiles=label, err=float("nan"), error=repr(exc)[-300:])
    failed = {r["tiles"] for r in LOG if r.get("phase") == "check" and not r["err"] < 2e-2}
    print(f"failing the float64 check (not timed): {sorted(failed)}", flush=True)
    name, bh, seq, d = LB26
    q, k, v, do = inputs(bh, seq, d)
    o, lse = fwd.flash_forward(q, k, v, True, T(256, 64, 8, 3))
    delta, grads = torch.empty_like(lse), [torch.empty_like(t) for t in (q, k, v)]
    launch_kind("dq", KIND_TILES["dq"][0], q, k, v, o, lse, do, delta, *grads)
    flops = attention_flops(bh, seq, seq, d, True)["forward"]  # one tile product over the causal half
    products = {"dq": 3, "dkdv": 4}
    for kind, candidates in KIND_TILES.items():
        for tiles in candidates:
            label = kind_label(kind, tiles)
            if label in failed:
                continue
            ms = bench(partial(launch_kind, kind, tiles, q, k, v, o, lse, do, delta, *grads))
            record(phase="kinds", shape=name, kernel=kind, tiles=label, ms=ms,
                   tflops=products[kind] / 2 * flops / ms / 1e9)
    for kind in KIND_TILES:
        rows = sorted((r for r in LOG if r.get("phase") == "kinds" and r["kernel"] == kind), key=lambda r: r["ms"])
        print(f"\n== lb26 {kind} launch alone, fastest first")
        for r in rows:
            print(f"  {r['tiles']:24s} {r['ms']:8.3f} ms {r['tflops']:5.0f} TFLOP/s (tile products)")


def lb26() -> None:
    """The 8B step's attention shape: the wide d=128 candidates alone, then ours (table) against cuDNN."""
    check_candidates(128, WIDE_128["forward"], WIDE_128["backward"])
    print(f"failing the float64 check (not timed): {sorted(FAILED)}", flush=True)
    sweep_shape(*LB26, forward=WIDE_128["forward"], backward=WIDE_128["backward"])
    free_device_memory()
    name, bh, seq, d = LB26
    for impl, backend in (("triton", None), ("sdpa", "cudnn"), ("sdpa", "flash")):
        settings = {"device": "cuda", "impl": impl, "seq": seq, "d": d, "dtype": "bf16", "batch": 1,
                    "heads": bh, "causal": True}
        if backend:
            settings["sdpa_backend"] = backend
        compare_point(settings, "lb26_compare")


def sweep() -> None:
    for d in (64, 128):
        check_candidates(d, FORWARD[d], BACKWARD[d])
    checks = [r for r in LOG if r.get("phase") == "check"]
    print(f"{len(checks) - len(FAILED)} of {len(checks)} variants pass the float64 check; failing (not timed): "
          f"{sorted(FAILED)}", flush=True)
    for shape in SHAPES:
        sweep_shape(*shape)
        free_device_memory()


def sweep_shape(name: str, bh: int, seq: int, d: int, forward: list | None = None,
                backward: list | None = None) -> None:
    forward, backward = forward or FORWARD[d], backward or BACKWARD[d]
    q, k, v, do = inputs(bh, seq, d)
    flops = attention_flops(bh, seq, seq, d, True)
    o, lse = fwd.flash_forward(q, k, v, True, next(t for t in forward if ("forward", d, str(t)) not in FAILED))
    for t in forward:
        if ("forward", d, str(t)) in FAILED:
            continue
        ms = bench(partial(fwd.flash_forward, q, k, v, True, t))
        record(phase="sweep", shape=name, kernel="forward", tiles=str(t), ms=ms, tflops=flops["forward"] / ms / 1e9)
    for c in backward:  # the whole backward: delta kernel + one launch of dK/dV and dQ programs
        if ("backward", d, str(c)) in FAILED:
            continue
        ms = bench(partial(bwd.flash_backward, q, k, v, o, lse, do, True, c))
        record(phase="sweep", shape=name, kernel="backward", tiles=str(c), ms=ms,
               tflops=flops["backward"] / ms / 1e9)


def compare_point(settings: dict, phase: str = "compare") -> None:
    start = time.perf_counter()
    try:
        metrics = run_flash_point(settings)
        record(phase=phase, settings=settings, wall_s=time.perf_counter() - start, **metrics)
    except Unsupported as exc:
        record(phase=phase, settings=settings, status="unsupported", reason=str(exc))
    except Exception as exc:
        if not is_oom(exc):
            raise
        record(phase=phase, settings=settings, status="oom")
    free_device_memory()


def compare() -> None:
    for seq in (8192, 16384, 32768, 65536):
        for d in (64, 128):
            for impl, backend in (("triton", None), ("sdpa", "flash"), ("sdpa", "cudnn"), ("naive", None)):
                if impl == "naive" and seq > 16384:
                    continue
                settings = {"device": "cuda", "impl": impl, "seq": seq, "d": d, "dtype": "bf16", "batch": 1,
                            "heads": 1, "causal": True}
                if backend:
                    settings["sdpa_backend"] = backend
                compare_point(settings)
    for impl in ("triton", "naive"):  # float32 (tf32 products in ours), for the ratio to naive
        compare_point({"device": "cuda", "impl": impl, "seq": 16384, "d": 64, "dtype": "fp32"})


def grid() -> None:
    """The Triton part of the flash grid (seq 128..65536 x d 16..128 x bf16/fp32), timed whole."""
    start = time.perf_counter()
    for dtype in ("bf16", "fp32"):
        for d in (16, 32, 64, 128):
            for e in range(7, 17):
                compare_point({"device": "cuda", "impl": "triton", "seq": 2**e, "d": d, "dtype": dtype},
                              "grid_point")
    record(phase="grid", what="triton points, 80", wall_s=time.perf_counter() - start)


def leaderboard() -> None:
    for impl in ("ours", "sdpa_flash", "sdpa_cudnn", "sdpa_efficient", "naive"):
        settings = {"device": "cuda", "impl": impl}
        try:
            record(phase="leaderboard", settings=settings, **run_leaderboard_point(settings))
        except Unsupported as exc:
            record(phase="leaderboard", settings=settings, status="unsupported", reason=str(exc))
        free_device_memory()


def leaderboard_backward() -> None:
    """The leaderboard measurement with the backward in one launch or one per kind, alternated."""
    from cs336sys.attention import flash_configs

    table = flash_configs.backward_config
    variants = {"split": B(64, 64, 64, 64, 4, 3, fused=False), "fused": B(64, 64, 64, 64, 4, 3, fused=True)}
    try:
        for rep in range(3):
            for name, config in variants.items():
                flash_configs.backward_config = lambda *args, config=config: config
                metrics = run_leaderboard_point({"device": "cuda", "impl": "ours"})
                record(phase="lb_backward", variant=name, rep=rep, **metrics)
    finally:
        flash_configs.backward_config = table
    for impl in ("sdpa_cudnn", "sdpa_flash"):
        record(phase="lb_backward", variant=impl, rep=0, **run_leaderboard_point({"device": "cuda", "impl": impl}))


def summary() -> None:
    print("\n== ceilings")
    for r in LOG:
        if r["phase"] == "ceilings":
            rate = f"{r['tflops']:.0f} TFLOP/s" if "tflops" in r else f"{r['tb_s']:.2f} TB/s"
            print(f"  {r['what']:22s} {r['ms']:8.3f} ms  {rate}")
    sweeps = [r for r in LOG if r["phase"] == "sweep"]
    if sweeps:
        print("\n== sweep: fastest tiles per kernel (ms, TFLOP/s credited) and the table's entry")
        for name, bh, seq, d in SHAPES:
            table = {"forward": str(forward_config(d, torch.bfloat16, seq, bh, True)),
                     "backward": str(backward_config(d, torch.bfloat16, seq, bh, True))}
            for kernel in ("forward", "backward"):
                rows = sorted((r for r in sweeps if r["shape"] == name and r["kernel"] == kernel),
                              key=lambda r: r["ms"])
                if rows:
                    mine = next((r for r in rows if r["tiles"] == table[kernel]), None)
                    print(f"  {name:9s} {kernel:8s} best {rows[0]['ms']:7.3f} ms {rows[0]['tflops']:4.0f}  "
                          f"{rows[0]['tiles']:26s}" + (f" table {mine['ms']:7.3f} ms" if mine else ""))
    rows = [r for r in LOG if r["phase"] == "compare" and "fwd_bwd_ms" in r]
    if rows:
        print("\n== compare (causal, batch 1, 1 head): ms fwd / bwd / fwd+bwd, and ours / this")
        ours = {(r["settings"]["seq"], r["settings"]["d"], r["settings"]["dtype"]): r for r in rows
                if r["settings"]["impl"] == "triton"}
        for r in rows:
            s = r["settings"]
            label = s["impl"] + (":" + r.get("sdpa_backend", "") if s["impl"] == "sdpa" else "")
            mine = ours.get((s["seq"], s["d"], s["dtype"]))
            ratio = (f"  ratio fwd {mine['forward_ms'] / r['forward_ms']:5.2f} fwd+bwd "
                     f"{mine['fwd_bwd_ms'] / r['fwd_bwd_ms']:5.2f}") if mine and mine is not r else ""
            print(f"  seq {s['seq']:6d} d {s['d']:3d} {s['dtype']} {label:15s} {r['forward_ms']:8.3f} "
                  f"{r['backward_ms']:8.3f} {r['fwd_bwd_ms']:8.3f}{ratio}")
    for r in LOG:
        if r["phase"] == "compare" and "status" in r:
            print(f"  {r['settings']}: {r['status']} {r.get('reason', '')[:100]}")
        if r["phase"] == "grid":
            print(f"\n== grid: {r['what']} in {r['wall_s']:.0f} s (compilation included)")
    rows = [r for r in LOG if r["phase"] == "lb_backward"]
    if rows:
        print("\n== leaderboard, backward launch layout (ms fwd+bwd, in run order)")
        for r in rows:
            print(f"  {r['variant']:10s} rep {r['rep']}  {r['fwd_bwd_ms']:.3f} ms")
    sweeps26 = [r for r in LOG if r["phase"] == "sweep" and r["shape"] == LB26[0]]
    for kernel in ("forward", "backward"):
        rows = sorted((r for r in sweeps26 if r["kernel"] == kernel), key=lambda r: r["ms"])
        if rows:
            table = (forward_config if kernel == "forward" else backward_config)(128, torch.bfloat16, LB26[2],
                                                                                   LB26[1], True)
            print(f"\n== lb26 {kernel}: every candidate, fastest first (the table's entry: {table})")
            for r in rows:
                print(f"  {r['tiles']:30s} {r['ms']:8.3f} ms {r['tflops']:5.0f} TFLOP/s")
    for r in LOG:
        if r["phase"] == "lb26_compare":
            s = r["settings"]
            label = s["impl"] + (":" + s["sdpa_backend"] if "sdpa_backend" in s else "")
            times = (f"{r['forward_ms']:8.3f} / {r['backward_ms']:8.3f} / {r['fwd_bwd_ms']:8.3f} ms"
                     if "fwd_bwd_ms" in r else r.get("status", ""))
            print(f"  lb26 {label:12s} fwd / bwd / both {times}")
    rows = [r for r in LOG if r["phase"] == "leaderboard"]
    if rows:
        print("\n== leaderboard (1 x 16 heads x 16384 x 64, bf16, causal, fwd+bwd)")
        for r in rows:
            result = (f"{r['fwd_bwd_ms']:.3f} ms  {r['fwd_bwd_tflops']:.0f} TFLOP/s" if "fwd_bwd_ms" in r
                      else r.get("reason", r.get("status", "")))
            print(f"  {r['settings']['impl']:16s} {result}")


def main() -> None:
    global OUT
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default=".")
    parser.add_argument("--phases", default="ceilings,sweep,compare,leaderboard,grid")
    args = parser.parse_args()
    OUT = Path(args.out)
    OUT.mkdir(parents=True, exist_ok=True)
    props = torch.cuda.get_device_properties(0)
    record(phase="env", gpu=props.name, sms=props.multi_processor_count, torch=torch.__version__,
           triton=triton.__version__, cuda=torch.version.cuda)
    print(LOG[-1], flush=True)
    phases = {"ceilings": ceilings, "sweep": sweep, "compare": compare, "leaderboard": leaderboard,
              "grid": grid, "lb_backward": leaderboard_backward, "lb26": lb26, "lb26_kinds": lb26_kinds}
    for name in args.phases.split(","):
        start = time.perf_counter()
        try:
            phases[name]()
        finally:
            print(f"-- phase {name}: {time.perf_counter() - start:.1f} s", flush=True)
    summary()


if __name__ == "__main__":
    main()
