"""FSDP driven unit by unit, for the leaderboard step: the units of `fsdp_unit`, run explicitly.

    fsdp = BlockFSDP(leaderboard_units(model), compute_dtype=torch.bfloat16, reshard_after_forward=True)
    x = fsdp.run_unit(0, embed_fn, tokens)                       # fn(params: dict, *args)
    x = fsdp.run_unit(1, block_fn, x, checkpointed=True)
    ...
    loss.backward(); fsdp.finish_gradient_synchronization()
    optimizer = FusedAdamW(fsdp.shards(), lowp_copies=fsdp.lowp_copies())

Why not the hooks of `cs336sys.distributed.fsdp`: the 8B step at 32k tokens checkpoints blocks,
and its head runs as a fused LM head + loss on the head's parameters, not as the model's modules.
So the step calls each unit itself; sharding, gathers, saved-tensor records and reduce-scatters
are `fsdp_unit.FlatUnit`'s, as in `FSDP(model, unit="block")`. The units are what FSDP2 shards:
the token embedding, each TransformerBlock, and the final norm with the LM head.

Layout. Each unit is one `FlatUnit` (reduce op AVG) with a persistent shard in the compute dtype
(`lowp`, which FusedAdamW rewrites in its own pass), so the all-gather sends bf16; with fp32
compute `lowp` is the shard itself. The model's own parameters are replaced by meta tensors:
nothing full-size stays behind, and the model is only ever run through
`torch.func.functional_call` with views of a gathered buffer (its parameters are never mutated).

Forward. `run_unit(k, fn, ...)` all-gathers unit k into a fresh flat buffer (or waits for the
gather prefetched for it), first issuing unit k+1's gather (prefetch: with resharding, at most two
gathered units exist while unit k runs in the forward). The views go through `fsdp_unit.UnitParams`,
whose backward hands every parameter's gradient at once to `reduce`: one reduce-scatter, at most
`fsdp_unit.MAX_REDUCTIONS_IN_FLIGHT` left in flight. `finish_gradient_synchronization()` waits for
all of them.

Resharding and checkpointing. A checkpointed unit (non-reentrant torch.utils.checkpoint) saves
only its inputs; in the backward its function runs again and asks for its parameters again: with
`reshard_after_forward=True` the gathered buffer was dropped after the forward and is gathered
again; with False it was kept (the unit's parameters in the compute dtype stay in memory) and is
reused. A unit that is not checkpointed would keep its gathered buffer alive through the weights
autograd saves (the matmuls' W); with `reshard_after_forward=True` the unit's saved-tensor hooks
replace a saved view of the buffer by a record, and its first unpack in the backward gathers the
unit again (a small view, such as ln_final's weight in the head unit, is copied instead). The
checkpointed case never installs those hooks: inside checkpoint the innermost hook would win and
store activations.

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
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint, noop_context_fn

from cs336sys.distributed import process_group
from cs336sys.distributed.fsdp_unit import FlatUnit, ReductionQueue, parameters_of


def leaderboard_units(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """(prefix, module) per unit of a TransformerLM: embedding, each block, ln_final + lm_head.
    The head unit is a ModuleDict over the model's own submodules, so its names stay the model's."""
    head = nn.ModuleDict({"ln_final": model.ln_final, "lm_head": model.lm_head})
    return ([("token_embeddings", model.token_embeddings)]
            + [(f"layers.{i}", block) for i, block in enumerate(model.layers)] + [("", head)])


@dataclass
class _StepState:
    """What one unit did in this step (reset at its forward and after gradient synchronisation)."""

    kept: Tensor | None = None  # checkpointed + reshard_after_forward=False: forward -> backward
    checkpointed: bool = False
    backward_done: bool = False
    ran_forward: bool = False


class BlockFSDP:
    """Units sharded flat over the ranks of the default process group (or none: world of one)."""

    def __init__(self, units: Sequence[tuple[str, nn.Module]], compute_dtype: torch.dtype = torch.bfloat16,
                 reshard_after_forward: bool = True, reduce_dtype: torch.dtype = torch.float32,
                 device: str | torch.device | None = None):
        self.rank, self.world_size = process_group.rank(), process_group.world_size()
        first = next(p for _, m in units for p in m.parameters())
        self.device = torch.device(device) if device is not None else first.device
        self.compute_dtype = compute_dtype
        self.reshard_after_forward = reshard_after_forward
        self.units: list[FlatUnit] = []
        self._fn_names = [[name for name, _ in module.named_parameters()] for _, module in units]  # as fn sees them
        for prefix, module in units:
            params = parameters_of(prefix, module)
            unit = FlatUnit(len(self.units), params, self, self.rank, self.world_size, self.device, compute_dtype,
                            keep_lowp=True, reduce_dtype=reduce_dtype, reduce_op="avg")
            for p in params:  # free the full-size originals
                original = p.owner._parameters[p.attr]
                p.owner._parameters[p.attr] = nn.Parameter(torch.empty_like(original, device="meta"),
                                                           requires_grad=original.requires_grad)
            self.units.append(unit)
        self._state = [_StepState() for _ in self.units]
        self._reductions = ReductionQueue()

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
            flat = self.backward_buffer(unit)
        else:
            self._reset(unit)
            state = self._state[unit.index]
            state.ran_forward, state.checkpointed = True, checkpointed
            flat = self._forward_buffer(unit)
        track = torch.is_grad_enabled() and unit.shard.requires_grad
        named = dict(zip(self._fn_names[unit.index], unit.parameters_from(flat, track), strict=True))
        if in_backward or not track or not self.reshard_after_forward:
            if track and checkpointed and not in_backward:
                self._state[unit.index].kept = flat  # reshard_after_forward=False: the recompute reuses it
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

    def _reset(self, unit: FlatUnit) -> None:
        self._state[unit.index] = _StepState()
        unit.forward_flat = unit.backward_flat = None
        unit.saved_weight = False

    def _needs_backward_gather(self, unit: FlatUnit) -> bool:
        state = self._state[unit.index]
        return (state.ran_forward and not state.backward_done and state.kept is None and unit.backward_flat is None
                and self.reshard_after_forward and (state.checkpointed or unit.saved_weight))

    def _forward_buffer(self, unit: FlatUnit) -> Tensor:
        unit.start_gather()  # ours first (if not prefetched): every rank issues in the same order
        if unit.index + 1 < len(self.units):
            self.units[unit.index + 1].start_gather()
        else:
            self._prefetch_backward_before(unit.index)  # the head: the last block's recompute is next
        return unit.wait_gather()

    def backward_buffer(self, unit: FlatUnit) -> Tensor:
        """The unit's gathered parameters for its backward (a recompute, or unpacking a saved weight)."""
        kept = self._state[unit.index].kept
        if kept is not None:
            return kept
        if unit.backward_flat is None:
            unit.start_gather()
            self._prefetch_backward_before(unit.index)
            unit.backward_flat = unit.wait_gather()
        return unit.backward_flat

    def _prefetch_backward_before(self, index: int) -> None:
        for unit in reversed(self.units[:index]):
            if self._needs_backward_gather(unit):
                unit.start_gather()  # no-op when already in flight
                return

    # --- gradient reduction --------------------------------------------------------------------

    def reduce(self, unit: FlatUnit, grads: tuple[Tensor | None, ...]) -> None:
        """The unit's gradients are complete: drop its gathered copy, reduce-scatter them, prefetch."""
        self._state[unit.index].kept = unit.backward_flat = None
        self._state[unit.index].backward_done = True
        self._reductions.push(unit.reduce_scatter(grads))
        self._prefetch_backward_before(unit.index)

    def finish_gradient_synchronization(self) -> None:
        """Wait for every reduce-scatter; leave the averaged fp32 gradients on the shards."""
        self._reductions.finish()
        for unit in self.units:
            if unit.gather_in_flight:
                unit.wait_gather()  # a prefetch nobody used
            self._reset(unit)

    # --- checks -----------------------------------------------------------------------------------

    def gather_full_params(self) -> dict[str, Tensor]:
        """Every parameter, full and fp32, by its name in the model (a collective)."""
        out: dict[str, Tensor] = {}
        for unit in self.units:
            out.update(unit.gather_fp32(unit.shard))
        return out

    def gather_full_grads(self) -> dict[str, Tensor]:
        """Every parameter's averaged gradient, full and fp32 (a collective; zeros where none)."""
        out: dict[str, Tensor] = {}
        for unit in self.units:
            out.update(unit.gather_fp32(unit.shard.grad if unit.shard.grad is not None
                                        else torch.zeros_like(unit.shard)))
        return out
