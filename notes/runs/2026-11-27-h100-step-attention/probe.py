"""The optimised step's attention at its own shapes, and two cheap levers inside the step (a hand-run
probe, not a result).

    PYTHONPATH=src python notes/runs/2026-11-27-h100-step-attention/probe.py [--steps large medium]

1. Attention alone at each size's shape (batch 4, context 512, causal bf16, the heads of the size,
   d 64, or 128 for "2.7B"'s padded 80): forward, backward and both, each as 20 calls captured in one
   CUDA graph (the step replays its graph, so launch gaps are not what it pays), median replay over
   20. Ours with the table's tiles and with other forward tiles and backward configurations
   (each candidate's outputs compared with the table's first), the Gluon kernels
   (`FlashAttentionGluon`), and SDPA's cuDNN and flash backends for scale.
2. The step (the series' best configuration) at the sizes in --steps, built as the pipeline builds
   it, then with the fastest tiles of part 1 in force, and with the updates' kernel launched at 4096
   elements a program instead of 1024 (`leaderboard.adamw.BLOCK`): step times by the host clock
   around each synchronised step (`cs336sys.timing.time_steps`, 40 steps), in A B A B order.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import statistics

import torch
import torch.nn.functional as F

from cs336sys.attention import flash_configs, flash_triton_backward, flash_triton_forward
from cs336sys.attention.flash_configs import BackwardConfig as B
from cs336sys.attention.flash_configs import Tiles as T
from cs336sys.leaderboard import adamw as adamw_module
from cs336sys.sizes import get_size
from cs336sys.timing import time_steps
from cs336sys.training.optimized import OptimizedSpec, build_optimized_step

BEST = ("fused_adamw", "flash", "bf16_weights", "adamw_in_backward", "fused_projections", "compiled_loss")
SIZES = ("small", "medium", "large", "xl", "2.7B")
FORWARD = [T(64, 64, 4, 3), T(64, 64, 4, 2), T(64, 64, 4, 4), T(128, 64, 8, 3), T(128, 64, 4, 3), T(64, 32, 4, 3),
           T(32, 32, 4, 3), T(32, 32, 2, 3), T(128, 128, 8, 2), T(64, 64, 8, 3), T(128, 32, 4, 3)]
BACKWARD = [B(64, 64, 64, 64, 4, 3, True), B(64, 64, 64, 64, 4, 3, False), B(64, 64, 64, 64, 4, 2, True),
            B(32, 64, 64, 32, 4, 3, True), B(32, 64, 64, 32, 4, 3, False), B(32, 32, 32, 32, 4, 3, True),
            B(32, 32, 32, 32, 2, 3, True), B(64, 128, 128, 64, 8, 3, True), B(32, 128, 128, 32, 8, 3, True),
            B(16, 64, 64, 16, 4, 3, True), B(32, 64, 64, 32, 4, 2, True), B(64, 64, 64, 64, 8, 3, True)]


def graph_ms(fn, calls: int = 20, replays: int = 20) -> float:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    times = []
    for _ in range(replays + 3):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / calls)
    return statistics.median(times[3:])


def shape(size: str) -> tuple[int, int, int, int]:
    s = get_size(size)
    d = s.d_model // s.num_heads
    return 4, s.num_heads, 512, 64 if d <= 64 else 128


def attention_at(size: str) -> tuple[T, B]:
    batch, heads, seq, d = shape(size)
    q, k, v, dout = (torch.randn(batch, heads, seq, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    table_f = flash_configs.forward_config(d, q.dtype, seq, batch * heads, True)
    table_b = flash_configs.backward_config(d, q.dtype, seq, batch * heads, True)
    ref_o, ref_l = flash_triton_forward.flash_forward(q, k, v, True, table_f)
    ref_g = flash_triton_backward.flash_backward(q, k, v, ref_o, ref_l, dout, True, table_b)
    print(f"\n{size} {(batch, heads, seq, d)}; table: forward {table_f}, backward {table_b}", flush=True)
    forward = {}
    for t in FORWARD:
        try:
            o, lse = flash_triton_forward.flash_forward(q, k, v, True, t)
            err = max((o.float() - ref_o.float()).abs().max().item(), (lse - ref_l).abs().max().item())
            forward[t] = graph_ms(lambda t=t: flash_triton_forward.flash_forward(q, k, v, True, t))
            print(f"  forward {str(t):16s} {forward[t] * 1e3:7.1f} us  max diff {err:.1e}", flush=True)
        except Exception as e:  # noqa: BLE001 (a candidate that does not compile or fit is reported, not fatal)
            print(f"  forward {str(t):16s} failed: {type(e).__name__}: {str(e)[:120]}", flush=True)
    backward = {}
    for c in BACKWARD:
        try:
            grads = flash_triton_backward.flash_backward(q, k, v, ref_o, ref_l, dout, True, c)
            err = max((a.float() - b.float()).abs().max().item() for a, b in zip(grads, ref_g, strict=True))
            backward[c] = graph_ms(lambda c=c: flash_triton_backward.flash_backward(q, k, v, ref_o, ref_l, dout,
                                                                                   True, c))
            print(f"  backward {str(c):30s} {backward[c] * 1e3:7.1f} us  max diff {err:.1e}", flush=True)
        except Exception as e:  # noqa: BLE001
            print(f"  backward {str(c):30s} failed: {type(e).__name__}: {str(e)[:120]}", flush=True)
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))

    def through(attention):
        def call():
            out = attention(qg, kg, vg)
            torch.autograd.grad(out, (qg, kg, vg), dout)
        return call

    others = {}
    for backend in (torch.nn.attention.SDPBackend.CUDNN_ATTENTION, torch.nn.attention.SDPBackend.FLASH_ATTENTION):
        def sdpa(a, b, c, backend=backend):
            with torch.nn.attention.sdpa_kernel(backend):
                return F.scaled_dot_product_attention(a, b, c, is_causal=True)
        others[backend.name] = sdpa
    try:
        from cs336sys.attention.flash_gluon import FlashAttentionGluon
        others["gluon"] = lambda a, b, c: FlashAttentionGluon.apply(a, b, c, True)
    except Exception as e:  # noqa: BLE001
        print(f"  gluon unavailable: {e}")
    for name, attention in others.items():
        try:
            fwd = graph_ms(lambda attention=attention: attention(q, k, v))
            both = graph_ms(through(attention))
            print(f"  {name:24s} forward {fwd * 1e3:7.1f} us, forward+backward {both * 1e3:7.1f} us", flush=True)
        except Exception as e:  # noqa: BLE001
            print(f"  {name:24s} failed: {type(e).__name__}: {str(e)[:160]}", flush=True)
    best_f, best_b = min(forward, key=forward.get), min(backward, key=backward.get)
    print(f"  best: forward {best_f} {forward[best_f] * 1e3:.1f} us (table {forward.get(table_f, 0) * 1e3:.1f}), "
          f"backward {best_b} {backward[best_b] * 1e3:.1f} us (table {backward.get(table_b, 0) * 1e3:.1f})",
          flush=True)
    return best_f, best_b


def step_ms(size: str) -> float:
    torch._dynamo.reset()
    step = build_optimized_step(OptimizedSpec(size, 512, techniques=BEST), "cuda")
    step.capture()
    ms = statistics.median(time_steps(step.run, 10, 40, "cuda"))
    del step
    gc.collect()
    torch.cuda.empty_cache()
    return ms


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", nargs="+", default=list(SIZES))
    parser.add_argument("--steps", nargs="*", default=["large", "medium"])
    args = parser.parse_args()
    print(torch.__version__, torch.cuda.get_device_name(), flush=True)
    best = {size: attention_at(size) for size in args.sizes}
    table_forward, table_backward = flash_configs.forward_config, flash_configs.backward_config
    for size in args.steps:
        tiles = best.get(size) or attention_at(size)
        _, heads, _, d = shape(size)

        def tuned(table, chosen, heads=heads, d=d):
            """The table's choice, except `chosen` at this size's own attention shape."""
            def config(d_, dtype, seq, batch_heads, on_gpu):
                mine = (d_, seq, batch_heads) == (d, 512, 4 * heads)
                return chosen if mine else table(d_, dtype, seq, batch_heads, on_gpu)
            return config

        variants = {"table": (table_forward, table_backward, 1024),
                    "tuned attention": (tuned(table_forward, tiles[0]), tuned(table_backward, tiles[1]), 1024),
                    "updates BLOCK 4096": (table_forward, table_backward, 4096)}
        results: dict[str, list[float]] = {name: [] for name in variants}
        for name, (fwd, bwd, block) in itertools.chain(variants.items(), variants.items()):
            flash_configs.forward_config, flash_configs.backward_config, adamw_module.BLOCK = fwd, bwd, block
            results[name].append(step_ms(size))
            print(f"{size} step, {name}: {results[name][-1]:.2f} ms", flush=True)
        flash_configs.forward_config, flash_configs.backward_config, adamw_module.BLOCK = (table_forward,
                                                                                          table_backward, 1024)
        print(f"{size} step: " + ", ".join(f"{n} {statistics.fmean(v):.2f} ms" for n, v in results.items()), flush=True)


if __name__ == "__main__":
    main()
