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


class AdamW(torch.optim.Optimizer):
    """Loshchilov & Hutter's AdamW (algorithm 2), decoupled weight decay applied after the update."""

    def __init__(self, params: Iterable, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.01):
        if lr < 0:
            raise ValueError(f"invalid learning rate {lr}")
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

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
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_sq"] = torch.zeros_like(p)
                state["step"] += 1
                t = state["step"]
                m, v = state["exp_avg"], state["exp_avg_sq"]
                m.mul_(beta1).add_(p.grad, alpha=1 - beta1)
                v.mul_(beta2).addcmul_(p.grad, p.grad, value=1 - beta2)
                step_size = lr * math.sqrt(1 - beta2**t) / (1 - beta1**t)
                p.addcdiv_(m, v.sqrt().add_(eps), value=-step_size)
                p.mul_(1 - lr * wd)
        return loss


def make_optimizer(params: Iterable, kind: str = "ours", **kwargs) -> torch.optim.Optimizer:
    """`ours` is the assignment-1 AdamW; `torch_fused` is torch.optim.AdamW(fused=True) (GPU only)."""
    if kind == "ours":
        return AdamW(params, **kwargs)
    if kind == "torch_fused":
        return torch.optim.AdamW(params, fused=True, **kwargs)
    raise ValueError(f"unknown optimizer {kind!r}; known: ours, torch_fused")
