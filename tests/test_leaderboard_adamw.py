"""FusedAdamW and fused_adamw_ against cs336sys.optim.AdamW, on both of fused_adamw_'s paths.

In this process (no TRITON_INTERPRET) CPU tensors take the torch-ops path. Triton chooses
between its interpreter and its compiler when triton is first imported, so, as in
test_attention_triton.py, the first test re-runs this file in a subprocess with TRITON_INTERPRET=1,
where every other test goes through the Triton kernel; the interpreter-only tests are skipped here
with that reason, and their failures fail the first test. Inputs are fresh random tensors each run.
"""

from __future__ import annotations

import math
import os

import pytest
import torch
from conftest import rerun_under_the_interpreter

pytest.importorskip("triton")

from cs336sys.leaderboard import adamw as fused  # noqa: E402
from cs336sys.leaderboard.adamw import FusedAdamW, fused_adamw_  # noqa: E402
from cs336sys.optim import AdamW  # noqa: E402

IN_INTERPRETER = os.environ.get("TRITON_INTERPRET") == "1" and fused.kernel_interpreted()
interpreted = pytest.mark.skipif(not IN_INTERPRETER, reason="runs in the TRITON_INTERPRET=1 subprocess "
                                 "of test_kernel_in_an_interpreter_process")

SHAPES = [(3000,), (17, 33), (5,), (2, 3, 7)]  # one full 1024-block and partial ones


def test_kernel_in_an_interpreter_process():
    if IN_INTERPRETER:
        pytest.skip("this process already interprets; the tests below run here")
    rerun_under_the_interpreter(__file__, "not in_an_interpreter_process and not without_the_interpreter",
                                timeout_s=600)


def assert_close_in_ulps(got: torch.Tensor, want: torch.Tensor, terms: torch.Tensor | None = None):
    """Within a few float32 ulps of the scale of the terms summed (`terms`: their absolute values added,
    elementwise; the result's own where not given): the kernel rounds in another order than torch (no
    fused multiply-adds, say), and m = b1 m + (1 - b1) g cancels, so an error relative to the result
    alone would be unbounded (one element of 0.0012 from terms of about 0.1 missed by 26 of its ulps)."""
    scale = (want.abs() if terms is None else terms).max().item()
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6 * scale)


def assert_matches(got: torch.Tensor, want: torch.Tensor):
    """Equal on the torch path (the same ops as the reference); close in ulps on the kernel's."""
    if IN_INTERPRETER:
        assert_close_in_ulps(got, want)
    else:
        assert torch.equal(got, want)


def random_hyperparameters() -> dict:
    return dict(lr=10 ** torch.empty(()).uniform_(-3, -1.5).item(), betas=(0.9, 0.95 + 0.049 * torch.rand(()).item()),
                eps=1e-8, weight_decay=0.1 * torch.rand(()).item())


def paired_parameters():
    start = [torch.randn(s) for s in SHAPES]
    return [p.clone().requires_grad_() for p in start], [p.clone().requires_grad_() for p in start]


def test_matches_reference_adamw(fresh_seed):
    ours, theirs = paired_parameters()
    idle_ours, idle_theirs = torch.randn(10, requires_grad=True), torch.randn(10, requires_grad=True)
    idle_start = idle_ours.detach().clone()
    hyper = random_hyperparameters()
    opt, ref = FusedAdamW([*ours, idle_ours], **hyper), AdamW([*theirs, idle_theirs], **hyper)
    copy = torch.empty(SHAPES[1], dtype=torch.bfloat16)
    opt.set_lowp_copy(ours[1], copy)
    for _ in range(6):
        for p, q in zip(ours, theirs, strict=True):
            g = torch.randn_like(p)
            p.grad, q.grad = g.clone(), g.clone()
        opt.step()
        ref.step()
        for p, q in zip(ours, theirs, strict=True):
            assert_matches(p.detach(), q.detach())
            for key in ("exp_avg", "exp_avg_sq"):
                assert_matches(opt.state[p][key], ref.state[q][key])
            assert opt.state[p]["step"] == ref.state[q]["step"]
        assert torch.equal(copy, ours[1].detach().to(torch.bfloat16))
    assert torch.equal(idle_ours.detach(), idle_start) and idle_ours not in opt.state  # grad None: skipped


def test_bf16_gradients_are_upcast(fresh_seed):
    ours, theirs = paired_parameters()
    hyper = random_hyperparameters()
    ref = AdamW(theirs, **hyper)
    (beta1, beta2), lr = hyper["betas"], hyper["lr"]
    state = [(torch.zeros_like(p), torch.zeros_like(p)) for p in ours]
    for t in range(1, 6):
        step_size = lr * math.sqrt(1 - beta2**t) / (1 - beta1**t)
        for p, q, (m, v) in zip(ours, theirs, state, strict=True):
            g = torch.randn_like(p).to(torch.bfloat16)
            q.grad = g.float()  # exactly the values the kernel loads and upcasts
            with torch.no_grad():
                fused_adamw_(p, g, m, v, step_size=step_size, lr=lr, eps=hyper["eps"],
                             weight_decay=hyper["weight_decay"], beta1=beta1, beta2=beta2)
        ref.step()
        for p, q, (m, v) in zip(ours, theirs, state, strict=True):
            assert_matches(p.detach(), q.detach())
            assert_matches(m, ref.state[q]["exp_avg"])
            assert_matches(v, ref.state[q]["exp_avg_sq"])


