"""Named ranges around the phases of a step and inside attention, free when annotation is off.

    with annotations_enabled():          # profiler runs only
        with phase("forward"):
            ...

`phase` fits the step builder's hook: `step.phase = phase` (cs336sys.training.step.Step), then
run the step inside `annotations_enabled()`.

Each range is a `torch.profiler.record_function` (seen by torch.profiler) and, where CUDA is
present, an NVTX range (seen by Nsight Systems). When annotation is off, `phase` returns one
shared no-op context: no profiler call, no allocation, nothing that could perturb a timed step.
While CUDA memory history is recorded, the innermost range's name is also attached to each
allocation as the allocator's memory metadata, so a snapshot knows which phase allocated what.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from cs336sys.attention.naive import attention_scores

PHASES = ("forward", "backward", "sync", "optimizer_step")  # the step builder's phase names
ATTENTION_RANGES = ("attention/scores", "attention/softmax", "attention/final_matmul")

_enabled = False
_nvtx = False
_OFF = contextlib.nullcontext()
_metadata_stack: list[str] = []


def annotating() -> bool:
    return _enabled


@contextlib.contextmanager
def annotations_enabled(enabled: bool = True) -> Iterator[None]:
    """Switch the ranges on (or off) inside this block; the previous state is restored after."""
    global _enabled, _nvtx
    previous = _enabled, _nvtx
    _enabled, _nvtx = enabled, enabled and torch.cuda.is_available()
    try:
        yield
    finally:
        _enabled, _nvtx = previous


def _set_memory_metadata(name: str) -> None:
    setter = getattr(torch._C, "_cuda_setMemoryMetadata", None)
    if setter is not None:
        setter(name)


class _Range:
    __slots__ = ("name", "_record")

    def __init__(self, name: str):
        self.name = name

    def __enter__(self) -> _Range:
        self._record = torch.profiler.record_function(self.name)
        self._record.__enter__()
        if _nvtx:
            torch.cuda.nvtx.range_push(self.name)
            _metadata_stack.append(self.name)
            _set_memory_metadata(self.name)
        return self

    def __exit__(self, *exc) -> None:
        if _nvtx:
            _metadata_stack.pop()
            _set_memory_metadata(_metadata_stack[-1] if _metadata_stack else "")
            torch.cuda.nvtx.range_pop()
        self._record.__exit__(*exc)


def phase(name: str) -> contextlib.AbstractContextManager:
    """A named range while annotation is enabled, otherwise a shared no-op context."""
    return _Range(name) if _enabled else _OFF


def annotated_naive_causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """`cs336sys.attention.naive.naive_causal_attention` with its three parts as named ranges
    (the scaled, masked scores; the softmax; the product with V); the same operations in the same
    order, so the values are identical. Pass it as the model's `attention=` backend."""
    with phase("attention"):
        with phase("attention/scores"):
            scores = attention_scores(q, k, is_causal=True)
        with phase("attention/softmax"):
            probs = torch.softmax(scores, dim=-1)
        with phase("attention/final_matmul"):
            return probs @ v
