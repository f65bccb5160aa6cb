"""What a forward pass keeps for the backward (problems 5f and 6): saved-tensor bytes per op,
gradient bytes per block, the size of one residual-stream activation.

`saved_tensor_accounting` runs a module's forward under `torch.autograd.graph.saved_tensors_hooks`.
The pack hook sees every tensor autograd saves, but neither which op is saving it nor which op
made it (`grad_fn` names only an autograd node, and is None for anything not requiring grad). So a
`TorchFunctionMode` follows the torch function being called (matmul, softmax, pow ...) and records
which call returned each fresh storage, and module pre/post hooks follow the submodule running
(`attn.q_proj`): the softmax output saved inside `attn` is produced by, and saved by,
`attn/softmax`. The mode is not active inside its own handler, so a function's inner calls count
as the function. A tensor saved outside any torch function call (by a compiled graph, or a custom
autograd.Function's forward) is attributed to `<module>/fused`.

Bytes are counted once per storage: a tensor saved twice (x by both `pow` and `mul`), or a view of
a saved tensor, keeps one storage alive, and the whole storage is what is kept. Parameters and
views of them (the `weight.T` a matmul saves) are not counted: they are alive anyway.
"""

from __future__ import annotations

import contextlib
from collections import defaultdict
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_leaves


def residual_stream_bytes(batch_size: int, context_length: int, d_model: int, bytes_per_element: int = 4) -> int:
    """Bytes of one activation tensor of the residual stream (a block's input or output).

    The residual stream carries one d_model-vector per token of the batch: a tensor of shape
    (batch_size, context_length, d_model), so batch_size * context_length * d_model elements of
    `bytes_per_element` bytes (4 in float32, 2 under bf16 autocast's bf16 outputs). For the 2.7B
    model (d_model 2560) at batch 4: context 512 gives 4 * 512 * 2560 * 4 B = 20,971,520 B =
    20 MiB; context 2048 gives 80 MiB.
    """
    return batch_size * context_length * d_model * bytes_per_element


def parameter_gradient_bytes(module: nn.Module) -> int:
    """Bytes the gradients of `module`'s trainable parameters take: one tensor of each
    parameter's shape and dtype (what `backward` allocates into `.grad`)."""
    return sum(p.numel() * p.element_size() for p in module.parameters() if p.requires_grad)


def allocated_gradient_bytes(module: nn.Module) -> int:
    """Bytes of the `.grad` tensors that exist now (after a backward), each storage once."""
    storages = {p.grad.untyped_storage().data_ptr(): p.grad.untyped_storage().nbytes()
                for p in module.parameters() if p.grad is not None}
    return sum(storages.values())


def gradient_bytes_per_block(model: nn.Module, blocks: str = "layers") -> list[int]:
    """`parameter_gradient_bytes` of each block in `model.<blocks>`."""
    return [parameter_gradient_bytes(block) for block in getattr(model, blocks)]


