"""The leaderboard step's own attention call, and the policy that keeps attention through a checkpoint.

    model = build_model(size, seq, attention=tuned_flash_attention)   # attention "flash_tuned"
    checkpoint(fn, x, use_reentrant=False, context_fn=keep_attention_context)

`tuned_flash_attention`: our causal Triton FlashAttention-2 with the tiles tuned at the 8B's attention
shape (32 heads, 32,768 tokens, d_head 128, bf16; `notes/runs/2026-11-23-h200/flash_tune.py --phases lb26` on one H200,
notes/leaderboard.md): forward 256x64/w8/s3, backward kv64x128/q128x64/w8/s3 in two launches. They
are used only for bf16 CUDA tensors with d_head 128; anything else takes the table's tiles
(`cs336sys.attention.flash_configs`, which stays as every flash result was measured with). The
forward is called as the custom operator `cs336sys_leaderboard::flash_forward`, so that a checkpoint's
dispatch mode sees it as one op (a Triton launch alone is invisible to it).

`gluon_attention` (attention "gluon"): the Gluon kernels for Hopper (`cs336sys.attention.flash_gluon`:
the warp-specialised forward and backward with their default tiles), causal, the forward called as the
custom operator `cs336sys_leaderboard::gluon_forward` for the same reason. Only on a Hopper GPU;
anywhere else the step refuses it when built (`gluon_device_refusal`).

`keep_attention_context`: selective activation checkpointing (`torch.utils.checkpoint`'s
`create_selective_checkpoint_contexts`) whose policy saves the outputs of attention's forward ops
(SDPA's fused kernels, and ours above) in the forward and recomputes everything else. A checkpointed
block then runs attention's forward once, not twice, at the cost of keeping O and its logsumexp
(the kept op's outputs) for each checkpointed block.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

from cs336sys.attention.flash_configs import BackwardConfig, Tiles
from cs336sys.attention.flash_triton import (
    flash_attention_triton_backward,
    flash_attention_triton_forward,
    kernels_interpreted,
)
from cs336sys.attention.inputs import check_attention_inputs

FORWARD_8B = Tiles(256, 64, 8, 3)
BACKWARD_8B = BackwardConfig(64, 128, 128, 64, 8, 3, fused=False)
TUNED_HEAD_DIM = 128


def tuned_tiles(q: Tensor) -> tuple[Tiles | None, BackwardConfig | None]:
    """The 8B's tiles where they were measured (bf16, CUDA, d_head 128); else None: the table's."""
    if q.is_cuda and q.dtype == torch.bfloat16 and q.shape[-1] == TUNED_HEAD_DIM:
        return FORWARD_8B, BACKWARD_8B
    return None, None


@torch.library.custom_op("cs336sys_leaderboard::flash_forward", mutates_args=())
def flash_forward(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    """Causal O and L (float32 logsumexp, q.shape[:-1]) with `tuned_tiles`."""
    return flash_attention_triton_forward(q, k, v, True, config=tuned_tiles(q)[0])


@flash_forward.register_fake
def _(q, k, v):
    return q.new_empty(q.shape), q.new_empty(q.shape[:-1], dtype=torch.float32)


class TunedFlashAttention(torch.autograd.Function):
    """Causal attention: the forward through `flash_forward`, the backward with `tuned_tiles`."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        check_attention_inputs(q, k, v, True, for_triton=True)
        if not q.is_cuda and not kernels_interpreted():
            raise ValueError(f"our flash kernels need CUDA tensors (got {q.device}), or TRITON_INTERPRET=1 "
                             "set before triton is imported")
        out, lse = flash_forward(q, k, v)
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, grad_out: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        q, k, v, out, lse = ctx.saved_tensors
        return flash_attention_triton_backward(q, k, v, out, lse, grad_out, True, config=tuned_tiles(q)[1])


def tuned_flash_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """An attention backend for `TransformerLM(attention=...)`."""
    return TunedFlashAttention.apply(q, k, v)


@torch.library.custom_op("cs336sys_leaderboard::gluon_forward", mutates_args=())
def gluon_forward(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    """Causal O and L (float32 logsumexp, q.shape[:-1]) by the Gluon forward."""
    from cs336sys.attention.flash_gluon import flash_attention_gluon_forward

    return flash_attention_gluon_forward(q, k, v, True)


@gluon_forward.register_fake
def _(q, k, v):
    return q.new_empty(q.shape), q.new_empty(q.shape[:-1], dtype=torch.float32)


class GluonFlashAttention(torch.autograd.Function):
    """Causal attention by the Gluon kernels: the forward through `gluon_forward`, the Gluon backward."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        from cs336sys.attention.flash_gluon import check_gluon_inputs

        check_gluon_inputs(q, k, v, True)
        out, lse = gluon_forward(q, k, v)
        ctx.save_for_backward(q, k, v, out, lse)
        return out

    @staticmethod
    def backward(ctx, grad_out: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        from cs336sys.attention.flash_gluon import flash_attention_gluon_backward

        q, k, v, out, lse = ctx.saved_tensors
        return flash_attention_gluon_backward(q, k, v, out, lse, grad_out, True)


def gluon_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """An attention backend for `TransformerLM(attention=...)`: the Gluon kernels (Hopper only)."""
    return GluonFlashAttention.apply(q, k, v)


def gluon_device_refusal(device: str | torch.device) -> str | None:
    """Why attention "gluon" cannot run on this device (None: it can)."""
    from cs336sys.attention.flash_gluon import device_refusal

    return device_refusal(device)


_aten = torch.ops.aten
KEPT_OPS = frozenset([
    _aten._scaled_dot_product_flash_attention.default,
    _aten._scaled_dot_product_efficient_attention.default,
    _aten._scaled_dot_product_cudnn_attention.default,
    _aten._scaled_dot_product_flash_attention_for_cpu.default,
    torch.ops.cs336sys_leaderboard.flash_forward.default,
    torch.ops.cs336sys_leaderboard.gluon_forward.default,
])


def _keep_attention_policy(ctx, op, *args, **kwargs) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if op in KEPT_OPS else CheckpointPolicy.PREFER_RECOMPUTE


keep_attention_context = functools.partial(create_selective_checkpoint_contexts, _keep_attention_policy)
