"""Block-wise fully-sharded data parallelism for the leaderboard step: one flat shard per unit.

    fsdp = BlockFSDP(leaderboard_units(model), compute_dtype=torch.bfloat16, reshard_after_forward=True)
    x = fsdp.run_unit(0, embed_fn, tokens)                       # fn(params: dict, *args)
    x = fsdp.run_unit(1, block_fn, x, checkpointed=True)
    ...
    loss.backward(); fsdp.finish_gradient_synchronization()
    optimizer = FusedAdamW(fsdp.shards(), lowp_copies=fsdp.lowp_copies())

Why not `cs336sys.distributed.fsdp`: it gathers each Linear on its own (measured 1.106x FSDP2's
step at 2.7B: many small collectives, each a kernel launch and a sync) and it cannot be combined
with activation checkpointing, which the 8B step at 32k tokens needs. Here the unit is what FSDP2
shards: the token embedding, each TransformerBlock, and the final norm with the LM head.

Layout. A unit's parameters (registration order) are flattened into one fp32 vector, padded with
zeros to a multiple of the world size, broadcast from rank 0 (every rank starts from rank 0's
model), and rank r keeps the contiguous slice r as an `nn.Parameter` (`shard`, the master weight
the optimizer updates) plus a copy in the compute dtype (`lowp`, refreshed by the optimizer in its
own pass: FusedAdamW's low-precision copy), so the all-gather sends bf16. With fp32 compute `lowp`
is the shard itself. The model's own parameters are replaced by meta tensors: nothing full-size
stays behind, and the model is only ever run through `torch.func.functional_call` with views of a
gathered buffer (its parameters are never mutated).

Forward. `run_unit(k, fn, ...)` all-gathers unit k's `lowp` shards into a fresh flat buffer (or
waits for the gather prefetched for it), first issuing unit k+1's gather (prefetch: with resharding,
at most two gathered units exist while unit k runs in the forward). The views go through
`_UnitParams`, an autograd Function that is the identity forward and whose backward receives
every parameter's gradient at once:
they are copied into one fp32 flat buffer and reduce-scattered asynchronously (AVG over ranks)
into a shard-sized buffer; the queue keeps at most `MAX_REDUCTIONS_IN_FLIGHT` in flight, retiring
older ones (wait, then set or accumulate `shard.grad`). `finish_gradient_synchronization()` waits
for all of them.

Resharding and checkpointing. A checkpointed unit (non-reentrant torch.utils.checkpoint) saves
only its inputs; in the backward its function runs again and asks for its parameters again: with
`reshard_after_forward=True` the gathered buffer was dropped after the forward and is gathered
again; with False it was kept (the unit's parameters in the compute dtype stay in memory) and is
reused. A unit that is not checkpointed would keep its gathered buffer alive through the weights
autograd saves (the matmuls' W); with `reshard_after_forward=True` a saved-tensor hook replaces a
saved view of the buffer by (shape, stride, offset), and its first unpack in the backward gathers
the unit again. A saved view smaller than 1/64 of the unit (a norm's weight) is copied instead,
so the LM head unit is not gathered again for ln_final's 4096 elements. The checkpointed case
never installs that hook: inside checkpoint the innermost hook would win and store activations.

Backward prefetch. When a unit's backward gather is taken (its recompute, or the first unpack),
and again when its gradient is handed to the reduction, the previous unit that will need a
backward gather has its gather issued. When the last unit (the head) starts its forward, the last
block's backward gather is issued, so the first recompute of the backward does not wait.
Whether "in the backward": `torch._C._current_graph_task_id()` is -1 outside the autograd engine
(torch.utils.checkpoint uses the same call), so a recompute is told from the first forward.

Constraints: every rank runs the same units in the same order with the same policy (the
collectives are issued in that order); call `finish_gradient_synchronization()` after each
backward; a unit runs at most once per forward.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint, noop_context_fn

# torch >= 2.10 names the flat collectives *_single; 2.13 warns on the *_tensor names.
_all_gather_flat = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
_reduce_scatter_flat = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor

MAX_REDUCTIONS_IN_FLIGHT = 2
SMALL_SAVED_FRACTION = 64  # a saved view with at most numel/64 elements is copied, not re-gathered


def leaderboard_units(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(prefix, module) per unit of a TransformerLM: embedding, each block, ln_final + lm_head.
    The head unit is a ModuleDict over the model's own submodules, so its names stay the model's."""
    head = nn.ModuleDict({"ln_final": model.ln_final, "lm_head": model.lm_head})
    return ([("token_embeddings", model.token_embeddings)]
            + [(f"layers.{i}", block) for i, block in enumerate(model.layers)] + [("", head)])


