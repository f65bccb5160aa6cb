"""The optimised step's optimizers (`cs336sys.training.optimized`): AdamW over fp32 masters used through
bf16 copies (`bf16_weights`), and its updates made inside the backward (`adamw_in_backward`).

    optimizer = MasterCopyAdamW(model.parameters(), copies={master: CopyRows(bf16_leaf, rows), ...})
    updates = BackwardAdamW(optimizer, "cuda")   # hooks on every leaf whose gradient arrives
    updates.begin_step(); loss.backward(); updates.join()

Both launch `cs336sys.leaderboard.adamw.fused_adamw_`, one kernel per parameter, with the same state and
step size as `optimizer.step()`, so a parameter comes out of either bitwise the same.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from torch import Tensor

from cs336sys.leaderboard.adamw import FusedAdamW, fused_adamw_
from cs336sys.optim import adamw_step_size


def _adamw_state(state: dict, p: Tensor) -> dict:
    """`state`, given AdamW's step count and moments (zero) if it has none yet."""
    if not state:
        state["step"] = 0
        state["exp_avg"] = torch.zeros_like(p, memory_format=torch.contiguous_format)
        state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.contiguous_format)
    return state


@dataclass(frozen=True, eq=False)
class CopyRows:
    """Where a master parameter's bf16 copy lives: rows `rows` of `leaf`, a bf16 leaf that requires grad
    (all of it, unless `fused_projections` stacked several masters in it). The master's gradient is
    the same rows of the leaf's."""

    leaf: Tensor
    rows: slice

    def grad(self) -> Tensor | None:
        return None if self.leaf.grad is None else self.leaf.grad[self.rows]

    def copy(self) -> Tensor:
        """The rows, outside autograd: what the optimizer's kernel writes."""
        return self.leaf.detach()[self.rows]


