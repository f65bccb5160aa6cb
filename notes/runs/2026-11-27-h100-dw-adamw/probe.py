"""Would the weight gradient's product and the AdamW update in one kernel beat the two apart? A hand-run
probe, not a result.

    PYTHONPATH=src python notes/runs/2026-11-27-h100-dw-adamw/probe.py SIZE...     # on the GPU
    TRITON_INTERPRET=1 PYTHONPATH=src python notes/runs/2026-11-27-h100-dw-adamw/probe.py --check   # CPU

The optimised step's updates are memory-bound (about 28 B per parameter) and run on a side stream beside
the backward's products, which are compute-bound; the two share the SMs only where a product leaves
some free. `dw_adamw_kernel` computes a tile of dW = dY^T X (fp32 accumulator) and applies AdamW to the
same tile of the master weight, its moments and its bf16 copy in the epilogue: the gradient is never
written or read, and, with two programs on an SM, one's epilogue (memory) can overlap the other's
products. For each weight shape of a size's block (tokens = batch 4 x context 512) it times, CUDA-event
medians:
  - `dW`: cuBLAS dY^T X alone (bf16 out, as the step's backward writes it);
  - `adamw`: the step's fused update alone (`fused_adamw_`, bf16 gradient, bf16 copy written);
  - `fused`: `dw_adamw_kernel`, the best of a few tile configurations;
and then, per size, the whole optimised step with its updates inside the backward against the same
graph captured without them (the updates' cost on top of forward+backward, which is what fusing could
take back).
"""

from __future__ import annotations

import gc
import statistics
import sys

import torch
import triton
import triton.language as tl

from cs336sys.leaderboard.adamw import fused_adamw_
from cs336sys.optim import adamw_step_size
from cs336sys.sizes import get_size

BETAS, LR, EPS, WD = (0.9, 0.999), 1e-3, 1e-8, 0.01
CONFIGS = [(128, 128, 64, 4, 3), (128, 128, 64, 8, 3), (128, 256, 64, 8, 3), (64, 128, 64, 4, 4),
           (128, 64, 64, 4, 4)]  # (BLOCK_M, BLOCK_N, BLOCK_K, warps, stages)


@triton.jit
def dw_adamw_kernel(DY, X, P, M, V, OUT, n_out, n_in, tokens, step_size, beta1, beta2, eps, decay,
                    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP: tl.constexpr):
    """One (BLOCK_M, BLOCK_N) tile of the weight (n_out, n_in): G = dY[:, rows]^T X[:, cols] over the
    tokens, then AdamW on P, M, V there and the new P into OUT (bf16). Shapes divide the tiles."""
    pid = tl.program_id(0)
    tiles_m, tiles_n = n_out // BLOCK_M, n_in // BLOCK_N
    group = pid // (GROUP * tiles_n)  # GROUP row tiles walk the column tiles together (L2 reuse of X)
    first = group * GROUP
    rows_in_group = tl.minimum(tiles_m - first, GROUP)
    pid_m = first + (pid % (GROUP * tiles_n)) % rows_in_group
    pid_n = (pid % (GROUP * tiles_n)) // rows_in_group
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tokens, BLOCK_K):
        a = tl.load(DY + (k + rk)[:, None] * n_out + rm[None, :])  # (BLOCK_K, BLOCK_M)
        b = tl.load(X + (k + rk)[:, None] * n_in + rn[None, :])  # (BLOCK_K, BLOCK_N)
        acc = tl.dot(tl.trans(a), b, acc)
    offs = rm[:, None].to(tl.int64) * n_in + rn[None, :]
    p = tl.load(P + offs)
    m = tl.load(M + offs) * beta1 + (1 - beta1) * acc
    v = tl.load(V + offs) * beta2 + (1 - beta2) * (acc * acc)
    p = (p - step_size * tl.div_rn(m, tl.sqrt_rn(v) + eps)) * decay
    tl.store(P + offs, p)
    tl.store(M + offs, m)
    tl.store(V + offs, v)
    tl.store(OUT + offs, p.to(OUT.dtype.element_ty))


