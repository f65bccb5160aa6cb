"""Fully-sharded data parallel training of an unchanged `nn.Module`, with gathers prefetched.

    model = FSDP(build_model("xl", 512), compute_dtype=torch.bfloat16)
    optimizer = AdamW(model.parameters())       # fp32 flat shards + replicated parameters
    loss_fn(model(x_local), y_local).backward()
    model.finish_gradient_synchronization()
    optimizer.step()

Every Linear- or Embedding-like layer (`fsdp_layer.is_shardable_layer`) is sharded flat over the
ranks (`fsdp_layer.ShardedLayer`); everything else is replicated. At construction every parameter
and buffer is broadcast from rank 0, so all ranks start from the same model.

Forward. Before a sharded layer runs (a forward pre-hook), its full parameters are made available:
the gather prefetched for it is waited on, or one is issued and waited on if none is in flight.
Floating-point tensor arguments of the layer are cast to `compute_dtype` when one is given, as its
parameters are. After it runs (a forward hook), the gathered parameters are dropped.
Prefetch rule (forward): the expected order of layer calls is the order of the previous forward
(before the first one: module registration order). When the forward starts, the gathers of the
first two expected calls are issued; when the call at position k ends, the gather of the call
expected at position k + 2 is issued. So the gather of a layer starts once the layer two before
it has finished, and at most two gathered copies exist at a time (the running layer's and the
next one's; the one after is issued only as the running one is dropped).

Backward. The expected backward order is the reverse of the last forward's calls (each layer at
its last call), keeping only layers whose weight autograd saved (embeddings need no weight for
their gradient and are not gathered again). The first time autograd unpacks a layer's saved
weight, the layer is gathered again (or its prefetched gather waited on); when the first gather
of a backward happens for the layer at expected position k, the one at k + 1 is issued, and when
the layer at position k has its gradient, the one at k + 2 is issued (the forward rule mirrored).
When a layer's parameter gradients are complete, autograd calls its `GatherLayerParams.backward`,
which drops the gathered copy and issues an async reduce-scatter (in `reduce_dtype`, fp32 by
default) of the padded flat gradient; at most `MAX_REDUCTIONS_IN_FLIGHT` are left in flight, older
ones are completed (their full-size gradient buffers freed) as new ones are issued.
Replicated parameters' gradients are all-reduced asynchronously (in place) as soon as each is
accumulated (a post-accumulate-grad hook).

`finish_gradient_synchronization()` waits for everything, divides by the world size (so the
gradient is the average over ranks) and leaves fp32 gradients on `flat_shard.grad` and on the
replicated parameters. Call it after every backward (before the next one), before
`optimizer.step()`. Gradients accumulate over backward passes until `zero_grad`.

Constraints: every rank must call the same layers in the same order (as in any data parallelism:
the collectives are issued in call order); a sharded layer's full parameters exist as attributes
(`module.weight`) only while that layer's forward runs. Combining this with activation
checkpointing of the wrapped model (`checkpoint_blocks`) is not supported.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor, nn

from cs336sys.distributed import process_group
from cs336sys.distributed.ddp_base import weak_hook
from cs336sys.distributed.fsdp_layer import ShardedLayer, is_shardable_layer

MAX_REDUCTIONS_IN_FLIGHT = 2


def _owned_elsewhere(root: nn.Module) -> set[int]:
    """ids of parameters that more than one module owns directly (tied weights)."""
    owners: dict[int, int] = {}
    for module in root.modules():
        for p in module._parameters.values():
            if p is not None:
                owners[id(p)] = owners.get(id(p), 0) + 1
    return {pid for pid, count in owners.items() if count > 1}


def _cast_floating(value: Any, dtype: torch.dtype) -> Any:
    if isinstance(value, Tensor) and value.is_floating_point() and value.dtype != dtype:
        return value.to(dtype)
    if isinstance(value, (tuple, list)):
        return type(value)(_cast_floating(v, dtype) for v in value)
    if isinstance(value, dict):
        return {k: _cast_floating(v, dtype) for k, v in value.items()}
    return value


class FSDP(nn.Module):
    """Wraps `module`: Linear/Embedding-like layers sharded over the ranks, the rest replicated."""

    def __init__(self, module: nn.Module, compute_dtype: torch.dtype | None = None,
                 reduce_dtype: torch.dtype = torch.float32):
        super().__init__()
        self.module = module
        self.compute_dtype = compute_dtype
        self.rank = process_group.rank()
        self.world_size = process_group.world_size()
        self._broadcast_from_rank0()
        self.original_names = [name for name, _ in module.named_parameters()]

        tied = _owned_elsewhere(module)
        self.layers: list[ShardedLayer] = []
        for path, m in module.named_modules():
            if is_shardable_layer(m) and not any(id(p) in tied for p in m._parameters.values()):
                layer = ShardedLayer(len(self.layers), path, m, self.rank, self.world_size,
                                     compute_dtype, reduce_dtype, scheduler=self)
                self.layers.append(layer)
                m.register_forward_pre_hook(self._make_pre_hook(layer), with_kwargs=True)
                m.register_forward_hook(self._make_post_hook(layer), always_call=True)
        self.replicated = [p for p in module.parameters() if all(p is not layer.shard for layer in self.layers)]
        for p in self.replicated:
            if p.requires_grad:
                p.register_post_accumulate_grad_hook(weak_hook(self._all_reduce_grad))
        self._all_reductions: list[tuple[Tensor, Any]] = []

        self._expected_forward = list(range(len(self.layers)))  # layer indices, in call order
        self._calls: list[int] | None = None  # this forward's calls so far; None outside a forward
        self._expected_backward: list[int] = []
        self._backward_position: dict[int, int] = {}
        self._backward_started = False
        self._backward_done: set[int] = set()
        self._reduction_queue: list[ShardedLayer] = []

    # --- what an experiment inspects ----------------------------------------------------------

    def sharded_parameters(self) -> list[nn.Parameter]:
        """This rank's fp32 flat shards (one per sharded layer)."""
        return [layer.shard for layer in self.layers]

    def replicated_parameters(self) -> list[nn.Parameter]:
        return list(self.replicated)

    @torch.no_grad()
    def _broadcast_from_rank0(self) -> None:
        if self.world_size == 1:
            return
        for t in [*self.module.parameters(), *self.module.buffers()]:
            buffer = t.data if t.is_contiguous() else t.data.contiguous()
            dist.broadcast(buffer, src=0)
            if buffer is not t.data:
                t.data.copy_(buffer)

    # --- forward ------------------------------------------------------------------------------

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        self._calls = []
        for layer in self.layers:
            layer.saved_weight = False
        for position in (0, 1):
            self._prefetch_forward(position)
        try:
            return self.module(*args, **kwargs)
        finally:
            calls, self._calls = self._calls, None
            self._end_forward(calls)

    def _prefetch_forward(self, position: int) -> None:
        if position < len(self._expected_forward):
            layer = self.layers[self._expected_forward[position]]
            if not layer.gather_in_flight and layer.forward_gathered is None:
                layer.start_gather()

    def _make_pre_hook(self, layer: ShardedLayer):
        def pre_hook(module: nn.Module, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
            if self._calls is not None:
                self._calls.append(layer.index)
            layer.install(layer.wait_gather(), track_grad=torch.is_grad_enabled() and layer.shard.requires_grad)
            if self.compute_dtype is not None:
                args, kwargs = _cast_floating(args, self.compute_dtype), _cast_floating(kwargs, self.compute_dtype)
            return args, kwargs
        return pre_hook

    def _make_post_hook(self, layer: ShardedLayer):
        def post_hook(module: nn.Module, args: tuple, output: Any) -> None:
            layer.uninstall()
            if self._calls is not None:
                self._prefetch_forward(len(self._calls) + 1)  # the call at k = len - 1 ended: prefetch k + 2
        return post_hook

    def _end_forward(self, calls: list[int]) -> None:
        for layer in self.layers:
            layer.drop_gathers()  # prefetches the forward did not use (its calls differed from the last)
        if calls:
            self._expected_forward = calls
        last_calls = list(dict.fromkeys(reversed(calls)))  # each layer once, at its last call, reversed
        self._expected_backward = [i for i in last_calls if self.layers[i].saved_weight]
        self._backward_position = {i: k for k, i in enumerate(self._expected_backward)}
        self._backward_started = False
        self._backward_done = set()

    # --- backward (called by the layers) ------------------------------------------------------

    def _prefetch_backward(self, position: int) -> None:
        if position < len(self._expected_backward):
            layer = self.layers[self._expected_backward[position]]
            if (layer.index not in self._backward_done and not layer.gather_in_flight
                    and layer.backward_gathered is None):
                layer.start_gather()

    def before_backward_gather(self, layer: ShardedLayer) -> None:
        if not self._backward_started and layer.index in self._backward_position:
            self._backward_started = True
            self._prefetch_backward(self._backward_position[layer.index] + 1)

    def after_reduce_scatter(self, layer: ShardedLayer) -> None:
        self._backward_done.add(layer.index)
        if layer.index in self._backward_position:
            self._prefetch_backward(self._backward_position[layer.index] + 2)
        self._reduction_queue.append(layer)
        while len(self._reduction_queue) > MAX_REDUCTIONS_IN_FLIGHT:
            self._reduction_queue.pop(0).finish_reductions()

    def _all_reduce_grad(self, p: Tensor) -> None:
        if self.world_size == 1:
            return
        if any(p is q for q, _ in self._all_reductions):
            raise RuntimeError("a replicated parameter's gradient became ready twice: call "
                               "finish_gradient_synchronization() after every backward pass")
        self._all_reductions.append((p, dist.all_reduce(p.grad, async_op=True)))

    def finish_gradient_synchronization(self) -> None:
        """Wait for every reduction; leave averaged fp32 gradients on the shards and replicated params."""
        for layer in self.layers:
            layer.finish_reductions()
            layer.drop_gathers()
        self._reduction_queue.clear()
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
        for layer in self.layers:
            prefix = f"{layer.path}." if layer.path else ""
            full.update((prefix + name, t) for name, t in layer.full_fp32().items())
        replicated = {id(p) for p in self.replicated}
        for name, p in self.module.named_parameters():
            if id(p) in replicated:
                full[name] = p.detach().clone()
        return {name: full[name] for name in self.original_names}
