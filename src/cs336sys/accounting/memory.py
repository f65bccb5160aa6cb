"""Memory of training our Transformer: parameters, gradients, optimizer state and saved activations,
by dtype and by how a strategy divides them over devices.

Parameters fall in three classes that strategies treat differently: the matrices of the blocks
(attention projections, SwiGLU), the embedding and LM head, and the RMSNorm gains. AdamW keeps two
moments per parameter in the master weights' dtype (`cs336sys.optim.AdamW`; its step count is a
Python int).

Saved activations (what autograd keeps between the forward and the backward) are counted for the
model as written, eager, naive attention, every tensor in one dtype: `tests/test_accounting_memory.py`
checks the count against `torch.autograd.graph.saved_tensors_hooks` byte for byte in float32. Under
autocast, where norms and the loss stay in float32, the same terms at 2 bytes are an estimate.
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy as sp

from cs336sys.accounting.symbols import LATEX_NAMES, N_FSDP, N_TP, L, N, V, b, d, f, h, s

# Parameters by class.
P_BLOCK = sp.Symbol("P_block", positive=True)  # L (4 d^2 + 3 d d_ff)
P_EMBED = sp.Symbol("P_embed", positive=True)  # 2 V d (embedding + untied LM head)
P_NORM = sp.Symbol("P_norm", positive=True)  # (2 L + 1) d
PARAMETER_CLASSES = {
    P_BLOCK: L * (4 * d**2 + 3 * d * f),
    P_EMBED: 2 * V * d,
    P_NORM: (2 * L + 1) * d,
}
PARAMETERS = sp.Add(*PARAMETER_CLASSES.values())
LATEX_NAMES.update({P_BLOCK: r"P_{\mathrm{block}}", P_EMBED: r"P_{\mathrm{embed}}", P_NORM: r"P_{\mathrm{norm}}"})

ADAMW_STATES = 2  # first and second moments

# How many devices share each class: a strategy keeps 1/divisor of a class on each device.
# `zero1` is optimizer-state sharding (our ShardedOptimizer, ZeRO stage 1): only the state is divided.
STRATEGIES = ("single", "ddp", "zero1", "fsdp", "tp", "fsdp_tp")


@dataclass(frozen=True)
class Division:
    parameters: dict  # {class symbol: divisor} for parameters and gradients
    optimizer: dict  # {class symbol: divisor} for the optimizer state
    batch: sp.Expr  # devices the batch is split over
    tensor: sp.Expr  # devices the heads and d_ff are split over


def division(strategy: str) -> Division:
    one = {P_BLOCK: 1, P_EMBED: 1, P_NORM: 1}
    if strategy == "single":
        return Division(one, one, 1, 1)
    if strategy == "ddp":
        return Division(one, one, N, 1)
    if strategy == "zero1":
        return Division(one, {c: N for c in one}, N, 1)
    if strategy == "fsdp":  # norms stay replicated (too small to be worth a collective)
        sharded = {P_BLOCK: N, P_EMBED: N, P_NORM: 1}
        return Division(sharded, sharded, N, 1)
    if strategy == "tp":  # Megatron-style blocks; embedding, head and norms replicated
        split = {P_BLOCK: N_TP, P_EMBED: 1, P_NORM: 1}
        return Division(split, split, 1, N_TP)
    if strategy == "fsdp_tp":
        split = {P_BLOCK: N_FSDP * N_TP, P_EMBED: N_FSDP, P_NORM: 1}
        return Division(split, split, N_FSDP, N_TP)
    raise ValueError(f"unknown strategy {strategy!r}; known: {', '.join(STRATEGIES)}")


def parameter_bytes(strategy: str, bytes_per_parameter: int = 4) -> sp.Expr:
    div = division(strategy).parameters
    return sp.Add(*(c / div[c] for c in div)) * bytes_per_parameter


def gradient_bytes(strategy: str, bytes_per_gradient: int = 4) -> sp.Expr:
    return parameter_bytes(strategy, bytes_per_gradient)


def optimizer_state_bytes(strategy: str, bytes_per_state: int = 4) -> sp.Expr:
    div = division(strategy).optimizer
    return ADAMW_STATES * bytes_per_state * sp.Add(*(c / div[c] for c in div))


def model_state_bytes(strategy: str, param_bytes: int = 4, grad_bytes: int = 4, state_bytes: int = 4) -> sp.Expr:
    return (parameter_bytes(strategy, param_bytes) + gradient_bytes(strategy, grad_bytes)
            + optimizer_state_bytes(strategy, state_bytes))


# Saved activations of one block, in elements, named by the tensors autograd keeps (b sequences of s tokens).
# `split` says whether tensor parallelism divides the term over N_TP (it divides heads and d_ff).
@dataclass(frozen=True)
class SavedTerm:
    name: str
    elements: sp.Expr
    split_by_tp: bool


def block_saved_terms(attention: str = "naive") -> list[SavedTerm]:
    terms = [
        SavedTerm("RMSNorm input and x/rms (two norms)", 4 * b * s * d, False),
        SavedTerm("RMSNorm rms (two norms)", 2 * b * s, False),
        SavedTerm("q, k, v projections' input", b * s * d, False),
        SavedTerm("q and k after RoPE", 2 * b * s * d, True),
        SavedTerm("RoPE cos and sin (for q and for k)", 2 * s * d / h, False),
        SavedTerm("v", b * s * d, True),
        SavedTerm("output projection's input", b * s * d, True),
        SavedTerm("SwiGLU input", b * s * d, False),
        SavedTerm("SwiGLU: w1 x, sigmoid, SiLU, w3 x, their product", 5 * b * s * f, True),
    ]
    if attention == "naive":
        terms.append(SavedTerm("softmax probabilities", b * h * s**2, True))
    elif attention == "flash":  # saves O and the row log-sum-exp instead of the probabilities
        terms += [SavedTerm("attention output O", b * s * d, True),
                  SavedTerm("log-sum-exp per row", b * h * s, True)]
    else:
        raise ValueError(f"unknown attention {attention!r}; known: naive, flash")
    return terms


def block_activation_bytes(bytes_per_element: int = 4, attention: str = "naive", tp: sp.Expr = 1) -> sp.Expr:
    return bytes_per_element * sp.Add(*(t.elements / (tp if t.split_by_tp else 1)
                                        for t in block_saved_terms(attention)))


def model_activation_bytes(bytes_per_element: int = 4, attention: str = "naive", tp: sp.Expr = 1,
                           with_loss: bool = True) -> sp.Expr:
    """All blocks, plus what is saved once per model: the token ids (int64), the causal mask the naive
    attention caches (one byte per entry, shared by the blocks), the final norm and the LM head's input,
    and (`with_loss`) what our cross-entropy keeps (logits, their shifted exponentials, max and sum)."""
    total = L * block_activation_bytes(bytes_per_element, attention, tp)
    total += 8 * b * s + bytes_per_element * (3 * b * s * d + b * s)
    if attention == "naive":
        total += s**2
    if with_loss:
        total += bytes_per_element * (3 * b * s * V + 2 * b * s) + 8 * b * s
    return total