def dw_adamw(dy, x, p, m, v, out, step_size, config=CONFIGS[0]):
    block_m, block_n, block_k, warps, stages = config
    n_out, n_in = p.shape
    grid = (n_out // block_m * (n_in // block_n),)
    dw_adamw_kernel[grid](dy, x, p, m, v, out, n_out, n_in, x.shape[0], step_size, BETAS[0], BETAS[1], EPS,
                          1 - LR * WD, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, GROUP=8,
                          num_warps=warps, num_stages=stages)


def reference(dy, x, p, m, v, step_size):
    """The step's way: the bf16 gradient by a product, then the fused update (fp32 state, bf16 copy)."""
    g = (dy.T @ x).to(dy.dtype)
    out = torch.empty_like(p, dtype=dy.dtype)
    fused_adamw_(p, g, m, v, step_size=step_size, lr=LR, eps=EPS, weight_decay=WD, beta1=BETAS[0],
                 beta2=BETAS[1], out_lowp=out)
    return out


def state(n_out, n_in, device):
    p = torch.randn(n_out, n_in, device=device) * 0.02
    return p, torch.randn_like(p) * 1e-3, torch.rand_like(p) * 1e-6


def check() -> None:
    """The kernel against the reference in float32 (the interpreter), fresh inputs."""
    tokens, n_out, n_in = 64, 128, 64
    dy, x = torch.randn(tokens, n_out), torch.randn(tokens, n_in)
    p, m, v = state(n_out, n_in, "cpu")
    step_size = adamw_step_size(LR, *BETAS, 3)
    ref = [t.clone() for t in (p, m, v)]
    ref_out = reference(dy, x, *ref, step_size)
    out = torch.empty_like(p)
    dw_adamw(dy, x, p, m, v, out, step_size, (64, 32, 16, 4, 1))
    for name, a, b in zip(("p", "m", "v", "copy"), (p, m, v, out), (*ref, ref_out), strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5 * b.abs().max().item(), msg=name)
    print("dw_adamw_kernel matches the product and the fused update (float32)")


def median_ms(fn, repeats=30, warmup=5):
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


def shapes(size_name):
    s = get_size(size_name)
    d, dff = s.d_model, s.d_ff
    return {"qkv": (3 * d, d), "output": (d, d), "w13": (2 * dff, d), "w2": (d, dff)}, s.num_layers


def one_shape(n_out: int, n_in: int, tokens: int) -> tuple[float, float, dict, float]:
    """(dW ms, adamw ms, fused ms per configuration, max |p - p_ref|) at one weight shape."""
    dy = torch.randn(tokens, n_out, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(tokens, n_in, device="cuda", dtype=torch.bfloat16)
    p, m, v = state(n_out, n_in, "cuda")
    step_size = adamw_step_size(LR, *BETAS, 3)
    g = (dy.T @ x).to(torch.bfloat16)
    out = torch.empty_like(p, dtype=torch.bfloat16)
    # correctness at this shape: one update from the same state, the kernel's fp32 gradient against the
    # reference's bf16-rounded one (so about bf16's rounding apart)
    ref = [t.clone() for t in (p, m, v)]
    reference(dy, x, *ref, step_size)
    mine = [t.clone() for t in (p, m, v)]
    dw_adamw(dy, x, *mine, out, step_size)
    err = (mine[0] - ref[0]).abs().max().item()
    t_dw = median_ms(lambda: torch.mm(dy.T, x, out=g))
    t_adamw = median_ms(lambda: fused_adamw_(p, g, m, v, step_size=step_size, lr=LR, eps=EPS, weight_decay=WD,
                                             beta1=BETAS[0], beta2=BETAS[1], out_lowp=out))
    fused = {}
    for config in CONFIGS:
        if n_out % config[0] or n_in % config[1]:
            continue
        try:
            fused[config] = median_ms(lambda c=config: dw_adamw(dy, x, p, m, v, out, step_size, c))
        except Exception as e:  # (out of resources: shared memory or registers)
            print(f"    {config}: {type(e).__name__}")
    return t_dw, t_adamw, fused, err


def kernels(size_name: str) -> None:
    weights, layers = shapes(size_name)
    total = {"dW": 0.0, "adamw": 0.0, "fused": 0.0}
    for name, (n_out, n_in) in weights.items():
        t_dw, t_adamw, fused, err = one_shape(n_out, n_in, 4 * 512)
        best = min(fused, key=fused.get)
        every = ", ".join(f"{c[:3]}/{c[3]}w {t:.3f}" for c, t in fused.items())
        print(f"{size_name} {name:6s} ({n_out}x{n_in}): dW {t_dw:.3f} ms, adamw {t_adamw:.3f}, sum "
              f"{t_dw + t_adamw:.3f}; fused {fused[best]:.3f} {best}; all {every}; max |p - p_ref| {err:.2e}",
              flush=True)
        total["dW"] += t_dw * layers
        total["adamw"] += t_adamw * layers
        total["fused"] += fused[best] * layers
    print(f"{size_name} all blocks ({layers}): dW {total['dW']:.2f} ms + adamw {total['adamw']:.2f} = "
          f"{total['dW'] + total['adamw']:.2f}; fused {total['fused']:.2f}", flush=True)


def updates_cost(size_name: str) -> None:
    """The best configuration's step replayed with its updates inside the backward, and the same graph
    captured with the updates off (forward+backward only)."""
    from cs336sys.training.optimized import OptimizedSpec, build_optimized_step

    techniques = ("fused_adamw", "cuda_graph", "flash", "bf16_weights", "adamw_in_backward", "fused_projections",
                  "compiled_loss")
    result = {}
    for armed in (True, False):
        torch._dynamo.reset()
        spec = OptimizedSpec(size_name, 512, techniques=tuple(t for t in techniques if t != "cuda_graph"))
        step = build_optimized_step(spec, "cuda")
        step.capture()
        if not armed:  # re-capture with the hooks doing nothing (and no join with their stream)
            updates, step.in_backward = step.in_backward, None
            updates.armed = False
            step.graph = None
            step._clear_grads()
            step.capture()
            step.in_backward = updates
        result[armed] = median_ms(step.run, repeats=40, warmup=10)
        del step
        gc.collect()
        torch.cuda.empty_cache()
    print(f"{size_name} step with updates {result[True]:.2f} ms, without {result[False]:.2f} ms: the updates "
          f"add {result[True] - result[False]:.2f} ms", flush=True)


if __name__ == "__main__":
    if sys.argv[1:] == ["--check"]:
        check()
        sys.exit()
    print(torch.__version__, triton.__version__, torch.cuda.get_device_name(), flush=True)
    kernel_sizes = [s for s in sys.argv[1:] if not s.startswith("updates:")]
    for size in kernel_sizes:
        kernels(size)
        updates_cost(size)
    for size in [s.removeprefix("updates:") for s in sys.argv[1:] if s.startswith("updates:")]:
        updates_cost(size)
