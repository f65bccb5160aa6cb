"""The course test-suite's adapter functions, pointed at this package.

Each returns our implementation; nothing here implements anything. Sections are added as the
parts of the assignment land (DDP, sharded optimizer and FSDP adapters go below).
"""

from __future__ import annotations

import torch

# --- FlashAttention-2 (problems 9-10): classes called as Cls.apply(q, k, v, is_causal) ---------


def get_flashattention_autograd_function_pytorch() -> type[torch.autograd.Function]:
    from cs336sys.attention.flash_pytorch import FlashAttention2PyTorch

    return FlashAttention2PyTorch


def get_flashattention_autograd_function_triton() -> type[torch.autograd.Function]:
    from cs336sys.attention.flash_triton import FlashAttention2Triton

    return FlashAttention2Triton
