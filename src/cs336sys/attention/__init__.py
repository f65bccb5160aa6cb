"""Attention kernels: naive PyTorch, FlashAttention-2 in PyTorch and in Triton (problems 7-11).

    naive_attention(q, k, v, is_causal=False)            # materialised scores; the baseline
    FlashAttention2PyTorch.apply(q, k, v, is_causal)     # tiled forward, compiled recompute backward
    FlashAttention2Triton.apply(q, k, v, is_causal)      # fused Triton forward and backward

The Triton class is imported lazily (`from cs336sys.attention.flash_triton import ...`) so that
this package imports where Triton does not.
"""

from cs336sys.attention.flash_pytorch import FlashAttention2PyTorch, flash_forward_pytorch
from cs336sys.attention.naive import attention_logsumexp, naive_attention

__all__ = ["FlashAttention2PyTorch", "attention_logsumexp", "flash_forward_pytorch", "naive_attention"]
