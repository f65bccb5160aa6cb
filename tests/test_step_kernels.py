"""The optimised step's backward kernels (`cs336sys.training.step_kernels`) against float64 autograd of the
forward they invert, and the block built on them (`kernel_block`) against `projected_block`.

As in test_leaderboard_fused_ops.py: the first test re-runs this file with TRITON_INTERPRET=1, where the
kernels run on CPU tensors (float32); in this process the functions take their torch ops, which the same
tests check. On a GPU the kernels run compiled on CUDA tensors (the `gpu` marker: `pytest -m gpu` takes them
there). Fresh random inputs.
"""

from __future__ import annotations

import os

import pytest
import torch
from conftest import rerun_under_the_interpreter

pytest.importorskip("triton")

from cs336sys.dtypes import autocast  # noqa: E402
from cs336sys.leaderboard import fused_ops  # noqa: E402
from cs336sys.model import RotaryEmbedding, build_model  # noqa: E402
from cs336sys.training.step_blocks import (  # noqa: E402
    PROJECTED_BLOCK_INPUTS,
    joined_rotary_tables,
    kernel_block,
    projected_block,
    rotate_pairs,
)
from cs336sys.training.step_kernels import residual_rms_norm_backward, rotary_heads_backward  # noqa: E402

IN_INTERPRETER = os.environ.get("TRITON_INTERPRET") == "1" and fused_ops.kernels_interpreted()
ON_GPU = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"
DEVICE = "cuda" if ON_GPU else "cpu"


@pytest.mark.slow(seconds=40)
def test_kernels_in_an_interpreter_process():
    if IN_INTERPRETER:
        pytest.skip("this process already interprets; the tests below run here")
    rerun_under_the_interpreter(__file__, "not in_an_interpreter_process and not on_the_gpu", timeout_s=600)


def rel(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.double() - want).abs().max() / want.abs().max()).item()


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(2, 37, 3, 8), (1, 33, 2, 10), (2, 64, 4, 64)])  # (batch, seq, heads, d_head)
@pytest.mark.parametrize("strided", [False, True])
def test_ropes_backward_is_the_gradient_of_rope_and_the_head_layout(shape, strided, fresh_seed):
    # the forward's RoPE over the joined projection and its layout as three (batch, heads, seq, d) tensors,
    # differentiated in float64; the gradients strided as the padded head dimension leaves them (a slice)
    batch, seq, heads, d = shape
    rope = RotaryEmbedding(10000.0, d, seq)
    cos, sin = joined_rotary_tables(rope.cos[:seq], rope.sin[:seq])
    projected = torch.randn(batch, seq, 3, heads, d, dtype=torch.float64, requires_grad=True)
    heads_of = rotate_pairs(projected, cos.double(), sin.double()).permute(2, 0, 3, 1, 4).unbind(0)
    width = d + 6 if strided else d
    grads = [torch.randn(batch, heads, seq, width, device=DEVICE)[..., :d] for _ in range(3)]
    torch.autograd.backward(heads_of, [g.double().cpu() for g in grads])
    got = rotary_heads_backward(*grads, cos.to(DEVICE), sin.to(DEVICE))
    assert got.shape == projected.shape and got.dtype == torch.float32
    assert rel(got.cpu(), projected.grad) < 2e-6


@pytest.mark.gpu
@pytest.mark.parametrize(("rows", "d"), [(37, 24), (9, 100), (130, 256)])
@pytest.mark.parametrize("residual", [False, True])
def test_the_norms_backward_is_its_gradient_plus_the_residuals(rows, d, residual, fresh_seed):
    # x's gradient (plus the residual's own, when given) in fp32 and rounded once to bf16, and the weight's
    # gradient summed over every row (a ragged last program included), against float64 autograd
    eps = 1e-5
    x, weight, dh = torch.randn(rows, d) * 3, torch.rand(d) + 0.5, torch.randn(rows, d)
    g = torch.randn(rows, d) if residual else None
    x64, w64 = x.double().requires_grad_(), weight.double().requires_grad_()
    rms = torch.sqrt(x64.pow(2).mean(-1, keepdim=True) + eps)
    (x64 / rms * w64).backward(dh.double())
    want_dx = x64.grad + (g.double() if residual else 0)
    rstd = rms.reciprocal().squeeze(-1).float().detach()
    dx, dx_low, dw = residual_rms_norm_backward(*(t.to(DEVICE) if t is not None else None
                                                  for t in (dh, x, weight, rstd, g)))
    assert rel(dx.cpu(), want_dx) < 2e-6
    assert rel(dw.cpu(), w64.grad) < 2e-6
    assert dx_low.dtype == torch.bfloat16 and torch.equal(dx_low, dx.to(torch.bfloat16))  # rounded to nearest even


@pytest.mark.gpu
def test_the_kernel_block_computes_the_projected_blocks_values(fresh_seed):
    # two blocks under bf16 autocast: the kernel block's forward (the residual adds moved into the norms after
    # them) is the projected block's bit for bit, and its gradients agree within bf16 rounding
    model = build_model("tiny", 32).to(DEVICE)
    blocks = model.layers[:2]
    d = model.lm_head.weight.shape[1]
    x = torch.randn(2, 32, d, device=DEVICE, requires_grad=True)
    weights = [{"ln1.weight": b.ln1.weight, "ln2.weight": b.ln2.weight,
                "attn.qkv": torch.cat([b.attn.q_proj.weight, b.attn.k_proj.weight, b.attn.v_proj.weight]),
                "attn.output_proj.weight": b.attn.output_proj.weight,
                "ffn.w13": torch.cat([b.ffn.w1.weight, b.ffn.w3.weight]), "ffn.w2.weight": b.ffn.w2.weight}
               for b in blocks]
    weights = [[w[n].detach().to(torch.bfloat16 if w[n].ndim == 2 else torch.float32).requires_grad_()
                for n in PROJECTED_BLOCK_INPUTS] for w in weights]
    tables = [t.to(DEVICE, torch.bfloat16) for t in joined_rotary_tables(blocks[0].attn.rope.cos[:32],
                                                                          blocks[0].attn.rope.sin[:32])]
    grad = torch.randn_like(x)
    results = []
    for make in (projected_block, kernel_block):
        fn = make(blocks[0])
        with autocast("bf16", DEVICE):
            if make is kernel_block:
                h, branch = x, None
                for w in weights:
                    h, branch = fn(h, branch, *w, *tables)
                out = h + branch
            else:
                out = x
                for w in weights:
                    out = fn(out, *w, *tables)
        leaves = [x, *(w for ws in weights for w in ws)]
        results.append((out, torch.autograd.grad(out, leaves, grad)))
    (want, want_grads), (got, got_grads) = results
    assert torch.equal(got, want)
    for a, b in zip(got_grads, want_grads, strict=True):
        assert a.dtype == b.dtype and rel(a.float(), b.double()) < 2e-2