class _OpTracker(TorchFunctionMode):
    """Keeps the torch function being called on `functions`, and, for each fresh storage a call
    returns (not a view of one of its inputs), the `<module>/<function>` that produced it."""

    def __init__(self, functions: list[str], modules: list[str], produced_by: dict[tuple[int, str], str]):
        super().__init__()
        self.functions, self.modules, self.produced_by = functions, modules, produced_by

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", str(func)).strip("_")
        self.functions.append(name)
        try:
            result = func(*args, **kwargs)
        finally:
            self.functions.pop()
        inputs = {_storage_key(t)[:2] for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        for t in tree_leaves(result):
            if isinstance(t, torch.Tensor) and (key := _storage_key(t)[:2]) not in inputs:
                self.produced_by[key] = _label(self.modules, name)
        return result


def _label(modules: list[str], function: str | None) -> str:
    return (modules[-1] if modules else "") + (f"/{function}" if function else "")


@contextmanager
def _module_path_tracker(module: nn.Module, stack: list[str]) -> Iterator[None]:
    def enter(label: str) -> None:
        stack.append(label)

    def leave() -> None:
        stack.pop()

    handles = []
    for name, sub in module.named_modules():
        label = name or type(module).__name__
        handles.append(sub.register_forward_pre_hook(lambda m, a, label=label: enter(label)))
        handles.append(sub.register_forward_hook(lambda m, a, o: leave()))
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def _storage_key(t: torch.Tensor) -> tuple[int, str, int]:
    storage = t.untyped_storage()
    return storage.data_ptr(), str(t.device), storage.nbytes()


def is_compiled(module: nn.Module) -> bool:
    """Whether `module` or a submodule runs through torch.compile (wrapped, or `.compile()`d)."""
    return any(isinstance(m, torch._dynamo.eval_frame.OptimizedModule) or getattr(m, "_compiled_call_impl", None)
               for m in module.modules())


def _grouped(records: list[dict], field: str, total: int) -> list[dict]:
    groups: dict[str, dict] = defaultdict(lambda: {"bytes": 0, "tensors": 0})
    for r in records:
        groups[r[field]]["bytes"] += r["bytes"]
        groups[r[field]]["tensors"] += 1
    rows = [{"op": op, "bytes": g["bytes"], "share": g["bytes"] / total if total else 0.0, "tensors": g["tensors"]}
            for op, g in groups.items()]
    return sorted(rows, key=lambda r: (-r["bytes"], r["op"]))


def saved_tensor_accounting(module: nn.Module, *inputs: torch.Tensor, attribute_ops: bool | None = None,
                            top: int = 5, keep_output: bool = False) -> dict[str, Any]:
    """Run `module(*inputs)` and account for every tensor saved for its backward.

    Each saved storage is attributed twice: to the op that *produced* it (`produced_by`: the op
    whose output stays alive, what "contributing op" means in a memory profile) and to the first
    op that *saved* it (`saved_by`). Ops are `<module path>/<torch function>` ("attn/softmax",
    "ffn.w2/matmul"); the module's inputs are produced by "input".

    `attribute_ops`: whether to follow torch functions (a TorchFunctionMode during the forward);
    by default on, except for compiled modules: dynamo would trace the mode into the graph (graph
    breaks, recompiles, eager fallback) and change what is saved. Without it, ops are module paths.

    Returns {"total_bytes" (unique storages, parameters excluded), "tensor_bytes" (sum of numel *
    element_size over saved tensors, duplicates included, parameters excluded: the handout's
    count), "input_bytes" (of total_bytes, the inputs' storages), "parameter_bytes" (parameter
    storages saved; not in the totals), "saved" (tensors saved, parameters excluded), "unique"
    (storages), "by_producer" and "by_saver" ([{"op", "bytes", "share", "tensors"}], largest
    first; `tensors` counts saves, duplicates included), "top" (the first `top` of by_producer),
    "tensors" ([{"saved_by", "produced_by", "shape", "dtype", "bytes" (0 for a storage already
    counted), "grad_fn", "shared", "is_input"}] in saving order)}; with keep_output also "output".
    """
    if attribute_ops is None:
        attribute_ops = not is_compiled(module)
    functions: list[str] = []
    modules: list[str] = []
    produced_by: dict[tuple[int, str], str] = {}
    parameter_storages = {_storage_key(p)[:2] for p in module.parameters()}
    input_storages = {_storage_key(t)[:2] for t in inputs if isinstance(t, torch.Tensor)}
    records: list[dict] = []
    counted: set[tuple[int, str]] = set()
    parameter_bytes: dict[tuple[int, str], int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        ptr, device, nbytes = _storage_key(t)
        key = (ptr, device)
        if key in parameter_storages or isinstance(t, nn.Parameter):
            parameter_bytes[key] = nbytes
            return t
        shared = nbytes > 0 and key in counted
        if nbytes > 0:
            counted.add(key)
        records.append({"key": key, "saved_by": _label(modules, functions[-1] if functions else
                                                      "fused" if attribute_ops else None),
                        "shape": list(t.shape), "dtype": str(t.dtype).removeprefix("torch."),
                        "bytes": 0 if shared else nbytes, "tensor_bytes": t.numel() * t.element_size(),
                        "grad_fn": type(t.grad_fn).__name__ if t.grad_fn is not None else None,
                        "shared": shared, "is_input": key in input_storages})
        return t

    tracker = _OpTracker(functions, modules, produced_by) if attribute_ops else contextlib.nullcontext()
    with _module_path_tracker(module, modules), torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        with tracker:
            output = module(*inputs)
    for r in records:
        key = r.pop("key")
        # produced inside the forward, else an input; a compiled graph's outputs are its saver's
        r["produced_by"] = "input" if r["is_input"] else produced_by.get(key, r["saved_by"])

    total = sum(r["bytes"] for r in records)
    by_producer = _grouped(records, "produced_by", total)
    result = {
        "total_bytes": total,
        "tensor_bytes": sum(r.pop("tensor_bytes") for r in records),
        "input_bytes": sum(r["bytes"] for r in records if r["is_input"]),
        "parameter_bytes": sum(parameter_bytes.values()),
        "saved": len(records),
        "unique": sum(1 for r in records if not r["shared"]),
        "by_producer": by_producer,
        "by_saver": _grouped(records, "saved_by", total),
        "top": by_producer[:top],
        "tensors": records,
    }
    if keep_output:
        result["output"] = output
    return result
