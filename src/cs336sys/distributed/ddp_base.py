"""What every data-parallel wrapper shares: rank 0's weights at construction, the list of
gradients to average, how they are grouped into all-reduces, `no_sync()`, and the step that waits
for the all-reduces and writes the averages back. The variants in `ddp.py` differ only in how
gradients are grouped (one per parameter, or flat buckets) and in when the all-reduces start
(after backward, or from gradient hooks while backward still runs).

Rules every variant follows:

* Which gradients: the module's parameters with `requires_grad=True` when the wrapper is built,
  each once (`module.parameters()` yields a tied parameter once, so it gets one all-reduce).
  Frozen parameters are broadcast at construction and never reduced.
* Same collectives, same order, on every rank: gradient groups are all-reduced strictly in a fixed
  order (reverse registration order, about the order backward produces them); a group that is
  ready early waits for the groups before it. Ranks whose backward passes differ (a parameter one
  rank does not use) therefore still issue identical sequences of collectives.
* Parameters without a gradient: a rank with no gradient for a parameter contributes zeros, so a
  parameter some ranks used gets sum / world_size, the gradient of the mean loss over the global
  batch. A parameter no rank produced a gradient for keeps `grad = None`, as in single-process
  training (so an optimizer skips it, weight decay included). Telling the two apart takes one extra
  all-reduce per step of one float32 counter per parameter (how many ranks had a gradient).
* The module is not moved: put it on the rank's device before wrapping. Buffers are broadcast at
  construction only (buffers that training changes, such as batch-norm statistics, stay per rank).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import weakref
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn


def weak_hook(method: Callable) -> Callable:
    """`method` (bound) as a hook that does not keep its object alive: autograd holds a tensor's
    hooks from C++, where the garbage collector cannot follow a cycle, so a hook holding its wrapper
    would keep the wrapper, its module and every parameter and gradient alive after the wrapper is
    dropped (measured: 27 GB per 2.7B model, points of one job piling up until out of memory). Once
    the object is gone the hook does nothing."""
    ref = weakref.WeakMethod(method)

    def hook(*args: Any) -> Any:
        live = ref()
        return None if live is None else live(*args)

    return hook


def world_size() -> int:
    return dist.get_world_size() if dist.is_initialized() else 1


@torch.no_grad()
def broadcast_from_rank0(module: nn.Module) -> None:
    """Overwrite every parameter (frozen ones too) and buffer with global rank 0's values."""
    if not dist.is_initialized():
        return
    for tensor in itertools.chain(module.parameters(), module.buffers()):
        if tensor.is_contiguous():
            dist.broadcast(tensor.detach(), src=0)
        else:  # collectives need dense contiguous memory
            staged = tensor.detach().contiguous()
            dist.broadcast(staged, src=0)
            tensor.copy_(staged)


def plan_buckets(params: Sequence[Tensor], cap_bytes: float) -> list[list[int]]:
    """Indices of `params` grouped into buckets, walking from the last parameter to the first.

    A bucket holds parameters of one device and dtype whose gradients total at most `cap_bytes`
    (`math.inf`: one bucket per device and dtype run). A parameter larger than `cap_bytes` gets a
    bucket of its own.
    """
    if not cap_bytes >= 0:
        raise ValueError(f"bucket size must be non-negative, got {cap_bytes} bytes")
    buckets: list[list[int]] = []
    current: list[int] = []
    current_bytes, current_kind = 0, None
    for i in reversed(range(len(params))):
        p = params[i]
        nbytes, kind = p.numel() * p.element_size(), (p.device, p.dtype)
        if current and (kind != current_kind or current_bytes + nbytes > cap_bytes):
            buckets.append(current)
            current, current_bytes = [], 0
        current.append(i)
        current_bytes += nbytes
        current_kind = kind
    if current:
        buckets.append(current)
    return buckets


@dataclass
class GradientGroup:
    """Parameters whose gradients travel in one all-reduce."""

    indices: list[int]  # positions in the wrapper's parameter list
    params: list[nn.Parameter]
    buffer: Tensor | None = None  # flat gradients of `params`; None: one gradient reduced in place
    views: list[Tensor] = field(default_factory=list)  # each parameter's slice of `buffer`, shaped like it
    work: Any = None  # the in-flight all-reduce of this step

    @classmethod
    def flat(cls, indices: list[int], params: list[nn.Parameter]) -> GradientGroup:
        buffer = torch.empty(sum(p.numel() for p in params), dtype=params[0].dtype, device=params[0].device)
        views, offset = [], 0
        for p in params:
            views.append(buffer[offset:offset + p.numel()].view(p.shape))
            offset += p.numel()
        return cls(indices, params, buffer, views)


