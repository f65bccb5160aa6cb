"""The handout answers: the tensor-parallel backward run on shards against autograd, bounds worked by
hand, the 2D optimum against a brute-force search, and the XXL numbers recomputed in plain Python."""

from __future__ import annotations

import math

import pytest
import sympy as sp
import torch

from cs336sys.accounting import communication_accounting as xxl
from cs336sys.accounting import questions
from cs336sys.accounting.symbols import D_FF, N_DP, N_FSDP, N_TP, B, C, D, N, S, W, bound, evaluate


@pytest.fixture(scope="module")
def answers():
    return questions.all_answers()


def test_tensor_parallel_backward_equations_reproduce_autograd(fresh_seed):
    """The equations of tp_calcs (a), computed shard by shard, give autograd's gradients of the whole layer."""
    batch, d, d_ff, n_tp = 5, 6, 12, 3
    f = torch.nn.functional.silu
    x = torch.randn(batch, d, dtype=torch.float64, requires_grad=True)
    w1, w2 = (torch.randn(d, d_ff, dtype=torch.float64, requires_grad=True) for _ in range(2))
    w3 = torch.randn(d_ff, d, dtype=torch.float64, requires_grad=True)
    dy = torch.randn(batch, d, dtype=torch.float64)
    y = (f(x @ w1) * (x @ w2)) @ w3
    y.backward(dy)

    cols = torch.arange(d_ff).chunk(n_tp)
    partial_dx, grads = [], []
    for c in cols:  # device i holds columns c of W1, W2 and rows c of W3
        x1, x2 = x.detach() @ w1.detach()[:, c], x.detach() @ w2.detach()[:, c]
        z = f(x1) * x2
        dz = dy @ w3.detach()[c].T
        sig = torch.sigmoid(x1)
        dx2 = dz * f(x1)
        dx1 = dz * (sig * (1 + x1 * (1 - sig))) * x2  # f'(x1) for SiLU
        grads.append((x.detach().T @ dx1, x.detach().T @ dx2, z.T @ dy))
        partial_dx.append(dx1 @ w1.detach()[:, c].T + dx2 @ w2.detach()[:, c].T)
    dx = sum(partial_dx)  # the all-reduce
    torch.testing.assert_close(dx, x.grad)
    torch.testing.assert_close(torch.cat([g[0] for g in grads], dim=1), w1.grad)
    torch.testing.assert_close(torch.cat([g[1] for g in grads], dim=1), w2.grad)
    torch.testing.assert_close(torch.cat([g[2] for g in grads], dim=0), w3.grad)
    assert len(questions.TP_BACKWARD) == 7


def test_bounds_worked_by_hand(answers):
    # B = 1,000 rows, D_FF = 200, C = 100 FLOP/s, W = 1 byte/s: C/W = 100 rows.
    v = {B: 1000, D: 50, D_FF: 200, C: 100, W: 1}
    assert evaluate(answers["data_parallel_calcs"]["bound"].rhs, v) == 11  # N - 1 <= B W / C = 10
    assert evaluate(answers["data_parallel_calcs"]["bound_large_n"].rhs, v) == 10
    assert evaluate(answers["fsdp_calcs"]["forward_bound"].rhs, v) == 11
    assert evaluate(answers["tp_calcs"]["forward_bound"].rhs, v) == 4  # 1 + 3 * 200 / (2 * 100)
    assert evaluate(answers["tp_calcs"]["backward_bound"].rhs, v) == 7
    assert evaluate(answers["fsdp_tp_calcs"]["overlap_bound"].rhs, v) == 44  # 11 * 4
    assert isinstance(answers["data_parallel_calcs"]["bound"], sp.LessThan)


