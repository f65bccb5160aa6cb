"""The chunked LM-head cross-entropy against autograd through cs336sys.optim.cross_entropy.

The reference runs the matmul and autograd in float64 (cross_entropy itself takes the log-sum-exp
in float32, as our chunks do). Inputs are fresh random tensors each run (the seed is printed).
"""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from cs336sys.leaderboard.loss import lm_head_cross_entropy
from cs336sys.numerics import rel_err
from cs336sys.optim import cross_entropy


def random_inputs(lead: tuple[int, ...], d: int, vocab: int, hidden_dtype=torch.float32, weight_dtype=torch.float32):
    hidden = torch.randn(*lead, d, dtype=hidden_dtype, requires_grad=True)
    weight = (torch.randn(vocab, d) / d**0.25).to(weight_dtype).requires_grad_()
    targets = torch.randint(0, vocab, lead)
    return hidden, weight, targets


def reference(hidden, weight, targets, grad_out):
    """Loss, d hidden, d weight of cross_entropy(hidden @ weight.T) with float64 matmul and autograd."""
    h64 = hidden.detach().double().requires_grad_()
    w64 = weight.detach().double().requires_grad_()
    loss = cross_entropy(h64 @ w64.T, targets)
    (loss * grad_out.double()).backward()
    return loss.detach(), h64.grad, w64.grad


CASES = [  # (leading dims, d, vocab, chunk_tokens)
    ((64,), 16, 50, 16),  # N a multiple of the chunk
    ((70,), 16, 50, 16),  # a partial last chunk
    ((20,), 8, 33, 64),  # one chunk larger than N
    ((9,), 8, 21, 1),  # one token per chunk
    ((2, 13), 16, 40, 8),  # (batch, seq, d) hidden
]


@pytest.mark.parametrize("lead,d,vocab,chunk", CASES)
def test_matches_float64_reference(fresh_seed, lead, d, vocab, chunk):
    hidden, weight, targets = random_inputs(lead, d, vocab)
    grad_out = torch.randn(())  # backward must scale the saved gradients by it
    loss = lm_head_cross_entropy(hidden, weight, targets, chunk_tokens=chunk)
    loss.backward(grad_out)
    want_loss, want_h, want_w = reference(hidden, weight, targets, grad_out)
    assert loss.shape == () and loss.dtype == torch.float32
    assert abs(loss.item() - want_loss.item()) <= 1e-5 * abs(want_loss.item())
    assert hidden.grad.shape == hidden.shape and weight.grad.shape == weight.shape
    assert rel_err(hidden.grad, want_h) < 1e-5
    assert rel_err(weight.grad, want_w) < 1e-5


@pytest.mark.parametrize("which", ["hidden", "weight"])
def test_gradient_of_one_input_only(fresh_seed, which):
    hidden, weight, targets = random_inputs((30,), 8, 25)
    frozen = weight if which == "hidden" else hidden
    frozen.requires_grad_(False)
    lm_head_cross_entropy(hidden, weight, targets, chunk_tokens=7).backward()
    _, want_h, want_w = reference(hidden, weight, targets, torch.ones(()))
    assert frozen.grad is None
    got, want = (hidden.grad, want_h) if which == "hidden" else (weight.grad, want_w)
    assert rel_err(got, want) < 1e-5


def test_float32_inputs_under_autocast_stay_float32(fresh_seed):
    # CPU autocast would run the matmuls in bf16 (errors ~1e-2); the function turns it off inside
    hidden, weight, targets = random_inputs((40,), 16, 30)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = lm_head_cross_entropy(hidden, weight, targets, chunk_tokens=16)
        loss.backward()
    want_loss, want_h, want_w = reference(hidden, weight, targets, torch.ones(()))
    assert abs(loss.item() - want_loss.item()) <= 1e-5 * abs(want_loss.item())
    assert rel_err(hidden.grad, want_h) < 1e-5 and rel_err(weight.grad, want_w) < 1e-5


def test_bf16_hidden_fp32_weight_under_autocast(fresh_seed):
    """Mixed precision as in training: matmuls in bf16, softmax in fp32, each gradient in its input's dtype.

    Tolerance: bf16 keeps 8 significant bits (relative rounding 2^-9 ~ 0.2%); the weight, the
    logits (|logit| ~ 4 here) and both gradient matmuls are rounded, so the loss is compared to
    2e-2 absolute and the gradients to 2e-2 relative (norm-wise) error.
    """
    hidden, weight, targets = random_inputs((2, 24), 32, 60, hidden_dtype=torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = lm_head_cross_entropy(hidden, weight, targets, chunk_tokens=16)
        loss.backward()
    want_loss, want_h, want_w = reference(hidden, weight, targets, torch.ones(()))
    assert loss.dtype == torch.float32
    assert hidden.grad.dtype == torch.bfloat16 and weight.grad.dtype == torch.float32
    assert abs(loss.item() - want_loss.item()) < 2e-2
    assert rel_err(hidden.grad, want_h) < 2e-2
    assert rel_err(weight.grad, want_w) < 2e-2


def test_no_grad_returns_the_loss_only(fresh_seed):
    hidden, weight, targets = random_inputs((50,), 8, 20)
    want_loss = reference(hidden, weight, targets, torch.ones(()))[0]
    with torch.no_grad():
        loss = lm_head_cross_entropy(hidden, weight, targets, chunk_tokens=16)
    assert not loss.requires_grad and loss.grad_fn is None
    assert abs(loss.item() - want_loss.item()) <= 1e-5 * abs(want_loss.item())
    frozen = lm_head_cross_entropy(hidden.detach(), weight.detach(), targets, chunk_tokens=16)
    assert frozen.grad_fn is None and torch.equal(frozen, loss)
    assert hidden.grad is None and weight.grad is None


class LargestTensor(TorchDispatchMode):
    """Records the most elements of any tensor an op produces."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor):
                self.largest = max(self.largest, t.numel())
        return out


def test_never_builds_the_full_logits(fresh_seed):
    # N * V = 2560 is larger than chunk * V = 640 and than the (N, d) and (V, d) gradients
    n, d, vocab, chunk = 64, 8, 40, 16
    hidden, weight, targets = random_inputs((n,), d, vocab)
    with LargestTensor() as full:  # the mode sees the full logits when they are built
        cross_entropy(hidden @ weight.T, targets).backward()
    assert full.largest >= n * vocab
    hidden.grad = weight.grad = None
    with LargestTensor() as chunked:
        lm_head_cross_entropy(hidden, weight, targets, chunk_tokens=chunk).backward()
    assert chunked.largest <= chunk * vocab
    assert hidden.grad is not None and weight.grad is not None


def test_rejects_bad_arguments():
    hidden, weight, targets = random_inputs((4,), 8, 10)
    with pytest.raises(ValueError, match="chunk_tokens"):
        lm_head_cross_entropy(hidden, weight, targets, chunk_tokens=0)
    with pytest.raises(ValueError, match="does not match weight"):
        lm_head_cross_entropy(hidden, weight[:, :4], targets)
    with pytest.raises(ValueError, match="targets"):
        lm_head_cross_entropy(hidden, weight, targets[:3])
