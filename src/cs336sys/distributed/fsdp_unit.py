"""One FSDP unit: a group of parameters held as one flat fp32 shard, gathered whole before use and
its gradient reduce-scattered whole after: FSDP's sharding, gathers and reduce-scatters, written
once. `cs336sys.distributed.fsdp` (module hooks, units of a layer or of k blocks) and
`cs336sys.distributed.fsdp_blocks` (units run explicitly, for the leaderboard step) decide when.

Layout. The unit's parameters (in the order given) are flattened and concatenated into n
elements, padded with zeros to P = ceil(n / world) * world, broadcast from rank 0 (every rank
starts from rank 0's values), and rank r keeps elements [r * P/world, (r+1) * P/world) as an fp32
Parameter `shard`: the master weight the optimizer updates, whatever dtype the model had. The
caller removes the originals from their modules.

Gathering. The all-gather sends the gather dtype (the compute dtype: low-precision runs send half
the bytes): with `keep_lowp` a persistent copy of the shard in that dtype (`lowp`, which the
optimizer refreshes: FusedAdamW's low-precision copy; with fp32 it is the shard itself), else the
shard cast at each gather. The gathered flat vector is exposed as views shaped like the original
parameters; `UnitParams` is the autograd function that hands their gradients, all at once, to
the unit's owner (`owner.reduce(unit, grads)`), which calls `reduce_scatter`.

Saved tensors. While a unit's forward runs with `forward_flat` set, `pack` replaces any tensor
autograd saves that lives in the gathered storage (the weight a matmul keeps for the input
gradient) by a record (shape, strides, offset) and sets `saved_weight`; `unpack` rebuilds it from
`owner.backward_buffer(unit)` (gathered again, or prefetched). A saved view of at most 1/64 of the
unit (a norm's weight inside a block) is copied instead, so a unit is not gathered again for it.

Reduction. The gradients are copied into one flat buffer in `reduce_dtype` (fp32 by default; a
single unpadded gradient is converted without an extra copy) and reduce-scattered asynchronously:
with `reduce_op="avg"` the collective averages; with "sum" it sums and `retire` divides by the
world size. `ReductionQueue` keeps at most `MAX_REDUCTIONS_IN_FLIGHT` in flight and retires older
ones (wait, then set or accumulate `shard.grad` in fp32), so full-size gradient buffers are freed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

# torch >= 2.10 names the flat collectives *_single; 2.13 warns on the *_tensor names.
_all_gather_flat = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_flat = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

MAX_REDUCTIONS_IN_FLIGHT = 2
SMALL_SAVED_FRACTION = 64  # a saved view with at most numel/64 elements is copied, not re-gathered
REDUCE_OPS = {"avg": dist.ReduceOp.AVG, "sum": dist.ReduceOp.SUM}


def is_shardable_layer(module: nn.Module) -> bool:
    """A leaf module that directly owns a 2-D Parameter named `weight` (Linear- or Embedding-like)."""
    weight = module._parameters.get("weight")
    return (isinstance(weight, nn.Parameter) and weight.dim() == 2 and weight.numel() > 0
            and next(module.children(), None) is None)


@dataclass(frozen=True)
class UnitParameter:
    """Where one parameter of a unit lives: `owner._parameters[attr]`, named `name` in the model."""

    name: str
    owner: nn.Module
    attr: str


def parameters_of(prefix: str, module: nn.Module, skip: frozenset[int] = frozenset()) -> list[UnitParameter]:
    """`module`'s parameters (registration order, those whose id is in `skip` left out), named in
    the model as `prefix` + their name in `module`."""
    out = []
    for name, p in module.named_parameters():
        if id(p) not in skip:
            owner, _, attr = name.rpartition(".")
            out.append(UnitParameter(f"{prefix}.{name}" if prefix else name, module.get_submodule(owner), attr))
    return out


@dataclass(frozen=True)
class _SavedView:
    """What autograd keeps instead of a large view of a gathered buffer: enough to rebuild it."""

    unit: FlatUnit
    size: torch.Size
    stride: tuple[int, ...]
    offset: int


@dataclass
class Reduction:
    """One reduce-scatter in flight: its output, the full-size input it reads, and its work."""

    unit: FlatUnit
    out: Tensor
    full: Tensor
    work: Any


class UnitParams(torch.autograd.Function):
    """shard -> the unit's parameters as views of the gathered buffer; backward: their gradients
    go to the owner's reduction of the unit, nothing flows to the shard through autograd."""

    @staticmethod
    def forward(ctx: Any, shard: Tensor, unit: FlatUnit, flat: Tensor) -> tuple[Tensor, ...]:
        ctx.unit = unit
        return unit.views(flat)

    @staticmethod
    def backward(ctx: Any, *grads: Tensor | None) -> tuple[None, None, None]:
        ctx.unit.owner.reduce(ctx.unit, grads)
        return None, None, None