class DDPBase(nn.Module):
    """Base of the DDP wrappers: wraps any module (kept at `.module`); `forward` calls it unchanged.

    `bucket_cap_bytes=None` all-reduces each gradient in place on its own; a number packs gradients
    into flat buckets of at most that many bytes (see `plan_buckets`). Training loop, every variant:

        loss = loss_fn(ddp(x), y); loss.backward()
        ddp.finish_gradient_synchronization()   # gradients now hold the average over ranks
        optimizer.step()

    Without a process group (one process, not launched) the wrapper changes nothing.
    """

    overlaps_backward = False  # True: all-reduces start from gradient hooks during backward

    def __init__(self, module: nn.Module, bucket_cap_bytes: float | None = None):
        super().__init__()
        self.module = module
        self.world_size = world_size()
        broadcast_from_rank0(module)
        self._params: list[nn.Parameter] = [p for p in module.parameters() if p.requires_grad]
        if len({p.device for p in self._params}) > 1:
            raise ValueError("a data-parallel module must keep all its trainable parameters on one device")
        last_first = [[i] for i in reversed(range(len(self._params)))]
        if bucket_cap_bytes is None:
            groups = [GradientGroup(ix, [self._params[i] for i in ix]) for ix in last_first]
        else:
            groups = [GradientGroup.flat(ix, [self._params[i] for i in ix])
                      for ix in plan_buckets(self._params, bucket_cap_bytes)]
        self._groups: list[GradientGroup] = groups
        self._group_of = {i: g for g, group in enumerate(groups) for i in group.indices}
        device = self._params[0].device if self._params else torch.device("cpu")
        self._used_counts = torch.zeros(len(self._params), dtype=torch.float32, device=device)
        self._next_group = 0  # groups [0, _next_group) have been launched this step
        self._sync_enabled = True
        self.groups_launched_in_backward = 0  # in the last synchronised step (0 unless overlapping)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    def _hook_gradients(self) -> None:
        """Call `self._on_gradient_ready(index, param)` from each trainable parameter's
        post-accumulate-grad hook, in parameter order, holding the wrapper only weakly (the
        overlapping wrappers; without a process group there is nothing to start, so no hooks)."""
        if dist.is_initialized():
            on_ready = weak_hook(self._on_gradient_ready)
            self._hooks = [p.register_post_accumulate_grad_hook(functools.partial(on_ready, i))
                           for i, p in enumerate(self._params)]

    @property
    def gradient_groups(self) -> list[list[nn.Parameter]]:
        """The parameters of each all-reduce, in the order they are issued."""
        return [list(g.params) for g in self._groups]

    @contextlib.contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward passes inside accumulate local gradients without communicating;
        `finish_gradient_synchronization()` inside does nothing, so call it in the same context as
        the backward it follows. The first synchronised backward after it averages the accumulated
        totals."""
        previous, self._sync_enabled = self._sync_enabled, False
        try:
            yield
        finally:
            self._sync_enabled = previous

    def on_train_batch_start(self) -> None:
        """Check that the last step's synchronisation finished (finish resets all per-step state)."""
        if self._step_in_progress():
            raise RuntimeError("gradients of the previous backward were not synchronised: call "
                               "finish_gradient_synchronization() after every backward outside no_sync()")

    def finish_gradient_synchronization(self) -> None:
        """Start the all-reduces backward did not start, wait for all of them, and leave every
        reduced gradient holding the average over ranks (None where no rank had one)."""
        if not self._sync_enabled or not dist.is_initialized():
            return
        had_grad = [p.grad is not None for p in self._params]  # before launching fills in zeros
        self.groups_launched_in_backward = self._next_group
        for group in self._groups[self._next_group:]:
            self._launch(group)
        if all(had_grad):
            self._used_counts.fill_(1.0)
        else:
            self._used_counts.copy_(torch.tensor(had_grad, dtype=torch.float32))
        counts_work = dist.all_reduce(self._used_counts, async_op=True)
        for group in self._groups:
            group.work.wait()
            group.work = None
        counts_work.wait()
        # Reading the counts syncs with the device, so only ranks that lacked a gradient do it.
        unused = set() if all(had_grad) else {i for i, n in enumerate(self._used_counts.tolist()) if n == 0}
        self._write_back_averages(unused)
        self._reset_step()

    # -- per-group mechanics, shared by every variant ------------------------------------------

    def _launch(self, group: GradientGroup) -> None:
        """Start the all-reduce of `group` (the next in order); a missing gradient counts as zeros."""
        if group.buffer is None:
            p = group.params[0]
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            elif p.grad.is_sparse:
                raise ValueError("sparse gradients are not supported")
            elif not p.grad.is_contiguous():  # collectives need dense contiguous memory
                p.grad = p.grad.contiguous()
            tensor = p.grad
        else:
            for p, view in zip(group.params, group.views, strict=True):
                if p.grad is None:
                    view.zero_()
                else:
                    view.copy_(p.grad)
            tensor = group.buffer
        group.work = dist.all_reduce(tensor, async_op=True)
        if not self.overlaps_backward:
            group.work.wait()  # the non-overlapped variants issue one collective at a time
        self._next_group += 1

    def _write_back_averages(self, unused: set[int]) -> None:
        in_place: list[Tensor] = []
        for group in self._groups:
            if group.buffer is None:
                i, p = group.indices[0], group.params[0]
                if i in unused:
                    p.grad = None  # was zeros only for the all-reduce
                else:
                    in_place.append(p.grad)
                continue
            group.buffer.div_(self.world_size)
            for i, p, view in zip(group.indices, group.params, group.views, strict=True):
                if i in unused:
                    continue
                if p.grad is None:
                    p.grad = view.clone()
                else:
                    p.grad.copy_(view)
        if in_place:
            torch._foreach_div_(in_place, self.world_size)

    def _reset_step(self) -> None:
        self._next_group = 0

    def _step_in_progress(self) -> bool:
        return self._next_group > 0
