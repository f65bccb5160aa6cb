"""The SwiGLU gate in the products' epilogues (`cs336sys.training.gate_products`) against float64 autograd of
the products and gate it replaces, and the kernel block built on it against the block without it.

As in test_step_kernels.py: the first test re-runs this file with TRITON_INTERPRET=1, where the kernels run
on CPU tensors (float32; ragged tiles at the edges of every dimension); in this process the functions take
their torch ops, which the same tests check. On a GPU the kernels run compiled, in bf16 (the `gpu` marker).
Fresh random inputs.
"""

from __future__ import annotations

import os

import pytest
import torch
from conftest import rerun_under_the_interpreter

pytest.importorskip("triton")

from cs336sys.dtypes import autocast  # noqa: E402
from cs336sys.leaderboard import fused_ops  # noqa: E402
from cs336sys.model import build_model  # noqa: E402
from cs336sys.training.gate_products import gate_backward, gate_forward, gated_mlp  # noqa: E402
from cs336sys.training.step_blocks import PROJECTED_BLOCK_INPUTS, joined_rotary_tables, kernel_block  # noqa: E402

IN_INTERPRETER = os.environ.get("TRITON_INTERPRET") == "1" and fused_ops.kernels_interpreted()
ON_GPU = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"
DEVICE = "cuda" if ON_GPU else "cpu"
DTYPE = torch.bfloat16 if ON_GPU else torch.float32  # the interpreter's dots are float32
TOLERANCE = 1e-2 if ON_GPU else 1e-5  # of the largest element, against float64
SHAPES = [(37, 24, 40), (64, 32, 48), (130, 64, 136), (256, 128, 512)]  # (rows, d_model, d_ff): ragged tiles


@pytest.mark.slow(seconds=60)
def test_kernels_in_an_interpreter_process():
    if IN_INTERPRETER:
        pytest.skip("this process already interprets; the tests below run here")
    # (the kernel block's products are bf16, which the interpreter does not compute rightly)
    rerun_under_the_interpreter(__file__, "not in_an_interpreter_process and not kernel_block", timeout_s=600)


def rel(got: torch.Tensor, want: torch.Tensor) -> float:
    got, want = got.detach().cpu().double(), want.detach().cpu()
    return ((got - want).abs().max() / want.abs().max()).item()


def inputs(rows: int, d: int, n: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    x = torch.randn(rows, d, device=DEVICE).to(DTYPE)
    w13 = (torch.randn(2 * n, d, device=DEVICE) / d**0.5).to(DTYPE)
    w2 = (torch.randn(d, n, device=DEVICE) / n**0.5).to(DTYPE)
    return x, w13, w2


@pytest.mark.gpu
@pytest.mark.parametrize(("rows", "d", "n"), SHAPES)
def test_the_forward_product_writes_both_halves_and_their_gate(rows, d, n, fresh_seed):
    x, w13, _ = inputs(rows, d, n)
    ab, g = gate_forward(x, w13)
    assert ab.shape == (rows, 2 * n) and g.shape == (rows, n) and ab.dtype == g.dtype == DTYPE
    want_ab = x.double().cpu() @ w13.double().cpu().T
    assert rel(ab, want_ab) < TOLERANCE
    a, b = ab.double().cpu().chunk(2, dim=-1)  # the gate of the product as rounded (the compiled block's)
    assert rel(g, torch.nn.functional.silu(a) * b) < TOLERANCE


@pytest.mark.gpu
@pytest.mark.parametrize(("rows", "d", "n"), SHAPES)
def test_the_backward_product_writes_the_gates_gradients(rows, d, n, fresh_seed):
    x, w13, w2 = inputs(rows, d, n)
    ab = (x @ w13.T) * 2  # larger gates: sigmoid's tails in play
    dy = torch.randn(rows, d, device=DEVICE).to(DTYPE)
    ab64 = ab.double().cpu().requires_grad_()
    a, b = ab64.chunk(2, dim=-1)
    ((torch.nn.functional.silu(a) * b) @ w2.double().cpu().T).backward(dy.double().cpu())
    got = gate_backward(dy, w2, ab)
    assert got.shape == ab.shape and got.dtype == DTYPE
    assert rel(got, ab64.grad) < TOLERANCE


@pytest.mark.gpu
@pytest.mark.parametrize(("rows", "d", "n"), SHAPES[:3])
def test_the_gated_mlp_and_its_gradients_are_the_plain_ones(rows, d, n, fresh_seed):
    # (batch, seq, d_model) in; the three gradients against float64 autograd of the plain ops
    x, w13, w2 = inputs(rows, d, n)
    x = x.view(1, rows, d)
    leaves = [t.detach().requires_grad_() for t in (x, w13, w2)]
    leaves64 = [t.detach().cpu().double().requires_grad_() for t in (x, w13, w2)]
    dy = torch.randn(1, rows, d, device=DEVICE).to(DTYPE)
    y = gated_mlp(*leaves)
    y.backward(dy)
    a, b = (leaves64[0] @ leaves64[1].T).chunk(2, dim=-1)
    y64 = (torch.nn.functional.silu(a) * b) @ leaves64[2].T
    y64.backward(dy.cpu().double())
    assert y.shape == y64.shape and rel(y, y64.detach()) < TOLERANCE
    for got, want in zip(leaves, leaves64, strict=True):
        assert got.grad.dtype == DTYPE and rel(got.grad, want.grad) < TOLERANCE


@pytest.mark.gpu
def test_the_products_refuse_what_their_descriptors_cannot_take():
    if not (ON_GPU or IN_INTERPRETER):
        pytest.skip("the torch ops take any shape; the kernels' checks run on the GPU and in the interpreter")
    x, w13, _ = inputs(32, 34, 32)  # rows of 34 elements: not a multiple of 16 bytes (bf16 or float32)
    with pytest.raises(ValueError, match="16-byte"):
        gate_forward(x, w13)
    x, w13, _ = inputs(32, 32, 32)
    with pytest.raises(TypeError, match="one dtype"):
        gate_forward(x, w13.double())


@pytest.mark.gpu
def test_the_kernel_block_with_the_gate_in_the_products_is_the_kernel_block(fresh_seed):
    # two blocks under bf16 autocast, with and without gate_epilogues: values and gradients within bf16 rounding
    if IN_INTERPRETER:
        pytest.skip("the block's products are bf16, which the interpreter computes wrongly; here the torch ops, "
                    "on the GPU the kernels")
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
    for gate in (False, True):
        fn = kernel_block(blocks[0], gate_epilogues=gate)
        with autocast("bf16", DEVICE):
            h, branch = x, None
            for w in weights:
                h, branch = fn(h, branch, *w, *tables)
            out = h + branch
        leaves = [x, *(w for ws in weights for w in ws)]
        results.append((out, torch.autograd.grad(out, leaves, grad)))
    (want, want_grads), (got, got_grads) = results
    assert rel(got, want.double()) < 1e-2
    for a, b in zip(got_grads, want_grads, strict=True):
        assert a.dtype == b.dtype and rel(a.float(), b.double()) < 2e-2
