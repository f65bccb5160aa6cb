"""One fully-sharded layer: its parameters as one flat fp32 vector, padded and split over the ranks,
gathered before use and its gradient reduce-scattered after. `cs336sys.distributed.fsdp` decides
when; this module does the work for one layer.

Which layers. `is_shardable_layer`: a leaf module (no child modules) that directly owns a 2-D
`weight` Parameter: the operand of a matrix product (Linear-like) or a lookup table
(Embedding-like), whatever the class (ours, torch.nn's, anyone's). All parameters the module owns
directly are sharded together (nn.Linear's bias rides along with its weight, so both are cast and
gathered in one collective). Norm weights (1-D) and anything else stay replicated, as does a
module whose parameter is also owned by another module (tied weights): swapping the tensor in one
owner would not reach the other.

Layout. The layer's parameters are flattened in registration order and concatenated into n
elements, padded with zeros to P = ceil(n / world) * world; rank r keeps elements
[r * P/world, (r+1) * P/world) as an fp32 Parameter `flat_shard` registered on the layer in place
of the originals (so the optimizer sees fp32 master shards, whatever dtype the model had).

Gathering. The shard is cast to the gather dtype (the compute dtype, else the parameters' own)
before the all-gather, so low-precision runs send half the bytes. The gathered flat vector is
exposed to the layer's forward as views named like the original parameters (`module.weight`),
produced by `GatherLayerParams`, an autograd function whose backward receives the gradients of
those views and hands them to `reduce_scatter_grads`.

Freeing. While the layer's forward runs, saved-tensor hooks replace any tensor that autograd
saves and that lives in the gathered storage (the weight a matmul keeps for the input gradient)
by a small record (shape, strides, offset); the gathered vector is dropped when the forward ends.
In the backward, the first unpack of such a record gathers the layer again (or takes a prefetched
gather) and keeps it until the layer's gradient has been reduce-scattered. A layer whose weight
is never saved (an embedding lookup) is not gathered in the backward at all.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

# torch >= 2.10 names the single-tensor collectives *_single; older versions only have *_tensor.
_all_gather_flat = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_flat = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

FLAT_SHARD_NAME = "flat_shard"


def is_shardable_layer(module: nn.Module) -> bool:
    """A leaf module that directly owns a 2-D Parameter named `weight` (Linear- or Embedding-like)."""
    weight = module._parameters.get("weight")
    return (isinstance(weight, nn.Parameter) and weight.dim() == 2 and weight.numel() > 0
            and next(module.children(), None) is None)


@dataclass(frozen=True)
class _SavedView:
    """What autograd keeps instead of a view of the gathered parameters: enough to rebuild it."""

    layer: ShardedLayer
    size: torch.Size
    stride: tuple[int, ...]
    storage_offset: int


class GatherLayerParams(torch.autograd.Function):
    """flat_shard -> the layer's full parameters (views of an already gathered vector); backward:
    the parameters' gradients go to the layer's reduce-scatter, nothing flows to the shard."""

    @staticmethod
    def forward(ctx: Any, shard: Tensor, layer: ShardedLayer, gathered: Tensor) -> tuple[Tensor, ...]:
        ctx.layer = layer
        return layer.views(gathered)

    @staticmethod
    def backward(ctx: Any, *grads: Tensor | None) -> tuple[None, None, None]:
        ctx.layer.reduce_scatter_grads(grads)
        return None, None, None


class ShardedLayer:
    """The flat shard of one layer's parameters, its gathers and its gradient reductions."""

    def __init__(self, index: int, path: str, module: nn.Module, rank: int, world_size: int,
                 compute_dtype: torch.dtype | None, reduce_dtype: torch.dtype, scheduler: Any):
        self.index, self.path, self.module = index, path, module
        self.rank, self.world_size = rank, world_size
        self.scheduler = scheduler  # the FSDP object: told when a backward gather or reduction happens
        self.param_names = [n for n, p in module._parameters.items() if p is not None]
        params = [module._parameters[n] for n in self.param_names]
        self.shapes = [p.shape for p in params]
        self.numels = [p.numel() for p in params]
        self.offsets = [sum(self.numels[:i]) for i in range(len(params))]
        self.numel = sum(self.numels)
        self.shard_numel = -(-self.numel // world_size)
        self.padded_numel = self.shard_numel * world_size
        self.gather_dtype = compute_dtype or module.weight.dtype
        self.reduce_dtype = reduce_dtype
        device = module.weight.device
        with torch.no_grad():
            flat = torch.zeros(self.padded_numel, dtype=torch.float32, device=device)
            for p, offset, numel in zip(params, self.offsets, self.numels, strict=True):
                flat[offset:offset + numel].copy_(p.reshape(-1))
            start = rank * self.shard_numel
            self.shard = nn.Parameter(flat[start:start + self.shard_numel].clone(),
                                      requires_grad=any(p.requires_grad for p in params))
        for name in self.param_names:
            del module._parameters[name]
        module.register_parameter(FLAT_SHARD_NAME, self.shard)

        self._gather: tuple[Tensor, Tensor, Any] | None = None  # (output, input, work) in flight
        self.forward_gathered: Tensor | None = None  # while the layer's forward runs
        self.backward_gathered: Tensor | None = None  # from the first unpack until the reduction
        self.saved_weight = False  # did autograd save a view of the weight in this forward? (FSDP resets it)
        self._hooks: Any = None
        self._reductions: list[tuple[Tensor, Tensor, Any]] = []  # (shard grad, full grad, work)

    # --- gathers ------------------------------------------------------------------------------

    @property
    def gather_in_flight(self) -> bool:
        return self._gather is not None

    def start_gather(self) -> None:
        """Issue the async all-gather of the full parameters (cast to the gather dtype first)."""
        assert self._gather is None, f"{self.path}: a gather is already in flight"
        send = self.shard.detach().to(self.gather_dtype)
        out = torch.empty(self.padded_numel, dtype=self.gather_dtype, device=send.device)
        if self.world_size == 1:
            out.copy_(send)
            work = None
        else:
            work = _all_gather_flat(out, send, async_op=True)
        self._gather = (out, send, work)

    def wait_gather(self) -> Tensor:
        """The gathered flat vector (started now if no prefetch is in flight)."""
        if self._gather is None:
            self.start_gather()
        out, _, work = self._gather
        self._gather = None
        if work is not None:
            work.wait()
        return out

    def views(self, gathered: Tensor) -> tuple[Tensor, ...]:
        return tuple(gathered[o:o + n].view(shape)
                     for o, n, shape in zip(self.offsets, self.numels, self.shapes, strict=True))

    def full_fp32(self) -> dict[str, Tensor]:
        """The layer's full parameters in fp32, gathered now (a collective), as fresh tensors."""
        out = torch.empty(self.padded_numel, dtype=self.shard.dtype, device=self.shard.device)
        if self.world_size == 1:
            out.copy_(self.shard.detach())
        else:
            _all_gather_flat(out, self.shard.detach())
        return dict(zip(self.param_names, (v.clone() for v in self.views(out)), strict=True))

    # --- forward ------------------------------------------------------------------------------

    def install(self, gathered: Tensor, track_grad: bool) -> None:
        """Expose the gathered parameters as the module's attributes and start recording saves."""
        self.forward_gathered = gathered
        params = (GatherLayerParams.apply(self.shard, self, gathered) if track_grad else self.views(gathered))
        for name, value in zip(self.param_names, params, strict=True):
            setattr(self.module, name, value)
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self._hooks.__enter__()

    def uninstall(self) -> None:
        """After the layer's forward: stop the hooks and drop our references to the gathered vector."""
        if self._hooks is not None:
            self._hooks.__exit__(None, None, None)
            self._hooks = None
        for name in self.param_names:
            self.module.__dict__.pop(name, None)
        self.forward_gathered = None

    def _pack(self, t: Tensor) -> Any:
        gathered = self.forward_gathered
        if (gathered is not None and t.device == gathered.device and t.dtype == gathered.dtype
                and t.untyped_storage().data_ptr() == gathered.untyped_storage().data_ptr()):
            self.saved_weight = True
            return _SavedView(self, t.size(), t.stride(), t.storage_offset() - gathered.storage_offset())
        return t

    @staticmethod
    def _unpack(saved: Any) -> Tensor:
        if isinstance(saved, _SavedView):
            gathered = saved.layer.gathered_for_backward()
            return gathered.as_strided(saved.size, saved.stride, gathered.storage_offset() + saved.storage_offset)
        return saved

    # --- backward -----------------------------------------------------------------------------

    def gathered_for_backward(self) -> Tensor:
        if self.backward_gathered is None:
            if self._gather is None:
                self.start_gather()  # ours first: it is needed now, the prefetch after it
            self.scheduler.before_backward_gather(self)
            self.backward_gathered = self.wait_gather()
        return self.backward_gathered

    def reduce_scatter_grads(self, grads: tuple[Tensor | None, ...]) -> None:
        """Sum the layer's gradient over ranks into this rank's slice (async); free the gathered copy."""
        self.backward_gathered = None
        if len(grads) == 1 and grads[0] is not None and self.numel == self.padded_numel:
            full = grads[0].reshape(-1).to(self.reduce_dtype).contiguous()
        else:
            full = torch.zeros(self.padded_numel, dtype=self.reduce_dtype, device=self.shard.device)
            for grad, offset, numel in zip(grads, self.offsets, self.numels, strict=True):
                if grad is not None:
                    full[offset:offset + numel].copy_(grad.reshape(-1))
        out = torch.empty(self.shard_numel, dtype=self.reduce_dtype, device=full.device)
        if self.world_size == 1:
            out.copy_(full)
            work = None
        else:
            work = _reduce_scatter_flat(out, full, op=dist.ReduceOp.SUM, async_op=True)
        self._reductions.append((out, full, work))
        self.scheduler.after_reduce_scatter(self)

    @torch.no_grad()
    def finish_reductions(self) -> None:
        """Wait for this layer's reduce-scatters; average and accumulate them into `flat_shard.grad`."""
        for out, _, work in self._reductions:
            if work is not None:
                work.wait()
            grad = out.div_(self.world_size).to(self.shard.dtype)
            if self.shard.grad is None:
                self.shard.grad = grad
            else:
                self.shard.grad.add_(grad)
        self._reductions.clear()

    def drop_gathers(self) -> None:
        """Complete and discard any gather still in flight or kept (unused prefetches)."""
        if self._gather is not None:
            self.wait_gather()
        self.backward_gathered = None
