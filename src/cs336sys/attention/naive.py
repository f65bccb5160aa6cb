"""Naive scaled dot-product attention: the full score matrix is materialised.

This is the baseline of problems 7, 8 and 11, and (in float64) the reference the tests compare
the tiled implementations with.
"""

from __future__ import annotations

import math

import torch

MASKED_SCORE = -1.0e6  # the assignment's value for masked scores (finite, so a row never turns NaN)


def attention_scores(q: torch.Tensor, k: torch.Tensor, is_causal: bool = False) -> torch.Tensor:
    """Scaled scores q k^T / sqrt(d), masked scores set to -1e6 (query i sees keys j <= i)."""
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
    if is_causal:
        rows = torch.arange(q.shape[-2], device=q.device)[:, None]
        cols = torch.arange(k.shape[-2], device=q.device)[None, :]
        scores = scores.masked_fill(cols > rows, MASKED_SCORE)
    return scores


def naive_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                    is_causal: bool = False) -> torch.Tensor:
    """softmax(q k^T / sqrt(d)) v over the last two dimensions; any leading dimensions."""
    return torch.softmax(attention_scores(q, k, is_causal), dim=-1) @ v


def attention_logsumexp(q: torch.Tensor, k: torch.Tensor, is_causal: bool = False) -> torch.Tensor:
    """L = logsumexp of each query's scaled scores: the statistic FlashAttention saves."""
    return torch.logsumexp(attention_scores(q, k, is_causal), dim=-1)
