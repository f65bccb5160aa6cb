"""Naive attention's points (problems 7 and 8a; registry: pytorch_attention), `fn(settings, run) -> metrics`
for cs336sys.run: forward and backward of naive attention, eager or compiled, at one (seq, d). Timing and
the compiled function are cs336sys.attention.bench_common's.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from cs336sys.attention.bench_common import _random_qkv, _retainable_graphs, compiled_naive_attention
from cs336sys.attention.naive import naive_attention
from cs336sys.dtypes import torch_dtype
from cs336sys.jobs import Run
from cs336sys.timing import summarize_ms, synchronize, time_steps


@dataclass(frozen=True)
class PytorchAttentionSettings:
    """Problems 7 and 8a: naive attention at (batch, seq, d), no heads."""

    seq: int
    """Sequence length of q, k and v."""
    d: int
    """Head dimension: q, k, v are (batch, seq, d)."""
    impl: str = "eager"
    """Naive attention eager or through torch.compile: eager | compiled."""
    batch: int = 8
    """Batch size."""
    passes: int = 100
    """Timed calls of the forward, then of the backward (mean and std reported)."""
    warmup: int = 5
    """Untimed calls before each of the two timed series."""
    dtype: str = "fp32"
    """dtype of q, k and v: fp32 | bf16 | fp16."""
    device: str = "cuda"
    """Device kind: cuda | cpu (the grid's `device`); the job runner picks this rank's GPU."""


def run_pytorch_attention_point(settings: PytorchAttentionSettings, run: Run) -> dict:
    """Naive attention at (batch, seq, d), no heads: forward and backward times, memory.

    settings: device ("cuda"), d, seq, batch (8), passes (100), warmup (5), impl ("eager" |
    "compiled"), dtype ("fp32"). Forward/backward: mean and std over `passes` synchronised calls;
    the backward reuses one graph (retain_graph) so it times the backward alone.
    """
    device = torch.device(run.device)
    batch, seq, d, passes, warmup = settings.batch, settings.seq, settings.d, settings.passes, settings.warmup
    if settings.impl not in ("eager", "compiled"):
        raise ValueError(f"impl must be 'eager' or 'compiled', got {settings.impl!r}")
    attend = naive_attention if settings.impl == "eager" else compiled_naive_attention()
    q, k, v = _random_qkv((batch, seq, d), torch_dtype(settings.dtype), device)
    with _retainable_graphs():
        return _time_pytorch_attention(attend, q, k, v, warmup, passes, device)


def _time_pytorch_attention(attend: Callable, q, k, v, warmup: int, passes: int,
                            device: torch.device) -> dict:
    forward = summarize_ms(time_steps(lambda: attend(q, k, v), warmup, passes, device))
    out = attend(q, k, v)
    synchronize(device)
    metrics: dict = {"forward_ms": forward["mean_ms"], "forward_std_ms": forward["std_ms"]}
    if device.type == "cuda":
        metrics["memory_before_backward_bytes"] = torch.cuda.memory_allocated(device)
    grad_out = torch.randn_like(out)

    def backward() -> None:
        q.grad = k.grad = v.grad = None
        out.backward(grad_out, retain_graph=True)

    backward_times = summarize_ms(time_steps(backward, warmup, passes, device))
    metrics.update(backward_ms=backward_times["mean_ms"], backward_std_ms=backward_times["std_ms"])
    if device.type == "cuda":
        metrics["peak_memory_bytes"] = torch.cuda.max_memory_allocated(device)
    return metrics
