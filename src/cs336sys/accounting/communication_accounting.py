"""The 2025 handout's communication_accounting problem: the XXL model (d_model 16384, d_ff 53248,
126 blocks of two linear layers, nothing else), answered with sympy.

Precision (as the problem states): master weights, accumulated gradients and AdamW's two moments in
FP32 (4 + 4 + 8 = 16 bytes per parameter); activations and gradient communication in BF16. Without
activation checkpointing, a linear layer keeps its input for its weight gradient: per token and block,
the d_model-wide input of the first layer and the d_ff-wide input of the second.

Part (c) follows the Scaling Book's model of mixed FSDP (axis X, spanning M_X mesh axes) and tensor
parallelism (axis Y, M_Y axes), forward pass only, global batch B tokens over N = X Y devices:
T_FSDP = 2*2*D*F / (Y W M_X) (all-gather of the two weight matrices' X-shards, BF16),
T_TP = 2*2*B*D / (X W M_Y) (all-gather and reduce-scatter of the activations, BF16),
T_math = 2*2*B*D*F / (N C). Its condition is T_FSDP + T_TP <= T_math (the two collectives share the
links); the overlapped variant max(T_FSDP, T_TP) <= T_math is given beside it.
"""

from __future__ import annotations

import math

import sympy as sp

from cs336sys.accounting.symbols import M_X, M_Y, B, C, D, F, L, P, T, W, X, Y, bound, evaluate

XXL = {D: 16384, F: 53248, L: 126}
FP32, BF16 = 4, 2
STATE_BYTES_PER_PARAMETER = FP32 + FP32 + 2 * FP32  # master weight, gradient, AdamW m and v
H100_BYTES = 80e9  # "H100 80GB"
MESH = {X: 16, Y: 4, M_X: 2, M_Y: 1}
N_FSDP = sp.Symbol("N_FSDP", positive=True)
R = sp.Symbol("R", positive=True)  # device memory left after the unsharded half of the activations
A_TOKEN = sp.Symbol("a", positive=True)  # bytes of saved activations per token
M_DEV = sp.Symbol("M_dev", positive=True)


def _positive_fraction(expr: sp.Expr) -> sp.Expr:
    """n/d written with a positive numerator (sympy's solve returns -n/(-d) forms)."""
    num, den = sp.fraction(sp.factor(expr))
    if num.could_extract_minus_sign():
        num, den = -num, sp.factor_terms(sp.expand(-den))
    return sp.Mul(num, sp.Pow(den, -1, evaluate=False), evaluate=False)


def part_a() -> dict[str, sp.Basic]:
    params = L * 2 * D * F
    return {"parameters": params, "state_bytes": STATE_BYTES_PER_PARAMETER * P,
            "activation_bytes_per_token": L * (D + F) * BF16, "activations": A_TOKEN * T}


def part_b() -> dict[str, sp.Basic]:
    """State and half of the activations divided over N_FSDP devices, the other half on every device."""
    act = A_TOKEN * T
    per_device = (STATE_BYTES_PER_PARAMETER * P + act / 2) / N_FSDP + act / 2
    # per_device <= M_dev  <=>  (16 P + A/2) / N_FSDP <= M_dev - A/2 =: R, possible only while R > 0.
    needed = bound((STATE_BYTES_PER_PARAMETER * P + act / 2) / N_FSDP <= R, N_FSDP)
    return {"per_device": per_device, "needed": needed, "token_limit": bound(act / 2 < M_DEV, T)}


def times(fsdp_bytes: int = BF16) -> dict[str, sp.Expr]:
    n = X * Y
    return {"fsdp": 2 * fsdp_bytes * D * F / (Y * W * M_X), "tp": 2 * BF16 * B * D / (X * W * M_Y),
            "math": 2 * 2 * B * D * F / (n * C)}


def part_c() -> dict[str, sp.Basic]:
    t = times()
    # The threshold as a formula (sympy solves the equality), and which side is compute-bound decided by
    # sympy on the inequality with the numbers in (the sign of B's coefficient needs F W M_Y > Y C).
    threshold = sp.solve(sp.Eq(t["fsdp"] + t["tp"], t["math"]), B)[0]
    return {"t_fsdp": t["fsdp"], "t_tp": t["tp"], "t_math": t["math"], "threshold": _positive_fraction(threshold),
            "overlap_threshold": bound(t["fsdp"] <= t["math"], B), "tp_condition": bound(t["tp"] <= t["math"], Y)}


