"""The Gluon FlashAttention kernels beside cuDNN, SDPA flash and our `triton.language` kernels, one process.

Run on a Hopper GPU host (notes/flash_attention.md, "Gluon kernels (Hopper)", "Gluon backward (Hopper)"):

    PYTHONPATH=src python3 notes/runs/2026-11-27-h100-leaderboard-clocks/flash_gluon_bench.py --out $OUT [--shapes lb25,lb26] [--variants all]
    PYTHONPATH=src python3 notes/runs/2026-11-27-h100-leaderboard-clocks/flash_gluon_bench.py --out $OUT --backward-only   # the backward alone

1. Each Gluon variant (tiles x ring depth x warps x loop schedule) is checked against float64 at small
   ragged shapes, causal and not, both head dims, bf16 and fp16 (O and L); a variant that fails to
   compile or to match is reported and skipped.
2. At each leaderboard shape, causal bf16: cuDNN and SDPA flash (forward, forward+backward), our
   pointer kernels with the table's tiles (and at d 128 the 8B step's tiles), and each Gluon variant
   (forward; forward+backward through `FlashAttentionGluon` with the Gluon backward and with the `tl`
   one). Medians of `triton.testing.do_bench`; ratios to cuDNN's time in this process.
3. The backward alone at each shape (unless --no-backward): cuDNN's (autograd.grad over one retained
   SDPA graph), then from the Gluon forward's O and L the `tl` backward (table tiles; at d 128 also the
   8B step's) and each Gluon backward variant, launchers called directly; the Gluon and `tl` defaults
   also through autograd.grad as cuDNN's. Each Gluon variant's dQ, dK, dV are compared with the `tl`
   backward's at that shape (max abs difference; no float64 there), after the float64 check of step 1
   at small shapes (dQ, dK, dV).
Rows go to OUT/rows.jsonl; tables are printed last. A row timed by `bench` also carries the SM clock and
power (medians of nvidia-smi's samples every 100 ms during its last timing, where nvidia-smi runs): a
back-to-back timing holds an H100 at its 700 W cap, with the clock ~15 % under its unloaded one
(notes/flash_attention.md, "The d 128 backward takes L and D in the ring").
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import statistics
import time
import traceback
from pathlib import Path

import torch
import triton
import triton.testing

from cs336sys.attention.flash_configs import BackwardConfig, Tiles
from cs336sys.attention.flash_gluon import (
    BACKWARD_TILES,
    BACKWARD_VARIANTS,
    FORWARD_TILES,
    LAUNCHED,
    FlashAttentionGluon,
    GluonBackwardTiles,
    GluonTiles,
    flash_attention_gluon_backward,
    flash_attention_gluon_forward,
)
from cs336sys.attention.flash_triton import (
    FlashAttention2Triton,
    flash_attention_triton_backward,
    flash_attention_triton_forward,
)
from cs336sys.attention.naive import attention_logsumexp, naive_attention
from cs336sys.gpu_clocks import ClockSampler
from cs336sys.numerics import rel_err

SHAPES = {"lb25": (16, 16384, 64), "lb26": (1, 32, 32768, 128)}
VARIANTS = {  # name -> tiles per head dim
    "serial": {64: GluonTiles(128, 128, 3, 8, False), 128: GluonTiles(128, 128, 2, 8, False)},
    "overlap": {64: GluonTiles(128, 128, 3, 8, True), 128: GluonTiles(128, 128, 2, 8, True)},
    "overlap_n64": {64: GluonTiles(128, 64, 4, 8, True), 128: GluonTiles(128, 64, 3, 8, True)},
    "overlap_w4": {64: GluonTiles(64, 128, 3, 4, True), 128: GluonTiles(64, 128, 2, 4, True)},
    "ws": {64: GluonTiles(128, 128, 3, 4, True, 240), 128: GluonTiles(128, 128, 2, 4, True, 240)},
    "ws_n64": {64: GluonTiles(128, 64, 4, 4, True, 240), 128: GluonTiles(128, 64, 4, 4, True, 240)},
    "ws_deep": {64: GluonTiles(128, 128, 4, 4, True, 240), 128: GluonTiles(128, 128, 3, 4, True, 240)},
    "ws_n64_deep": {64: GluonTiles(128, 64, 8, 4, True, 240), 128: GluonTiles(128, 64, 6, 4, True, 240)},
    "ws_r200": {64: GluonTiles(128, 128, 3, 4, True, 200), 128: GluonTiles(128, 128, 2, 4, True, 200)},
    "ws_tiles_first": {64: GluonTiles(128, 128, 3, 4, True, 240, tiles_first=True),
                       128: GluonTiles(128, 128, 3, 4, True, 240, tiles_first=True)},
    "ws_tiles_first_deep": {64: GluonTiles(128, 128, 4, 4, True, 240, tiles_first=True),
                            128: GluonTiles(128, 128, 3, 4, True, 240, tiles_first=True)},
    "ws_d128s3": {64: GluonTiles(128, 128, 3, 4, True, 240), 128: GluonTiles(128, 128, 3, 4, True, 240)},
    # ws_tiles_first_deep with one schedule option or more (GluonTiles; notes/flash_attention.md, "The
    # forward's PV wait"): P cast just before its product, the consumers taking turns, the PV wait kept
    # after the softmax; ws_pin_p_late is the default
    **{"ws_" + "_".join(options): {d: dataclasses.replace(
        t, **dict.fromkeys(("p_late", "pingpong", "pin"), False) | dict.fromkeys(options, True))
                                   for d, t in FORWARD_TILES.items()}
       for options in (("p_late",), ("pingpong",), ("pin",), ("pin", "p_late"), ("pin", "pingpong"),
                       ("pin", "pingpong", "p_late"))},
    # two CTAs an SM at d 64: 12 warps (Triton rounds the 9 up to whole warpgroups) x 80 registers at
    # launch, 64-key tiles (32 bytes of spills; with P cast late 180, and at d 128 over 500)
    "ws_two_ctas": {64: GluonTiles(128, 64, 3, 4, True, 104, tiles_first=True, max_regs=80)},
}


def compiled_facts(tiles: GluonTiles | GluonBackwardTiles, d: int) -> dict:
    handle = LAUNCHED.get((str(tiles), d, True))
    if handle is None:
        return {}
    return {key: getattr(handle, key, None) for key in ("n_regs", "n_spills")} | {
        "shared": getattr(getattr(handle, "metadata", None), "shared", None)}
CHECK_SHAPES = [  # (leading dims, seq_q, seq_k, causal)
    ((2, 3), 1000, 1000, True),
    ((2, 3), 1000, 1000, False),
    ((3,), 300, 700, True),
    ((1, 2), 700, 300, True),
    ((1, 2), 520, 900, False),
]
ROWS: list[dict] = []
OUT: Path


SAMPLER: ClockSampler | None = None
WINDOW: tuple[float, float] | None = None  # the last `bench` call's host times


def record(**row) -> dict:
    global WINDOW
    if SAMPLER is not None and WINDOW is not None and row.get("kind") != "env":
        row.update(SAMPLER.summary(*WINDOW))
        WINDOW = None
    ROWS.append(row)
    print(json.dumps(row), flush=True)
    with open(OUT / "rows.jsonl", "a") as f:
        f.write(json.dumps(row) + "\n")
    return row


def bench(fn) -> float:
    # about 25 calls at the 2026 shape (40-60 ms each), hundreds at the 2025 shape
    start = time.perf_counter()
    global WINDOW
    ms = float(triton.testing.do_bench(fn, warmup=200, rep=1000, return_mode="median"))
    WINDOW = (start, time.perf_counter())
    return ms


def check(tiles: GluonTiles, d: int) -> float:
    """Largest relative error of O and L against float64 over CHECK_SHAPES, bf16 and fp16."""
    worst = 0.0
    for dtype in (torch.bfloat16, torch.float16):
        for lead, seq_q, seq_k, causal in CHECK_SHAPES:
            q = torch.randn(*lead, seq_q, d, device="cuda", dtype=dtype)
            k, v = (torch.randn(*lead, seq_k, d, device="cuda", dtype=dtype) for _ in range(2))
            out, lse = flash_attention_gluon_forward(q, k, v, causal, tiles)
            q64, k64, v64 = q.double(), k.double(), v.double()
            err = max(rel_err(out.double(), naive_attention(q64, k64, v64, causal)),
                      rel_err(lse.double(), attention_logsumexp(q64, k64, causal)))
            if not math.isfinite(err):
                return math.inf
            worst = max(worst, err)
    return worst


def check_backward(tiles: GluonBackwardTiles, d: int) -> float:
    """Largest relative error of dQ, dK, dV (from the Gluon forward's O and L) against float64 over
    CHECK_SHAPES, bf16 and fp16."""
    worst = 0.0
    for dtype in (torch.bfloat16, torch.float16):
        for lead, seq_q, seq_k, causal in CHECK_SHAPES:
            q = torch.randn(*lead, seq_q, d, device="cuda", dtype=dtype)
            k, v = (torch.randn(*lead, seq_k, d, device="cuda", dtype=dtype) for _ in range(2))
            do = torch.randn_like(q)
            out, lse = flash_attention_gluon_forward(q, k, v, causal)
            grads = flash_attention_gluon_backward(q, k, v, out, lse, do, causal, tiles)
            q64, k64, v64 = (t.double().requires_grad_() for t in (q, k, v))
            naive_attention(q64, k64, v64, causal).backward(do.double())
            err = max(rel_err(g.double(), r.grad) for g, r in zip(grads, (q64, k64, v64), strict=True))
            if not math.isfinite(err):
                return math.inf
            worst = max(worst, err)
    return worst


def cudnn_forward(q, k, v):
    """cuDNN's causal forward as a callable (3-D inputs get a heads axis, as in `cudnn_backward`)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q4, k4, v4 = (t if t.dim() == 4 else t.unsqueeze(1) for t in (q, k, v))

    def run():
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            torch.nn.functional.scaled_dot_product_attention(q4, k4, v4, is_causal=True)
    return run


def cudnn_backward(q, k, v, do):
    """cuDNN's backward alone, as a callable: autograd.grad over one retained causal SDPA graph (3-D
    inputs, the 2025 harness's, get a heads axis: SDPA's fused kernels want 4-D)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q4, k4, v4, do4 = (t if t.dim() == 4 else t.unsqueeze(1) for t in (q, k, v, do))
    inputs = tuple(t.detach().requires_grad_() for t in (q4, k4, v4))
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        graph = torch.nn.functional.scaled_dot_product_attention(*inputs, is_causal=True)
    return lambda: torch.autograd.grad(graph, inputs, do4, retain_graph=True)


def backward_rows(shape_name, q, k, v, do, variants: list[GluonBackwardTiles]) -> list[tuple]:
    """The backward alone at one shape, causal: cuDNN, `tl`, each Gluon variant (see the docstring)."""
    d = q.shape[-1]
    table = []
    cudnn = bench(cudnn_backward(q, k, v, do))
    record(shape=shape_name, impl="cudnn", kind="bwd", bwd_ms=cudnn)
    table.append((shape_name, "cudnn (autograd)", "", cudnn, math.nan))

    for backward in ("gluon", "tl"):  # the defaults through autograd, as cuDNN's
        inputs = tuple(t.detach().requires_grad_() for t in (q, k, v))
        graph = FlashAttentionGluon.apply(*inputs, True, backward)
        ms = bench(lambda graph=graph, inputs=inputs: torch.autograd.grad(graph, inputs, do, retain_graph=True))
        graph = inputs = None
        record(shape=shape_name, impl=f"{backward}_autograd", kind="bwd", bwd_ms=ms, bwd_vs_cudnn=ms / cudnn)
        table.append((shape_name, f"{backward} (autograd)", "default", ms, math.nan))

    out, lse = flash_attention_gluon_forward(q, k, v, True)
    tl_configs = [("table", None)]
    if d == 128:
        tl_configs.append(("8B tiles", BackwardConfig(64, 128, 128, 64, 8, 3, fused=False)))
    reference = None
    for label, config in tl_configs:
        grads = flash_attention_triton_backward(q, k, v, out, lse, do, True, config)
        reference = reference or grads
        ms = bench(lambda config=config: flash_attention_triton_backward(q, k, v, out, lse, do, True, config))
        record(shape=shape_name, impl="tl", kind="bwd", tiles=label, bwd_ms=ms, bwd_vs_cudnn=ms / cudnn)
        table.append((shape_name, "tl", label, ms, math.nan))
    scale = {name: r.float().abs().max().item() for name, r in zip(("dq", "dk", "dv"), reference, strict=True)}
    for tiles in variants:
        try:
            grads = flash_attention_gluon_backward(q, k, v, out, lse, do, True, tiles)
            diff = {name: (g.float() - r.float()).abs().max().item()
                    for name, g, r in zip(("dq", "dk", "dv"), grads, reference, strict=True)}
            grads = None
            ms = bench(lambda tiles=tiles: flash_attention_gluon_backward(q, k, v, out, lse, do, True, tiles))
        except Exception as exc:
            traceback.print_exc()
            record(shape=shape_name, impl="gluon", kind="bwd", tiles=str(tiles),
                   error=f"{type(exc).__name__}: {exc}"[:2000])
            continue
        record(shape=shape_name, impl="gluon", kind="bwd", tiles=str(tiles), bwd_ms=ms, bwd_vs_cudnn=ms / cudnn,
               max_abs_diff_vs_tl=diff, max_abs_tl=scale, **compiled_facts(tiles, d))
        table.append((shape_name, "gluon", str(tiles), ms, max(diff.values())))
    return [(s, impl, tiles, ms, ms / cudnn, diff) for s, impl, tiles, ms, diff in table]


def sdpa_rows(shape_name, q, k, v, do) -> float:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if q.dim() == 3:  # the 2025 harness folds heads into the batch; SDPA's fused kernels want 4-D
        q, k, v, do = (t.unsqueeze(1) for t in (q, k, v, do))
    cudnn = math.nan
    for name, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
        qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))
        with sdpa_kernel(backend):
            fwd = bench(lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True))

            def both(qg=qg, kg=kg, vg=vg):
                qg.grad = kg.grad = vg.grad = None
                torch.nn.functional.scaled_dot_product_attention(qg, kg, vg, is_causal=True).backward(do)
            fb = bench(both)
        record(shape=shape_name, impl=f"sdpa_{name}", fwd_ms=fwd, fwd_bwd_ms=fb)
        if name == "cudnn":
            cudnn = fwd
            cudnn_fb = fb
    return cudnn, cudnn_fb


def forward_rounds(shape_name: str, q, k, v, variants: dict, rounds: int) -> None:
    """The forward of cuDNN and of each variant (name -> tiles) timed in turn, `rounds` times, after 5 s of
    warm-up: a few-percent difference between variants is then not the order they ran in (the first
    kernel timed on a cool GPU ran 4-6 % faster; notes/flash_attention.md, "The order of measurement")."""
    calls = {"cudnn": cudnn_forward(q, k, v)}
    for name, tiles in variants.items():
        calls[name] = lambda tiles=tiles: flash_attention_gluon_forward(q, k, v, True, tiles)
    end = time.perf_counter() + 5.0
    while time.perf_counter() < end:
        for fn in calls.values():
            fn()
        torch.cuda.synchronize()
    times = {name: [] for name in calls}
    for _ in range(rounds):
        for name, fn in calls.items():
            times[name].append(bench(fn))
    base = statistics.median(times["cudnn"])
    for name, ts in times.items():
        ms = statistics.median(ts)
        record(kind="forward_rounds", shape=shape_name, variant=name,
               tiles=str(variants[name]) if name in variants else "", fwd_ms=ms, rounds=ts, fwd_vs_cudnn=ms / base)
        each = " ".join(f"{t:.3f}" for t in ts)
        print(f"{shape_name:6} {name:26} {ms:8.3f} ms {ms / base:7.3f}x cuDNN  rounds {each}")


def fwd_bwd(cls, q, k, v, do, *extra):
    qg, kg, vg = (t.detach().requires_grad_() for t in (q, k, v))

    def run():
        qg.grad = kg.grad = vg.grad = None
        cls.apply(qg, kg, vg, True, *extra).backward(do)
    return bench(run)


def _profile_once(label: str, fn) -> None:
    """`fn` once warm (compiled, autotuned), then once inside a profiler range, for `ncu --profile-from-start off`."""
    fn()
    torch.cuda.synchronize()
    print(f"== {label}", flush=True)
    torch.cuda.profiler.start()
    fn()
    torch.cuda.synchronize()
    torch.cuda.profiler.stop()


def profile(shape_names: list[str], names: list[str]) -> None:
    """Each variant's forward (and cuDNN's) once warm, then once inside a profiler range."""
    for shape_name in shape_names:
        shape = SHAPES[shape_name]
        d = shape[-1]
        q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        for name in names:
            if name == "cudnn":
                fn = cudnn_forward(q, k, v)
            elif d in VARIANTS[name]:
                fn = lambda tiles=VARIANTS[name][d], q=q, k=k, v=v: flash_attention_gluon_forward(q, k, v, True, tiles)
            else:
                continue
            _profile_once(f"{shape_name} {name}", fn)


def profile_backward(shape_names: list[str], names: list[str]) -> None:
    """The backward alone, once warm, then once inside a profiler range: 'cudnn' (autograd.grad over one
    retained SDPA graph) or an index into BACKWARD_VARIANTS[d] (the launcher called directly)."""

    for shape_name in shape_names:
        shape = SHAPES[shape_name]
        d = shape[-1]
        q, k, v, do = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(4))
        out, lse = flash_attention_gluon_forward(q, k, v, True)
        for name in names:
            if name == "cudnn":
                fn = cudnn_backward(q, k, v, do)
            else:
                tiles = BACKWARD_VARIANTS[d][int(name)]
                fn = lambda tiles=tiles, a=(q, k, v, out, lse, do): flash_attention_gluon_backward(*a, True, tiles)
            _profile_once(f"{shape_name} backward {name}", fn)


def order_check(shape_names: list[str], rounds: int) -> None:
    """The backward alone, three ways timed in turn for `rounds` rounds at each shape: cuDNN (autograd),
    the default Gluon backward through autograd and its launcher called directly, so that a drift of the
    GPU's clocks over a process shows as a trend across rounds, not as a gap between the three."""
    for shape_name in shape_names:
        ways = _backward_ways(shape_name)
        for r in range(rounds):
            times = {name: bench(fn) for name, fn in ways.items()}
            record(kind="order_check", shape=shape_name, round=r, **{f"{n}_ms": t for n, t in times.items()})
            print(shape_name, r, "  ".join(f"{n} {t:.3f}" for n, t in times.items()), flush=True)


