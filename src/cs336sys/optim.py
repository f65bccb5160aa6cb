"""The assignment-1 AdamW and cross-entropy, and a switch to PyTorch's fused AdamW."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable

import torch
from torch import Tensor


def cross_entropy(logits: Tensor, targets: Tensor) -> Tensor:
    """Mean negative log-likelihood, computed stably in float32 via log-sum-exp."""
    logits = logits.reshape(-1, logits.shape[-1]).float()
    targets = targets.reshape(-1)
    shifted = logits - logits.amax(dim=-1, keepdim=True)
    log_z = torch.log(torch.exp(shifted).sum(dim=-1))
    return (log_z - shifted.gather(-1, targets[:, None]).squeeze(-1)).mean()


def adamw_step_size(lr: float, beta1: float, beta2: float, t: int) -> float:
    """The bias-corrected step size of update `t` (from 1): lr * sqrt(1 - beta2^t) / (1 - beta1^t)."""
    return lr * math.sqrt(1 - beta2**t) / (1 - beta1**t)


def adamw_update_(param: Tensor, grad: Tensor, exp_avg: Tensor, exp_avg_sq: Tensor, *, step_size: float,
                  lr: float, eps: float, weight_decay: float, beta1: float, beta2: float) -> None:
    """One AdamW update in place, with torch ops: the moments, the bias-corrected step, then the
    decoupled weight decay. The one statement of the math; the fused Triton pass
    (`cs336sys.leaderboard.adamw`) computes the same, and its tests compare against this."""
    exp_avg.mul_(beta1).add_(grad, alpha=1 - beta1)
    exp_avg_sq.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
    param.addcdiv_(exp_avg, exp_avg_sq.sqrt().add_(eps), value=-step_size)
    param.mul_(1 - lr * weight_decay)


class AdamW(torch.optim.Optimizer):
    """Loshchilov & Hutter's AdamW (algorithm 2), decoupled weight decay applied after the update.

    The loop over parameter groups and the state are here once; a subclass changes only how one
    parameter is updated (`_update`), as the fused optimizer of the 8B step does."""

    def __init__(self, params: Iterable, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.01):
        if lr < 0:
            raise ValueError(f"invalid learning rate {lr}")
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    def _update(self, param: Tensor, grad: Tensor, exp_avg: Tensor, exp_avg_sq: Tensor, **hyper: float) -> None:
        adamw_update_(param, grad, exp_avg, exp_avg_sq, **hyper)

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, (beta1, beta2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.contiguous_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.contiguous_format)
                state["step"] += 1
                self._update(p, p.grad, state["exp_avg"], state["exp_avg_sq"],
                             step_size=adamw_step_size(lr, beta1, beta2, state["step"]), lr=lr, eps=eps,
                             weight_decay=wd, beta1=beta1, beta2=beta2)
        return loss


def make_optimizer(params: Iterable, kind: str = "ours", **kwargs) -> torch.optim.Optimizer:
    """`ours` is the assignment-1 AdamW; `torch_fused` is torch.optim.AdamW(fused=True) (GPU only)."""
    if kind == "ours":
        return AdamW(params, **kwargs)
    if kind == "torch_fused":
        return torch.optim.AdamW(params, fused=True, **kwargs)
    raise ValueError(f"unknown optimizer {kind!r}; known: ours, torch_fused")
