"""Default flash implementation: FlashAttention-2 over the Triton kernels (problems 9-11).

A `torch.autograd.Function` over `flash_triton_forward` and `flash_triton_backward`, tiles from
`flash_configs`; the flash benchmarks, the optimised step and the 8B step's "flash" attention run it.

`FlashAttention2Triton.apply(q, k, v, is_causal=False, precision="tf32", forward_tiles=None,
backward_tiles=None)` takes (batch, seq, d) or (batch, heads, seq, d) tensors in float32, float16
or bfloat16 with d in {16, 32, 64, 128}, on CUDA, or on the CPU when TRITON_INTERPRET=1. It saves
L (shape q.shape[:-1], float32), Q, K, V, O. `precision` says how float32 products run: "tf32"
(Triton's default: tensor cores, 10-bit mantissa inputs) or "ieee" (full float32 on the CUDA
cores); float16 and bfloat16 inputs ignore it. The tiles, as `flash_configs.Tiles` /
`BackwardConfig` strings ("256x64/w8/s3", "kv64x128/q128x64/w8/s3/split"), replace the table's
choice for a shape the table was not tuned for; None (or "") keeps the table's.
"""

from __future__ import annotations

import math

import torch

from cs336sys.attention import flash_configs, flash_triton_backward, flash_triton_forward
from cs336sys.attention.inputs import check_attention_inputs

PRECISIONS = ("tf32", "ieee")


def check_precision(precision: str) -> str:
    if precision not in PRECISIONS:
        raise ValueError(f"unknown float32 precision {precision!r}; known: {', '.join(PRECISIONS)}")
    return precision


def kernels_interpreted() -> bool:
    """Are the kernels (and Triton's own library functions) set up for the interpreter?

    Triton fixes interpreted-or-compiled when a function is decorated, so TRITON_INTERPRET must
    be set before `triton` is first imported; setting it later leaves a mixture that cannot run.
    """
    import triton.language.standard
    from triton.runtime.jit import JITFunction

    ours = not isinstance(flash_triton_forward.flash_forward_kernel, JITFunction)
    library = not any(isinstance(f, JITFunction) for f in vars(triton.language.standard).values())
    if ours != library:
        raise RuntimeError("TRITON_INTERPRET changed between importing triton and importing the "
                           "attention kernels; set it before anything imports triton")
    return ours


def _contiguous(t: torch.Tensor) -> torch.Tensor:
    return t if t.is_contiguous() else t.contiguous()


def _tiles(text: str | None, kind: type):
    return kind.parse(text) if text else None


# The kernels take the tensors as they come, (batch, seq, d) or (batch, heads, seq, d), with no
# reshaping views: on the H100 host we measured, each view costs a few microseconds, and the
# whole call path here is host-bound for sequences up to a few thousand (notes/flash_attention.md).
def flash_attention_triton_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool,
                                   config: flash_configs.Tiles | None = None, precision: str = "tf32",
                                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """O (q's shape and dtype) and L (q.shape[:-1], float32) without autograd."""
    q, k, v = _contiguous(q), _contiguous(k), _contiguous(v)
    if config is None:
        *lead, seq_q, d = q.shape
        config = flash_configs.forward_config(d, q.dtype, seq_q, math.prod(lead), q.is_cuda)
    return flash_triton_forward.flash_forward(q, k, v, is_causal, config, check_precision(precision))


def flash_attention_triton_backward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                                    out: torch.Tensor, lse: torch.Tensor, grad_out: torch.Tensor,
                                    is_causal: bool, config: flash_configs.BackwardConfig | None = None,
                                    precision: str = "tf32") -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dQ, dK, dV (shapes and dtypes of q, k, v) from the forward's O and L."""
    q, k, v, out, lse, grad_out = (_contiguous(t) for t in (q, k, v, out, lse, grad_out))
    if config is None:
        *lead, seq_k, d = k.shape
        config = flash_configs.backward_config(d, q.dtype, seq_k, math.prod(lead), q.is_cuda)
    return flash_triton_backward.flash_backward(q, k, v, out, lse, grad_out, is_causal, config,
                                                check_precision(precision))


# For torch.compile the kernels are registered as PyTorch custom operators, so that it traces the
# autograd.Function without a graph break: each launch is one opaque node whose output shapes the
# fake implementations describe. Eagerly the functions are called directly, because the custom
# operator's dispatch costs tens of microseconds per call, as much as a short kernel.
@torch.library.custom_op("cs336sys::flash_attention_triton_forward", mutates_args=())
def _forward_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool, precision: str,
                tiles: str = "") -> tuple[torch.Tensor, torch.Tensor]:
    return flash_attention_triton_forward(q, k, v, is_causal, _tiles(tiles, flash_configs.Tiles), precision)


@_forward_op.register_fake
def _(q, k, v, is_causal, precision, tiles=""):
    return q.new_empty(q.shape), q.new_empty(q.shape[:-1], dtype=torch.float32)


@torch.library.custom_op("cs336sys::flash_attention_triton_backward", mutates_args=())
def _backward_op(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor, lse: torch.Tensor,
                 grad_out: torch.Tensor, is_causal: bool, precision: str, tiles: str = "",
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return flash_attention_triton_backward(q, k, v, out, lse, grad_out, is_causal,
                                           _tiles(tiles, flash_configs.BackwardConfig), precision)


@_backward_op.register_fake
def _(q, k, v, out, lse, grad_out, is_causal, precision, tiles=""):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


class FlashAttention2Triton(torch.autograd.Function):
    """`FlashAttention2Triton.apply(q, k, v, is_causal=False, precision="tf32", forward_tiles=None,
    backward_tiles=None)`; fused Triton forward and backward."""

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, is_causal: bool = False,
                precision: str = "tf32", forward_tiles: str | None = None, backward_tiles: str | None = None):
        check_attention_inputs(q, k, v, is_causal, for_triton=True)
        check_precision(precision)
        if q.device.type != "cuda" and not kernels_interpreted():
            raise ValueError(f"the Triton kernels need CUDA tensors (got {q.device}); to run them on the "
                             "CPU set TRITON_INTERPRET=1 before triton is imported")
        _tiles(backward_tiles, flash_configs.BackwardConfig)  # a malformed string fails here, not in backward
        if torch.compiler.is_compiling():
            out, lse = _forward_op(q, k, v, is_causal, precision, forward_tiles or "")
        else:
            out, lse = flash_attention_triton_forward(q, k, v, is_causal,
                                                      _tiles(forward_tiles, flash_configs.Tiles), precision)
        ctx.save_for_backward(lse, q, k, v, out)
        ctx.is_causal, ctx.precision, ctx.backward_tiles = is_causal, precision, backward_tiles or ""
        return out

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        lse, q, k, v, out = ctx.saved_tensors
        if torch.compiler.is_compiling():
            dq, dk, dv = _backward_op(q, k, v, out, lse, grad_out, ctx.is_causal, ctx.precision,
                                      ctx.backward_tiles)
        else:
            dq, dk, dv = flash_attention_triton_backward(
                q, k, v, out, lse, grad_out, ctx.is_causal,
                _tiles(ctx.backward_tiles, flash_configs.BackwardConfig), ctx.precision)
        return dq, dk, dv, None, None, None, None


def flash_causal_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Causal FlashAttention-2 in Triton as a Transformer attention backend (`TransformerLM(attention=...)`)."""
    return FlashAttention2Triton.apply(q, k, v, True)
