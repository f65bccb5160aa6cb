"""The 2026 handout's section 8 problems (alternate_ring_all_reduce, data_parallel_calcs, fsdp_calcs,
tp_calcs, fsdp_tp_calcs) and the expected savings of fsdp_accounting (a), answered with sympy.

Setting (handout 8.2): one FFN layer, x (B, D), W1 and W2 (D, D_FF), W3 (D_FF, D); weights,
activations and the gradients sent are FP16 (2 bytes); a device computes C FLOP/s and sends W bytes/s;
communication overlaps computation, so a pass is communication-bound when its communication time
exceeds its computation time. Times are per device: every device does the same work at once.

Each answer is built from `cs336sys.accounting.compute` (FLOPs) and `.communication` (collective
times), and each "how large can N become" is `symbols.bound(...)`: sympy solves the inequality.
`large_n` versions replace the ring's (N - 1)/N by its limit 1 (sympy's `limit`), the form the Scaling
Book uses; the exact ones keep it, which is where the "+ 1" in the bounds comes from.
"""

from __future__ import annotations

import sympy as sp

from cs336sys.accounting import communication as comm
from cs336sys.accounting import memory
from cs336sys.accounting.compute import FFN_BACKWARD_FLOPS, FFN_FORWARD_FLOPS, model_values
from cs336sys.accounting.symbols import D_FF, N_DP, N_FSDP, N_TP, B, C, D, N, S, bound, evaluate

FP16 = 2  # bytes per weight, activation and gradient element in section 8
FFN_WEIGHT_BYTES = 3 * D * D_FF * FP16  # W1, W2, W3
ACTIVATION_BYTES = B * D * FP16  # y or dx, (B, D)


def _large(expr: sp.Expr, n: sp.Symbol) -> sp.Expr:
    """The time for many devices: the ring factor (n - 1)/n replaced by its limit, 1."""
    return sp.limit(expr, n, sp.oo)


def alternate_ring_all_reduce() -> dict[str, sp.Basic]:
    ring = comm.collective_time("all_reduce", S, N)
    alternate = comm.collective_time("alternate_all_reduce", S, N)
    return {"time": sp.factor(alternate), "ring_time": sp.factor(ring), "slowdown": sp.simplify(alternate / ring),
            "alternate_steps": comm.steps("alternate_all_reduce"), "ring_steps": comm.steps("all_reduce"),
            "alternate_sent": comm.bytes_sent_per_device("alternate_all_reduce", S),
            "ring_sent": sp.factor(comm.bytes_sent_per_device("all_reduce", S))}


def data_parallel_calcs() -> dict[str, sp.Basic]:
    flops = FFN_BACKWARD_FLOPS / N_DP
    time = sp.simplify(comm.collective_time("all_reduce", FFN_WEIGHT_BYTES, N_DP))
    compute = flops / C
    return {"backward_flops": flops, "backward_comm_time": time, "backward_compute_time": compute,
            "bound": bound(time <= compute, N_DP),
            "bound_large_n": bound(_large(time, N_DP) <= compute, N_DP)}


def fsdp_calcs() -> dict[str, sp.Basic]:
    gather = comm.collective_time("all_gather", FFN_WEIGHT_BYTES, N_FSDP)
    scatter = comm.collective_time("reduce_scatter", FFN_WEIGHT_BYTES, N_FSDP)
    out: dict[str, sp.Basic] = {
        "forward_flops": FFN_FORWARD_FLOPS / N_FSDP, "backward_flops": FFN_BACKWARD_FLOPS / N_FSDP,
        "forward_comm_time": sp.simplify(gather), "backward_comm_time": sp.simplify(gather + scatter)}
    for p in ("forward", "backward"):
        compute = out[f"{p}_flops"] / C
        out[f"{p}_bound"] = bound(out[f"{p}_comm_time"] <= compute, N_FSDP)
        out[f"{p}_bound_large_n"] = bound(_large(out[f"{p}_comm_time"], N_FSDP) <= compute, N_FSDP)
    return out


# tp_calcs (a): the backward pass of the column/row-parallel FFN on device i. dy (B, D) is the same on
# every device (the forward ended in an all-reduce, whose backward passes the gradient through).
TP_BACKWARD = [
    r"\mathbf{dz}^{(i)} = \mathbf{dy}\, \mathbf{W}_3^{(i)\top}",
    r"\mathbf{dx}_2^{(i)} = \mathbf{dz}^{(i)} \ast f(\mathbf{x}_1^{(i)})",
    r"\mathbf{dx}_1^{(i)} = \mathbf{dz}^{(i)} \ast f'(\mathbf{x}_1^{(i)}) \ast \mathbf{x}_2^{(i)}",
    r"\mathbf{dW}_3^{(i)} = \mathbf{z}^{(i)\top} \mathbf{dy}",
    r"\mathbf{dW}_2^{(i)} = \mathbf{x}^{\top} \mathbf{dx}_2^{(i)}",
    r"\mathbf{dW}_1^{(i)} = \mathbf{x}^{\top} \mathbf{dx}_1^{(i)}",
    r"\mathbf{dx} = \operatorname{all-reduce}\left(\left\{\mathbf{dx}_1^{(i)} \mathbf{W}_1^{(i)\top}"
    r" + \mathbf{dx}_2^{(i)} \mathbf{W}_2^{(i)\top}\right\}_{i}\right)",
]


