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

Activation checkpointing (`CHECKPOINT_MODES`): K of the L blocks keep only their input ("every"), or
their input and attention's output ("selective", as the leaderboard step's `keep_attention`: the
recompute then runs everything but the attention kernel's forward); the other L - K keep everything.
A checkpointed block's backward recomputes its forward, so one block's activations exist again,
briefly: that transient is counted once, as it is at the peak.

Fused elementwise kernels (`fused_elementwise`, the leaderboard step's option of that name): each
block runs RMSNorm, the SwiGLU gate and RoPE as the autograd Functions of
`cs336sys.leaderboard.fused_ops`, which save fewer tensors than the eager ops
(`fused_block_saved_terms`); `tests/test_accounting_memory.py` checks that block's count byte for
byte in float32 too, with the kernels run by Triton's interpreter. The final norm stays eager.
"""

from __future__ import annotations

from dataclasses import dataclass

import sympy as sp

from cs336sys.accounting.symbols import LATEX_NAMES, N_FSDP, N_TP, K, L, N, V, b, c, d, f, h, s

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


def attention_saved_terms(attention: str = "naive") -> list[SavedTerm]:
    """What the attention op itself keeps for its backward (its inputs q, k, v are counted apart)."""
    if attention == "naive":
        return [SavedTerm("softmax probabilities", b * h * s**2, True)]
    if attention == "flash":  # saves O and the row log-sum-exp instead of the probabilities
        return [SavedTerm("attention output O", b * s * d, True),
                SavedTerm("log-sum-exp per row", b * h * s, True)]
    raise ValueError(f"unknown attention {attention!r}; known: naive, flash")


def block_saved_terms(attention: str = "naive", fused_elementwise: bool = False) -> list[SavedTerm]:
    """What one block keeps for its backward: the eager model's ops, or (`fused_elementwise`) the
    block of `cs336sys.leaderboard.fused_block` (`fused_block_saved_terms`)."""
    if fused_elementwise:
        return fused_block_saved_terms(attention)
    return [
        SavedTerm("RMSNorm input and x/rms (two norms)", 4 * b * s * d, False),
        SavedTerm("RMSNorm rms (two norms)", 2 * b * s, False),
        SavedTerm("q, k, v projections' input", b * s * d, False),
        SavedTerm("q and k after RoPE", 2 * b * s * d, True),
        SavedTerm("RoPE cos and sin (for q and for k)", 2 * s * d / h, False),
        SavedTerm("v", b * s * d, True),
        SavedTerm("output projection's input", b * s * d, True),
        SavedTerm("SwiGLU input", b * s * d, False),
        SavedTerm("SwiGLU: w1 x, sigmoid, SiLU, w3 x, their product", 5 * b * s * f, True),
        *attention_saved_terms(attention),
    ]


def fused_block_saved_terms(attention: str = "naive") -> list[SavedTerm]:
    """What a block built by `cs336sys.leaderboard.fused_block.fused_block_forward` keeps: the
    matmuls, the attention call and the residual adds are the eager block's; RMSNorm, the SwiGLU gate
    and RoPE are the autograd Functions of `cs336sys.leaderboard.fused_ops`, which save

    - `_RMSNormFunction.forward`: `save_for_backward(rows, weight, rstd)`: the norm's input x itself
      (`rows` is a view of it), the gain (a parameter) and 1/rms per row, always float32. The eager
      norm keeps x, x/rms and rms: one (b, s, d) tensor less per norm.
    - `_SiluGateFunction.forward`: `save_for_backward(a, b)`: w1 x and w3 x, its two inputs; its
      output, w2's input, is saved by that matmul. The eager gate also keeps sigmoid(w1 x) and
      silu(w1 x): two (b, s, d_ff) tensors less.
    - `_RotaryFunction.forward`: `save_for_backward(cos, sin)` and not its input. cos and sin are the
      block's RoPE tables (`rope.cos[:s]`, `rope.sin[:s]`: float32 buffers, which `.float().contiguous()`
      leaves as views), resident whether or not autograd keeps them, like a parameter: no bytes. The
      eager RoPE indexes the tables into new tensors for q and for k (its 2 s d/h term).
    """
    return [
        SavedTerm("RMSNorm input (two norms)", 2 * b * s * d, False),
        SavedTerm("RMSNorm 1/rms (two norms)", 2 * b * s, False),
        SavedTerm("q, k, v projections' input", b * s * d, False),
        SavedTerm("q and k after RoPE", 2 * b * s * d, True),
        SavedTerm("v", b * s * d, True),
        SavedTerm("output projection's input", b * s * d, True),
        SavedTerm("SwiGLU input", b * s * d, False),
        SavedTerm("SwiGLU gate's inputs w1 x and w3 x, and its output", 3 * b * s * f, True),
        *attention_saved_terms(attention),
    ]


CHECKPOINT_MODES = ("none", "every", "selective")


def checkpointed_block_terms(attention: str, checkpoint: str) -> list[SavedTerm]:
    """What a checkpointed block keeps from its forward to its backward: its input (the residual
    stream, b s d in the compute dtype), and with "selective" also what attention's fused kernel
    returns (O and the log-sum-exp), so the recompute skips that kernel."""
    if checkpoint not in CHECKPOINT_MODES[1:]:
        raise ValueError(f"checkpointed blocks need a checkpoint mode of {', '.join(CHECKPOINT_MODES[1:])}, "
                         f"got {checkpoint!r}")
    terms = [SavedTerm("block input", b * s * d, False)]
    if checkpoint == "selective":
        if attention != "flash":  # naive attention's backward needs the probabilities: nothing to keep instead
            raise ValueError("selective checkpointing keeps a fused attention kernel's outputs (O and the "
                             "log-sum-exp); it needs flash attention, not naive")
        terms += attention_saved_terms(attention)
    return terms


def _bytes_of(terms: list[SavedTerm], bytes_per_element: int, tp: sp.Expr) -> sp.Expr:
    return bytes_per_element * sp.Add(*(t.elements / (tp if t.split_by_tp else 1) for t in terms))


def block_activation_bytes(bytes_per_element: int = 4, attention: str = "naive", tp: sp.Expr = 1,
                           fused_elementwise: bool = False) -> sp.Expr:
    return _bytes_of(block_saved_terms(attention, fused_elementwise), bytes_per_element, tp)


def blocks_activation_bytes(bytes_per_element: int = 4, attention: str = "naive", tp: sp.Expr = 1,
                            checkpoint: str = "none", fused_elementwise: bool = False) -> tuple[sp.Expr, sp.Expr]:
    """The L blocks' saved activations, K of them checkpointed (K a symbol: the plan gives it a
    value), as (kept from the forward, transient of the backward). A checkpointed block's recompute
    holds one block's activations again, one block at a time: the transient, Min(K, 1) blocks (none
    when K = 0), less what "selective" kept, which the recompute reuses instead of making anew."""
    full = block_activation_bytes(bytes_per_element, attention, tp, fused_elementwise)
    if checkpoint == "none":
        return L * full, sp.Integer(0)
    kept_terms = checkpointed_block_terms(attention, checkpoint)
    kept = _bytes_of(kept_terms, bytes_per_element, tp)
    reused = _bytes_of(kept_terms[1:], bytes_per_element, tp)
    return (L - K) * full + K * kept, sp.Min(K, 1) * (full - reused)


def model_activation_bytes(bytes_per_element: int = 4, attention: str = "naive", tp: sp.Expr = 1,
                           with_loss: bool = True, checkpoint: str = "none", loss_chunked: bool = False,
                           fused_elementwise: bool = False) -> sp.Expr:
    """All blocks (`blocks_activation_bytes`), plus what is saved once per model: the token ids
    (int64), the causal mask the naive attention caches (one byte per entry, shared by the blocks),
    the final norm and the LM head's input, and (`with_loss`) what our cross-entropy keeps (logits,
    their shifted exponentials, max and sum; int64 targets). `loss_chunked`: the loss runs over
    chunks of c tokens (the leaderboard step's fused head, or checkpointed chunks), so the logits
    and what is computed from them exist for one chunk at a time. `fused_elementwise`: the blocks
    run the fused kernels (`fused_block_saved_terms`); what is saved once per model is the same."""
    kept, transient = blocks_activation_bytes(bytes_per_element, attention, tp, checkpoint, fused_elementwise)
    total = kept + 8 * b * s + bytes_per_element * (3 * b * s * d + b * s)
    if attention == "naive":
        total += s**2
    loss = 0
    if with_loss:
        tokens = c if loss_chunked else b * s
        loss = bytes_per_element * (3 * tokens * V + 2 * tokens)
        total += 8 * b * s
    # The loss's tensors are freed by its backward, which runs before any block's: a recompute never
    # meets them, so the peak holds the larger of the two, not both.
    return total + (sp.Max(loss, transient) if checkpoint != "none" else loss)
