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


# --- Optimizer state sharding and FSDP (problems optimizer_state_sharding, fsdp). Classes in
# cs336sys.distributed.sharded_optimizer and cs336sys.distributed.fsdp. ---------------------------


def get_sharded_optimizer(params, optimizer_cls: type[torch.optim.Optimizer], **kwargs) -> torch.optim.Optimizer:
    from cs336sys.distributed.sharded_optimizer import ShardedOptimizer

    return ShardedOptimizer(params, optimizer_cls, **kwargs)


def get_fsdp(module: torch.nn.Module, compute_dtype: torch.dtype | None = None) -> torch.nn.Module:
    from cs336sys.distributed.fsdp import FSDP

    return FSDP(module, compute_dtype=compute_dtype)


def fsdp_on_after_backward(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> None:
    model.finish_gradient_synchronization()


def fsdp_gather_full_params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter of the wrapped module by its original name, full and fp32 (a collective)."""
    return model.gather_full_params()
