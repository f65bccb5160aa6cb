"""Fully-sharded data parallel training of an unchanged `nn.Module`, with gathers prefetched.

    model = FSDP(build_model("xl", 512), compute_dtype=torch.bfloat16, unit="block")
    optimizer = AdamW(model.parameters())       # fp32 flat shards + replicated parameters
    loss_fn(model(x_local), y_local).backward()
    model.finish_gradient_synchronization()
    optimizer.step()

Units. The parameters are sharded in units (`fsdp_unit.FlatUnit`: one flat shard, one all-gather
and one reduce-scatter per use), chosen by `unit`:
  "layer" (the default, the course adapter's FSDP): every Linear- or Embedding-like layer
          (`fsdp_unit.is_shardable_layer`) is a unit;
  "block": every block (each entry of the model's ModuleLists: a TransformerLM's `layers`) is a
          unit with all its parameters, norms included; outside the blocks, every Linear- or
          Embedding-like layer is a unit (a TransformerLM's embedding and LM head), as with "layer";
  k (an int): k consecutive blocks per unit, the rest as with "block".
Everything else (norms outside blocks, tied parameters) is replicated. Units are ordered as their
first module is registered. At construction each unit's flat vector and every replicated
parameter and buffer are broadcast from rank 0, so all ranks start from the same model.

Forward. Before a unit's first module runs (a forward pre-hook), its full parameters are made
available: the gather prefetched for it is waited on, or one is issued and waited on if none is
in flight. Floating-point tensor arguments of that module are cast to `compute_dtype` when one is
given, as its parameters are. After the unit's last module runs (a forward hook), the gathered
parameters are dropped.
Prefetch rule (forward): the expected order of unit calls is the order of the previous forward
(before the first one: unit order). When the forward starts, the gathers of the first two
expected calls are issued; when the call at position k ends, the gather of the call expected at
position k + 2 is issued. So the gather of a unit starts once the unit two before it has
finished, and at most two gathered copies exist at a time (the running unit's and the next
one's; the one after is issued only as the running one is dropped).

Backward. The expected backward order is the reverse of the last forward's calls (each unit at
its last call), keeping only units whose weight autograd saved (embeddings need no weight for
their gradient and are not gathered again). The first time autograd unpacks a unit's saved
weight, the unit is gathered again (or its prefetched gather waited on); when the first gather
of a backward happens for the unit at expected position k, the one at k + 1 is issued, and when
the unit at position k has its gradient, the one at k + 2 is issued (the forward rule mirrored).
When a unit's parameter gradients are complete, autograd hands them to `reduce`, which drops the
gathered copy and issues an async reduce-scatter (in `reduce_dtype`, fp32 by default, summed and
divided by the world size as it is retired) of the padded flat gradient; at most
`fsdp_unit.MAX_REDUCTIONS_IN_FLIGHT` are left in flight.
Replicated parameters' gradients are all-reduced asynchronously (in place) as soon as each is
accumulated (a post-accumulate-grad hook).

`finish_gradient_synchronization()` waits for everything, divides by the world size (so the
gradient is the average over ranks) and leaves fp32 gradients on the shards (`flat_shard.grad`)
and on the replicated parameters. Call it after every backward (before the next one), before
`optimizer.step()`. Gradients accumulate over backward passes until `zero_grad`.

Constraints: every rank must call the same units in the same order (as in any data parallelism:
the collectives are issued in call order); the modules of a k-block unit must run one after the
other; a unit's full parameters exist as attributes (`module.weight`) only while it runs.
Combining this with activation checkpointing of the wrapped model (`checkpoint_blocks`) is not
supported (the leaderboard step's `fsdp_blocks.BlockFSDP` drives the same units explicitly and
supports it).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from cs336sys.distributed import process_group
from cs336sys.distributed.ddp_base import weak_hook
from cs336sys.distributed.fsdp_unit import FlatUnit, ReductionQueue, UnitParameter, is_shardable_layer, parameters_of

FLAT_SHARD_NAME = "flat_shard"
Unit = str | int  # "layer", "block" or a number of blocks per unit


def _owned_elsewhere(root: nn.Module) -> set[int]:
    """ids of parameters that more than one module owns directly (tied weights)."""
    owners: dict[int, int] = {}
    for module in root.modules():
        for p in module._parameters.values():
            if p is not None:
                owners[id(p)] = owners.get(id(p), 0) + 1
    return {pid for pid, count in owners.items() if count > 1}


def blocks_per_unit(unit: Unit) -> int | None:
    """None for per-layer units, else the number of blocks in a unit (ValueError for anything else)."""
    if unit == "layer":
        return None
    if unit == "block":
        return 1
    if isinstance(unit, int) and not isinstance(unit, bool) and unit >= 1:
        return unit
    raise ValueError(f"unit must be 'layer', 'block' or a positive number of blocks, got {unit!r}")


def unit_modules(root: nn.Module, unit: Unit) -> list[list[tuple[str, nn.Module]]]:
    """The (path, module) groups that become units, in the order their first module is registered."""
    k = blocks_per_unit(unit)
    groups: dict[int, list[tuple[str, nn.Module]]] = {}  # id of a group's first block -> the group
    in_blocks: set[int] = set()
    if k is not None:
        for path, m in root.named_modules():
            if isinstance(m, nn.ModuleList) and id(m) not in in_blocks:
                blocks = [(f"{path}.{name}" if path else name, b) for name, b in m.named_children()]
                for start in range(0, len(blocks), k):
                    groups[id(blocks[start][1])] = blocks[start:start + k]
                in_blocks.update(id(x) for _, b in blocks for x in b.modules())
    out = []
    for path, m in root.named_modules():
        if id(m) in groups:
            out.append(groups[id(m)])
        elif id(m) not in in_blocks and is_shardable_layer(m):
            out.append([(path, m)])
    return out


def _cast_floating(value: Any, dtype: torch.dtype) -> Any:
    if isinstance(value, Tensor) and value.is_floating_point() and value.dtype != dtype:
        return value.to(dtype)
    if isinstance(value, (tuple, list)):
        return type(value)(_cast_floating(v, dtype) for v in value)
    if isinstance(value, dict):
        return {k: _cast_floating(v, dtype) for k, v in value.items()}
    return value


class FSDP(nn.Module):
    """Wraps `module`: its units (`unit`: "layer", "block" or k blocks) sharded over the ranks, the
    rest replicated."""

    def __init__(self, module: nn.Module, compute_dtype: torch.dtype | None = None,
                 reduce_dtype: torch.dtype = torch.float32, unit: Unit = "layer"):
        super().__init__()
        self.module = module
        self.compute_dtype = compute_dtype
        self.unit = unit
        self.rank = process_group.rank()
        self.world_size = process_group.world_size()
        self.original_names = [name for name, _ in module.named_parameters()]

        tied = frozenset(_owned_elsewhere(module))
        self.units: list[FlatUnit] = []
        self._unit_groups: list[list[tuple[str, nn.Module]]] = []  # each unit's (path, module)s
        self._saving: dict[int, Any] = {}  # unit index -> its saved-tensor hooks, while its forward runs
        for group in unit_modules(module, unit):
            params = [p for path, m in group for p in parameters_of(path, m, skip=tied)]
            if params:
                self._add_unit(group, params, reduce_dtype)
        sharded = {id(u.shard) for u in self.units}
        self.replicated = [p for p in module.parameters() if id(p) not in sharded]
        self._broadcast_from_rank0()
        for p in self.replicated:
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(weak_hook(self._all_reduce_grad))
        self._all_reductions: list[tuple[Tensor, Any]] = []
        self._reductions = ReductionQueue()

        self._expected_forward = list(range(len(self.units)))  # unit indices, in call order
        self._calls: list[int] | None = None  # this forward's calls so far; None outside a forward
        self._expected_backward: list[int] = []
        self._backward_position: dict[int, int] = {}
        self._backward_started = False
        self._backward_done: set[int] = set()

    def _add_unit(self, group: list[tuple[str, nn.Module]], params: list[UnitParameter],
                  reduce_dtype: torch.dtype) -> None:
        first = params[0].owner._parameters[params[0].attr]
        unit = FlatUnit(len(self.units), params, self, self.rank, self.world_size, first.device,
                        self.compute_dtype or first.dtype, reduce_dtype=reduce_dtype, reduce_op="sum")
        for p in params:
            del p.owner._parameters[p.attr]
        group[0][1].register_parameter(FLAT_SHARD_NAME, unit.shard)
        self.units.append(unit)
        self._unit_groups.append(group)
        group[0][1].register_forward_pre_hook(self._make_pre_hook(unit), with_kwargs=True)
        group[-1][1].register_forward_hook(self._make_post_hook(unit), always_call=True)

    # --- what an experiment inspects ----------------------------------------------------------

    def sharded_parameters(self) -> list[nn.Parameter]:
        """This rank's fp32 flat shards (one per unit)."""
        return [unit.shard for unit in self.units]

    def replicated_parameters(self) -> list[nn.Parameter]:
        return list(self.replicated)

    def unit_paths(self) -> list[list[str]]:
        """The module paths of each unit (one for a layer or a block, k for k blocks)."""
        return [[path for path, _ in group] for group in self._unit_groups]

    @torch.no_grad()
    def _broadcast_from_rank0(self) -> None:
        """The replicated parameters and the buffers (the units broadcast their own flat vectors)."""
        if self.world_size == 1:
            return
        for t in [*self.replicated, *self.module.buffers()]:
            buffer = t.data if t.is_contiguous() else t.data.contiguous()
            dist.broadcast(buffer, src=0)
            if buffer is not t.data:
                t.data.copy_(buffer)

    # --- forward ------------------------------------------------------------------------------

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        self._calls = []
        for unit in self.units:
            unit.saved_weight = False
        for position in (0, 1):
            self._prefetch_forward(position)
        try:
            return self.module(*args, **kwargs)
        finally:
            calls, self._calls = self._calls, None
            self._end_forward(calls)

    def _prefetch_forward(self, position: int) -> None:
        if position < len(self._expected_forward):
            unit = self.units[self._expected_forward[position]]
            if not unit.gather_in_flight and unit.forward_flat is None:
                unit.start_gather()

    def _install(self, unit: FlatUnit, flat: Tensor, track_grad: bool) -> None:
        """Expose the gathered parameters as their modules' attributes and start recording saves."""
        unit.forward_flat = flat
        for p, value in zip(unit.params, unit.parameters_from(flat, track_grad), strict=True):
            setattr(p.owner, p.attr, value)
        hooks = self._saving[unit.index] = torch.autograd.graph.saved_tensors_hooks(unit.pack, FlatUnit.unpack)
        hooks.__enter__()

    def _uninstall(self, unit: FlatUnit) -> None:
        """After the unit's forward: stop the hooks and drop our references to the gathered vector."""
        hooks = self._saving.pop(unit.index, None)
        if hooks is not None:
            hooks.__exit__(None, None, None)
        for p in unit.params:
            p.owner.__dict__.pop(p.attr, None)
        unit.forward_flat = None

    def _make_pre_hook(self, unit: FlatUnit):
        def pre_hook(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
            if self._calls is not None:
                self._calls.append(unit.index)
            self._install(unit, unit.wait_gather(), track_grad=torch.is_grad_enabled() and unit.shard.requires_grad)
            if self.compute_dtype is not None:
                args, kwargs = _cast_floating(args, self.compute_dtype), _cast_floating(kwargs, self.compute_dtype)
            return args, kwargs
        return pre_hook

    def _make_post_hook(self, unit: FlatUnit):
        def post_hook(module: nn.Module, args: tuple, output: Any) -> None:
            self._uninstall(unit)
            if self._calls is not None:
                self._prefetch_forward(len(self._calls) + 1)  # the call at k = len - 1 ended: prefetch k + 2
        return post_hook

    def _end_forward(self, calls: list[int]) -> None:
        for unit in self.units:
            if unit.index in self._saving:  # a k-block unit whose last block never ran (the forward raised)
                self._uninstall(unit)
            self._drop_gathers(unit)  # prefetches the forward did not use (its calls differed from the last)
        if calls:
            self._expected_forward = calls
        last_calls = list(dict.fromkeys(reversed(calls)))  # each unit once, at its last call, reversed
        self._expected_backward = [i for i in last_calls if self.units[i].saved_weight]
        self._backward_position = {i: k for k, i in enumerate(self._expected_backward)}
        self._backward_started = False
        self._backward_done = set()

    @staticmethod
    def _drop_gathers(unit: FlatUnit) -> None:
        """Complete and discard any gather still in flight or kept (unused prefetches)."""
        if unit.gather_in_flight:
            unit.wait_gather()
        unit.backward_flat = None

    # --- backward (called by the units) -------------------------------------------------------

    def _prefetch_backward(self, position: int) -> None:
        if position < len(self._expected_backward):
            unit = self.units[self._expected_backward[position]]
            if (unit.index not in self._backward_done and not unit.gather_in_flight
                    and unit.backward_flat is None):
                unit.start_gather()

    def backward_buffer(self, unit: FlatUnit) -> Tensor:
        """The unit's gathered parameters for its backward (unpacking a saved weight)."""
        if unit.backward_flat is None:
            if not unit.gather_in_flight:
                unit.start_gather()  # ours first: it is needed now, the prefetch after it
            if not self._backward_started and unit.index in self._backward_position:
                self._backward_started = True
                self._prefetch_backward(self._backward_position[unit.index] + 1)
            unit.backward_flat = unit.wait_gather()
        return unit.backward_flat

    def reduce(self, unit: FlatUnit, grads: tuple[Tensor | None, ...]) -> None:
        """The unit's gradients are complete: free its gathered copy, reduce-scatter them, prefetch."""
        unit.backward_flat = None
        reduction = unit.reduce_scatter(grads)
        self._backward_done.add(unit.index)
        if unit.index in self._backward_position:
            self._prefetch_backward(self._backward_position[unit.index] + 2)
        self._reductions.push(reduction)

    def _all_reduce_grad(self, p: Tensor) -> None:
        if self.world_size == 1:
            return
        if any(p is q for q, _ in self._all_reductions):
            raise RuntimeError("a replicated parameter's gradient became ready twice: call "
                               "finish_gradient_synchronization() after every backward pass")
        self._all_reductions.append((p, dist.all_reduce(p.grad, async_op=True)))

    def finish_gradient_synchronization(self) -> None:
        """Wait for every reduction; leave averaged fp32 gradients on the shards and replicated params."""
        self._reductions.finish(key=lambda r: r.unit.index)  # by unit, as the per-layer FSDP always has
        for unit in self.units:
            self._drop_gathers(unit)
        with torch.no_grad():
            for p, work in self._all_reductions:
                work.wait()
                p.grad.div_(self.world_size)
        self._all_reductions.clear()

    # --- checkpoints and checks ---------------------------------------------------------------

    def gather_full_params(self) -> dict[str, Tensor]:
        """Every parameter of the wrapped module, full and in fp32 for the sharded ones, by its
        original name (a collective: call it on every rank)."""
        full: dict[str, Tensor] = {}
        for unit in self.units:
            full.update(unit.gather_fp32(unit.shard))
        replicated = {id(p) for p in self.replicated}
        for name, p in self.module.named_parameters():
            if id(p) in replicated:
                full[name] = p.detach().clone()
        return {name: full[name] for name in self.original_names}
