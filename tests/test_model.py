import math

import pytest
import torch

from cs336sys.attention.naive import naive_causal_attention
from cs336sys.model import RMSNorm, RotaryEmbedding, build_model
from cs336sys.sizes import SIZES, forward_flops, get_size, parameter_count


@pytest.mark.parametrize("name, expected", [("small", 128_625_408), ("medium", 423_183_360)])
def test_parameter_counts_match_the_handout(name, expected):
    model = build_model(name, context_length=16, device="meta")
    assert sum(p.numel() for p in model.parameters()) == expected == parameter_count(name)


@pytest.mark.parametrize("name", [n for n in SIZES if n not in ("small", "medium")])
def test_parameter_formula_matches_the_module_for_every_size(name):
    model = build_model(name, context_length=16, device="meta")
    assert sum(p.numel() for p in model.parameters()) == parameter_count(name)


def test_unknown_size_names_the_known_ones():
    with pytest.raises(ValueError, match="unknown model size 'huge'.*small.*10B"):
        get_size("huge")


def test_no_biases_and_untied_head():
    model = build_model("tiny", context_length=8)
    assert not [n for n, _ in model.named_parameters() if "bias" in n]
    assert model.lm_head.weight.data_ptr() != model.token_embeddings.weight.data_ptr()


def test_forward_is_causal_and_shaped():
    torch.manual_seed(0)
    model = build_model("tiny", context_length=16)
    tokens = torch.randint(0, 10_000, (2, 16))
    logits = model(tokens)
    assert logits.shape == (2, 16, 10_000)
    changed = tokens.clone()
    changed[:, 10:] = torch.randint(0, 10_000, (2, 6))
    again = model(changed)
    torch.testing.assert_close(again[:, :10], logits[:, :10])
    assert not torch.allclose(again[:, 10:], logits[:, 10:])


def test_too_long_sequence_is_a_clear_error():
    model = build_model("tiny", context_length=8)
    with pytest.raises(ValueError, match="exceeds context_length 8"):
        model(torch.zeros(1, 9, dtype=torch.long))


def test_rmsnorm_matches_float64_reference():
    x = torch.randn(3, 5, 32)
    norm = RMSNorm(32)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(32))
    ref = x.double() / torch.sqrt(x.double().pow(2).mean(-1, keepdim=True) + 1e-5) * norm.weight.double()
    torch.testing.assert_close(norm(x).double(), ref, rtol=1e-5, atol=1e-6)
    assert norm(x.to(torch.bfloat16)).dtype == torch.bfloat16


def test_rope_rotates_pairs_and_keeps_norms():
    rope = RotaryEmbedding(10_000.0, 8, 32)
    x = torch.randn(2, 32, 8)
    pos = torch.arange(32)
    y = rope(x, pos)
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1))
    torch.testing.assert_close(y[:, 0], x[:, 0])  # position 0 is not rotated
    angle = 5 * 10_000.0 ** (-2 / 8)  # pair 1 at position 5
    c, s = math.cos(angle), math.sin(angle)
    torch.testing.assert_close(y[:, 5, 2], c * x[:, 5, 2] - s * x[:, 5, 3])


def test_causal_attention_matches_float64_reference():
    q, k, v = (torch.randn(2, 3, 7, 16) for _ in range(3))
    ref = torch.nn.functional.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=True)
    torch.testing.assert_close(naive_causal_attention(q, k, v).double(), ref, rtol=1e-5, atol=1e-5)
    big = torch.full((1, 1, 3, 4), 1000.0)
    assert torch.isfinite(naive_causal_attention(big, big, big)).all()


def test_flops_count_every_matmul_and_the_quadratic_attention_term():
    s = get_size("small")
    dense = 2 * 4 * 512 * (parameter_count("small") - s.vocab_size * s.d_model - s.num_layers * 2 * s.d_model
                           - s.d_model)  # 2 FLOPs per weight per token; the embedding lookup and norms do none
    attention = s.num_layers * 2 * 2 * 4 * 512**2 * s.d_model  # QK^T and PV over the full square
    assert forward_flops("small", 4, 512) == dense + attention
    # Doubling the context doubles the dense part and quadruples attention: the difference is the
    # attention term, which must not be zero.
    assert forward_flops("small", 4, 1024) - 2 * forward_flops("small", 4, 512) == 2 * attention > 0


def _loss_and_grads(model, tokens):
    model.zero_grad(set_to_none=True)
    loss = model(tokens).float().logsumexp(-1).mean()
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def test_attention_backends_compute_the_same_model():
    tokens = torch.randint(0, 10_000, (2, 24))
    torch.manual_seed(1)
    naive = build_model("tiny", context_length=32)
    torch.manual_seed(1)
    sdpa = build_model("tiny", context_length=32, attention="sdpa")
    torch.manual_seed(1)
    custom = build_model("tiny", context_length=32, attention=lambda q, k, v: naive_causal_attention(q, k, v))
    ref_loss, ref_grads = _loss_and_grads(naive, tokens)
    for other in (sdpa, custom):
        loss, grads = _loss_and_grads(other, tokens)
        torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-5)
        for n, g in grads.items():
            torch.testing.assert_close(g, ref_grads[n], rtol=1e-4, atol=1e-6)
    with pytest.raises(ValueError, match="unknown attention backend 'fast'"):
        build_model("tiny", context_length=8, attention="fast")


@pytest.mark.parametrize("k", [1, 2, 3])
def test_checkpointing_changes_no_gradient(k):
    tokens = torch.randint(0, 10_000, (2, 16))
    torch.manual_seed(2)
    plain = build_model("tiny2", context_length=16)
    torch.manual_seed(2)
    checkpointed = build_model("tiny2", context_length=16, checkpoint_blocks=k)
    ref_loss, ref_grads = _loss_and_grads(plain, tokens)
    loss, grads = _loss_and_grads(checkpointed, tokens)
    assert torch.equal(loss, ref_loss)
    assert all(torch.equal(grads[n], ref_grads[n]) for n in ref_grads)  # bitwise on CPU fp32


def test_checkpointing_keeps_fewer_tensors_for_backward():
    def saved_bytes(model):
        total = 0

        def pack(t):
            nonlocal total
            total += t.numel() * t.element_size()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            model(torch.randint(0, 10_000, (2, 32))).sum()
        return total

    torch.manual_seed(3)
    assert saved_bytes(build_model("tiny2", 32, checkpoint_blocks=3)) < saved_bytes(build_model("tiny2", 32)) / 2
    with pytest.raises(ValueError, match="non-negative integer"):
        build_model("tiny", 8, checkpoint_blocks=-1)