def test_ffn_flops_and_times_by_hand(answers):
    v = {B: 8, D: 2, D_FF: 3, N_DP: 2, N_FSDP: 2, N_TP: 2, W: 1}
    assert evaluate(answers["data_parallel_calcs"]["backward_flops"], v) == 12 * 8 * 2 * 3 / 2
    # All-reduce of 3 * 2 * 3 FP16 values = 36 bytes over 2 devices: 2 * (1/2) * 36 / 1.
    assert evaluate(answers["data_parallel_calcs"]["backward_comm_time"], v) == 36
    assert evaluate(answers["fsdp_calcs"]["forward_comm_time"], v) == 18
    assert evaluate(answers["tp_calcs"]["forward_comm_time"], v) == 2 * 0.5 * 8 * 2 * 2
    assert evaluate(answers["alternate_ring_all_reduce"]["slowdown"], {N: 6}) == 3
    assert evaluate(answers["alternate_ring_all_reduce"]["time"], {N: 6, S: 10, W: 2}) == 25


def test_shared_network_optimum_matches_a_brute_force_search(answers):
    """(d): the largest N_FSDP N_TP with T_FSDP + T_TP <= FLOPs / C, searched on a fine grid."""
    q = answers["fsdp_tp_calcs"]
    v = {B: 4096, D: 1024, D_FF: 4096, C: 1e3, W: 1.0}
    slack = sp.lambdify((N_FSDP, N_TP), (q["fsdp_comm_time"] + q["tp_comm_time"] - q["forward_flops"] / C).subs(v))
    best = 0.0
    for i in range(1, 4000):
        n_fsdp = 1 + i * 0.01
        lo, hi = 1.0, 1e4  # the slack grows with N_TP: bisect its root
        if slack(n_fsdp, lo) > 0:
            continue
        for _ in range(60):
            mid = (lo + hi) / 2
            lo, hi = (mid, hi) if slack(n_fsdp, mid) <= 0 else (lo, mid)
        best = max(best, n_fsdp * lo)
    assert evaluate(q["shared_bound"].rhs, v) == pytest.approx(best, rel=1e-4)
    large = evaluate(q["shared_bound_large_n"].rhs, v) / evaluate(q["overlap_bound_large_n"].rhs, v)
    assert large == pytest.approx(0.25)


def test_bound_solves_in_either_direction_and_under_a_root():
    x, a = sp.symbols("x a", positive=True)
    assert bound(a / x <= 2, x) == sp.GreaterThan(x, a / 2)
    assert bound(3 * x <= a, x) == sp.LessThan(x, a / 3)
    assert bound(sp.sqrt(x) <= a, x) == sp.LessThan(x, a**2)


def test_xxl_numbers_recomputed_by_hand():
    n = xxl.numbers()
    params = 126 * 2 * 16384 * 53248
    assert n["parameters"] == params == 219_848_638_464
    assert n["state_bytes"] == 16 * params
    assert n["state_h100s_ceil"] == math.ceil(16 * params / 80e9) == 44
    assert n["activation_bytes_per_token"] == 126 * (16384 + 53248) * 2
    assert n["fsdp_rows"][0]["n_fsdp"] == math.ceil(16 * params / 95e9) == 38
    alpha = 4.6e14 / 1.8e11
    # T_FSDP + T_TP <= T_math  <=>  B >= X F alpha / (M_X (F - Y alpha / M_Y)), with X=16, Y=4, M_X=2, M_Y=1.
    threshold = 16 * 53248 * alpha / (2 * (53248 - 4 * alpha))
    assert n["threshold_tokens"] == pytest.approx(threshold)
    assert n["threshold_per_device"] == pytest.approx(threshold / 64)
    assert n["numeric_direction"] == ">="
    assert n["overlap_threshold_tokens"] == pytest.approx(16 * alpha / 2)
    assert n["best_per_device"] == pytest.approx(4 * alpha**2 / (53248 * 2))
    assert n["fp8_threshold_tokens"] == pytest.approx(threshold / 2)


def test_fsdp_saving_by_hand(answers):
    from cs336sys.accounting.memory import P_BLOCK, P_EMBED, P_NORM

    v = {P_BLOCK: 1000, P_EMBED: 200, P_NORM: 10, N: 2}
    assert evaluate(answers["fsdp_accounting"]["saved_vs_ddp"], v) == 16 * 1200 / 2
    assert evaluate(answers["fsdp_accounting"]["fsdp"], v) == 16 * (600 + 10)
