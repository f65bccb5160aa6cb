"""The fused RMSNorm, SwiGLU gate and RoPE kernels and the block built from them, against float64
references of the model's own math and against `cs336sys.model.TransformerBlock` itself.

As in test_leaderboard_adamw.py: the first test re-runs this file with TRITON_INTERPRET=1, where the
kernels run on CPU tensors (float32: the interpreter's bf16 is not the GPU's); in this process the
functions take the model's torch ops, and the interpreter-only tests are skipped with that reason.
On a GPU the same fp32 kernel tests also run compiled, on CUDA tensors, and the bf16 tests at the 8B's
widths run there; without CUDA they skip. Both carry the `gpu` marker, so `pytest -m gpu` runs them on a
GPU host. Inputs are fresh random tensors each run.
"""

from __future__ import annotations

import os

import pytest
import torch
from conftest import rerun_under_the_interpreter, spawn_checks
from torch.func import functional_call

pytest.importorskip("triton")

from cs336sys.leaderboard import fused_ops  # noqa: E402
from cs336sys.leaderboard.fused_block import fused_block_forward  # noqa: E402
from cs336sys.leaderboard.fused_ops import rms_norm, rotary, silu_gate  # noqa: E402
from cs336sys.model import RotaryEmbedding, TransformerBlock  # noqa: E402

IN_INTERPRETER = os.environ.get("TRITON_INTERPRET") == "1" and fused_ops.kernels_interpreted()
interpreted = pytest.mark.skipif(not IN_INTERPRETER, reason="runs in the TRITON_INTERPRET=1 subprocess "
                                 "of test_kernels_in_an_interpreter_process")
ON_GPU = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1"
needs_gpu = pytest.mark.skipif(not ON_GPU,
                               reason="needs a CUDA GPU (none visible) and compiled kernels (no TRITON_INTERPRET)")
kernels_run = pytest.mark.skipif(not (IN_INTERPRETER or ON_GPU), reason="runs where the kernels run: in the "
                                 "TRITON_INTERPRET=1 subprocess of test_kernels_in_an_interpreter_process, or "
                                 "compiled on a CUDA GPU (none visible)")


@pytest.fixture
def kernel_device():
    """The kernel tests' tensors: CPU tensors under the interpreter, CUDA tensors (compiled kernels) on a GPU."""
    if ON_GPU and not IN_INTERPRETER:
        with torch.device("cuda"):
            yield
    else:
        yield

BF16_UNIT_ROUNDOFF = 2.0**-8  # half of bf16's spacing (8 significant bits) relative to the value

# float32 kernels against float64: a few ulps of float32 through a sum over d (RMSNorm) or none.
FP32_REL_TOL = 2e-6


@pytest.mark.slow(seconds=100)
def test_kernels_in_an_interpreter_process():
    if IN_INTERPRETER:
        pytest.skip("this process already interprets; the tests below run here")
    rerun_under_the_interpreter(
        __file__, "not in_an_interpreter_process and not without_the_interpreter and not on_the_gpu", timeout_s=600)


def rel(got: torch.Tensor, want: torch.Tensor) -> float:
    """Largest elementwise error over the tensor's largest magnitude."""
    return ((got.double() - want).abs().max() / want.abs().max().clamp_min(1e-300)).item()


def leaves(*tensors: torch.Tensor) -> list[torch.Tensor]:
    return [t.detach().clone().requires_grad_() for t in tensors]


def run_both(fn, ref, inputs: list[torch.Tensor], extra=(), dtype=None):
    """fn(*inputs) and ref(*float64 inputs) with a random upstream gradient: (outputs, gradients) each."""
    ours, refs = leaves(*inputs), [t.detach().double().requires_grad_() for t in inputs]
    out = fn(*ours, *extra)
    want = ref(*refs, *extra)
    grad = torch.randn_like(want).to(out.dtype)  # one upstream gradient, exact in both precisions
    out.backward(grad)
    want.backward(grad.double())
    return (out, want), [(a.grad, b.grad) for a, b in zip(ours, refs, strict=True)]


# --------------------------------------------------------------------------------- interpreter


@pytest.mark.gpu
@kernels_run
@pytest.mark.usefixtures("kernel_device")
@pytest.mark.parametrize("shape", [(14, 48), (2, 7, 100), (1, 64), (3, 5, 33)])
def test_rms_norm_matches_float64(fresh_seed, shape):
    x = torch.randn(shape) * 3
    weight = torch.randn(shape[-1])
    (out, want), grads = run_both(rms_norm, fused_ops.rms_norm_reference, [x, weight], extra=(1e-5,))
    assert out.shape == x.shape and out.dtype == x.dtype
    assert rel(out, want) < FP32_REL_TOL
    for got, ref in grads:  # dx, and dw summed over several programs of rows
        assert rel(got, ref) < 5 * FP32_REL_TOL * shape[-1] ** 0.5


