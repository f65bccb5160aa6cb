"""The optimised step against the plain step (loss and updated parameters within bf16 rounding), and the
step roofline's arithmetic against hand-computed cases."""

from __future__ import annotations

import random

import pytest
import torch

from cs336sys.accounting.roofline import step_bytes, step_roofline
from cs336sys.attention.flash_configs import BackwardConfig, Tiles
from cs336sys.attention.naive import naive_causal_attention
from cs336sys.dtypes import autocast
from cs336sys.sizes import ModelSize, parameter_count
from cs336sys.training.optimized import TECHNIQUES, OptimizedSpec, build_optimized_step
from cs336sys.training.step import StepSpec, build_step
from cs336sys.training.step_blocks import STEP_TILES, pad_head_dim, step_flash_attention

LR = 1e-3  # both optimizers' default


def two_steps_plain(size: str, context: int, seed: int, device: str, compile_mode: str = "eager"):
    step = build_step(StepSpec(size, context, mode="train_step", dtype="bf16", compile=compile_mode, seed=seed),
                      device)
    losses = []
    for _ in range(2):
        losses.append(step.forward_backward().item())
        step.optimizer_step()
        step.zero_grad()
    return losses, {n: p.detach().clone() for n, p in step.model.named_parameters()}


def two_steps_optimized(size: str, context: int, seed: int, device: str, techniques: tuple[str, ...],
                        compile_mode: str = "eager"):
    step = build_optimized_step(OptimizedSpec(size, context, techniques=techniques, compile=compile_mode,
                                              seed=seed), device)
    losses = [step.run().item() for _ in range(2)]
    return losses, {n: p.detach().clone() for n, p in step.model.named_parameters()}


def assert_close_to_plain(plain, optimized, loss_rtol: float, max_flipped: float) -> None:
    """Losses within `loss_rtol`; each parameter within two AdamW steps' sign flips (an update of
    about +-lr where a gradient near zero changed sign), and at most `max_flipped` of all elements
    differing by more than a tenth of the learning rate."""
    (plain_losses, plain_params), (losses, params) = plain, optimized
    for a, b in zip(plain_losses, losses, strict=True):
        assert abs(a - b) <= loss_rtol * abs(a), (plain_losses, losses)
    differing, total = 0, 0
    for name, p in plain_params.items():
        diff = (params[name] - p).abs()
        assert diff.max().item() <= 4.05 * LR, (name, diff.max().item())
        differing += (diff > 0.1 * LR).sum().item()
        total += diff.numel()
    assert differing <= max_flipped * total, differing / total


@pytest.mark.parametrize("techniques", [(), ("fused_adamw",), ("fused_adamw", "fused_elementwise"),
                                        ("fused_adamw", "bf16_weights"),
                                        ("fused_adamw", "fused_elementwise", "bf16_weights"),
                                        ("fused_adamw", "adamw_in_backward"),
                                        ("fused_adamw", "bf16_weights", "adamw_in_backward"),
                                        ("fused_adamw", "fused_elementwise", "bf16_weights", "adamw_in_backward"),
                                        ("fused_adamw", "bf16_weights", "fused_projections"),
                                        ("fused_adamw", "bf16_weights", "adamw_in_backward", "fused_projections"),
                                        ("fused_adamw", "fused_elementwise", "bf16_weights", "adamw_in_backward",
                                         "fused_projections"),
                                        ("fused_adamw", "bf16_weights", "compiled_loss"),
                                        ("fused_adamw", "bf16_weights", "adamw_in_backward", "fused_projections",
                                         "compiled_loss"),
                                        ("fused_adamw", "fused_elementwise", "bf16_weights", "compiled_loss"),
                                        ("fused_adamw", "bf16_weights", "fused_projections", "backward_kernels"),
                                        ("fused_adamw", "bf16_weights", "adamw_in_backward", "fused_projections",
                                         "compiled_loss", "backward_kernels")])
def test_optimized_step_matches_the_plain_step_on_cpu(techniques, fresh_seed):
    # On the CPU the fused ops are the model's torch ops and the fused AdamW is the reference's, and
    # bf16 weights through the model's forward are what autocast casts: bitwise the plain step. With
    # the fused forward, bf16 weights sum a norm's three bf16 input gradients in bf16 (autocast
    # upcasts each first), a rounding of the residual stream's gradient; joined projections sum them
    # inside one product, rounded once; the compiled loss reduces in Inductor's order; the norms' backward
    # (backward_kernels) sums in its own.
    plain = two_steps_plain("tiny", 32, fresh_seed, "cpu")
    optimized = two_steps_optimized("tiny", 32, fresh_seed, "cpu", techniques)
    if not ({"bf16_weights", "fused_elementwise"} <= set(techniques)
            or {"fused_projections", "compiled_loss", "backward_kernels"} & set(techniques)):
        assert plain[0] == optimized[0]
        assert all(torch.equal(plain[1][n], optimized[1][n]) for n in plain[1])
    assert_close_to_plain(plain, optimized, loss_rtol=1e-3, max_flipped=0.01)


def test_bf16_weights_keeps_the_copies_equal_to_the_rounded_masters(fresh_seed):
    step = build_optimized_step(OptimizedSpec("tiny", 32, techniques=("fused_adamw", "fused_elementwise",
                                                                     "bf16_weights"), compile="eager",
                                              seed=fresh_seed), "cpu")
    for _ in range(2):
        step.run()
    copies = step.optimizer.copies
    assert len(copies) == 7 * 2 + 1  # seven matrices per block, two blocks, the LM head
    for master, copy in copies.items():
        assert copy.leaf.dtype == torch.bfloat16 and copy.leaf.grad is None
        assert torch.equal(copy.copy(), master.detach().to(torch.bfloat16))