def test_lowp_copies_from_the_constructor(fresh_seed):
    params = [torch.randn(s, requires_grad=True) for s in SHAPES[:2]]
    copies = {p: torch.empty(p.numel(), dtype=torch.bfloat16) for p in params}  # flat, like a gather buffer
    opt = FusedAdamW(params, lowp_copies=copies)
    for p in params:
        p.grad = torch.randn_like(p)
    opt.step()
    for p in params:
        assert torch.equal(copies[p], p.detach().reshape(-1).to(torch.bfloat16))
    opt.set_lowp_copy(params[0], None)  # no more copies of this one
    before = copies[params[0]].clone()
    opt.step()
    assert torch.equal(copies[params[0]], before)
    assert torch.equal(copies[params[1]], params[1].detach().reshape(-1).to(torch.bfloat16))


def test_rejects_bad_arguments():
    with pytest.raises(ValueError, match="learning rate"):
        FusedAdamW([torch.zeros(3, requires_grad=True)], lr=-1.0)
    p = torch.zeros(4, 6)
    with pytest.raises(ValueError, match="contiguous"):
        fused_adamw_(p.T, p.T, p.T, p.T, step_size=1e-3, lr=1e-3, eps=1e-8, weight_decay=0.0,
                     beta1=0.9, beta2=0.999)
    with pytest.raises(ValueError, match="elements"):
        fused_adamw_(p, p, p, torch.zeros(5), step_size=1e-3, lr=1e-3, eps=1e-8, weight_decay=0.0,
                     beta1=0.9, beta2=0.999)
    opt = FusedAdamW([p.requires_grad_()])
    with pytest.raises(ValueError, match="low-precision copy"):
        opt.set_lowp_copy(p, torch.empty(23, dtype=torch.bfloat16))


class KernelSpy:
    """Stands in for adamw_kernel and counts launches."""

    def __init__(self, kernel):
        self.kernel, self.grids = kernel, []

    def __getitem__(self, grid):
        self.grids.append(grid)
        return self.kernel[grid]


def test_cpu_tensors_take_torch_ops_without_the_interpreter(monkeypatch):
    if IN_INTERPRETER:
        pytest.skip("in the interpreter CPU tensors go through the kernel")
    spy = KernelSpy(fused.adamw_kernel)
    monkeypatch.setattr(fused, "adamw_kernel", spy)
    monkeypatch.setattr(fused, "kernel_interpreted", lambda: False)
    p = torch.randn(100)
    fused_adamw_(p, torch.randn(100), torch.zeros(100), torch.zeros(100), step_size=1e-3, lr=1e-3, eps=1e-8,
                 weight_decay=0.01, beta1=0.9, beta2=0.999)
    assert spy.grids == []


@interpreted
@pytest.mark.parametrize("n", [1, 1023, 1025, 4097])
@pytest.mark.parametrize("lowp", [torch.bfloat16, torch.float16])
def test_kernel_launch_and_copy(fresh_seed, monkeypatch, n, lowp):
    spy = KernelSpy(fused.adamw_kernel)
    monkeypatch.setattr(fused, "adamw_kernel", spy)
    p, g = torch.randn(n), torch.randn(n)
    m, v = 0.1 * torch.randn(n), torch.rand(n)
    want_p, want_m, want_v = p.clone(), m.clone(), v.clone()
    out = torch.full((n,), float("nan"), dtype=lowp)
    kwargs = dict(step_size=3e-3, lr=1e-2, eps=1e-8, weight_decay=0.05, beta1=0.9, beta2=0.99)
    fused_adamw_(p, g, m, v, out_lowp=out, **kwargs)
    assert spy.grids == [(math.ceil(n / fused.BLOCK),)]
    # the reference's torch ops on copies
    m_terms = 0.9 * want_m.abs() + 0.1 * g.abs()
    want_m.mul_(0.9).add_(g, alpha=1 - 0.9)
    want_v.mul_(0.99).addcmul_(g, g, value=1 - 0.99)
    p_terms = want_p.abs() + 3e-3 * (want_m / (want_v.sqrt() + 1e-8)).abs()
    want_p.addcdiv_(want_m, want_v.sqrt().add_(1e-8), value=-3e-3).mul_(1 - 1e-2 * 0.05)
    for got, want, terms in ((p, want_p, p_terms), (m, want_m, m_terms), (v, want_v, None)):
        assert_close_in_ulps(got, want, terms)
    assert torch.equal(out, p.to(lowp))


def test_a_step_size_read_from_memory_gives_the_float_step_sizes_bits(fresh_seed):
    # the kernel takes the step size as a float32 either way (an argument, or loaded from the tensor
    # that a CUDA graph's replay reads); the torch path converts the tensor to its float
    hyper = dict(lr=1e-3, eps=1e-8, weight_decay=0.05, beta1=0.9, beta2=0.95)
    step_size = torch.tensor([1e-3 * math.sqrt(1 - 0.95**3) / (1 - 0.9**3)], dtype=torch.float32)
    results = []
    for given in (step_size.item(), step_size):
        torch.manual_seed(fresh_seed)
        p, g, m, v = (torch.randn(3000) for _ in range(4))
        v = v.abs()
        copy = torch.empty(3000, dtype=torch.bfloat16)
        fused_adamw_(p, g, m, v, step_size=given, out_lowp=copy, **hyper)
        results.append((p, m, v, copy))
    for a, b in zip(*results, strict=True):
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match="one float32 element"):
        fused_adamw_(p, g, m, v, step_size=step_size.double(), **hyper)
