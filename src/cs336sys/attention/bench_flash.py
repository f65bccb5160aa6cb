"""Problem 11's grid (registry: flash_benchmarking): forward, backward and forward+backward of one
implementation at one (seq, d, dtype), each family through its own experiment function in its own module,
so that a job reaches only its own code (its `code` hash, cs336sys.codehash) and an edit of the Triton
kernels re-runs only the Triton jobs:

    run_baseline_point   here: naive, naive_compiled (torch.compile), sdpa
    run_triton_point     cs336sys.attention.bench_flash_triton: ours, triton and triton_ieee

Timing (do_bench medians on CUDA), FLOP counts and the SDPA backends are cs336sys.attention.bench_common's.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch

from cs336sys.attention.bench_common import (
    _random_qkv,
    _retainable_graphs,
    attention_flops,
    bench_ms,
    compiled_naive_attention,
    pick_sdpa_backend,
    sdpa_attention,
)
from cs336sys.attention.naive import naive_attention
from cs336sys.dtypes import torch_dtype
from cs336sys.jobs import Run

TRITON_IMPLS = ("triton", "triton_ieee")
BASELINE_IMPLS = ("naive", "naive_compiled", "sdpa")


@dataclass(frozen=True)
class FlashSettings:
    """Problem 11: one point of the FlashAttention grid, inputs (batch, heads, seq, d)."""

    impl: str
    """triton | triton_ieee (fp32 products in IEEE fp32, not TF32) | naive | naive_compiled | sdpa."""
    seq: int
    """Sequence length (queries and keys)."""
    d: int
    """Head dimension."""
    dtype: str = "bf16"
    """dtype of q, k, v and dO: bf16 | fp32 (the Triton interpreter on the CPU takes fp32 only)."""
    batch: int = 1
    """Batch size."""
    heads: int = 1
    """Heads: q, k, v are (batch, heads, seq, d)."""
    causal: bool = True
    """Causal mask (key j <= query i)."""
    sdpa_backend: str | None = None
    """sdpa only: pin flash | efficient | cudnn | math; None: the first that runs, in PyTorch's order."""
    device: str = "cuda"
    """Device kind: cuda | cpu (the grid's `device`); the job runner picks this rank's GPU."""


def run_baseline_point(settings: FlashSettings, run: Run) -> dict:
    """One point of a baseline (impl naive | naive_compiled | sdpa); on CUDA SDPA is also timed as
    CUDA-graph replays, and `sdpa_backend` pins its backend (else the first that runs, in PyTorch's
    order, recorded in the metrics)."""
    if settings.impl not in BASELINE_IMPLS:
        raise ValueError(f"impl {settings.impl!r} is no baseline ({' | '.join(BASELINE_IMPLS)}): bench_flash_triton")
    device = torch.device(run.device)
    q, k, v = _inputs(settings, device)
    extra = {}
    if settings.impl == "naive":
        attend = naive_attention
    elif settings.impl == "naive_compiled":
        attend = compiled_naive_attention()
    else:
        backend = pick_sdpa_backend(q, settings.causal, settings.sdpa_backend)
        attend, extra = sdpa_attention(backend), {"sdpa_backend": backend}
    return _measure(attend, extra, q, k, v, settings, graphed=settings.impl == "sdpa")


def _inputs(settings: FlashSettings, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """q, k, v of (batch, heads, seq, d)."""
    shape = (settings.batch, settings.heads, settings.seq, settings.d)
    return _random_qkv(shape, torch_dtype(settings.dtype), device)


def _measure(attend: Callable, extra: dict, q, k, v, settings: FlashSettings, graphed: bool) -> dict:
    """forward_ms, backward_ms, fwd_bwd_ms with a random dO, their FLOPs and TFLOP/s, and with
    `graphed` on CUDA the CUDA-graph replays' times (GPU time without host overhead: `_graphed_times`)."""
    device, causal = q.device, settings.causal
    grad_out = torch.randn(q.shape, dtype=q.dtype, device=device)
    with _retainable_graphs():
        times = _time_forward_backward(attend, q, k, v, causal, device, grad_out)
        if device.type == "cuda" and graphed:
            times.update(_graphed_times(attend, q, k, v, causal, grad_out))
    flops = attention_flops(settings.batch * settings.heads, settings.seq, settings.seq, settings.d, causal)
    metrics = {**times, **extra}
    for part in ("forward", "backward", "fwd_bwd"):
        metrics[f"{part}_flops"] = flops[part]
        metrics[f"{part}_tflops"] = flops[part] / (times[f"{part}_ms"] * 1e-3) / 1e12
    return metrics


def _time_forward_backward(attend: Callable, q, k, v, is_causal: bool, device: torch.device,
                           grad_out: torch.Tensor | None) -> dict[str, float]:
    """forward_ms, backward_ms (one retained graph) and fwd_bwd_ms."""
    forward = bench_ms(lambda: attend(q, k, v, is_causal), device)
    out = attend(q, k, v, is_causal)
    grad_out = torch.randn_like(out) if grad_out is None else grad_out
    backward = bench_ms(functools.partial(out.backward, grad_out, retain_graph=True), device, [q, k, v])
    del out  # free the retained graph before the next measurement
    fwd_bwd = bench_ms(lambda: attend(q, k, v, is_causal).backward(grad_out), device, [q, k, v])
    return {"forward_ms": forward, "backward_ms": backward, "fwd_bwd_ms": fwd_bwd}


def _graphed_times(attend: Callable, q, k, v, is_causal: bool, grad_out: torch.Tensor) -> dict:
    """graph_{forward,backward,fwd_bwd}_ms: do_bench medians of replaying a CUDA graph of one
    call, i.e. the GPU's time alone, without the host's work of launching (Python, autograd,
    the kernel launcher), which the eager times include. Everything runs on one side stream, so
    that the backward's kernels (which run on their forward's stream) are captured too."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        out = attend(q, k, v, is_causal)
    calls = {"forward": lambda: attend(q, k, v, is_causal),
             "backward": lambda: out.backward(grad_out, retain_graph=True),
             "fwd_bwd": lambda: attend(q, k, v, is_causal).backward(grad_out)}
    times = {}
    for part, call in calls.items():
        with torch.cuda.stream(stream):
            for _ in range(2):  # compile, autotune and allocate outside the capture
                q.grad = k.grad = v.grad = None
                call()
        stream.synchronize()
        q.grad = k.grad = v.grad = None
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, stream=stream):
            call()
        times[f"graph_{part}_ms"] = bench_ms(graph.replay, q.device)
        del graph
    q.grad = k.grad = v.grad = None
    return times