@pytest.mark.gpu
@kernels_run
@pytest.mark.usefixtures("kernel_device")
def test_rms_norm_backward_of_a_strided_gradient(fresh_seed):
    x, weight = leaves(torch.randn(6, 40), torch.randn(40))
    ref_x, ref_w = leaves(x, weight)
    grad = torch.randn(40, 6).T  # non-contiguous upstream gradient
    rms_norm(x, weight).backward(grad)
    fused_ops.rms_norm_reference(ref_x, ref_w, 1e-5).backward(grad)
    assert rel(x.grad, ref_x.grad.double()) < 1e-5 and rel(weight.grad, ref_w.grad.double()) < 1e-5


@pytest.mark.gpu
@kernels_run
@pytest.mark.usefixtures("kernel_device")
@pytest.mark.parametrize("shape", [(3000,), (17, 33), (2, 3, 7)])
def test_silu_gate_matches_float64(fresh_seed, shape):
    a, b = torch.randn(shape) * 4, torch.randn(shape)
    (out, want), grads = run_both(silu_gate, fused_ops.silu_gate_reference, [a, b])
    assert rel(out, want) < FP32_REL_TOL
    for got, ref in grads:
        assert rel(got, ref) < 4 * FP32_REL_TOL


@pytest.mark.gpu
@kernels_run
@pytest.mark.usefixtures("kernel_device")
@pytest.mark.parametrize("batch,heads,seq,d_head", [(2, 3, 37, 6), (1, 2, 64, 16), (1, 1, 5, 10)])
def test_rotary_matches_float64_and_keeps_the_layout(fresh_seed, batch, heads, seq, d_head):
    rope = RotaryEmbedding(10000.0, d_head, max_seq_len=seq + 9)
    cos, sin = rope.cos[:seq], rope.sin[:seq]
    # q as the model makes it: a head split (transposed view) of a projection's output
    projected = torch.randn(batch, seq, heads * d_head, requires_grad=True)
    x = projected.view(batch, seq, heads, d_head).transpose(1, 2)
    out = rotary(x, cos, sin)
    x64 = projected.detach().double().requires_grad_()
    want = fused_ops.rotary_reference(x64.view(batch, seq, heads, d_head).transpose(1, 2), cos.double(), sin.double())
    assert out.is_contiguous() and out.shape == want.shape
    assert rel(out, want) < FP32_REL_TOL
    grad = torch.randn_like(want)
    out.backward(grad.float())
    want.backward(grad)
    assert rel(projected.grad, x64.grad) < FP32_REL_TOL
    # and against the module at positions 0..seq-1
    torch.testing.assert_close(out, rope(x.detach(), torch.arange(seq)), rtol=1e-6, atol=1e-6)


@pytest.mark.gpu
@kernels_run
@pytest.mark.usefixtures("kernel_device")
def test_rotary_gradient_is_in_the_input_layout(fresh_seed):
    """dx has the strides of the head-split view it came from, so it flows back into the projection's
    (batch, seq, d_model) gradient without a copy."""
    rope = RotaryEmbedding(500.0, 8, max_seq_len=20)
    projected = torch.randn(2, 20, 24, requires_grad=True)
    x = projected.view(2, 20, 3, 8).transpose(1, 2)
    (dx,) = torch.autograd.grad(rotary(x, rope.cos, rope.sin), x, torch.randn(2, 3, 20, 8))
    assert dx.stride() == x.stride() != dx.contiguous().stride()


def _tiny_block(attention="naive") -> TransformerBlock:
    return TransformerBlock(d_model=32, num_heads=4, d_ff=48, max_seq_len=40, theta=10000.0, attention=attention)


def _block_against_module(block: TransformerBlock, x: torch.Tensor):
    params = {n: p.detach().clone().requires_grad_() for n, p in block.named_parameters()}
    ours_x = x.detach().clone().requires_grad_()
    out = fused_block_forward(block, params, ours_x)
    ref_x = x.detach().clone().requires_grad_()
    want = functional_call(block, dict(block.named_parameters()), (ref_x,))
    grad = torch.randn_like(want)
    out.backward(grad)
    want.backward(grad)
    grads = [(ours_x.grad, ref_x.grad)] + [(params[n].grad, p.grad) for n, p in block.named_parameters()]
    return out, want, grads


@pytest.mark.gpu
@kernels_run
@pytest.mark.usefixtures("kernel_device")
def test_fused_block_matches_the_module(fresh_seed):
    block = _tiny_block()
    for p in block.parameters():  # RMSNorm weights away from 1, so a dropped weight shows
        if p.ndim == 1:
            p.data.normal_(1.0, 0.5)
    out, want, grads = _block_against_module(block, torch.randn(2, 19, 32))
    assert rel(out, want.double()) < 1e-5
    assert len(grads) == 1 + len(list(block.parameters()))
    for got, ref in grads:
        assert rel(got, ref.double()) < 1e-4


FUSED_STEP_CONFIGS = [("all", True), ("none", False), (1, True)]


