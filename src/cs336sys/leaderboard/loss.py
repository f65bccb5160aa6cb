"""LM head fused with cross-entropy, in chunks of tokens, so the (N, V) logits never exist.

At the leaderboard's vocabulary the full logits (and their float32 upcast and gradient) are the
largest activations of the step. Here the tokens are processed `chunk_tokens` rows at a time: the
chunk's logits are computed in the inputs' dtype, upcast to float32 for the log-sum-exp, and the
gradient (softmax - one-hot) / N is applied to the weight and hidden state at once, while the
chunk is live. Forward therefore does the work of backward too and saves only the two finished
gradients; backward scales them by the incoming gradient. The loss is the value of
`cs336sys.optim.cross_entropy(hidden @ weight.T, targets)`.
"""

from __future__ import annotations

import torch
from torch import Tensor


def _chunk_losses(hidden: Tensor, weight: Tensor, targets: Tensor, chunk_tokens: int,
                  grad_hidden: Tensor | None, grad_weight: Tensor | None) -> Tensor:
    """Per-token NLL (N,) float32 of 2-D `hidden` (N, d); fills the gradients of the mean if given.

    `weight` is already in hidden's dtype; `grad_weight` is a float32 (V, d) accumulator.
    """
    n = hidden.shape[0]
    losses = torch.empty(n, dtype=torch.float32, device=hidden.device)
    want_grad = grad_hidden is not None or grad_weight is not None
    for start in range(0, n, chunk_tokens):
        end = min(start + chunk_tokens, n)
        h, t = hidden[start:end], targets[start:end]
        rows = torch.arange(end - start, device=hidden.device)
        shifted = (h @ weight.T).float()
        shifted -= shifted.amax(dim=-1, keepdim=True)
        target_logit = shifted[rows, t]
        probs = shifted.exp_()  # in place: the chunk holds one float32 (c, V) buffer
        sum_exp = probs.sum(dim=-1)
        losses[start:end] = torch.log(sum_exp) - target_logit
        if not want_grad:
            continue
        probs /= sum_exp[:, None]
        probs[rows, t] -= 1.0
        probs *= 1.0 / n
        dlogits = probs.to(hidden.dtype)
        if grad_hidden is not None:
            torch.mm(dlogits, weight, out=grad_hidden[start:end])
        if grad_weight is not None:
            if dlogits.dtype == torch.float32:
                grad_weight.addmm_(dlogits.T, h)
            else:  # low-precision matmul (fp32 accumulation on the GPU), summed over chunks in fp32
                grad_weight += dlogits.T @ h
    return losses


class LMHeadCrossEntropy(torch.autograd.Function):
    """Mean NLL of `hidden @ weight.T`; gradients are computed in forward and saved."""

    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, targets: Tensor, chunk_tokens: int) -> Tensor:
        # Our dtypes, not autocast's: matmuls in hidden's dtype, softmax in float32.
        with torch.autocast(device_type=hidden.device.type, enabled=False):
            d = hidden.shape[-1]
            h = hidden.reshape(-1, d)
            w = weight.to(hidden.dtype)
            need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
            grad_h = torch.empty_like(h) if need_h else None
            grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_w else None
            losses = _chunk_losses(h, w, targets.reshape(-1), chunk_tokens, grad_h, grad_w)
            ctx.save_for_backward(grad_h.view(hidden.shape) if need_h else None,
                                  grad_w.to(weight.dtype) if need_w else None)
            return losses.mean()

    @staticmethod
    def backward(ctx, grad_output: Tensor):
        grad_h, grad_w = ctx.saved_tensors
        grad_hidden = grad_h * grad_output if grad_h is not None else None
        grad_weight = grad_w * grad_output if grad_w is not None else None
        return grad_hidden, grad_weight, None, None


def lm_head_cross_entropy(hidden: Tensor, weight: Tensor, targets: Tensor, chunk_tokens: int = 4096) -> Tensor:
    """Mean cross-entropy of the logits `hidden @ weight.T` against `targets`, never building them whole.

    hidden (..., d), weight (V, d), targets (...) int64. Peak extra memory is one chunk of float32
    logits and its gradient (besides the (N, d) and (V, d) gradients). Under no_grad, or when
    neither input requires grad, only the loss is computed.
    """
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens must be positive, got {chunk_tokens}")
    if weight.dim() != 2 or hidden.shape[-1] != weight.shape[1]:
        raise ValueError(f"hidden (..., {hidden.shape[-1]}) does not match weight {tuple(weight.shape)}")
    if targets.numel() != hidden.numel() // hidden.shape[-1]:
        raise ValueError(f"targets {tuple(targets.shape)} do not match hidden {tuple(hidden.shape)}")
    if torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad):
        return LMHeadCrossEntropy.apply(hidden, weight, targets, chunk_tokens)
    with torch.no_grad(), torch.autocast(device_type=hidden.device.type, enabled=False):
        h = hidden.reshape(-1, hidden.shape[-1])
        return _chunk_losses(h, weight.to(hidden.dtype), targets.reshape(-1), chunk_tokens, None, None).mean()
