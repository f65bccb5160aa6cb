"""Default attention: naive scaled dot-product attention, the full score matrix materialised.

This is the baseline of problems 7, 8 and 11, the Transformer's default attention, and (in float64)
the reference the tests compare the tiled implementations with.
"""

from __future__ import annotations

import math

import torch

MASKED_SCORE = -1.0e6  # the assignment's value for masked scores (finite, so a row never turns NaN)

# One boolean "key after query" mask per (seq_q, seq_k, device), built on first use: a model calls
# attention once per layer and step, and rebuilding a seq x seq mask each time costs a kernel and
# seq^2 bytes of allocator traffic per call.
_MASKS: dict[tuple[int, int, str], torch.Tensor] = {}
_MAX_CACHED_MASKS = 16


def future_mask(seq_q: int, seq_k: int, device: torch.device) -> torch.Tensor:
    """True where key j comes after query i (j > i): the entries causal attention excludes."""
    if torch.compiler.is_compiling():  # inductor fuses this comparison into the masking kernel
        return torch.arange(seq_k, device=device)[None, :] > torch.arange(seq_q, device=device)[:, None]
    key = (seq_q, seq_k, str(device))
    mask = _MASKS.get(key)
    if mask is None:
        if len(_MASKS) >= _MAX_CACHED_MASKS:
            _MASKS.clear()
        mask = torch.ones(seq_q, seq_k, dtype=torch.bool, device=device).triu(1)
        _MASKS[key] = mask
    return mask


def attention_scores(q: torch.Tensor, k: torch.Tensor, is_causal: bool = False) -> torch.Tensor:
    """Scaled scores q k^T / sqrt(d), masked scores set to -1e6 (query i sees keys j <= i)."""
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if is_causal:
        scores = scores.masked_fill(future_mask(q.shape[-2], k.shape[-2], q.device), MASKED_SCORE)
    return scores


def naive_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    is_causal: bool = False) -> torch.Tensor:
    """softmax(q k^T / sqrt(d)) v over the last two dimensions; any leading dimensions."""
    return torch.softmax(attention_scores(q, k, is_causal), dim=-1) @ v


def naive_causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The Transformer's default attention backend: naive attention with the causal mask."""
    return naive_attention(q, k, v, is_causal=True)


def sdpa_causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """PyTorch's fused attention (it picks flash, memory-efficient or cuDNN kernels itself)."""
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)


def attention_logsumexp(q: torch.Tensor, k: torch.Tensor, is_causal: bool = False) -> torch.Tensor:
    """L = logsumexp of each query's scaled scores: the statistic FlashAttention saves."""
    return torch.logsumexp(attention_scores(q, k, is_causal), dim=-1)