def _fused_step_checks(info, seed: int) -> dict:
    """test_leaderboard_step's training check, with the step's `fused_elementwise` option."""
    from test_leaderboard_step import _train_ours

    return {f"{p}/{r}": _train_ours(info.rank, info.world_size, seed, p, r, fused_elementwise=True)
            for p, r in FUSED_STEP_CONFIGS}


@interpreted
def test_the_step_with_fused_blocks_matches_single_process_training():
    """Through BlockFSDP (parameters as views of gathered buffers), checkpointed and not, on one gloo rank:
    the same bounds as the step with the model's own blocks (test_leaderboard_step.py). Two ranks, where
    each interprets every kernel again (and the step took minutes on a busy 2-core host), are the step's
    with the model's ops (test_leaderboard_step.py); the kernels are the same on any rank."""
    from test_leaderboard_step import FP32_GRAD_TOL, FP32_LOSS_TOL, FP32_PARAM_TOL

    _, per_rank = spawn_checks(_fused_step_checks, 1)
    for rank, results in enumerate(per_rank):
        for config, r in results.items():
            where = f"rank {rank}, {config}"
            assert r["loss_err"] < FP32_LOSS_TOL, f"{where}: loss off by {r['loss_err']:.3g}"
            assert r["grad_err"] < FP32_GRAD_TOL, f"{where}: gradients off by {r['grad_err']:.3g}"
            assert r["param_err"] < FP32_PARAM_TOL, f"{where}: parameters off by {r['param_err']:.3g}"
            assert r["alive_after_step"] == 0, f"{where}: a gathered buffer outlived the step"


def test_torch_path_is_the_module_bit_for_bit_without_the_interpreter(fresh_seed):
    if IN_INTERPRETER:
        pytest.skip("the torch-ops path runs without the interpreter")
    out, want, grads = _block_against_module(_tiny_block(), torch.randn(3, 11, 32))
    assert torch.equal(out, want)
    for got, ref in grads:
        assert torch.equal(got, ref)


@pytest.mark.parametrize("call,match", [
    (lambda: rms_norm(torch.randn(3, 8), torch.randn(7)), "weight has shape"),
    (lambda: silu_gate(torch.randn(3, 8), torch.randn(3, 7)), "one shape and dtype"),
    (lambda: silu_gate(torch.randn(3), torch.randn(3, dtype=torch.float64)), "one shape and dtype"),
    (lambda: rotary(torch.randn(2, 5, 8), torch.randn(5, 4), torch.randn(5, 4)), "batch, heads, seq, d_head"),
    (lambda: rotary(torch.randn(1, 2, 5, 7), torch.randn(5, 3), torch.randn(5, 3)), "even d_head"),
    (lambda: rotary(torch.randn(1, 2, 5, 8), torch.randn(6, 4), torch.randn(6, 4)), r"shape \(5, 4\)"),
])
def test_bad_inputs_are_named(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# ------------------------------------------------------------------------------------------- GPU


def _error_against_float64(fn, ref, inputs, extra=()):
    (out, want), grads = run_both(fn, ref, inputs, extra)
    return max([rel(out, want)] + [rel(g, r) for g, r in grads])


@pytest.mark.gpu
@needs_gpu
@pytest.mark.parametrize("name", ["rms_norm", "silu_gate", "rotary"])
@pytest.mark.usefixtures("fresh_seed")
def test_bf16_kernels_on_the_gpu_round_once(name):
    """At the 8B's widths (d_model 4096, d_ff 11008, d_head 128) in bf16: each output and gradient of a
    fused kernel is float64's value rounded once to bf16 (fp32 arithmetic inside), so its error is
    within bf16's unit roundoff 2^-8 of the largest value. The model's ops, which round after some
    of their ops, are printed beside it: their error is about the same or larger, by the op."""
    bf16 = dict(device="cuda", dtype=torch.bfloat16)
    if name == "rms_norm":
        inputs, extra = [torch.randn(2048, 4096, **bf16), torch.randn(4096, **bf16)], (1e-5,)
        fn, ref = rms_norm, fused_ops.rms_norm_reference
    elif name == "silu_gate":
        inputs, extra = [torch.randn(1024, 11008, **bf16) * 3, torch.randn(1024, 11008, **bf16)], ()
        fn, ref = silu_gate, fused_ops.silu_gate_reference
    else:
        rope = RotaryEmbedding(10000.0, 128, max_seq_len=4096, device="cuda")
        inputs = [torch.randn(1, 4096, 8, 128, **bf16).transpose(1, 2)]
        extra = (rope.cos, rope.sin)
        fn, ref = rotary, fused_ops.rotary_reference
    ours = _error_against_float64(fn, ref, inputs, extra)
    model_ops = _error_against_float64(ref, ref, inputs, extra)
    print(f"{name}: fused {ours:.2e}, model's ops {model_ops:.2e} (largest error / largest value; "
          f"one bf16 rounding: {BF16_UNIT_ROUNDOFF:.2e})")
    assert ours <= 1.02 * BF16_UNIT_ROUNDOFF
