"""The compiled Triton kernels (and the PyTorch FlashAttention) on a CUDA GPU vs float64.

Tolerances are on ||out - ref|| / ||ref||: float32 inputs go through tf32 tensor-core products
(about 3e-4 expected), bfloat16 inputs through bf16 products with fp32 accumulation (1e-3..1e-2).
"""

from __future__ import annotations

import os

import pytest
import torch
from conftest import rel_err, run_experiment

from cs336sys.attention.flash_pytorch import FlashAttention2PyTorch
from cs336sys.attention.naive import attention_logsumexp, naive_attention

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (none visible)"),
    pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") == "1",
                       reason="TRITON_INTERPRET=1: kernels are interpreted, not compiled"),
]

TOLERANCE = {torch.float32: 5e-3, torch.bfloat16: 2e-2, torch.float16: 5e-3}


def triton_class():
    from cs336sys.attention.flash_triton import FlashAttention2Triton

    return FlashAttention2Triton


def check_against_float64(cls, lead, seq_q, seq_k, d, causal, dtype):
    make = lambda n: torch.randn(*lead, n, d, device="cuda", dtype=dtype, requires_grad=True)
    q, k, v = make(seq_q), make(seq_k), make(seq_k)
    out = cls.apply(q, k, v, causal)
    lse = next(t for t in out.grad_fn.saved_tensors if t.shape == q.shape[:-1])
    grad_out = torch.randn_like(out)
    out.backward(grad_out)
    q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
    ref = naive_attention(q64, k64, v64, causal)
    ref.backward(grad_out.double())
    tol = TOLERANCE[dtype]
    assert out.dtype == dtype and out.shape == q.shape
    assert torch.isfinite(out).all()
    errors = {"O": rel_err(out, ref), "L": rel_err(lse, attention_logsumexp(q64.detach(), k64.detach(), causal)),
              "dQ": rel_err(q.grad, q64.grad), "dK": rel_err(k.grad, k64.grad), "dV": rel_err(v.grad, v64.grad)}
    assert all(e < tol for e in errors.values()), errors


SHAPES = [  # (leading dims, seq_q, seq_k, d, causal)
    ((2,), 512, 512, 64, True),  # (batch, seq, d)
    ((1, 4), 1000, 1000, 128, False),  # not a multiple of any tile
    ((2, 3), 300, 700, 32, False),  # different query and key lengths
    ((1, 2), 700, 300, 16, True),
    ((1, 16), 2048, 2048, 64, True),  # enough programs for the large tiles
    ((1, 1), 4096, 4096, 128, True),  # few programs: the small-tile entries
]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
@pytest.mark.parametrize("lead,seq_q,seq_k,d,causal", SHAPES)
def test_triton_matches_float64(lead, seq_q, seq_k, d, causal, dtype):
    check_against_float64(triton_class(), lead, seq_q, seq_k, d, causal, dtype)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_pytorch_flash_matches_float64_on_gpu(dtype):
    check_against_float64(FlashAttention2PyTorch, (2, 2), 200, 200, 64, True, dtype)


