"""Distributed data parallel wrappers for any `nn.Module` (assignment 2, section "Distributed Data
Parallel Training"), from the naive one to bucketed overlap:

    NaiveDDP(module)                  one all-reduce per gradient, one after another, after backward
    FlatDDP(module)                   all gradients flattened into one buffer, one all-reduce after backward
    OverlappedDDP(module)             each gradient all-reduced in place from its hook as backward produces it
    BucketedDDP(module, bucket_size_mb)  gradients packed into buckets of at most bucket_size_mb MiB,
                                      each bucket all-reduced from the hook that completes it

All four: rank 0's parameters and buffers at construction, gradients averaged over ranks after
`finish_gradient_synchronization()`, `no_sync()`, frozen / unused / tied parameters handled as
`ddp_base` describes. They use the default process group and never create one.
"""

from __future__ import annotations

import math

from torch import nn

from cs336sys.distributed.ddp_base import DDPBase
from cs336sys.units import MIB


class NaiveDDP(DDPBase):
    """One blocking all-reduce per parameter gradient, all after backward."""

    def __init__(self, module: nn.Module):
        super().__init__(module, bucket_cap_bytes=None)


class FlatDDP(DDPBase):
    """All gradients copied into one flat buffer, one all-reduce after backward, copied back
    (one buffer per gradient dtype: an all-fp32 model has exactly one)."""

    def __init__(self, module: nn.Module):
        super().__init__(module, bucket_cap_bytes=math.inf)


class _OverlappingDDP(DDPBase):
    """Starts each gradient group's all-reduce from the post-accumulate-grad hook of its last
    ready parameter, while backward goes on computing the rest.

    Groups start strictly in order: when a group becomes ready, it and every ready group after it
    start, up to the first group still waiting. A group whose parameters get no gradient this step
    (and every group after it) starts in `finish_gradient_synchronization()` instead, so nothing
    waits for a gradient that will not come.
    """

    overlaps_backward = True

    def __init__(self, module: nn.Module, bucket_cap_bytes: float | None):
        super().__init__(module, bucket_cap_bytes)
        self._reset_step()
        self._hook_gradients()

    def _on_gradient_ready(self, index: int, param: nn.Parameter) -> None:
        if not self._sync_enabled:
            return  # inside no_sync(): the gradient just accumulates
        if self._ready[index]:
            raise RuntimeError(f"gradient of parameter {index} {tuple(param.shape)} became ready twice in one step: "
                               "call finish_gradient_synchronization() after every backward")
        self._ready[index] = True
        group = self._group_of[index]
        self._waiting[group] -= 1
        while self._next_group < len(self._groups) and self._waiting[self._next_group] == 0:
            self._launch(self._groups[self._next_group])

    def _reset_step(self) -> None:
        super()._reset_step()
        self._ready = [False] * len(self._params)
        self._waiting = [len(g.params) for g in self._groups]  # parameters each group still waits for

    def _step_in_progress(self) -> bool:
        return super()._step_in_progress() or any(self._ready)


class OverlappedDDP(_OverlappingDDP):
    """Each parameter's gradient all-reduced in place, asynchronously, as soon as backward has
    accumulated it (the handout's "overlapping individual parameters")."""

    def __init__(self, module: nn.Module):
        super().__init__(module, bucket_cap_bytes=None)


class BucketedDDP(_OverlappingDDP):
    """Gradients packed into flat buckets of at most `bucket_size_mb` MiB (2**20 bytes), formed in
    reverse registration order; a bucket's all-reduce starts once backward has produced all its
    gradients. A parameter larger than a bucket gets a bucket of its own (so 0 means one bucket per
    parameter, and a size above the model's gradients one bucket per gradient dtype)."""

    def __init__(self, module: nn.Module, bucket_size_mb: float):
        if not bucket_size_mb >= 0:
            raise ValueError(f"bucket_size_mb must be non-negative, got {bucket_size_mb}")
        super().__init__(module, bucket_cap_bytes=bucket_size_mb * MIB)
        self.bucket_size_mb = bucket_size_mb


VARIANTS = ("naive", "flat", "overlap", "bucketed")


def build_ddp(variant: str, module: nn.Module, bucket_size_mb: float | None = None) -> DDPBase:
    """The wrapper named `variant` (one of VARIANTS); `bucket_size_mb` only for "bucketed"."""
    if variant == "bucketed":
        if bucket_size_mb is None:
            raise ValueError("the bucketed variant needs bucket_size_mb")
        return BucketedDDP(module, bucket_size_mb)
    if bucket_size_mb is not None:
        raise ValueError(f"bucket_size_mb applies to the bucketed variant only, not {variant!r}")
    classes = {"naive": NaiveDDP, "flat": FlatDDP, "overlap": OverlappedDDP}
    if variant not in classes:
        raise ValueError(f"unknown DDP variant {variant!r}; expected one of {VARIANTS}")
    return classes[variant](module)
