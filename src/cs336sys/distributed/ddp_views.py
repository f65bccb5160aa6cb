"""Bucketed DDP with gradients as views of the buckets: the bucketed wrapper's rules with
less host work per step.

    BucketViewDDP(module, bucket_size_mb)   variant "bucket_view"; bucket_size_mb=0: one bucket per
                                            parameter (the overlapped per-parameter wrapper's grouping)

`BucketedDDP` (cs336sys.distributed.ddp) keeps gradients apart from its flat buckets: every step it
copies each gradient into its bucket before the all-reduce and back out after it, parameter by
parameter, and keeps per-step bookkeeping lists. Here, as in PyTorch's DDP with
`gradient_as_bucket_view=True`, each parameter's `.grad` *is* its slice of a bucket allocated once:

* the post-accumulate-grad hook of a parameter whose gradient is already its bucket view does no
  tensor work at all (autograd accumulated in place): it decrements its bucket's count and starts
  the all-reduce of every complete bucket in order. A gradient autograd made afresh (after
  `zero_grad(set_to_none=True)`, or accumulated under `no_sync()`) is copied into its view once and
  the parameter pointed at the view; from then on it stays there (zero with set_to_none=False to
  keep it there across steps: no copy at all).
* after the all-reduces, one `_foreach_div_` over the buckets averages every gradient in place:
  no copy back, no unflatten.

The rules of `ddp_base` hold unchanged (same collectives in the same order on every rank; unused
parameters contribute zeros and end as None where no rank had a gradient, with the per-step
all-reduce of counts; `no_sync()`; tied parameters once; frozen ones never). Refused: sparse
gradients (a clear error in the hook). A parameter's gradient, once synchronised, is a view of a
shared buffer: an optimizer or hook that replaces `.grad` is fine, one that resizes it in place is not.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor, nn

from cs336sys.distributed.ddp_base import DDPBase, GradientGroup
from cs336sys.units import MIB


class BucketViewDDP(DDPBase):
    """Gradients packed into flat buckets of at most `bucket_size_mb` MiB (reverse registration order,
    as `BucketedDDP`), each parameter's gradient a view of its bucket; a bucket's all-reduce starts
    from the hook of its last gradient, in bucket order."""

    overlaps_backward = True

    def __init__(self, module: nn.Module, bucket_size_mb: float):
        if not bucket_size_mb >= 0:
            raise ValueError(f"bucket_size_mb must be non-negative, got {bucket_size_mb}")
        super().__init__(module, bucket_cap_bytes=bucket_size_mb * MIB)
        self.bucket_size_mb = bucket_size_mb
        n = len(self._params)
        slot = {i: (g, view) for g, group in enumerate(self._groups)
                for i, view in zip(group.indices, group.views, strict=True)}
        self._views: list[Tensor] = [slot[i][1] for i in range(n)]  # parameter -> its gradient's bucket view
        self._bucket_index = [slot[i][0] for i in range(n)]
        # (not `_buffers`: that name is nn.Module's registry, and a list there makes every attribute
        # assignment compare the name with each tensor: measured 11 ms per hook at 435 buckets)
        self._bucket_buffers = [g.buffer for g in self._groups]
        self._step = _StepState([len(g.params) for g in self._groups], n)
        self._hook_gradients()

    def _on_gradient_ready(self, index: int, param: nn.Parameter) -> None:
        if not self._sync_enabled:
            return  # inside no_sync(): the gradient just accumulates
        step = self._step  # plain attributes: nn.Module's __setattr__ is slow for per-hook state
        if step.ready[index]:
            raise RuntimeError(f"gradient of parameter {index} {tuple(param.shape)} became ready twice in one step: "
                               "call finish_gradient_synchronization() after every backward")
        step.ready[index] = True
        step.ready_count += 1
        view = self._views[index]
        if param.grad is not view:
            self._adopt(param, view)
        step.waiting[self._bucket_index[index]] -= 1
        while step.next < len(step.waiting) and step.waiting[step.next] == 0:
            self._start(self._groups[step.next])

    @staticmethod
    def _adopt(param: nn.Parameter, view: Tensor) -> None:
        """Move a gradient autograd allocated into the parameter's bucket view, and keep it there."""
        if param.grad.is_sparse:
            raise ValueError("sparse gradients are not supported")
        view.copy_(param.grad)
        param.grad = view

    def _start(self, group: GradientGroup) -> None:
        group.work = dist.all_reduce(group.buffer, async_op=True)
        self._step.next += 1

    def finish_gradient_synchronization(self) -> None:
        """Start the buckets backward did not complete (a missing gradient counts as zeros), wait for
        every all-reduce, and average the buckets in place."""
        if not self._sync_enabled or not dist.is_initialized():
            return
        step = self._step
        self.groups_launched_in_backward = step.next
        lacking = []  # parameters this rank has no gradient for
        for group in self._groups[step.next:]:
            for i, p, view in zip(group.indices, group.params, group.views, strict=True):
                if step.ready[i]:
                    continue
                if p.grad is None:
                    view.zero_()
                    lacking.append(i)
                elif p.grad is not view:  # accumulated under no_sync() only
                    self._adopt(p, view)
            self._start(group)
        self._used_counts.fill_(1.0)
        if lacking:
            self._used_counts[lacking] = 0.0
        counts_work = dist.all_reduce(self._used_counts, async_op=True)
        for group in self._groups:
            group.work.wait()
            group.work = None
        counts_work.wait()
        torch._foreach_div_(self._bucket_buffers, self.world_size)
        if lacking:  # reading the counts syncs with the device: only ranks that lacked a gradient do it
            counts = self._used_counts.tolist()
            for i in lacking:  # another rank's gradient, averaged; None where no rank had one
                self._params[i].grad = self._views[i] if counts[i] else None
        self._reset_step()

    def _reset_step(self) -> None:
        self._step.reset()

    def _step_in_progress(self) -> bool:
        return self._step.next > 0 or self._step.ready_count > 0


class _StepState:
    """What one synchronised step has seen so far: buckets started, parameters each bucket still
    waits for, whose hook ran. Reset in place; no allocation per step."""

    __slots__ = ("sizes", "none_ready", "next", "waiting", "ready", "ready_count")

    def __init__(self, sizes: list[int], params: int):
        self.sizes, self.none_ready = sizes, [False] * params
        self.waiting, self.ready = list(sizes), [False] * params
        self.next, self.ready_count = 0, 0

    def reset(self) -> None:
        self.waiting[:] = self.sizes
        self.ready[:] = self.none_ready
        self.next, self.ready_count = 0, 0
