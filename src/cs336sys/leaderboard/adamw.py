"""AdamW as one Triton kernel per parameter tensor, with an optional low-precision copy of the result.

`cs336sys.optim.AdamW` runs about seven elementwise torch ops per parameter, each a pass over
memory; `adamw_kernel` reads p, g, m, v once and writes p, m, v once, with the same math. The FSDP
step keeps a bf16 copy of every fp32 master shard for its all-gathers; the kernel can write that
copy (`out_lowp`) in the same pass instead of a separate cast. The bias correction and decay
factor are Python floats computed on the host, as in the reference (the step size may instead be
read from device memory, for launches a CUDA graph replays). The kernel runs on CUDA
tensors, or on any tensors when TRITON_INTERPRET=1 was set before triton was imported; otherwise
`fused_adamw_` does the same math with torch ops (the CPU path). Loads and stores use plain
pointer arithmetic (no block pointers), so the module works across Triton versions.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch
import triton
import triton.language as tl
from torch import Tensor

from cs336sys.optim import AdamW, adamw_update_

BLOCK = 1024


@triton.jit
def _round_to_bf16(x):
    """float32 -> bfloat16, round to nearest even, by integer ops on the bits.

    What `x.to(tl.bfloat16)` does on the GPU, and torch's `.to(torch.bfloat16)`; spelled out because
    Triton's interpreter truncates instead, and the tests compare the copy exactly.
    """
    bits = x.to(tl.uint32, bitcast=True)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    rounded = tl.where(x == x, rounded, 0x7FC0)  # NaN stays a (quiet) NaN
    return rounded.to(tl.uint16).to(tl.bfloat16, bitcast=True)


@triton.jit
def adamw_kernel(P, G, M, V, OUT, n, beta1, one_minus_beta1, beta2, one_minus_beta2, step_size, eps, decay,
                 HAS_OUT: tl.constexpr, OUT_BF16: tl.constexpr, BLOCK: tl.constexpr,
                 STEP_SIZE_IN_MEMORY: tl.constexpr = False):
    if STEP_SIZE_IN_MEMORY:  # step_size points at the float32 value (a CUDA graph replays the launch)
        step_size = tl.load(step_size)
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    p = tl.load(P + offs, mask=mask, other=0.0).to(tl.float32)
    g = tl.load(G + offs, mask=mask, other=0.0).to(tl.float32)
    m = tl.load(M + offs, mask=mask, other=0.0).to(tl.float32)
    v = tl.load(V + offs, mask=mask, other=0.0).to(tl.float32)
    m = m * beta1 + one_minus_beta1 * g
    v = v * beta2 + one_minus_beta2 * (g * g)
    # IEEE sqrt and division (tl.sqrt and `/` are approximate on the GPU), as torch computes them
    p = p - step_size * tl.div_rn(m, tl.sqrt_rn(v) + eps)
    p = p * decay
    tl.store(P + offs, p.to(P.dtype.element_ty), mask=mask)
    tl.store(M + offs, m.to(M.dtype.element_ty), mask=mask)
    tl.store(V + offs, v.to(V.dtype.element_ty), mask=mask)
    if HAS_OUT:
        if OUT_BF16:
            tl.store(OUT + offs, _round_to_bf16(p), mask=mask)
        else:
            tl.store(OUT + offs, p.to(OUT.dtype.element_ty), mask=mask)


def kernel_interpreted() -> bool:
    """Was triton imported with TRITON_INTERPRET=1 (so the kernel can run on CPU tensors)?"""
    from triton.runtime.jit import JITFunction

    return not isinstance(adamw_kernel, JITFunction)


def fused_adamw_(param: Tensor, grad: Tensor, exp_avg: Tensor, exp_avg_sq: Tensor, *, step_size: float | Tensor,
                 lr: float, eps: float, weight_decay: float, beta1: float, beta2: float,
                 out_lowp: Tensor | None = None) -> None:
    """One AdamW update of `param`, `exp_avg`, `exp_avg_sq` in place (and `out_lowp` := the new param).

    step_size is lr * sqrt(1 - beta2^t) / (1 - beta1^t): a float, or a one-element float32 tensor on
    param's device that the kernel reads when it runs (so a CUDA graph that captured the launch
    takes each step's value). All tensors must be contiguous with as many elements as param; grad
    may be in a lower precision than param (it is upcast).
    """
    in_memory = isinstance(step_size, Tensor)
    if in_memory and (step_size.numel() != 1 or step_size.dtype != torch.float32
                      or step_size.device != param.device):
        raise ValueError(f"a step_size tensor must be one float32 element on {param.device}, got "
                         f"{step_size.dtype} {tuple(step_size.shape)} on {step_size.device}")
    tensors = {"param": param, "grad": grad, "exp_avg": exp_avg, "exp_avg_sq": exp_avg_sq}
    if out_lowp is not None:
        tensors["out_lowp"] = out_lowp
    for name, t in tensors.items():
        if not t.is_contiguous():
            raise ValueError(f"fused_adamw_ needs contiguous tensors; {name} has strides {t.stride()}")
        if t.numel() != param.numel():
            raise ValueError(f"{name} has {t.numel()} elements, param has {param.numel()}")
        if t.device != param.device:
            raise ValueError(f"{name} is on {t.device}, param on {param.device}")
    decay = 1.0 - lr * weight_decay
    n = param.numel()
    if n == 0:
        return
    if param.device.type == "cuda" or kernel_interpreted():
        grid = (triton.cdiv(n, BLOCK),)
        adamw_kernel[grid](param, grad, exp_avg, exp_avg_sq, out_lowp if out_lowp is not None else param, n,
                           beta1, 1.0 - beta1, beta2, 1.0 - beta2, step_size, eps, decay,
                           HAS_OUT=out_lowp is not None,
                           OUT_BF16=out_lowp is not None and out_lowp.dtype == torch.bfloat16, BLOCK=BLOCK,
                           **({"STEP_SIZE_IN_MEMORY": True} if in_memory else {}))
        return
    if in_memory:
        step_size = step_size.item()
    # the reference's torch ops, so the CPU path is bitwise cs336sys.optim.AdamW
    adamw_update_(param, grad, exp_avg, exp_avg_sq, step_size=step_size, lr=lr, eps=eps, weight_decay=weight_decay,
                  beta1=beta1, beta2=beta2)
    if out_lowp is not None:
        out_lowp.view(param.shape).copy_(param)


class FusedAdamW(AdamW):
    """cs336sys.optim.AdamW with each parameter's update as one `fused_adamw_` call.

    `lowp_copies` (or `set_lowp_copy`) maps a parameter to a buffer with as many elements, e.g. a
    slice of a bf16 all-gather buffer, which each step overwrites with the updated parameter.
    """

    def __init__(self, params: Iterable, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, weight_decay: float = 0.01, *, lowp_copies: Mapping[Tensor, Tensor] | None = None):
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)
        self._lowp: dict[Tensor, Tensor] = {}
        for p, buffer in (lowp_copies or {}).items():
            self.set_lowp_copy(p, buffer)

    def set_lowp_copy(self, param: Tensor, buffer: Tensor | None) -> None:
        """Write `param`'s updated value into `buffer` in the same pass as its update (None: stop)."""
        if buffer is None:
            self._lowp.pop(param, None)
            return
        if buffer.numel() != param.numel() or not buffer.is_contiguous():
            raise ValueError(f"the low-precision copy must be contiguous with {param.numel()} elements, got "
                             f"shape {tuple(buffer.shape)} strides {buffer.stride()}")
        self._lowp[param] = buffer

    def _update(self, param: Tensor, grad: Tensor, exp_avg: Tensor, exp_avg_sq: Tensor, **hyper: float) -> None:
        fused_adamw_(param, grad.contiguous(), exp_avg, exp_avg_sq, out_lowp=self._lowp.get(param), **hyper)