class MasterCopyAdamW(torch.optim.Optimizer):
    """`FusedAdamW` over fp32 master parameters of which some are used, forward and backward, through
    bf16 copies: such a parameter's gradient is its copy's (bf16, upcast in the kernel), and the kernel
    writes the updated parameter into the copy in the same pass. `copies` maps master -> `CopyRows`."""

    def __init__(self, params: Iterable[Tensor], copies: dict[Tensor, CopyRows], lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.01):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        self.copies = copies

    def zero_grad(self, set_to_none: bool = True) -> None:
        super().zero_grad(set_to_none)
        for copy in self.copies.values():
            copy.leaf.grad = None

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None):
        for group in self.param_groups:
            lr, (beta1, beta2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
            for p in group["params"]:
                copy = self.copies.get(p)
                grad = copy.grad() if copy is not None else p.grad
                if grad is None:
                    continue
                state = _adamw_state(self.state[p], p)
                state["step"] += 1
                fused_adamw_(p, grad.contiguous(), state["exp_avg"], state["exp_avg_sq"],
                             step_size=adamw_step_size(lr, beta1, beta2, state["step"]), lr=lr, eps=eps,
                             weight_decay=wd, beta1=beta1, beta2=beta2,
                             out_lowp=copy.copy() if copy is not None else None)
        return None


def _hook(this: weakref.ref, targets: tuple[int, ...]) -> Callable[[Tensor], None]:
    """`BackwardAdamW`'s hook for the parameters `targets` (indices) whose gradient is (part of) the
    tensor's it is registered on (nothing once the object is gone)."""

    def hook(leaf: Tensor) -> None:
        updates = this()
        if updates is not None:
            for i in targets:
                updates._update(i, leaf.grad)

    return hook


class BackwardAdamW:
    """The updates of `optimizer` (`FusedAdamW` or `MasterCopyAdamW`) made during the backward: each
    parameter's `fused_adamw_` launched by a post-accumulate-grad hook on the tensor whose gradient
    arrives (the parameter, or its bf16 copy: one hook for every master whose rows it holds), once the
    backward has accumulated that gradient, so every node that reads the parameter has run. On CUDA the
    updates go to a side stream (of normal priority: a captured step's backward has a higher one, see
    `OptimizedStep.capture`) that first waits for the backward's stream, and `join` (after the
    backward) makes that stream wait for them.
    Each update is the optimizer step's for that parameter (the same kernel, state and step size), so
    the parameters come out bitwise as `optimizer.step()` after the backward would leave them.

    `begin_step()` before each forward+backward counts the step and writes each group's step size
    into a device tensor the kernels read when they run, which a CUDA graph that captured them
    needs (the step size changes every step); `armed` False skips the updates (a graph's warm-up).
    Every parameter is taken to get a gradient in every backward (the model's all do): a step counts
    for all of them, where `optimizer.step()` would skip a parameter without one."""

    def __init__(self, optimizer: torch.optim.Optimizer, device: str):
        if not isinstance(optimizer, FusedAdamW | MasterCopyAdamW):
            raise TypeError(f"the updates in the backward are the fused AdamW's, not {type(optimizer).__name__}'s")
        self.optimizer = optimizer
        self.side = torch.cuda.Stream(device, priority=0) if torch.device(device).type == "cuda" else None
        self.armed = True
        self.step_sizes = [torch.zeros(1, dtype=torch.float32, device=device) for _ in optimizer.param_groups]
        self.step_size_values = [0.0] * len(optimizer.param_groups)
        copies = getattr(optimizer, "copies", {})
        lowp = getattr(optimizer, "_lowp", {})
        # (group, parameter, its low-precision copy, its rows of the gradient that arrives)
        self.targets: list[tuple[int, Tensor, Tensor | None, slice]] = []
        arrives: dict[int, tuple[Tensor, list[int]]] = {}  # id -> the tensor whose gradient arrives, its targets
        for g, group in enumerate(optimizer.param_groups):
            for p in group["params"]:
                _adamw_state(optimizer.state[p], p)  # allocated now: a graph captures their addresses
                copy = copies.get(p)
                leaf, out, rows = (copy.leaf, copy.copy(), copy.rows) if copy else (p, lowp.get(p), slice(None))
                self.targets.append((g, p, out, rows))
                arrives.setdefault(id(leaf), (leaf, []))[1].append(len(self.targets) - 1)
        # a hook holds no tensor and only a weak reference to this object: the tensor it is registered on
        # keeps its hooks, and a strong reference back would keep the model alive (CPU test)
        this = weakref.ref(self)
        self.hooks = [leaf.register_post_accumulate_grad_hook(_hook(this, tuple(targets)))
                      for leaf, targets in arrives.values()]

    def begin_step(self) -> None:
        for g, group in enumerate(self.optimizer.param_groups):
            t = 0
            for p in group["params"]:
                state = self.optimizer.state[p]
                state["step"] += 1
                t = state["step"]
            value = adamw_step_size(group["lr"], *group["betas"], t)
            self.step_size_values[g] = value
            self.step_sizes[g].fill_(value)

    @torch.no_grad()
    def _update(self, i: int, grad: Tensor) -> None:
        if not self.armed:
            return
        g, p, out_lowp, rows = self.targets[i]
        group, state = self.optimizer.param_groups[g], self.optimizer.state[p]
        if self.side is None:  # the CPU: in order, with the host's step size (the step's own float)
            step_size, stream = self.step_size_values[g], contextlib.nullcontext()
        else:
            step_size, stream = self.step_sizes[g], torch.cuda.stream(self.side)
            self.side.wait_stream(torch.cuda.current_stream(p.device))
        with stream:
            fused_adamw_(p, grad[rows].contiguous(), state["exp_avg"], state["exp_avg_sq"], step_size=step_size,
                         lr=group["lr"], eps=group["eps"], weight_decay=group["weight_decay"],
                         beta1=group["betas"][0], beta2=group["betas"][1], out_lowp=out_lowp)

    def join(self) -> None:
        if self.side is not None:
            torch.cuda.current_stream(self.side.device).wait_stream(self.side)
