"""Memory and FLOP formulas against the real model on the CPU: saved activations byte for byte
(saved_tensors_hooks), FLOPs against FlopCounterMode, parameter counts against the size registry.

The fused block's saved activations (`memory.fused_block_saved_terms`) are counted where its Triton
kernels run on CPU tensors: a subprocess with TRITON_INTERPRET=1 (`test_fused_block_in_an_interpreter_process`,
as in test_leaderboard_fused_ops.py; float32). In this process the fused ops would take the model's
torch ops, which save what the eager block saves, so the fused count is skipped here with that reason.
"""

from __future__ import annotations

import os

import pytest
import torch
from conftest import rerun_under_the_interpreter
from torch.utils.flop_counter import FlopCounterMode

from cs336sys.accounting import compute, memory
from cs336sys.accounting.symbols import evaluate
from cs336sys.model import TransformerBlock, build_model
from cs336sys.optim import cross_entropy
from cs336sys.sizes import SIZES, forward_flops, parameter_count


def saved_bytes(size: str, batch: int, context: int, with_loss: bool) -> int:
    """Bytes of every distinct storage autograd saves in a forward (parameters excluded: they live anyway)."""
    model = build_model(size, context)
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    kept: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in params:
            kept[storage.data_ptr()] = storage.nbytes()
        return t

    tokens = torch.randint(0, 100, (batch, context))
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        logits = model(tokens)
        if with_loss:
            logits = cross_entropy(logits, torch.randint(0, 100, (batch, context)))
    del logits
    return sum(kept.values())


@pytest.mark.parametrize("size, batch, context, with_loss",
                         [("tiny", 2, 16, False), ("tiny", 3, 24, True), ("tiny2", 1, 32, True)])
def test_saved_activations_formula_is_exact_in_fp32(size, batch, context, with_loss):
    formula = memory.model_activation_bytes(4, "naive", with_loss=with_loss)
    assert evaluate(formula, compute.model_values(size, batch, context)) == saved_bytes(size, batch, context, with_loss)


IN_INTERPRETER = os.environ.get("TRITON_INTERPRET") == "1"
interpreted = pytest.mark.skipif(not IN_INTERPRETER, reason="runs in the TRITON_INTERPRET=1 subprocess of "
                                 "test_fused_block_in_an_interpreter_process (here the fused ops take torch ops)")

# (batch, seq, d_model, heads, d_ff, RoPE table length): a ragged sequence, and tables longer than it
BLOCK_SHAPES = [(2, 16, 24, 3, 40, 16), (1, 33, 32, 4, 48, 40)]


def block_saved_bytes(block: TransformerBlock, forward, x: torch.Tensor) -> int:
    """Bytes of every distinct storage autograd saves in one block's forward, the block's parameters and
    buffers excluded: they live anyway (the buffers are the RoPE tables, which the fused RoPE saves views of)."""
    resident = {t.untyped_storage().data_ptr() for t in (*block.parameters(), *block.buffers())}
    kept: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        storage = t.untyped_storage()
        if storage.data_ptr() not in resident:
            kept[storage.data_ptr()] = storage.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        y = forward(x)
    del y
    return sum(kept.values())


def predicted_block_bytes(attention: str, fused_elementwise: bool, batch: int, seq: int, d_model: int, heads: int,
                          d_ff: int) -> int:
    """The block's terms in float32; naive attention also saves its causal mask (one byte per entry: a
    per-model term of `model_activation_bytes`, shared by the blocks, but saved in this block too)."""
    shape = {memory.b: batch, memory.s: seq, memory.d: d_model, memory.h: heads, memory.f: d_ff}
    formula = memory.block_activation_bytes(4, "naive" if attention == "naive" else "flash",
                                            fused_elementwise=fused_elementwise)
    return evaluate(formula, shape) + (seq * seq if attention == "naive" else 0)