@pytest.mark.parametrize("in_backward", [False, True])
def test_fused_projections_stack_the_copies_and_read_each_gradient_as_its_rows(in_backward, fresh_seed):
    # q, k, v share one bf16 leaf per block, w1 and w3 another; after two steps every master's rows of
    # its leaf are the master rounded, and the backward's hooks are one per leaf, not per master
    techniques = ("fused_adamw", "bf16_weights", "fused_projections") + (("adamw_in_backward",) if in_backward else ())
    step = build_optimized_step(OptimizedSpec("tiny", 32, techniques=techniques, compile="eager", seed=fresh_seed),
                                "cpu")
    for _ in range(2):
        step.run()
    copies = step.optimizer.copies
    leaves = {id(c.leaf): c.leaf for c in copies.values()}
    assert len(copies) == 7 * 2 + 1 and len(leaves) == 4 * 2 + 1  # qkv, output, w13, w2 per block; the head
    block = step.model.layers[0]
    d, d_ff = block.attn.q_proj.weight.shape[1], block.ffn.w1.weight.shape[0]
    assert step.block_params[0]["attn.qkv"].shape == (3 * d, d)
    assert step.block_params[0]["ffn.w13"].shape == (2 * d_ff, d)
    assert copies[block.attn.k_proj.weight].leaf is step.block_params[0]["attn.qkv"]
    assert copies[block.attn.k_proj.weight].rows == slice(d, 2 * d)
    assert copies[block.ffn.w3.weight].rows == slice(d_ff, 2 * d_ff)
    for master, copy in copies.items():
        assert torch.equal(copy.copy(), master.detach().to(torch.bfloat16))
    if in_backward:
        assert len(step.in_backward.hooks) == len(leaves) + sum(  # + the fp32 parameters' own
            1 for p in step.model.parameters() if p not in copies)


def test_fused_projections_issue_one_product_per_joined_weight(fresh_seed, monkeypatch):
    # the forward multiplies by the joined weights: per block 4 products where the model issues 7
    step = build_optimized_step(OptimizedSpec("tiny", 32, techniques=("fused_adamw", "bf16_weights",
                                                                      "fused_projections"),
                                              compile="eager", seed=fresh_seed), "cpu")
    calls, matmul = [], torch.Tensor.__matmul__

    def counting(a, b):
        if b.ndim == 2:  # (a weight: not the naive attention's products of heads)
            calls.append(b.shape)
        return matmul(a, b)

    monkeypatch.setattr(torch.Tensor, "__matmul__", counting)
    with torch.no_grad(), autocast("bf16", "cpu"):
        step._loss()
    monkeypatch.undo()
    d = step.model.layers[0].attn.q_proj.weight.shape[1]
    assert len(calls) == 4 * len(step.model.layers) + 1  # (+ the LM head)
    assert calls[0] == (d, 3 * d)


def test_bf16_weights_through_the_compiled_blocks_is_the_plain_step(fresh_seed):
    plain = two_steps_plain("tiny", 32, fresh_seed, "cpu", compile_mode="blocks")
    optimized = two_steps_optimized("tiny", 32, fresh_seed, "cpu", ("fused_adamw", "bf16_weights"),
                                    compile_mode="blocks")
    assert plain[0] == optimized[0]
    assert all(torch.equal(plain[1][n], optimized[1][n]) for n in plain[1])