def part_d() -> dict[str, sp.Basic]:
    """Two levers, computed: choosing X and Y for the device count (N fixed, X free), and gathering
    weights in FP8 (1 byte) instead of BF16."""
    n = sp.Symbol("N", positive=True)
    t = {k: v.subs(Y, n / X) for k, v in times().items()}
    total = t["fsdp"] + t["tp"]
    best_x = [r for r in sp.solve(sp.diff(total, X), X) if r.is_positive is not False][0]
    best = bound(sp.simplify(total.subs(X, best_x)) <= t["math"], B)
    fp8 = times(fsdp_bytes=1)
    fp8_threshold = sp.solve(sp.Eq(fp8["fsdp"] + fp8["tp"], fp8["math"]), B)[0]
    return {"best_x": best_x, "best_bound": best, "per_device_best": sp.simplify(best.rhs / n),
            "fp8_threshold": _positive_fraction(fp8_threshold)}


def numbers(hardware_flops: float = 4.6e14, hardware_bandwidth: float = 2 * 9e10, device_memory: float = 95e9,
            token_examples: tuple[int, ...] = (0, 1024, 2048, 4096, 8192)) -> dict:
    """Every number the answers need, for the handout's constants."""
    hw = {C: hardware_flops, W: hardware_bandwidth}
    a, c, d = part_a(), part_c(), part_d()
    params = evaluate(a["parameters"], XXL)
    state = evaluate(a["state_bytes"], {P: params})
    per_token = evaluate(a["activation_bytes_per_token"], XXL)
    b_part = part_b()
    rows = []
    for tokens in token_examples:
        act = per_token * tokens
        left = device_memory - act / 2
        needed = {P: params, A_TOKEN: per_token, T: tokens, R: left}
        n_real = evaluate(b_part["needed"].rhs, needed) if left > 0 else None
        rows.append({"tokens": tokens, "activation_bytes": act, "n_fsdp_real": n_real,
                     "n_fsdp": math.ceil(n_real) if n_real is not None else None})
    values = {**XXL, **MESH, **hw}
    threshold = evaluate(c["threshold"], values)
    # sympy solves the numeric inequality in B: it must say B >= threshold.
    numeric = bound(c["t_fsdp"].subs(values) + c["t_tp"].subs(values) <= c["t_math"].subs(values), B)
    n_dev = MESH[X] * MESH[Y]
    best = evaluate(d["best_bound"].rhs, {**values, sp.Symbol("N", positive=True): n_dev})
    return {
        "parameters": params, "state_bytes": state, "state_h100s": state / H100_BYTES,
        "state_h100s_ceil": math.ceil(state / H100_BYTES), "activation_bytes_per_token": per_token,
        "tokens_per_h100_of_activations": H100_BYTES / per_token,
        "device_memory": device_memory, "state_devices": state / device_memory,
        "token_limit": evaluate(b_part["token_limit"].rhs, {A_TOKEN: per_token, M_DEV: device_memory}),
        "fsdp_rows": rows,
        "alpha": hardware_flops / hardware_bandwidth, "devices": n_dev,
        "threshold_tokens": threshold, "threshold_per_device": threshold / n_dev,
        "threshold_per_fsdp_shard": threshold / MESH[X],
        "numeric_inequality": str(numeric),
        "numeric_direction": ">=" if isinstance(numeric, sp.GreaterThan) else "other",
        "overlap_threshold_tokens": evaluate(c["overlap_threshold"].rhs, values),
        "overlap_threshold_per_device": evaluate(c["overlap_threshold"].rhs, values) / n_dev,
        "tp_limit": evaluate(c["tp_condition"].rhs, values),
        "best_tokens": best, "best_per_device": best / n_dev,
        "best_x": evaluate(d["best_x"], {**values, B: best, sp.Symbol("N", positive=True): n_dev}),
        "fp8_threshold_tokens": evaluate(d["fp8_threshold"], values),
        "fp8_threshold_per_device": evaluate(d["fp8_threshold"], values) / n_dev,
        "mesh": {"X": MESH[X], "Y": MESH[Y], "M_X": MESH[M_X], "M_Y": MESH[M_Y]},
        "xxl": {"d_model": XXL[D], "d_ff": XXL[F], "num_blocks": XXL[L]},
        "flops": hardware_flops, "bandwidth": hardware_bandwidth, "h100_bytes": H100_BYTES,
        "bytes_per_parameter": STATE_BYTES_PER_PARAMETER, "fp32_bytes": FP32, "bf16_bytes": BF16,
    }