@pytest.mark.parametrize("d,config", [(64, (64, 64, 64, 64, 4, 3)), (128, (32, 64, 64, 64, 4, 2))])
@pytest.mark.parametrize("fused", [False, True])
def test_backward_launch_layouts_on_gpu(d, config, fused):
    """The table picks one launch per kind of program for many heads x long sequences; check both
    layouts at a small shape (the table would pick the fused one here)."""
    from cs336sys.attention.flash_configs import BackwardConfig
    from cs336sys.attention.flash_triton import flash_attention_triton_backward, flash_attention_triton_forward

    q, k, v = (torch.randn(1, 4, 1000, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    grad_out = torch.randn_like(q)
    out, lse = flash_attention_triton_forward(q, k, v, True)
    grads = flash_attention_triton_backward(q, k, v, out, lse, grad_out, True, BackwardConfig(*config, fused=fused))
    q64, k64, v64 = (t.double().requires_grad_() for t in (q, k, v))
    naive_attention(q64, k64, v64, True).backward(grad_out.double())
    for got, want in zip(grads, (q64.grad, k64.grad, v64.grad), strict=True):
        assert rel_err(got, want) < TOLERANCE[torch.bfloat16]


def test_compiled_apply_on_gpu():
    q, k, v = (torch.randn(1, 2, 256, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    out = torch.compile(triton_class().apply)(q, k, v, True)
    out.sum().backward()
    assert rel_err(out, naive_attention(q.double(), k.double(), v.double(), True)) < 2e-2
    assert torch.isfinite(q.grad).all()


def test_tensors_on_different_devices_are_refused():
    q = torch.randn(1, 64, 64, device="cuda")
    with pytest.raises(ValueError, match="one device"):
        triton_class().apply(q, q.cpu(), q, False)


def test_unsupported_head_dim_is_refused_on_gpu():
    q = torch.randn(1, 64, 256, device="cuda")
    with pytest.raises(ValueError, match="head dimension"):
        triton_class().apply(q, q, q, False)


def test_unaligned_inputs_after_aligned_ones_on_gpu():
    """The kernels take the caller's tensors without copies or views, so a contiguous view whose
    pointer is not 16-byte aligned, or a length that is no multiple of 16, must not run a kernel
    that Triton specialised for aligned pointers and divisible lengths on an earlier call."""
    numel = 2 * 1024 * 64
    buffers = [torch.randn(numel + 8, device="cuda", dtype=torch.bfloat16) for _ in range(4)]
    for offset, seq in ((0, 1024), (0, 1024), (1, 1024), (3, 1000), (0, 1000), (0, 1024)):
        q, k, v, grad_out = (b[offset:offset + 2 * seq * 64].view(2, seq, 64) for b in buffers)
        q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
        assert offset == 0 or q.data_ptr() % 16
        out = triton_class().apply(q, k, v, True)
        out.backward(grad_out)
        q64, k64, v64 = (t.detach().double().requires_grad_() for t in (q, k, v))
        ref = naive_attention(q64, k64, v64, True)
        ref.backward(grad_out.double())
        errors = [rel_err(out, ref)] + [rel_err(a.grad, b.grad) for a, b in ((q, q64), (k, k64), (v, v64))]
        assert max(errors) < TOLERANCE[torch.bfloat16], (offset, seq, errors)


def test_triton_forward_and_backward_replay_from_a_cuda_graph():
    """The benchmark's GPU-only times replay a CUDA graph of one call: the capture must hold every
    kernel of ours, the backward's included, and replaying it must give the eager gradients."""
    q, k, v = (torch.randn(1, 2, 1000, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True)
               for _ in range(3))
    grad_out = torch.randn_like(q)
    call = lambda: triton_class().apply(q, k, v, True).backward(grad_out)
    call()
    want = [t.grad.clone() for t in (q, k, v)]
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        q.grad = k.grad = v.grad = None
        call()
    stream.synchronize()
    q.grad = k.grad = v.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        call()
    grads = [q.grad, k.grad, v.grad]
    for g in grads:
        g.zero_()
    graph.replay()
    torch.cuda.synchronize()
    assert all(torch.equal(got, ref) for got, ref in zip(grads, want, strict=True))


@pytest.mark.parametrize("impl", ["triton", "sdpa"])
def test_flash_point_times_cuda_graph_replays_on_gpu(impl):
    from cs336sys.attention.bench_flash import run_baseline_point
    from cs336sys.attention.bench_flash_triton import run_triton_point

    run_point = run_triton_point if impl == "triton" else run_baseline_point
    metrics = run_experiment(run_point, **{"device": "cuda", "impl": impl, "seq": 1024, "d": 64, "dtype": "bf16"})
    for part in ("forward", "backward", "fwd_bwd"):
        assert 0 < metrics[f"graph_{part}_ms"] < 5 * metrics[f"{part}_ms"], metrics