def test_the_projected_block_is_the_model_block_in_float64(fresh_seed):
    # the joined products, RoPE over q, k and v at once (v by the zero angle) and the stacked layout give
    # the block's output and the input's and weights' gradients, to float64 rounding
    from cs336sys.model import build_model
    from cs336sys.training.step_blocks import joined_rotary_tables, projected_block

    model = build_model("tiny", 32, dtype=torch.float64)
    block = model.layers[0]
    x = torch.randn(2, 32, block.attn.q_proj.weight.shape[1], dtype=torch.float64, requires_grad=True)
    joined = {"qkv": torch.cat([block.attn.q_proj.weight, block.attn.k_proj.weight, block.attn.v_proj.weight]),
              "w13": torch.cat([block.ffn.w1.weight, block.ffn.w3.weight])}
    joined = {name: w.detach().requires_grad_() for name, w in joined.items()}
    tables = joined_rotary_tables(block.attn.rope.cos[:32], block.attn.rope.sin[:32])
    out = projected_block(block)(x, block.ln1.weight, joined["qkv"], block.attn.output_proj.weight,
                                 block.ln2.weight, joined["w13"], block.ffn.w2.weight, *tables)
    grad = torch.randn_like(out)
    dx, dqkv, dw13 = torch.autograd.grad(out, (x, joined["qkv"], joined["w13"]), grad)
    expected = block(x)
    ex, eq, ek, ev, e1, e3 = torch.autograd.grad(expected, (x, block.attn.q_proj.weight, block.attn.k_proj.weight,
                                                            block.attn.v_proj.weight, block.ffn.w1.weight,
                                                            block.ffn.w3.weight), grad)
    torch.testing.assert_close(out, expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(dx, ex, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(dqkv, torch.cat([eq, ek, ev]), rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(dw13, torch.cat([e1, e3]), rtol=1e-10, atol=1e-10)


def test_the_compiled_loss_is_the_models_head_and_loss(fresh_seed):
    # the final norm, the LM head and the cross-entropy as one compiled function: the model's loss and
    # the gradients of the residual stream, the norm's weight and the head's, from a float64 model, to
    # float32 rounding (the loss's own precision: cross_entropy upcasts to float32, not beyond)
    from cs336sys.model import build_model
    from cs336sys.optim import cross_entropy
    from cs336sys.training.step_blocks import head_loss

    model = build_model("tiny", 32, dtype=torch.float64)
    x = torch.randn(2, 32, model.ln_final.weight.shape[0], dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, model.lm_head.weight.shape[0], (2, 32))
    with torch.no_grad():
        model.ln_final.weight.uniform_(0.5, 1.5)
    inputs = (x, model.ln_final.weight, model.lm_head.weight)
    torch._dynamo.reset()
    loss = torch.compile(head_loss(model.ln_final.eps))(*inputs, targets)
    ref = cross_entropy(model.lm_head(model.ln_final(x)), targets)
    torch.testing.assert_close(loss, ref, rtol=1e-6, atol=0)
    for g, r in zip(torch.autograd.grad(loss, inputs), torch.autograd.grad(ref, inputs), strict=True):
        torch.testing.assert_close(g, r, rtol=1e-5, atol=1e-5 * r.abs().max().item())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_joined_tables_leave_v_exactly_as_it_is_and_rotate_q_and_k_as_the_model(fresh_seed, dtype):
    from cs336sys.leaderboard.fused_ops import rotary_reference
    from cs336sys.training.step_blocks import joined_rotary_tables, rotate_pairs

    cos, sin = torch.randn(16, 4), torch.randn(16, 4)
    qkv = torch.randn(2, 16, 3, 5, 8, dtype=dtype, requires_grad=True)
    rotated = rotate_pairs(qkv, *joined_rotary_tables(cos, sin))
    assert torch.equal(rotated[:, :, 2], qkv[:, :, 2])
    model = torch.stack([rotary_reference(qkv[:, :, i].transpose(1, 2), cos, sin).transpose(1, 2) for i in (0, 1)]
                        + [qkv[:, :, 2]], dim=2)  # q and k as the model rotates them, head by head
    assert torch.equal(rotated, model)  # bit for bit
    grad = torch.randn_like(rotated)
    torch.testing.assert_close(torch.autograd.grad(rotated, qkv, grad)[0], torch.autograd.grad(model, qkv, grad)[0],
                               rtol=0, atol=0)


def test_the_blocks_get_the_rotary_tables_cast_once_and_compute_the_same_bits(fresh_seed):
    # the step casts the joined tables to bf16 once, so no block casts them again; a block fed the fp32
    # tables (rotate_pairs casting them itself, as before) gives the same output and gradients bit for bit
    from cs336sys.training.step_blocks import PROJECTED_BLOCK_INPUTS, joined_rotary_tables

    step = build_optimized_step(OptimizedSpec("tiny", 32, techniques=("fused_adamw", "bf16_weights",
                                                                      "fused_projections"), compile="eager",
                                              seed=fresh_seed), "cpu")
    seen, block_fn = [], step.block_fn
    step.block_fn = lambda *args: seen.append(args[-2:]) or block_fn(*args)
    step.forward_backward()
    assert len(seen) == len(step.model.layers)
    assert {(c.dtype, s.dtype) for c, s in seen} == {(torch.bfloat16, torch.bfloat16)}
    assert all(c is seen[0][0] and s is seen[0][1] for c, s in seen)  # one pair for every block and step
    rope, params = step.model.layers[0].attn.rope, step.block_params[0]
    weights = [params[n].detach().requires_grad_() for n in PROJECTED_BLOCK_INPUTS]
    x = torch.randn(2, 32, step.model.lm_head.weight.shape[1], requires_grad=True)
    results = []
    for tables in (step.rotary_tables, joined_rotary_tables(rope.cos[:32], rope.sin[:32])):
        with autocast("bf16", "cpu"):
            out = block_fn(x, *weights, *tables)
        results.append((out, *torch.autograd.grad(out, (x, *weights), torch.ones_like(out))))
    assert all(torch.equal(a, b) for a, b in zip(*results, strict=True))


def test_fused_projections_compile_one_graph_for_every_block(fresh_seed):
    # compiled, the joined products stay within bf16 rounding of the plain compiled step, and Dynamo
    # traced the block's function once: every block reuses its graph (no recompilation per block)
    from torch._dynamo.utils import counters

    plain = two_steps_plain("tiny", 32, fresh_seed, "cpu", compile_mode="blocks")
    counters.clear()
    optimized = two_steps_optimized("tiny", 32, fresh_seed, "cpu", ("fused_adamw", "bf16_weights",
                                                                    "fused_projections"), compile_mode="blocks")
    assert counters["stats"]["unique_graphs"] == 1, dict(counters["stats"])
    assert_close_to_plain(plain, optimized, loss_rtol=1e-3, max_flipped=0.01)


def test_the_kernel_blocks_compile_two_graphs_for_every_block(fresh_seed):
    # with backward_kernels the first block, which has no branch to add, has a graph of its own; every
    # other block reuses the second (and nothing breaks a graph)
    from torch._dynamo.utils import counters

    plain = two_steps_plain("tiny", 32, fresh_seed, "cpu", compile_mode="blocks")
    counters.clear()
    optimized = two_steps_optimized("tiny", 32, fresh_seed, "cpu", ("fused_adamw", "bf16_weights",
                                                                    "fused_projections", "backward_kernels"),
                                    compile_mode="blocks")
    assert counters["stats"]["unique_graphs"] == 2 and not counters["graph_break"], dict(counters["stats"])
    assert_close_to_plain(plain, optimized, loss_rtol=1e-3, max_flipped=0.01)


def test_adamw_in_the_backward_updates_each_parameter_once_its_gradient_is_final(fresh_seed):
    # the hooks fire during the backward: the optimizer step is left with nothing to do, every
    # parameter moved by the update of its own gradient (the plain step's, bitwise on the CPU), and a
    # disarmed step (a graph's warm-up) moves nothing
    spec = OptimizedSpec("tiny", 32, techniques=("fused_adamw", "bf16_weights", "adamw_in_backward"),
                         compile="eager", seed=fresh_seed)
    step = build_optimized_step(spec, "cpu")
    before = {n: p.detach().clone() for n, p in step.model.named_parameters()}
    step.in_backward.armed = False
    step._forward_backward()  # as the graph's warm-up runs it: no step counted
    assert all(torch.equal(p, before[n]) for n, p in step.model.named_parameters())
    step.zero_grad()
    step.in_backward.armed = True
    calls = []
    step.optimizer.step = lambda *a: calls.append(a)
    step.forward_backward()
    step.optimizer_step()
    assert calls == []
    states = [step.optimizer.state[p] for p in step.model.parameters()]
    assert {s["step"] for s in states} == {1}
    moved = [n for n, p in step.model.named_parameters() if not torch.equal(p, before[n])]
    assert len(moved) == len(before)
    for master, copy in step.optimizer.copies.items():
        assert torch.equal(copy.copy(), master.detach().to(torch.bfloat16))


@pytest.mark.parametrize("techniques", [("fused_adamw", "adamw_in_backward"),
                                        ("fused_adamw", "bf16_weights", "adamw_in_backward"),
                                        ("fused_adamw", "bf16_weights", "adamw_in_backward", "fused_projections")])
def test_a_dropped_step_frees_its_model_though_its_hooks_stay_on_the_parameters(techniques):
    # the benchmark builds one step per configuration in one process: a step kept alive by its hooks
    # held the "2.7B"'s model, optimizer state and graph, and the next configuration ran out of memory
    import gc
    import weakref

    step = build_optimized_step(OptimizedSpec("tiny", 32, techniques=techniques, compile="eager"), "cpu")
    step.run()
    parameter = weakref.ref(next(step.model.parameters()))
    del step
    gc.collect()
    assert parameter() is None


def test_spec_rejects_what_it_cannot_run():
    with pytest.raises(ValueError, match="needs fused_adamw"):
        OptimizedSpec("tiny", 32, techniques=("bf16_weights",))
    with pytest.raises(ValueError, match="needs fused_adamw"):
        OptimizedSpec("tiny", 32, techniques=("adamw_in_backward",))
    with pytest.raises(ValueError, match="needs bf16_weights"):
        OptimizedSpec("tiny", 32, techniques=("fused_adamw", "fused_projections"))
    with pytest.raises(ValueError, match="whole-model compile"):
        OptimizedSpec("tiny", 32, techniques=("fused_adamw", "bf16_weights"), compile="full")
    with pytest.raises(ValueError, match="unknown techniques"):
        OptimizedSpec("tiny", 32, techniques=("graphs",))
    with pytest.raises(ValueError, match="cuda_graph needs a CUDA device"):
        build_optimized_step(OptimizedSpec("tiny", 32, techniques=("cuda_graph",)), "cpu")


def test_padding_the_head_dimension_keeps_attention_and_its_gradients(fresh_seed):
    # d_head 80 (the "2.7B"'s) through an attention that only takes 16/32/64/128, in float64
    q, k, v = (torch.randn(2, 3, 40, 80, dtype=torch.float64, requires_grad=True) for _ in range(3))
    seen = []

    def only_pow2(q, k, v):
        seen.append(q.shape[-1])
        assert q.shape[-1] in (16, 32, 64, 128)
        return naive_causal_attention(q, k, v)

    grad = torch.randn(2, 3, 40, 80, dtype=torch.float64)
    out = pad_head_dim(only_pow2)(q, k, v)
    grads = torch.autograd.grad(out, (q, k, v), grad)
    ref = naive_causal_attention(q, k, v)
    ref_grads = torch.autograd.grad(ref, (q, k, v), grad)
    assert seen == [128]
    torch.testing.assert_close(out, ref)
    for g, r in zip(grads, ref_grads, strict=True):
        torch.testing.assert_close(g, r)
    with pytest.raises(ValueError, match="above the largest"):
        pad_head_dim(only_pow2)(*(t[..., :1].expand(2, 3, 40, 200) for t in (q, k, v)))


def test_attention_gets_the_heads_and_its_outputs_gradient_contiguous(fresh_seed):
    # the heads as the model makes them: a transposed view of (batch, seq, heads, d); the output goes back
    # the same way, so its gradient arrives as a transposed view of the output projection's gradient
    q, k, v = (torch.randn(2, 40, 3, 64, dtype=torch.float64, requires_grad=True) for _ in range(3))
    weight = torch.randn(5, 3 * 64, dtype=torch.float64)
    layouts, grad_layouts = [], []

    def record(q, k, v):
        layouts.append([t.is_contiguous() for t in (q, k, v)])
        out = naive_causal_attention(q, k, v)
        out.register_hook(lambda g: grad_layouts.append(g.is_contiguous()))
        return out

    def projected(attention, views):
        return attention(*views).transpose(1, 2).flatten(-2) @ weight.T

    views = [t.transpose(1, 2) for t in (q, k, v)]
    assert not any(t.is_contiguous() for t in views)
    out = projected(pad_head_dim(record), views)
    assert layouts == [[True, True, True]]
    grad = torch.randn_like(out)
    ref = projected(naive_causal_attention, views)
    torch.testing.assert_close(out, ref)
    for g, r in zip(torch.autograd.grad(out, (q, k, v), grad), torch.autograd.grad(ref, (q, k, v), grad),
                    strict=True):
        torch.testing.assert_close(g, r)
    assert grad_layouts == [True]


def test_padding_the_head_dimension_compiles_in_one_graph():
    # the "+ flash" configuration runs it inside blocks compiled with torch.compile
    q, k, v = (torch.randn(1, 2, 8, 80) for _ in range(3))
    torch._dynamo.reset()
    explanation = torch._dynamo.explain(pad_head_dim(naive_causal_attention))(q, k, v)
    assert explanation.graph_break_count == 0, explanation.break_reasons


def test_the_steps_attention_tiles_are_ones_the_kernels_take():
    for d, (forward, backward) in STEP_TILES.items():
        assert d in (64, 128)
        tiles = Tiles.parse(forward)
        assert tiles.block_m % tiles.block_n == 0, forward
        if backward:
            c = BackwardConfig.parse(backward)
            assert c.block_n_kv % c.block_m_kv == 0 and c.block_m_q % c.block_n_q == 0, backward


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (none visible)")
@pytest.mark.parametrize("d", [64, 128])
def test_the_steps_attention_tiles_match_float64_at_the_steps_shape(d, fresh_seed):
    # the step's tiles (STEP_TILES) at its batch and context, against causal attention in float64
    q, k, v, grad = (torch.randn(4, 12, 512, d, device="cuda", dtype=torch.bfloat16) for _ in range(4))
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    out = step_flash_attention(*leaves)
    out.backward(grad)
    exact = [t.double().requires_grad_() for t in (q, k, v)]
    reference = naive_causal_attention(*exact)
    reference.backward(grad.double())
    for ours, theirs in zip([out, *(t.grad for t in leaves)], [reference, *(t.grad for t in exact)], strict=True):
        error = (ours.double() - theirs).abs().max().item() / theirs.abs().max().item()
        assert error < 2e-2, error


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (none visible)")
@pytest.mark.parametrize("kernels", [(), ("backward_kernels",)])
def test_a_projected_block_with_our_attention_compiles_as_one_graph(kernels):
    # at d_head 64 the step's backward tiles are a string that FlashAttention2Triton's forward parses; traced
    # with `re`'s cache empty (as a step process's first trace may find it), torch 2.11 broke the block in
    # two graphs at the attention (notes/runs/2026-11-28-cpu-dynamo-regex)
    import re

    from cs336sys.training.step_blocks import PROJECTED_BLOCK_INPUTS

    step = build_optimized_step(OptimizedSpec("small", 256, techniques=("fused_adamw", "flash", "bf16_weights",
                                                                        "fused_projections", *kernels),
                                              compile="eager"), "cuda")
    params = step.block_params[0]
    assert step.model.layers[0].attn.d_head in STEP_TILES and STEP_TILES[64][1]
    x = torch.randn(step.spec.batch, 256, step.model.lm_head.weight.shape[1], device="cuda", requires_grad=True)
    branch = (x.detach().to(torch.bfloat16).requires_grad_(),) if kernels else ()  # (a block after the first)
    re.purge()
    torch._dynamo.reset()
    with autocast("bf16", "cuda"):
        explanation = torch._dynamo.explain(step.block_fn)(x, *branch, *(params[n] for n in PROJECTED_BLOCK_INPUTS),
                                                           *step.rotary_tables)
    assert (explanation.graph_count, explanation.graph_break_count) == (1, 0), explanation.break_reasons


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (none visible)")
@pytest.mark.parametrize("techniques", [TECHNIQUES, ("fused_adamw", "flash", "bf16_weights"), ("cuda_graph",),
                                        ("fused_adamw", "cuda_graph", "flash", "bf16_weights"),
                                        ("fused_adamw", "adamw_in_backward"),
                                        ("fused_adamw", "cuda_graph", "flash", "bf16_weights", "adamw_in_backward"),
                                        ("fused_adamw", "cuda_graph", "flash", "bf16_weights", "adamw_in_backward",
                                         "fused_projections", "compiled_loss"),
                                        ("fused_adamw", "cuda_graph", "flash", "bf16_weights", "adamw_in_backward",
                                         "fused_projections", "compiled_loss", "backward_kernels")])
def test_optimized_step_matches_the_plain_step_on_gpu(techniques, fresh_seed):
    # Triton kernels and our flash on the GPU (the fused forward eager, or flash and bf16 weights inside
    # the compiled blocks), replayed from a CUDA graph or not, against the plain step compiled per block.
    plain = two_steps_plain("small", 256, fresh_seed, "cuda", compile_mode="blocks")
    optimized = two_steps_optimized("small", 256, fresh_seed, "cuda", techniques, compile_mode="blocks")
    assert_close_to_plain(plain, optimized, loss_rtol=1e-2, max_flipped=0.05)


def test_roofline_of_a_hand_computed_model():
    # d_model 2, d_ff 4, 1 layer, 1 head, vocab 3; batch 1, context 2 (2 tokens):
    # parameters 2*3*2 (embedding, head) + 4*2^2 + 3*2*4 + 2*2 (block) + 2 (final norm) = 58;
    # forward 2*2*(4*4 + 3*2*4 + 2*3) + 2*2*1*2^2*2 = 184 + 32 = 216 FLOPs; the step 3x: 648;
    # bytes 58 * (16 + 12 + 4) = 1856, with a bf16 copy 58 * 34 = 1972.
    size = ModelSize("hand", d_model=2, d_ff=4, num_layers=1, num_heads=1, vocab_size=3)
    assert parameter_count(size) == 58
    r = step_roofline(size, 1, 2, matmul_flops_per_s=648.0, copy_bytes_per_s=928.0)
    assert (r.flops, r.bytes) == (648, 1856)
    assert (r.matmul_ms, r.memory_ms, r.total_ms) == (1000.0, 2000.0, 3000.0)
    assert step_bytes(size, lowp_copy=True) == 1972


def test_roofline_of_the_27b_step():
    # 42.6 TFLOP at the H100's measured 744 TFLOP/s = 57.2 ms; 3.41e9 parameters * 32 B = 109 GB at
    # 3.0 TB/s = 36.3 ms; 93.6 ms in all.
    r = step_roofline("2.7B", 4, 512, matmul_flops_per_s=744.0e12, copy_bytes_per_s=3.0e12)
    assert r.flops == 42_577_050_992_640
    assert r.bytes == 32 * 3_406_809_600
    assert r.matmul_ms == pytest.approx(57.227, abs=1e-3)
    assert r.memory_ms == pytest.approx(36.339, abs=1e-3)
    assert r.total_ms == pytest.approx(93.566, abs=1e-3)


H100_CEILING = {"NVIDIA H100 80GB HBM3": {"bf16": 744.0}}  # GPU name -> dtype -> measured ceiling (TFLOP/s)


def test_the_section_sets_each_configuration_against_the_roofline(tmp_path):
    import pandas as pd

    from cs336sys.analysis.optimized_step import optimized_step, summary_rows

    assert optimized_step(pd.DataFrame({"problem": ["benchmarking"]}), H100_CEILING, tmp_path) is None
    rows = [{"problem": "optimized_step", "status": "ok", "size": "2.7B", "context_length": 512, "metric_batch_size": 4,
             "configuration": name, "techniques": techniques, "median_ms": step, "std_ms": std,
             "env.gpu": "NVIDIA H100 80GB HBM3", "copy_bytes_per_s": 2.6e12,
             "phase_median_ms": {"forward_backward": fb, "optimizer_step": step - fb, "zero_grad": 0.0},
             "step_clocks": {"sm_clock_mhz": 1755.0 - std, "power_w": 690.4 - 30 * std, "power_limit_w": 700.0}
             if name != "plain" else {}}
            for name, techniques, fb, step, std in [("fused_adamw", ["fused_adamw"], 100.0, 133.0, 8.0),
                                                    ("plain", [], 100.0, 190.0, 3.0),
                                                    ("cuda_graph", ["fused_adamw", "cuda_graph"], 101.0, 134.0, 0.2)]]
    ctx = optimized_step(pd.DataFrame(rows), H100_CEILING, tmp_path)
    # the H100 preset's 3.0 TB/s, not the point's own 2.6: 57.23 + 36.34 ms
    assert ctx["copy_sources"] == ["h100 preset"]
    lines = ctx["table"].splitlines()
    assert "plain" in lines[2] and "fused AdamW" in lines[3]  # the series' order, not the files'
    # the clock over the timed steps, whole; none kept (an older result): an empty cell
    assert lines[0].endswith("| x roofline | clock (MHz) |")
    assert lines[2].endswith("| 93.6 | 2.03 |  |") and lines[3].endswith("| 93.6 | 1.42 | 1747 |")
    # the CUDA graph's point drew 684.4 W of 700 (within 3 %), the fused AdamW's 450.4 W
    assert ctx["power_capped"] == {"sizes": ["2.7B"], "limit_w": 700.0, "share": 0.97}
    assert optimized_step(pd.DataFrame(rows[:2]), H100_CEILING, tmp_path)["power_capped"] == {}
    # one column per size, the series down the rows (a longer series keeps the table within nine columns),
    # then the roofline, numbers right-aligned
    compact = ctx["compact"].splitlines()
    assert compact[:2] == ["| step (ms) | 2.7B |", "|:---|---:|"]
    assert [line.split("|")[1].strip() for line in compact[2:]] == ["plain", "fused AdamW", "CUDA graph",
                                                                    "roofline of the fastest"]
    assert compact[2].endswith("| 190.0 |") and compact[-1].endswith("| 93.6 |")
    assert ctx["best"]["2.7B"]["fastest_ms"] == 133.0 and (tmp_path / ctx["figure"]).exists()
    # verdicts decided here, not in the template: 133.0 / 93.57 = 1.42, outside the 2.7B's 1.2x
    assert ctx["best"]["2.7B"]["target"] == 1.2 and ctx["best"]["2.7B"]["met"] is False
    assert ctx["slower"] == {"the CUDA graph": ["2.7B"]}
    assert ctx["spread_ms"] == {"eager": 8.0, "graph": 0.2}
    [row] = summary_rows(ctx)  # one row, one verdict, for the whole series
    assert row["met"] is False and row["result"] == "2.7B 1.42×" and row["target"] == "≤ 1.2×"
    fast = {**ctx, "best": {"2.7B": {**ctx["best"]["2.7B"], "x_roofline": 1.19, "x_text": "1.19", "met": True},
                            "xl": {**ctx["best"]["2.7B"], "x_roofline": 1.25, "x_text": "1.25", "target": 1.3,
                                   "met": True}}}
    [row] = summary_rows(fast)
    assert row["met"] is True and row["why"] is None
    assert row["result"] == "2.7B 1.19×, xl 1.25×" and row["target"] == "≤ 1.2× (2.7B); ≤ 1.3× (xl)"
    # a size outside its target: the row misses, and says why, from the probes that measured it
    slow = {**fast, "best": {**fast["best"], "xl": {**fast["best"]["xl"], "x_roofline": 1.35, "x_text": "1.35",
                                                    "met": False}}}
    [row] = summary_rows(slow)
    assert row["met"] is False and "counts no activation traffic" in row["why"] and "notes/runs/" in row["why"]
    assert ctx["unmeasured"] == {}


def test_a_step_is_set_against_its_own_gpus_ceiling_only(tmp_path):
    # the roofline prices the products at the ceiling measured on the GPU model the step ran on: a ceiling of
    # another model (the H200's, after the matmul job moved) is never used, and without one there is no roofline
    import pandas as pd

    from cs336sys.analysis.optimized_step import optimized_step

    rows = [{"problem": "optimized_step", "status": "ok", "size": "2.7B", "context_length": 512, "metric_batch_size": 4,
             "configuration": "plain", "techniques": [], "median_ms": 190.0, "std_ms": 1.0,
             "env.gpu": "NVIDIA H100 80GB HBM3",
             "phase_median_ms": {"forward_backward": 150.0, "optimizer_step": 40.0, "zero_grad": 0.0}}]
    ceiling = random.uniform(600.0, 800.0)
    own = optimized_step(pd.DataFrame(rows), {"NVIDIA H100 80GB HBM3": {"bf16": ceiling},
                                              "NVIDIA H200": {"bf16": 2 * ceiling}}, tmp_path)
    roof = step_roofline("2.7B", 4, 512, matmul_flops_per_s=ceiling * 1e12, copy_bytes_per_s=3.0e12).total_ms
    assert own["table"].splitlines()[2].split("|")[6].strip() == f"{roof:.1f}"
    other = optimized_step(pd.DataFrame(rows), {"NVIDIA H200": {"bf16": ceiling}}, tmp_path)
    assert other["table"].splitlines()[2].split("|")[6].strip() in ("", "nan")


def test_a_configuration_one_size_has_not_measured_reads_as_such(tmp_path):
    # config/main.yaml's `pending` leaves a configuration out of one size's series: its cell in the
    # compact table reads "–" (not an empty cell, not a number), and the section names it and the size
    import pandas as pd

    from cs336sys.analysis.optimized_step import optimized_step

    rows = [{"problem": "optimized_step", "status": "ok", "size": size, "context_length": 512,
             "metric_batch_size": 4, "configuration": name, "techniques": techniques, "median_ms": step,
             "std_ms": 0.1, "env.gpu": "NVIDIA H100 80GB HBM3",
             "phase_median_ms": {"forward_backward": step, "optimizer_step": 0.0, "zero_grad": 0.0}}
            for size, series in [("xl", [("plain", [], 160.0), ("fused_adamw", ["fused_adamw"], 130.0)]),
                                 ("2.7B", [("plain", [], 190.0)])]
            for name, techniques, step in series]
    ctx = optimized_step(pd.DataFrame(rows), H100_CEILING, tmp_path)
    assert ctx["unmeasured"] == {"the fused AdamW": ["2.7B"]}
    compact = ctx["compact"].splitlines()
    assert compact[3].startswith("| fused AdamW |") and compact[3].endswith("| 130.0 | – |")
    assert compact[2].endswith("| 160.0 | 190.0 |")


def test_a_configuration_is_slower_only_where_most_pairs_of_steps_say_so(tmp_path):
    import pandas as pd

    from cs336sys.analysis.optimized_step import optimized_step, slower_pairs

    assert slower_pairs([1.0, 2.0], [3.0, 4.0]) == 1.0 and slower_pairs([3.0, 4.0], [1.0, 2.0]) == 0.0
    assert slower_pairs([1.0, 3.0], [2.0, 3.0]) == 0.625  # 2 > 1, 3 > 1, ties 3 = 3 half, 2 < 3
    base = (100 + torch.rand(10)).tolist()
    shifted = [x + 0.05 for x in base]  # the median up, but the steps overlap: noise, not slower
    steps = {"fused_adamw": base, "cuda_graph": shifted, "flash": [x + 2 for x in shifted]}
    rows = [{"problem": "optimized_step", "status": "ok", "size": "2.7B", "context_length": 512, "metric_batch_size": 4,
             "configuration": name, "techniques": techniques, "median_ms": float(torch.tensor(steps[name]).median()),
             "std_ms": 1.0, "step_ms": steps[name], "env.gpu": "NVIDIA H100 80GB HBM3",
             "phase_median_ms": {"forward_backward": 50.0, "optimizer_step": 50.0, "zero_grad": 0.0}}
            for name, techniques in [("fused_adamw", ["fused_adamw"]), ("cuda_graph", ["fused_adamw", "cuda_graph"]),
                                     ("flash", ["fused_adamw", "cuda_graph", "flash"])]]
    ctx = optimized_step(pd.DataFrame(rows), H100_CEILING, tmp_path)
    assert ctx["best"]["2.7B"]["fastest_ms"] == rows[0]["median_ms"]
    assert ctx["slower"] == {"our FlashAttention-2": ["2.7B"]} and ctx["slower_pairs"] == 0.9


def test_a_ratio_just_outside_its_target_is_not_printed_as_the_target():
    from cs336sys.analysis.optimized_step import ratio_text

    assert ratio_text(1.3049, 1.3) == "1.305" and ratio_text(1.30004, 1.3) == "1.30004"
    assert ratio_text(1.3052, 1.3) == "1.31"
    assert ratio_text(1.2951, 1.3) == "1.30"  # within: rounding onto the target says nothing wrong
    assert ratio_text(1.42, 1.2) == "1.42" and ratio_text(1.1549, 1.2) == "1.15"


def test_a_point_keeps_its_timed_steps_and_the_clocks_over_just_them(monkeypatch):
    from cs336sys import bench_optimized
    from cs336sys.jobs import Run

    class Sampler:  # what ClockSampler would give: its summary of the window it is asked about
        selector, samples = None, []

        def __init__(self, device, interval_ms):
            assert interval_ms == bench_optimized.CLOCK_MS

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            pass

        def summary(self, start, end):
            return {"window_s": end - start}

    monkeypatch.setattr(bench_optimized, "ClockSampler", Sampler)
    settings = bench_optimized.OptimizedStepSettings("tiny", 16, "plain", compile="eager", warmup=1, steps=3,
                                                     device="cpu")
    m = bench_optimized.run_point(settings, Run(device="cpu"))
    assert len(m["step_ms"]) == 3 and len(m["losses"]) == 3 and m["copy_bytes_per_s"] is None
    # the window holds the three timed steps (and not the build, which takes longer than they do)
    assert sum(m["step_ms"]) / 1e3 <= m["step_clocks"]["window_s"] < m["build_s"] + sum(m["step_ms"]) / 1e3
    assert bench_optimized.OptimizedStepSettings("small", 512, "plain").steps == 30


def test_a_step_with_the_ceiling_measured_in_its_own_job_is_held_to_that_one(tmp_path):
    # the point's own 8192-cube product (measured in the job, beside the step) is the roofline's matmul
    # ceiling, not the matmul_peak job's; where jobs measured different ceilings the section gives their range
    import pandas as pd

    from cs336sys.analysis.optimized_step import optimized_step

    peak_job, own = random.uniform(600.0, 700.0), random.uniform(720.0, 800.0)
    rows = [{"problem": "optimized_step", "status": "ok", "size": size, "context_length": 512, "metric_batch_size": 4,
             "configuration": "plain", "techniques": [], "median_ms": 190.0, "std_ms": 1.0,
             "env.gpu": "NVIDIA H100 80GB HBM3", "matmul_bf16_tflops": ceiling,
             "phase_median_ms": {"forward_backward": 150.0, "optimizer_step": 40.0, "zero_grad": 0.0}}
            for size, ceiling in [("2.7B", own), ("xl", own + 5.0)]]
    ctx = optimized_step(pd.DataFrame(rows[:1]), {"NVIDIA H100 80GB HBM3": {"bf16": peak_job}}, tmp_path)
    roof = step_roofline("2.7B", 4, 512, matmul_flops_per_s=own * 1e12, copy_bytes_per_s=3.0e12).total_ms
    assert ctx["best"]["2.7B"]["x_roofline"] == pytest.approx(190.0 / roof)
    assert ctx["matmul_tflops"] == pytest.approx(own) and ctx["matmul_sources"] == ["the same job"]
    both = optimized_step(pd.DataFrame(rows), {"NVIDIA H100 80GB HBM3": {"bf16": peak_job}}, tmp_path)
    assert both["matmul_tflops"] is None and both["matmul_range"] == pytest.approx((own, own + 5.0))
    older = optimized_step(pd.DataFrame([{k: v for k, v in rows[0].items() if k != "matmul_bf16_tflops"}]),
                           {"NVIDIA H100 80GB HBM3": {"bf16": peak_job}}, tmp_path)
    assert older["matmul_tflops"] == pytest.approx(peak_job) and older["matmul_sources"] == ["matmul_peak"]


def test_a_ratio_whose_ceiling_ran_at_another_clock_than_the_step_is_judged_at_both(tmp_path):
    # the cube product ran at a lower SM clock than the step: the ratio is also set against the ceiling scaled
    # to the step's clock; a target met by one and missed by the other is neither (the ratio at one clock lies
    # between them), and the summary says the range at the steps' clocks
    import pandas as pd

    from cs336sys.analysis.optimized_step import optimized_step, summary_rows

    own, ceiling_clock, step_clock = random.uniform(650.0, 750.0), random.uniform(1500.0, 1600.0), 1980.0
    roof = step_roofline("2.7B", 4, 512, matmul_flops_per_s=own * 1e12, copy_bytes_per_s=3.0e12).total_ms
    at = step_roofline("2.7B", 4, 512, matmul_flops_per_s=own * 1e12 * step_clock / ceiling_clock,
                       copy_bytes_per_s=3.0e12).total_ms
    assert at < roof

    def judged(step_ms: float, clocks: bool = True) -> dict:
        row = {"problem": "optimized_step", "status": "ok", "size": "2.7B", "context_length": 512,
               "metric_batch_size": 4, "configuration": "plain", "techniques": [], "median_ms": step_ms,
               "std_ms": 1.0, "env.gpu": "NVIDIA H100 80GB HBM3", "matmul_bf16_tflops": own,
               "phase_median_ms": {"forward_backward": step_ms - 10.0, "optimizer_step": 10.0, "zero_grad": 0.0},
               "step_clocks": {"sm_clock_mhz": step_clock}, "matmul_clocks": {"sm_clock_mhz": ceiling_clock}}
        if not clocks:
            row.pop("matmul_clocks")
        return optimized_step(pd.DataFrame([row]), {}, tmp_path)

    between = 1.2 * (roof + at) / 2  # within 1.2x of the roofline at the ceiling's clock, outside at the step's
    ctx = judged(between)
    b = ctx["best"]["2.7B"]
    assert b["x_roofline"] == pytest.approx(between / roof) and b["x_at_clock"] == pytest.approx(between / at)
    assert b["met"] == "noise" and b["clocks"] == (step_clock, ceiling_clock)
    assert ctx["clock_ranges"] == {"step": (step_clock, step_clock), "ceiling": (ceiling_clock, ceiling_clock)}
    [row] = summary_rows(ctx)
    x = f"{between / at:.2f}"
    assert row["met"] == "noise" and row["result"].endswith(f"; {x}–{x}× at step clocks")
    assert judged(1.19 * at)["best"]["2.7B"]["met"] is True and judged(1.21 * roof)["best"]["2.7B"]["met"] is False
    # no clock under the product (a result measured before it was sampled): one ratio, judged alone
    alone = judged(between, clocks=False)
    assert alone["best"]["2.7B"]["x_at_clock"] is None and alone["best"]["2.7B"]["met"] is True
    assert "clock_ranges" not in alone and "at step clocks" not in summary_rows(alone)[0]["result"]


def test_the_masked_half_of_attention_is_priced_at_the_rows_own_ceiling(tmp_path):
    """The roofline counts attention's full context x context products (`sizes.train_step_flops`); the share of it
    that prices the masked half (which causal FlashAttention skips) is that half of the attention FLOPs, counted
    here from the dense part, over the row's own ceiling, over the roofline."""
    import pandas as pd

    from cs336sys.analysis.optimized_step import optimized_step
    from cs336sys.sizes import get_size, train_step_flops

    size, batch, context = "small", 4, random.choice([256, 512, 1024])
    ceiling = random.uniform(600.0, 800.0)
    rows = [{"problem": "optimized_step", "size": size, "context_length": context, "metric_batch_size": batch,
             "status": "ok", "configuration": "plain", "techniques": [], "median_ms": 20.0, "std_ms": 0.1,
             "env.gpu": "NVIDIA H100 80GB HBM3", "matmul_bf16_tflops": ceiling,
             "phase_median_ms": {"forward_backward": 15.0, "optimizer_step": 5.0, "zero_grad": 0.0}}]
    ctx = optimized_step(pd.DataFrame(rows), {}, tmp_path)
    s = get_size(size)
    dense = 3 * 2 * batch * context * (s.num_layers * (4 * s.d_model**2 + 3 * s.d_model * s.d_ff)
                                       + s.d_model * s.vocab_size)
    masked = (train_step_flops(size, batch, context) - dense) / 2
    roof = step_roofline(size, batch, context, matmul_flops_per_s=ceiling * 1e12, copy_bytes_per_s=3.0e12).total_ms
    want = 100 * masked / (ceiling * 1e12) * 1e3 / roof
    assert ctx["best"][size]["masked_pct"] == pytest.approx(want)


def test_a_ratio_this_close_to_its_target_is_listed_as_unsettled(tmp_path):
    # a fastest step within NEAR_TARGET_PCT of its target (either side) at the ceiling's clock is listed with its
    # signed margin, for the section to say that one pass does not settle it; one further away is not listed
    import pandas as pd

    from cs336sys.analysis.optimized_step import NEAR_TARGET_PCT, optimized_step

    own = random.uniform(650.0, 750.0)
    roof = step_roofline("2.7B", 4, 512, matmul_flops_per_s=own * 1e12, copy_bytes_per_s=3.0e12).total_ms

    def near(x: float) -> list:
        row = {"problem": "optimized_step", "status": "ok", "size": "2.7B", "context_length": 512,
               "metric_batch_size": 4, "configuration": "plain", "techniques": [], "median_ms": x * roof,
               "std_ms": 1.0, "env.gpu": "NVIDIA H100 80GB HBM3", "matmul_bf16_tflops": own,
               "phase_median_ms": {"forward_backward": x * roof - 10.0, "optimizer_step": 10.0, "zero_grad": 0.0}}
        return optimized_step(pd.DataFrame([row]), {}, tmp_path)["near_target"]

    margin = random.uniform(0.05, 0.9) * NEAR_TARGET_PCT
    [over] = near(1.2 * (1 + margin / 100))
    assert over["size"] == "2.7B" and over["pct"] == pytest.approx(margin) and over["x_text"].startswith("1.2")
    [under] = near(1.2 * (1 - margin / 100))
    assert under["pct"] == pytest.approx(-margin)
    assert near(1.2 * (1 + 1.5 * NEAR_TARGET_PCT / 100)) == [] and near(1.0) == []