def check_block(attention: str, fused_elementwise: bool, shape: tuple[int, ...]) -> None:
    batch, seq, d_model, heads, d_ff, table = shape
    block = TransformerBlock(d_model, heads, d_ff, table, 10000.0, attention)
    x = torch.randn(batch, seq, d_model, requires_grad=True)
    if fused_elementwise:
        from cs336sys.leaderboard.fused_block import fused_block_forward

        params = dict(block.named_parameters())
        forward = lambda x: fused_block_forward(block, params, x)  # noqa: E731
    else:
        forward = block
    # CPU SDPA saves what flash does: q, k, v, O and the log-sum-exp (the accounting's "flash" terms).
    assert block_saved_bytes(block, forward, x) == predicted_block_bytes(attention, fused_elementwise, batch,
                                                                         *shape[1:5])


@pytest.mark.parametrize("shape", BLOCK_SHAPES)
@pytest.mark.parametrize("attention", ["naive", "sdpa"])
def test_eager_block_terms_are_exact_in_fp32(attention, shape):
    # The same count on the module's own block: the harness the fused count below uses agrees with
    # the terms the model-level test above checks.
    check_block(attention, False, shape)


def test_fused_block_in_an_interpreter_process():
    pytest.importorskip("triton")
    if IN_INTERPRETER:
        pytest.skip("this process already interprets; the fused block's count runs here")
    rerun_under_the_interpreter(__file__, "fused_block_terms_are_exact", timeout_s=600)


@interpreted
@pytest.mark.parametrize("shape", BLOCK_SHAPES)
@pytest.mark.parametrize("attention", ["naive", "sdpa"])
def test_fused_block_terms_are_exact_in_fp32(attention, shape):
    from cs336sys.leaderboard import fused_ops

    # the kernels' autograd Functions run (not the torch fallback, which saves what the eager ops save)
    assert fused_ops.kernels_interpreted()
    check_block(attention, True, shape)


def test_flops_formula_matches_the_flop_counter_on_a_real_cpu_model():
    model = build_model("tiny", 32)
    tokens = torch.randint(0, 100, (2, 32))
    counter = FlopCounterMode(display=False)
    with counter:
        cross_entropy(model(tokens), tokens).backward()
    predicted = evaluate(compute.train_step_flops(), compute.model_values("tiny", 2, 32))
    assert counter.get_total_flops() == predicted  # exact, well inside the 1 % the issue asks


@pytest.mark.parametrize("size", sorted(SIZES))
def test_formulas_agree_with_the_size_registry(size):
    v = compute.model_values(size, 3, 64)
    assert evaluate(memory.PARAMETERS, v) == parameter_count(size)
    assert evaluate(compute.forward_flops(), v) == forward_flops(size, 3, 64)


def test_causal_flops_count_only_visible_pairs():
    # s = 4: 10 visible (query, key) pairs of 16; per block and pair, 2 products x 2 FLOPs x d_model.
    v = compute.model_values("tiny", 1, 4)
    d, layers = SIZES["tiny"].d_model, SIZES["tiny"].num_layers
    assert evaluate(compute.attention_forward_flops(causal=True), v) == layers * 10 * 4 * d
    assert evaluate(compute.attention_forward_flops(causal=False), v) == layers * 16 * 4 * d


def test_state_bytes_by_strategy_by_hand():
    # P_block = 100, P_embed = 20, P_norm = 4 parameters, 4 devices, fp32.
    v = {memory.P_BLOCK: 100, memory.P_EMBED: 20, memory.P_NORM: 4, memory.N: 4,
         memory.N_TP: 2, memory.N_FSDP: 2}
    assert evaluate(memory.model_state_bytes("ddp"), v) == 16 * 124
    assert evaluate(memory.model_state_bytes("zero1"), v) == 8 * 124 + 8 * 124 // 4
    assert evaluate(memory.model_state_bytes("fsdp"), v) == 16 * (100 // 4 + 20 // 4 + 4)
    assert evaluate(memory.model_state_bytes("tp"), v) == 16 * (100 // 2 + 20 + 4)
    assert evaluate(memory.model_state_bytes("fsdp_tp"), v) == 16 * (100 // 4 + 20 // 2 + 4)
    with pytest.raises(ValueError, match="unknown strategy"):
        memory.division("pp")
