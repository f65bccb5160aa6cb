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


# --- Distributed data parallel (2025: ddp_overlap_individual_parameters, ddp_overlap_bucketed;
# 2026: ddp, the overlapped individual-parameter wrapper). Wrappers in cs336sys.distributed.ddp. ----


def get_ddp_individual_parameters(module: torch.nn.Module) -> torch.nn.Module:
    from cs336sys.distributed.ddp import OverlappedDDP

    return OverlappedDDP(module)


def ddp_individual_parameters_on_after_backward(ddp_model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    ddp_model.finish_gradient_synchronization()


def get_ddp_bucketed(module: torch.nn.Module, bucket_size_mb: float) -> torch.nn.Module:
    from cs336sys.distributed.ddp import BucketedDDP

    return BucketedDDP(module, bucket_size_mb)


def ddp_bucketed_on_after_backward(ddp_model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    ddp_model.finish_gradient_synchronization()


def ddp_bucketed_on_train_batch_start(ddp_model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    ddp_model.on_train_batch_start()


def get_ddp(module: torch.nn.Module) -> torch.nn.Module:
    """2026: each gradient all-reduced individually, overlapped with backward (as the 2026 adapter asks)."""
    from cs336sys.distributed.ddp import OverlappedDDP

    return OverlappedDDP(module)


def ddp_on_after_backward(ddp_model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    ddp_model.finish_gradient_synchronization()