class FlatUnit:
    """One unit's flat fp32 shard, its gathers, saved-tensor records and gradient reductions."""

    def __init__(self, index: int, params: list[UnitParameter], owner: Any, rank: int, world_size: int,
                 device: torch.device, gather_dtype: torch.dtype, keep_lowp: bool = False,
                 reduce_dtype: torch.dtype = torch.float32, reduce_op: str = "avg"):
        self.index, self.params, self.owner = index, params, owner  # owner: backward_buffer(), reduce()
        self.rank, self.world_size, self.device = rank, world_size, device
        self.gather_dtype, self.reduce_dtype, self.reduce_op = gather_dtype, reduce_dtype, REDUCE_OPS[reduce_op]
        originals = [p.owner._parameters[p.attr] for p in params]
        self.shapes = [t.shape for t in originals]
        self.numels = [t.numel() for t in originals]
        self.offsets = [sum(self.numels[:i]) for i in range(len(originals))]
        self.numel = sum(self.numels)
        self.shard_numel = -(-self.numel // world_size)
        self.padded_numel = self.shard_numel * world_size
        with torch.no_grad():
            flat = torch.zeros(self.padded_numel, dtype=torch.float32, device=device)
            for t, offset, numel in zip(originals, self.offsets, self.numels, strict=True):
                flat[offset:offset + numel].copy_(t.detach().reshape(-1))
            if world_size > 1:
                dist.broadcast(flat, src=0)
            start = rank * self.shard_numel
            self.shard = nn.Parameter(flat[start:start + self.shard_numel].clone(),
                                      requires_grad=any(t.requires_grad for t in originals))
            del flat
            self.lowp = self.shard.detach().to(gather_dtype) if keep_lowp else None
        self._inflight: tuple[Tensor, Tensor, Any] | None = None  # (output, input, work)
        self.gathers_issued = 0  # for tests and reports: how often this unit was gathered
        self.forward_flat: Tensor | None = None  # set by the owner while the unit's forward runs
        self.backward_flat: Tensor | None = None  # gathered for the backward, until the reduction
        self.saved_weight = False  # did `pack` record a view of the gathered buffer?

    @property
    def names(self) -> list[str]:
        return [p.name for p in self.params]

    # --- gathers ------------------------------------------------------------------------------

    @property
    def gather_in_flight(self) -> bool:
        return self._inflight is not None

    def start_gather(self) -> None:
        """Issue the async all-gather of the full parameters in the gather dtype (no-op if in flight)."""
        if self._inflight is not None:
            return
        self.gathers_issued += 1
        send = self.lowp if self.lowp is not None else self.shard.detach().to(self.gather_dtype)
        out = torch.empty(self.padded_numel, dtype=self.gather_dtype, device=send.device)
        if self.world_size == 1:
            out.copy_(send)  # same path as with collectives; a copy so the buffer is never the shard
            self._inflight = (out, send, None)
        else:
            self._inflight = (out, send, _all_gather_flat(out, send, async_op=True))

    def wait_gather(self) -> Tensor:
        """The gathered flat vector (the gather is issued now if none is in flight)."""
        if self._inflight is None:
            self.start_gather()
        out, _, work = self._inflight
        self._inflight = None
        if work is not None:
            work.wait()
        return out

    def views(self, flat: Tensor) -> tuple[Tensor, ...]:
        return tuple(flat[o:o + n].view(s) for o, n, s in zip(self.offsets, self.numels, self.shapes, strict=True))

    def parameters_from(self, flat: Tensor, track_grad: bool) -> tuple[Tensor, ...]:
        """The unit's parameters as views of `flat`, through `UnitParams` when gradients are wanted."""
        return UnitParams.apply(self.shard, self, flat) if track_grad else self.views(flat)

    def gather_fp32(self, source: Tensor) -> dict[str, Tensor]:
        """`source` (this rank's shard or its gradient) gathered in fp32 now (a collective), as fresh
        tensors by parameter name."""
        full = torch.empty(self.padded_numel, dtype=torch.float32, device=self.device)
        if self.world_size == 1:
            full.copy_(source.detach())
        else:
            _all_gather_flat(full, source.detach().float().contiguous())
        return {name: v.clone() for name, v in zip(self.names, self.views(full), strict=True)}

    # --- saved-tensor hooks -------------------------------------------------------------------

    def pack(self, t: Tensor) -> Any:
        flat = self.forward_flat
        if (flat is None or t.device != flat.device or t.dtype != flat.dtype
                or t.untyped_storage().data_ptr() != flat.untyped_storage().data_ptr()):
            return t
        if t.numel() * SMALL_SAVED_FRACTION <= self.numel:
            return t.clone()
        self.saved_weight = True
        return _SavedView(self, t.size(), t.stride(), t.storage_offset() - flat.storage_offset())

    @staticmethod
    def unpack(saved: Any) -> Tensor:
        if not isinstance(saved, _SavedView):
            return saved
        flat = saved.unit.owner.backward_buffer(saved.unit)
        return flat.as_strided(saved.size, saved.stride, flat.storage_offset() + saved.offset)

    # --- gradient reduction -------------------------------------------------------------------

    def reduce_scatter(self, grads: tuple[Tensor | None, ...]) -> Reduction:
        """Issue the async reduce-scatter of the unit's gradients (None counts as zeros)."""
        if len(grads) == 1 and grads[0] is not None and self.numel == self.padded_numel:
            full = grads[0].reshape(-1).to(self.reduce_dtype).contiguous()
        else:
            full = torch.empty(self.padded_numel, dtype=self.reduce_dtype, device=self.device)
            for grad, view in zip(grads, self.views(full), strict=True):
                if grad is None:
                    view.zero_()
                else:
                    view.copy_(grad)  # the upcast happens here, whatever the gradient's strides
            full[self.numel:].zero_()
        if self.world_size == 1:
            return Reduction(self, full, full, None)
        out = torch.empty(self.shard_numel, dtype=self.reduce_dtype, device=full.device)
        return Reduction(self, out, full, _reduce_scatter_flat(out, full, op=self.reduce_op, async_op=True))

    @torch.no_grad()
    def retire(self, reduction: Reduction) -> None:
        """Wait for one of this unit's reductions; set or accumulate the averaged `shard.grad`."""
        if reduction.work is not None:
            reduction.work.wait()  # on CUDA: the compute stream waits; `full` may then be reused
        grad = reduction.out
        if self.reduce_op == dist.ReduceOp.SUM and self.world_size > 1:
            grad = grad.div_(self.world_size)
        grad = grad.to(self.shard.dtype)
        if self.shard.grad is None:
            self.shard.grad = grad
        else:
            self.shard.grad.add_(grad)


class ReductionQueue:
    """Reductions in flight, oldest first; at most `MAX_REDUCTIONS_IN_FLIGHT` are left in flight."""

    def __init__(self) -> None:
        self._queue: list[Reduction] = []

    def push(self, reduction: Reduction) -> None:
        self._queue.append(reduction)
        while len(self._queue) > MAX_REDUCTIONS_IN_FLIGHT:
            self._retire_oldest()

    def finish(self, key: Callable[[Reduction], Any] | None = None) -> None:
        """Retire every reduction: oldest first, or in the order of `key`."""
        if key is not None:
            self._queue.sort(key=key)
        while self._queue:
            self._retire_oldest()

    def _retire_oldest(self) -> None:
        reduction = self._queue.pop(0)
        reduction.unit.retire(reduction)