def _backward_ways(shape_name: str) -> dict:
    """`order_check`'s three backwards at one shape, as callables."""
    q, k, v, do = (torch.randn(SHAPES[shape_name], device="cuda", dtype=torch.bfloat16) for _ in range(4))
    gluon_in = tuple(t.detach().requires_grad_() for t in (q, k, v))
    gluon_graph = FlashAttentionGluon.apply(*gluon_in, True, "gluon")
    out, lse = flash_attention_gluon_forward(q, k, v, True)
    ways = {
        "cudnn": cudnn_backward(q, k, v, do),
        "gluon_autograd": lambda: torch.autograd.grad(gluon_graph, gluon_in, do, retain_graph=True),
        "gluon_direct": lambda: flash_attention_gluon_backward(q, k, v, out, lse, do, True),
    }
    return ways


def main() -> None:
    global OUT, SAMPLER
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--shapes", default="lb25,lb26")
    ap.add_argument("--variants", default="all", help="comma-separated names from VARIANTS, or all")
    ap.add_argument("--no-baselines", action="store_true", help="skip SDPA and the tl kernels")
    ap.add_argument("--no-check", action="store_true")
    ap.add_argument("--no-backward", action="store_true", help="skip the backward-alone rows")
    ap.add_argument("--backward-only", action="store_true", help="only the backward: its float64 checks and "
                    "its rows (cuDNN's and the tl backward's included)")
    ap.add_argument("--profile", default="", help="only run these variants (and 'cudnn') once each inside a "
                    "profiler range, for `ncu --profile-from-start off`")
    ap.add_argument("--ws-only", action="store_true", help="of the Gluon backwards, only the warp-specialised")
    ap.add_argument("--skip-bwd", default="", help="comma-separated: leave out the backward tiles whose name "
                    "holds any of these (e.g. own-dq,heads-first)")
    ap.add_argument("--bwd-indices", default="", help="only these backward tiles: indices into "
                    "BACKWARD_VARIANTS[d] by head dim, e.g. '64:0,1;128:0,1'")
    ap.add_argument("--bwd-fragments", action="store_true", help="the selected warp-specialised backward "
                    "tiles with their dQ workspace in register order (dq_fragments)")
    ap.add_argument("--order-check", type=int, default=0, help="only time cuDNN's backward and the default "
                    "Gluon one (through autograd and directly) in turn, this many rounds")
    ap.add_argument("--forward-rounds", type=int, default=0, help="only time the forward of cuDNN and of the "
                    "selected variants in turn, this many rounds (medians; each variant checked first)")
    ap.add_argument("--profile-backward", default="", help="as --profile for the backward alone: 'cudnn' or "
                    "indices into BACKWARD_VARIANTS[d]")
    args = ap.parse_args()
    OUT = args.out
    OUT.mkdir(parents=True, exist_ok=True)
    SAMPLER = ClockSampler("cuda").start()
    if args.profile:
        return profile(args.shapes.split(","), args.profile.split(","))
    if args.order_check:
        return order_check(args.shapes.split(","), args.order_check)
    if args.profile_backward:
        return profile_backward(args.shapes.split(","), args.profile_backward.split(","))
    names = [] if args.backward_only else list(VARIANTS) if args.variants == "all" else args.variants.split(",")
    record(kind="env", gpu=torch.cuda.get_device_name(), torch=torch.__version__, triton=triton.__version__,
           default_tiles={d: str(t) for d, t in FORWARD_TILES.items()},
           default_backward_tiles={d: str(t) for d, t in BACKWARD_TILES.items()})
    good_bwd = {}
    for d, variants in ([] if args.no_backward else BACKWARD_VARIANTS.items()):
        good_bwd[d] = []
        keep = dict(part.split(":") for part in args.bwd_indices.split(";") if part)
        for index, tiles in enumerate(variants):
            if keep and str(index) not in keep.get(str(d), "").split(","):
                continue
            if args.ws_only and not tiles.consumer_regs:
                continue
            if args.bwd_fragments and tiles.consumer_regs:
                tiles = dataclasses.replace(tiles, dq_fragments=True)
            if any(part and part in str(tiles) for part in args.skip_bwd.split(",")):
                continue
            if args.no_check:
                good_bwd[d].append(tiles)
                continue
            try:
                err = check_backward(tiles, d)
            except Exception as exc:
                traceback.print_exc()
                record(kind="check_bwd", d=d, tiles=str(tiles), error=f"{type(exc).__name__}: {exc}"[:2000])
                continue
            record(kind="check_bwd", d=d, tiles=str(tiles), max_rel_err=err, ok=err < 2e-2)
            if err < 2e-2:
                good_bwd[d].append(tiles)
    good = {}
    for name in names:
        for d, tiles in VARIANTS[name].items():
            if args.no_check:
                good[name, d] = tiles
                continue
            try:
                err = check(tiles, d)
            except Exception as exc:  # a variant that does not compile is reported, the rest go on
                traceback.print_exc()
                record(kind="check", variant=name, d=d, tiles=str(tiles), error=f"{type(exc).__name__}: {exc}"[:2000])
                continue
            record(kind="check", variant=name, d=d, tiles=str(tiles), max_rel_err=err, ok=err < 2e-2)
            if err < 2e-2:
                good[name, d] = tiles

    if args.forward_rounds:
        for shape_name in args.shapes.split(","):
            shape = SHAPES[shape_name]
            g = torch.Generator(device="cuda").manual_seed(0)
            q, k, v = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(3))
            forward_rounds(shape_name, q, k, v, {name: good[name, shape[-1]] for name in names
                                                 if (name, shape[-1]) in good}, args.forward_rounds)
        return
    table, bwd_table = [], []
    for shape_name in args.shapes.split(","):
        shape = SHAPES[shape_name]
        *lead, seq, d = shape
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v, do = (torch.randn(shape, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(4))
        cudnn_f, cudnn_fb = math.nan, math.nan
        if not args.no_backward:
            bwd_table += backward_rows(shape_name, q, k, v, do, good_bwd.get(d, []))
            torch.cuda.empty_cache()
        if not args.no_baselines and not args.backward_only:
            cudnn_f, cudnn_fb = sdpa_rows(shape_name, q, k, v, do)
            table.append((shape_name, "cudnn", "", cudnn_f, cudnn_fb))
            tl_configs = [("table", None, None)]
            if d == 128:
                eight_b = BackwardConfig(64, 128, 128, 64, 8, 3, fused=False)
                tl_configs.append(("8B tiles", "256x64/w8/s3", str(eight_b)))
            for label, ft, bt in tl_configs:
                fconf = Tiles.parse(ft) if ft else None
                fwd = bench(lambda fconf=fconf, q=q, k=k, v=v:
                            flash_attention_triton_forward(q, k, v, True, fconf, "tf32"))
                fb = fwd_bwd(FlashAttention2Triton, q, k, v, do, "tf32", ft, bt)
                record(shape=shape_name, impl="tl", tiles=label, fwd_ms=fwd, fwd_bwd_ms=fb,
                       fwd_vs_cudnn=fwd / cudnn_f, fwd_bwd_vs_cudnn=fb / cudnn_fb)
                table.append((shape_name, f"tl {label}", "", fwd, fb))
        for name in names:
            tiles = good.get((name, d))
            if tiles is None:
                continue
            try:
                fwd = bench(lambda tiles=tiles, q=q, k=k, v=v: flash_attention_gluon_forward(q, k, v, True, tiles))
                if tiles == FORWARD_TILES[d]:
                    fb = fwd_bwd(FlashAttentionGluon, q, k, v, do, "gluon")
                    fb_tl = fwd_bwd(FlashAttentionGluon, q, k, v, do, "tl")
                else:
                    fb = fb_tl = math.nan
            except Exception as exc:
                traceback.print_exc()
                record(shape=shape_name, impl="gluon", variant=name, error=f"{type(exc).__name__}: {exc}"[:2000])
                continue
            record(shape=shape_name, impl="gluon", variant=name, tiles=str(tiles), fwd_ms=fwd, fwd_bwd_ms=fb,
                   fwd_vs_cudnn=fwd / cudnn_f, fwd_bwd_vs_cudnn=fb / cudnn_fb, fwd_bwd_tl_bwd_ms=fb_tl,
                   fwd_bwd_tl_bwd_vs_cudnn=fb_tl / cudnn_fb, **compiled_facts(tiles, d))
            table.append((shape_name, f"gluon {name}", str(tiles), fwd, fb))
            if fb_tl == fb_tl:  # the default tiles: the same forward with the tl backward
                table.append((shape_name, f"gluon {name}, tl bwd", str(tiles), fwd, fb_tl))
        q = k = v = do = None
        torch.cuda.empty_cache()
    cudnn = {s: (f, b) for s, impl, _, f, b in table if impl == "cudnn"}
    print(f"\n{torch.cuda.get_device_name()}, torch {torch.__version__}, Triton {triton.__version__}; causal bf16")
    print(f"{'shape':6} {'impl':22} {'tiles':28} {'fwd ms':>8} {'x cuDNN':>8} {'f+b ms':>8} {'x cuDNN':>8}")
    for s, impl, tiles, f, b in table:
        cf, cb = cudnn.get(s, (math.nan, math.nan))
        print(f"{s:6} {impl:22} {tiles:28} {f:8.3f} {f / cf:8.3f} {b:8.3f} {b / cb:8.3f}")
    if bwd_table:
        print("\nbackward alone (from the Gluon forward's O and L; max |diff| of dQ, dK, dV vs the tl backward)")
        print(f"{'shape':6} {'impl':22} {'tiles':28} {'bwd ms':>8} {'x cuDNN':>8} {'max|diff|':>10}")
        for s, impl, tiles, ms, ratio, diff in bwd_table:
            print(f"{s:6} {impl:22} {tiles:28} {ms:8.3f} {ratio:8.3f} {diff:10.3g}")


if __name__ == "__main__":
    main()