def tp_calcs() -> dict[str, sp.Basic]:
    time = sp.simplify(comm.collective_time("all_reduce", ACTIVATION_BYTES, N_TP))
    out: dict[str, sp.Basic] = {"forward_flops": FFN_FORWARD_FLOPS / N_TP, "backward_flops": FFN_BACKWARD_FLOPS / N_TP,
                                "forward_comm_time": time, "backward_comm_time": time}
    for p in ("forward", "backward"):
        compute = out[f"{p}_flops"] / C
        out[f"{p}_bound"] = bound(time <= compute, N_TP)
        out[f"{p}_bound_large_n"] = bound(_large(time, N_TP) <= compute, N_TP)
    return out


def fsdp_tp_calcs() -> dict[str, sp.Basic]:
    """Device (i, j) gathers its TP slice of the weights (3 D D_FF / N_TP elements) over the FSDP axis and
    all-reduces its (B / N_FSDP, D) output over the TP axis."""
    flops = FFN_FORWARD_FLOPS / (N_FSDP * N_TP)
    compute = flops / C
    t_fsdp = sp.simplify(comm.collective_time("all_gather", FFN_WEIGHT_BYTES / N_TP, N_FSDP))
    t_tp = sp.simplify(comm.collective_time("all_reduce", ACTIVATION_BYTES / N_FSDP, N_TP))
    out: dict[str, sp.Basic] = {"forward_flops": flops, "fsdp_comm_time": t_fsdp, "tp_comm_time": t_tp,
                                "comm_time": sp.Max(t_fsdp, t_tp)}
    for suffix, (a, c) in {"": (t_fsdp, t_tp), "_large_n": (_large(t_fsdp, N_FSDP), _large(t_tp, N_TP))}.items():
        # (c) Overlapped axes: each collective on its own must fit under the compute time.
        fsdp_bound, tp_bound = bound(a <= compute, N_FSDP), bound(c <= compute, N_TP)
        out[f"overlap_fsdp_bound{suffix}"] = fsdp_bound
        out[f"overlap_tp_bound{suffix}"] = tp_bound
        out[f"overlap_bound{suffix}"] = sp.LessThan(N, sp.factor(fsdp_bound.rhs * tp_bound.rhs))
        # (d) Shared network: the two collectives' times add. On the boundary a + c = compute, solve for
        # N_TP, then choose N_FSDP to maximise N = N_FSDP N_TP (sympy: derivative = 0).
        num, _ = sp.fraction(sp.together(a + c - compute))
        n_tp_edge = sp.solve(num, N_TP)[0]
        n_total = N_FSDP * n_tp_edge
        best_fsdp = [r for r in sp.solve(sp.diff(n_total, N_FSDP), N_FSDP) if r.is_positive is not False][0]
        best_n = sp.factor(sp.simplify(n_total.subs(N_FSDP, best_fsdp)))
        out[f"shared_best_fsdp{suffix}"] = sp.simplify(best_fsdp)
        out[f"shared_best_tp{suffix}"] = sp.simplify(n_tp_edge.subs(N_FSDP, best_fsdp))
        out[f"shared_bound{suffix}"] = sp.LessThan(N, best_n)
    return out


def fsdp_savings() -> dict[str, sp.Basic]:
    """fsdp_accounting (a): per-device model state (fp32 parameters, gradients, AdamW moments) with
    plain DDP, with optimizer-state sharding (section 6) and with FSDP over N devices."""
    ddp = memory.model_state_bytes("ddp")
    zero1 = memory.model_state_bytes("zero1")
    fsdp = memory.model_state_bytes("fsdp")
    return {"ddp": sp.factor(ddp), "zero1": sp.factor(zero1), "fsdp": sp.factor(fsdp),
            "saved_vs_ddp": sp.factor(sp.simplify(ddp - fsdp)),
            "saved_vs_zero1": sp.factor(sp.simplify(zero1 - fsdp))}


def parameter_class_values(size: str) -> dict:
    """{P_block, P_embed, P_norm: counts} of a registry size."""
    values = model_values(size)
    return {c: evaluate(expr, values) for c, expr in memory.PARAMETER_CLASSES.items()}


def all_answers() -> dict[str, dict[str, sp.Basic]]:
    return {"alternate_ring_all_reduce": alternate_ring_all_reduce(), "data_parallel_calcs": data_parallel_calcs(),
            "fsdp_calcs": fsdp_calcs(), "tp_calcs": tp_calcs(), "fsdp_tp_calcs": fsdp_tp_calcs(),
            "fsdp_accounting": fsdp_savings()}
