"""What the attention benchmarks share: do_bench timing, FLOP counts of attended pairs, random inputs,
naive attention compiled once a process, and SDPA with one backend pinned. The points are elsewhere, each
family in its own module so that a job's code hash (cs336sys.codehash) reaches only its own code:
cs336sys.attention.bench_naive (naive attention), bench_flash (problem 11's baselines), bench_flash_triton
(ours), bench (the leaderboards' shapes), bench_gluon and bench_rounds.

Out-of-memory propagates (the job runner records it as `oom`); a point that cannot run here
raises `Unsupported`. On CUDA, times come from `triton.testing.do_bench` (median, CUDA events,
L2 flushed between repetitions); elsewhere (the CPU smoke grid) from a synchronised host timer.

FLOP counts (for TFLOP/s) count only the (query, key) pairs that are attended: seq_q * seq_k
without a mask, and sum_i min(i + 1, seq_k) with the causal mask (S (S + 1) / 2 for seq_q =
seq_k = S), which is what a kernel that skips masked tiles must at least compute. The forward is
two matrix products, 4 * d FLOPs per pair; the backward five (recomputing S, dV, dP, dQ, dK),
2.5 times the forward, whatever an implementation actually recomputes (our two-kernel backward
does 7 products per pair; it is still credited with 5).
"""

from __future__ import annotations

import functools
import os
import statistics
import sys
from collections.abc import Callable

import torch
import torch.nn.functional as F

from cs336sys.attention.naive import naive_attention
from cs336sys.jobs import Unsupported
from cs336sys.timing import time_steps

# Without CUDA, Triton kernels can only run through Triton's interpreter, which must be chosen
# before triton is first imported (the CPU smoke grid runs the Triton points this way).
if "triton" not in sys.modules and not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

SDPA_BACKENDS = ("flash", "efficient", "cudnn", "math")  # PyTorch's own priority order

# do_bench budget per measurement (milliseconds): enough repetitions for a stable median at
# every size of the grid, small enough that the whole grid runs in minutes.
BENCH_WARMUP_MS = 25
BENCH_REP_MS = 100
CPU_REPEATS = 3


# --- shared timing helpers ------------------------------------------------------------------

def bench_ms(fn: Callable[[], object], device: torch.device,
             grad_to_none: list[torch.Tensor] | None = None) -> float:
    """Median milliseconds per call of `fn` (gradients of `grad_to_none` reset before each)."""
    if device.type == "cuda":
        import triton.testing

        return float(triton.testing.do_bench(fn, warmup=BENCH_WARMUP_MS, rep=BENCH_REP_MS,
                                             grad_to_none=grad_to_none, return_mode="median"))

    def step() -> None:
        for t in grad_to_none or ():
            t.grad = None
        fn()

    return statistics.median(time_steps(step, warmup=1, steps=CPU_REPEATS, device=device))


def attended_pairs(seq_q: int, seq_k: int, causal: bool) -> int:
    """Number of (query, key) pairs with a weight; causal is top-left aligned (key j <= query i)."""
    if not causal:
        return seq_q * seq_k
    full = min(seq_q, seq_k)  # rows 0..full-1 see i + 1 keys; later rows see all seq_k keys
    return full * (full + 1) // 2 + (seq_q - full) * seq_k


def attention_flops(batch_heads: int, seq_q: int, seq_k: int, d: int, causal: bool) -> dict[str, float]:
    forward = 4.0 * batch_heads * d * attended_pairs(seq_q, seq_k, causal)
    return {"forward": forward, "backward": 2.5 * forward, "fwd_bwd": 3.5 * forward}


def _random_qkv(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device,
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return tuple(torch.randn(shape, dtype=dtype, device=device, requires_grad=True) for _ in range(3))


# --- implementations ------------------------------------------------------------------------

@functools.cache
def compiled_naive_attention() -> Callable:
    """naive_attention through torch.compile, one compiled function for the whole process:
    symbolic shapes, so that a sweep over sequence lengths and head dimensions compiles once per
    dtype and mask, not once per point."""
    return torch.compile(naive_attention, dynamic=True)


def _retainable_graphs():
    """Compiled backward graphs that can run twice: AOTAutograd's buffer donation forbids a
    second backward through one graph (retain_graph), which is how the backward is timed alone.
    Patched for the whole measurement because the backward graph is compiled at its first call."""
    import torch._functorch.config

    return torch._functorch.config.patch(donated_buffer=False)


def _sdpa_backend(name: str):
    from torch.nn.attention import SDPBackend

    return {"flash": SDPBackend.FLASH_ATTENTION, "efficient": SDPBackend.EFFICIENT_ATTENTION,
            "cudnn": SDPBackend.CUDNN_ATTENTION, "math": SDPBackend.MATH}[name]


def sdpa_attention(backend: str) -> Callable:
    """SDPA pinned to one backend; calling it outside `sdpa_kernel` would let PyTorch choose."""
    from torch.nn.attention import sdpa_kernel

    def attend(q, k, v, is_causal):
        with sdpa_kernel([_sdpa_backend(backend)]):
            return F.scaled_dot_product_attention(q, k, v, is_causal=is_causal)

    return attend


def pick_sdpa_backend(q: torch.Tensor, is_causal: bool, wanted: str | None) -> str:
    """The backend to measure: `wanted`, or the first of PyTorch's priority order that runs here."""
    candidates = (wanted,) if wanted else SDPA_BACKENDS
    reasons = []
    for name in candidates:
        try:
            with torch.no_grad():
                sdpa_attention(name)(q[..., :16, :], q[..., :16, :], q[..., :16, :], is_causal)
            return name
        except RuntimeError as exc:  # "No available kernel", unsupported dtype or head dim
            reasons.append(f"{name}: {str(exc).splitlines()[0][:120]}")
    raise Unsupported(f"no SDPA backend in {candidates} runs {q.dtype} d={q.shape[-1]} on "
                      f"{q.device.type}: " + "; ".join(reasons))