def _set_parameter(module: nn.Module, name: str, value: nn.Parameter) -> None:
    owner, _, leaf = name.rpartition(".")
    (module.get_submodule(owner) if owner else module)._parameters[leaf] = value


@dataclass(frozen=True)
class _SavedView:
    """What autograd keeps instead of a large view of a gathered buffer."""

    unit: FlatUnit
    size: torch.Size
    stride: tuple[int, ...]
    offset: int


class FlatUnit:
    """One unit's flat fp32 shard, its low-precision copy, and its gathered buffers."""

    def __init__(self, index: int, prefix: str, module: nn.Module, owner: BlockFSDP):
        self.index, self.prefix, self.module, self.owner = index, prefix, module, owner
        named = list(module.named_parameters())
        self.param_names = [n for n, _ in named]
        self.shapes = [p.shape for _, p in named]
        self.numels = [p.numel() for _, p in named]
        self.offsets = [sum(self.numels[:i]) for i in range(len(named))]
        self.numel = sum(self.numels)
        world = owner.world_size
        self.shard_numel = -(-self.numel // world)
        self.padded_numel = self.shard_numel * world
        device = owner.device
        with torch.no_grad():
            flat = torch.zeros(self.padded_numel, dtype=torch.float32, device=device)
            for (_, p), offset, numel in zip(named, self.offsets, self.numels, strict=True):
                flat[offset:offset + numel].copy_(p.detach().reshape(-1))
            if world > 1:
                dist.broadcast(flat, src=0)
            start = owner.rank * self.shard_numel
            self.shard = nn.Parameter(flat[start:start + self.shard_numel].clone())
            del flat
            # fp32 compute gathers the master shard itself; otherwise a copy the optimizer refreshes
            self.lowp = (self.shard.detach() if owner.compute_dtype == torch.float32
                         else self.shard.detach().to(owner.compute_dtype))
        for (name, p), shape in zip(named, self.shapes, strict=True):  # free the full-size originals
            _set_parameter(module, name, nn.Parameter(torch.empty(shape, dtype=p.dtype, device="meta"),
                                                      requires_grad=p.requires_grad))
        self._inflight: tuple[Tensor, Any] | None = None  # (output buffer, work)
        self.gathers_issued = 0  # for tests and reports: how often this unit was gathered
        self.reset()

    def reset(self) -> None:
        """Per-step state (at the unit's forward and after gradient synchronisation)."""
        self.kept: Tensor | None = None  # checkpointed + reshard_after_forward=False: forward -> backward
        self.backward_flat: Tensor | None = None  # gathered for the backward, until the gradient is out
        self.forward_flat: Tensor | None = None  # only while a non-checkpointed forward runs (pack hook)
        self.checkpointed = False
        self.saved_weight = False  # the pack hook recorded a view: the backward must gather again
        self.backward_done = False
        self.ran_forward = False

    # --- gathers ------------------------------------------------------------------------------

    def start_gather(self) -> None:
        if self._inflight is not None:
            return
        self.gathers_issued += 1
        out = torch.empty(self.padded_numel, dtype=self.lowp.dtype, device=self.lowp.device)
        if self.owner.world_size == 1:
            out.copy_(self.lowp)  # same path as with collectives; a copy so the buffer is never the shard
            self._inflight = (out, None)
        else:
            self._inflight = (out, _all_gather_flat(out, self.lowp, async_op=True))

    @property
    def gather_in_flight(self) -> bool:
        return self._inflight is not None

    def wait_gather(self) -> Tensor:
        self.start_gather()
        out, work = self._inflight
        self._inflight = None
        if work is not None:
            work.wait()
        return out

    def views(self, flat: Tensor) -> tuple[Tensor, ...]:
        return tuple(flat[o:o + n].view(s) for o, n, s in zip(self.offsets, self.numels, self.shapes, strict=True))

    def needs_backward_gather(self) -> bool:
        return (self.ran_forward and not self.backward_done and self.kept is None and self.backward_flat is None
                and self.owner.reshard_after_forward and (self.checkpointed or self.saved_weight))

    # --- saved-tensor hooks (non-checkpointed units, reshard_after_forward=True) ----------------

    def pack(self, t: Tensor) -> Any:
        flat = self.forward_flat
        if (flat is None or t.device != flat.device
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
        flat = saved.unit.owner._backward_buffer(saved.unit)
        return flat.as_strided(saved.size, saved.stride, flat.storage_offset() + saved.offset)


class _UnitParams(torch.autograd.Function):
    """shard -> the unit's parameters as views of the gathered buffer; backward: their gradients
    go to the unit's reduce-scatter, nothing flows to the shard through autograd."""

    @staticmethod
    def forward(ctx: Any, shard: Tensor, unit: FlatUnit, flat: Tensor) -> tuple[Tensor, ...]:
        ctx.unit = unit
        return unit.views(flat)

    @staticmethod
    def backward(ctx: Any, *grads: Tensor | None) -> tuple[None, None, None]:
        ctx.unit.owner._reduce(ctx.unit, grads)
        return None, None, None


class BlockFSDP:
    """Units sharded flat over the ranks of the default process group (or none: world of one)."""

    def __init__(self, units: Sequence[tuple[str, nn.Module]], compute_dtype: torch.dtype = torch.bfloat16,
                 reshard_after_forward: bool = True, reduce_dtype: torch.dtype = torch.float32,
                 device: str | torch.device | None = None):
        self.rank = dist.get_rank() if dist.is_initialized() else 0
        self.world_size = dist.get_world_size() if dist.is_initialized() else 1
        first = next(p for _, m in units for p in m.parameters())
        self.device = torch.device(device) if device is not None else first.device
        self.compute_dtype = compute_dtype
        self.reduce_dtype = reduce_dtype
        self.reshard_after_forward = reshard_after_forward
        self.units = [FlatUnit(i, prefix, module, self) for i, (prefix, module) in enumerate(units)]
        self._reductions: list[tuple[FlatUnit, Tensor, Tensor, Any]] = []  # (unit, out, full, work)

    # --- what the step and the optimizer use ---------------------------------------------------

    def shards(self) -> list[nn.Parameter]:
        return [u.shard for u in self.units]

    def lowp_copies(self) -> dict[Tensor, Tensor]:
        """shard -> its low-precision copy, for FusedAdamW(lowp_copies=...); empty for fp32 compute."""
        return {u.shard: u.lowp for u in self.units if u.lowp.dtype != u.shard.dtype}

    @torch.no_grad()
    def refresh_lowp(self) -> None:
        """Recast the low-precision copies (for an optimizer that does not write them itself)."""
        for u in self.units:
            if u.lowp.dtype != u.shard.dtype:
                u.lowp.copy_(u.shard)

    def run_unit(self, index: int, fn: Callable[..., Any], *args: Any, checkpointed: bool = False,
                 context_fn: Callable[[], Any] | None = None) -> Any:
        """`fn(params, *args)` with `params` the unit's full parameters (name -> tensor, compute dtype).
        `context_fn`: the checkpoint's (torch.utils.checkpoint), e.g. a selective-checkpoint policy."""
        unit = self.units[index]
        if checkpointed and torch.is_grad_enabled():
            return checkpoint(self._call, unit, fn, True, *args, use_reentrant=False, preserve_rng_state=False,
                              context_fn=context_fn or noop_context_fn)
        return self._call(unit, fn, False, *args)

    def _call(self, unit: FlatUnit, fn: Callable[..., Any], checkpointed: bool, *args: Any) -> Any:
        in_backward = torch._C._current_graph_task_id() != -1  # a checkpoint recompute
        if in_backward:
            flat = self._backward_buffer(unit)
        else:
            unit.reset()
            unit.ran_forward, unit.checkpointed = True, checkpointed
            flat = self._forward_buffer(unit)
        track = torch.is_grad_enabled() and unit.shard.requires_grad
        params = _UnitParams.apply(unit.shard, unit, flat) if track else unit.views(flat)
        named = dict(zip(unit.param_names, params, strict=True))
        if in_backward or not track or not self.reshard_after_forward:
            if track and checkpointed and not in_backward:
                unit.kept = flat  # reshard_after_forward=False: the recompute reuses it
            return fn(named, *args)
        if checkpointed:
            return fn(named, *args)  # nothing of the buffer is saved: it dies with this frame
        unit.forward_flat = flat
        try:
            with torch.autograd.graph.saved_tensors_hooks(unit.pack, FlatUnit.unpack):
                return fn(named, *args)
        finally:
            unit.forward_flat = None

    # --- gathers and prefetching ---------------------------------------------------------------

    def _forward_buffer(self, unit: FlatUnit) -> Tensor:
        unit.start_gather()  # ours first (if not prefetched): every rank issues in the same order
        if unit.index + 1 < len(self.units):
            self.units[unit.index + 1].start_gather()
        else:
            self._prefetch_backward_before(unit.index)  # the head: the last block's recompute is next
        return unit.wait_gather()

    def _backward_buffer(self, unit: FlatUnit) -> Tensor:
        if unit.kept is not None:
            return unit.kept
        if unit.backward_flat is None:
            unit.start_gather()
            self._prefetch_backward_before(unit.index)
            unit.backward_flat = unit.wait_gather()
        return unit.backward_flat

    def _prefetch_backward_before(self, index: int) -> None:
        for unit in reversed(self.units[:index]):
            if unit.needs_backward_gather():
                unit.start_gather()  # no-op when already in flight
                return

    # --- gradient reduction --------------------------------------------------------------------

    def _reduce(self, unit: FlatUnit, grads: tuple[Tensor | None, ...]) -> None:
        unit.kept = unit.backward_flat = None  # the unit's backward is over: drop its gathered copy
        unit.backward_done = True
        full = torch.empty(unit.padded_numel, dtype=self.reduce_dtype, device=self.device)
        for grad, view in zip(grads, unit.views(full), strict=True):
            if grad is None:
                view.zero_()
            else:
                view.copy_(grad)  # the upcast to fp32 happens here, whatever the gradient's strides
        full[unit.numel:].zero_()
        if self.world_size == 1:
            out, work = full, None
        else:
            out = torch.empty(unit.shard_numel, dtype=self.reduce_dtype, device=self.device)
            work = _reduce_scatter_flat(out, full, op=dist.ReduceOp.AVG, async_op=True)
        self._reductions.append((unit, out, full, work))
        while len(self._reductions) > MAX_REDUCTIONS_IN_FLIGHT:
            self._retire(*self._reductions.pop(0))
        self._prefetch_backward_before(unit.index)

    @torch.no_grad()
    def _retire(self, unit: FlatUnit, out: Tensor, full: Tensor, work: Any) -> None:
        if work is not None:
            work.wait()  # on CUDA: the compute stream waits; `full` may then be reused
        grad = out.to(unit.shard.dtype)
        if unit.shard.grad is None:
            unit.shard.grad = grad
        else:
            unit.shard.grad.add_(grad)

    def finish_gradient_synchronization(self) -> None:
        """Wait for every reduce-scatter; leave the averaged fp32 gradients on the shards."""
        while self._reductions:
            self._retire(*self._reductions.pop(0))
        for unit in self.units:
            if unit.gather_in_flight:
                unit.wait_gather()  # a prefetch nobody used
            unit.reset()

    # --- checks -----------------------------------------------------------------------------------

    def _gather_fp32(self, unit: FlatUnit, shard: Tensor) -> dict[str, Tensor]:
        full = torch.empty(unit.padded_numel, dtype=torch.float32, device=self.device)
        if self.world_size == 1:
            full.copy_(shard)
        else:
            _all_gather_flat(full, shard.detach().float().contiguous())
        prefix = f"{unit.prefix}." if unit.prefix else ""
        return {prefix + n: v.clone() for n, v in zip(unit.param_names, unit.views(full), strict=True)}

    def gather_full_params(self) -> dict[str, Tensor]:
        """Every parameter, full and fp32, by its name in the model (a collective)."""
        out: dict[str, Tensor] = {}
        for unit in self.units:
            out.update(self._gather_fp32(unit, unit.shard.detach()))
        return out

    def gather_full_grads(self) -> dict[str, Tensor]:
        """Every parameter's averaged gradient, full and fp32 (a collective; zeros where none)."""
        out: dict[str, Tensor] = {}
        for unit in self.units:
            grad = unit.shard.grad if unit.shard.grad is not None else torch.zeros_like(unit.shard)
            out.update(self._gather_fp32(unit, grad))
        return out
