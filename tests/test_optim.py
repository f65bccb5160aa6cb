import pytest
import torch

from cs336sys.optim import AdamW, cross_entropy, make_optimizer


def test_cross_entropy_matches_float64_reference():
    logits = torch.randn(4, 9, 50) * 10
    targets = torch.randint(0, 50, (4, 9))
    ref = torch.nn.functional.cross_entropy(logits.double().reshape(-1, 50), targets.reshape(-1))
    torch.testing.assert_close(cross_entropy(logits, targets).double(), ref, rtol=1e-5, atol=1e-6)
    huge = torch.tensor([[1e4, -1e4, 0.0]])
    assert torch.isfinite(cross_entropy(huge, torch.tensor([1])))


def _train(opt_cls, weights, grads, **kw):
    p = torch.nn.Parameter(weights.clone())
    opt = opt_cls([p], **kw)
    for g in grads:
        p.grad = g.clone()
        opt.step()
    return p.detach()


def test_adamw_matches_torch_without_weight_decay():
    w = torch.randn(64)
    grads = [torch.randn(64) for _ in range(20)]
    kw = dict(lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)
    torch.testing.assert_close(_train(AdamW, w, grads, **kw), _train(torch.optim.AdamW, w, grads, **kw),
                               rtol=1e-4, atol=1e-6)


def test_adamw_weight_decay_is_decoupled():
    w = torch.randn(64)
    zero = [torch.zeros(64)] * 3
    out = _train(AdamW, w, zero, lr=0.1, weight_decay=0.5)
    torch.testing.assert_close(out, w * (1 - 0.1 * 0.5) ** 3)


def test_make_optimizer_rejects_unknown_kind():
    with pytest.raises(ValueError, match="unknown optimizer"):
        make_optimizer([torch.nn.Parameter(torch.zeros(1))], "sgd")


def test_adamw_is_bitwise_the_algorithm_written_out():
    """The optimizer (one loop, one update function shared with the fused optimizer) against
    algorithm 2 written out as separate torch ops, in that order: equal to the bit after 5 steps."""
    import math

    from cs336sys.optim import AdamW

    shapes = [(7, 5), (5,), (3, 4, 2)]
    params = [torch.randn(s, requires_grad=True) for s in shapes]
    mirror = [p.detach().clone() for p in params]
    m = [torch.zeros_like(p) for p in mirror]
    v = [torch.zeros_like(p) for p in mirror]
    lr, b1, b2, eps, wd = 3e-3, 0.9, 0.95, 1e-8, 0.1
    opt = AdamW(params, lr=lr, betas=(b1, b2), eps=eps, weight_decay=wd)
    for t in range(1, 6):
        grads = [torch.randn(s) for s in shapes]
        for p, g in zip(params, grads, strict=True):
            p.grad = g.clone()
        opt.step()
        for i, g in enumerate(grads):
            m[i].mul_(b1).add_(g, alpha=1 - b1)
            v[i].mul_(b2).addcmul_(g, g, value=1 - b2)
            step_size = lr * math.sqrt(1 - b2**t) / (1 - b1**t)
            mirror[i].addcdiv_(m[i], v[i].sqrt().add_(eps), value=-step_size)
            mirror[i].mul_(1 - lr * wd)
    for p, ref, mi, vi in zip(params, mirror, m, v, strict=True):
        assert torch.equal(p.detach(), ref)
        assert torch.equal(opt.state[p]["exp_avg"], mi) and torch.equal(opt.state[p]["exp_avg_sq"], vi)
