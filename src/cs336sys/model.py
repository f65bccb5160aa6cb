"""The assignment-1 "basics" Transformer language model, and nothing else.

Pre-norm blocks (RMSNorm), causal multi-head self-attention with RoPE, SwiGLU feed-forward,
a final RMSNorm and an untied LM head; no biases; truncated-normal initialisation.

Two plug points, both constructor arguments: `attention`, the function computing causal attention
over (batch, heads, seq, d_head) tensors ("naive", "sdpa", or any callable such as
`cs336sys.attention.flash_triton.flash_causal_attention`), and `checkpoint_blocks` (k > 0:
recompute the activations of each group of k blocks in the backward pass instead of storing them).
Profiling, precision and parallelism are applied to this module from outside.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from cs336sys.attention.naive import naive_causal_attention, sdpa_causal_attention
from cs336sys.sizes import ModelSize, get_size

AttentionFn = Callable[[Tensor, Tensor, Tensor], Tensor]
ATTENTION_BACKENDS: dict[str, AttentionFn] = {"naive": naive_causal_attention, "sdpa": sdpa_causal_attention}


def attention_backend(attention: str | AttentionFn) -> AttentionFn:
    if callable(attention):
        return attention
    try:
        return ATTENTION_BACKENDS[attention]
    except KeyError:
        raise ValueError(f"unknown attention backend {attention!r}; known: {', '.join(ATTENTION_BACKENDS)} "
                         "(or pass a function of q, k, v)") from None


class Linear(nn.Module):
    """y = x W^T without bias; W ~ N(0, 2/(d_in+d_out)) truncated at 3 sigma."""

    def __init__(self, in_features: int, out_features: int, device=None, dtype=None):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(out_features, in_features, device=device, dtype=dtype))
        std = math.sqrt(2.0 / (in_features + out_features))
        nn.init.trunc_normal_(self.weight, std=std, a=-3 * std, b=3 * std)

    def forward(self, x: Tensor) -> Tensor:
        return x @ self.weight.T


class Embedding(nn.Module):
    def __init__(self, num_embeddings: int, embedding_dim: int, device=None, dtype=None):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(num_embeddings, embedding_dim, device=device, dtype=dtype))
        nn.init.trunc_normal_(self.weight, std=1.0, a=-3.0, b=3.0)

    def forward(self, token_ids: Tensor) -> Tensor:
        return self.weight[token_ids]


class RMSNorm(nn.Module):
    """Normalises in float32 whatever the input dtype, then returns the input dtype."""

    def __init__(self, d_model: int, eps: float = 1e-5, device=None, dtype=None):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(d_model, device=device, dtype=dtype))

    def forward(self, x: Tensor) -> Tensor:
        in_dtype = x.dtype
        x = x.to(torch.float32)
        rms = torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True) + self.eps)
        return (x / rms * self.weight).to(in_dtype)


def silu(x: Tensor) -> Tensor:
    return x * torch.sigmoid(x)


class SwiGLU(nn.Module):
    def __init__(self, d_model: int, d_ff: int, device=None, dtype=None):
        super().__init__()
        self.w1 = Linear(d_model, d_ff, device=device, dtype=dtype)
        self.w2 = Linear(d_ff, d_model, device=device, dtype=dtype)
        self.w3 = Linear(d_model, d_ff, device=device, dtype=dtype)

    def forward(self, x: Tensor) -> Tensor:
        return self.w2(silu(self.w1(x)) * self.w3(x))


class RotaryEmbedding(nn.Module):
    """Rotates consecutive pairs (x[2i], x[2i+1]) by angle position * theta^(-2i/d)."""

    def __init__(self, theta: float, d_k: int, max_seq_len: int, device=None):
        super().__init__()
        inv_freq = theta ** (-torch.arange(0, d_k, 2, device=device, dtype=torch.float32) / d_k)
        angles = torch.outer(torch.arange(max_seq_len, device=device, dtype=torch.float32), inv_freq)
        self.register_buffer("cos", angles.cos(), persistent=False)
        self.register_buffer("sin", angles.sin(), persistent=False)

    def forward(self, x: Tensor, positions: Tensor) -> Tensor:
        cos, sin = self.cos[positions].to(x.dtype), self.sin[positions].to(x.dtype)
        x_even, x_odd = x[..., 0::2], x[..., 1::2]
        rotated = torch.stack((x_even * cos - x_odd * sin, x_even * sin + x_odd * cos), dim=-1)
        return rotated.flatten(-2)


class CausalMultiHeadSelfAttention(nn.Module):
    def __init__(self, d_model: int, num_heads: int, max_seq_len: int, theta: float,
                 attention: str | AttentionFn = "naive", device=None, dtype=None):
        super().__init__()
        if d_model % num_heads:
            raise ValueError(f"d_model={d_model} is not divisible by num_heads={num_heads}")
        self.num_heads = num_heads
        self.d_head = d_model // num_heads
        self.attention = attention_backend(attention)
        self.q_proj = Linear(d_model, d_model, device=device, dtype=dtype)
        self.k_proj = Linear(d_model, d_model, device=device, dtype=dtype)
        self.v_proj = Linear(d_model, d_model, device=device, dtype=dtype)
        self.output_proj = Linear(d_model, d_model, device=device, dtype=dtype)
        self.rope = RotaryEmbedding(theta, self.d_head, max_seq_len, device=device)

    def _split_heads(self, x: Tensor) -> Tensor:
        *lead, seq, _ = x.shape
        return x.view(*lead, seq, self.num_heads, self.d_head).transpose(-3, -2)

    def forward(self, x: Tensor) -> Tensor:
        positions = torch.arange(x.shape[-2], device=x.device)
        q = self.rope(self._split_heads(self.q_proj(x)), positions)
        k = self.rope(self._split_heads(self.k_proj(x)), positions)
        v = self._split_heads(self.v_proj(x))
        out = self.attention(q, k, v)
        return self.output_proj(out.transpose(-3, -2).flatten(-2))


class TransformerBlock(nn.Module):
    def __init__(self, d_model: int, num_heads: int, d_ff: int, max_seq_len: int, theta: float,
                 attention: str | AttentionFn = "naive", device=None, dtype=None):
        super().__init__()
        self.ln1 = RMSNorm(d_model, device=device, dtype=dtype)
        self.attn = CausalMultiHeadSelfAttention(d_model, num_heads, max_seq_len, theta, attention, device, dtype)
        self.ln2 = RMSNorm(d_model, device=device, dtype=dtype)
        self.ffn = SwiGLU(d_model, d_ff, device=device, dtype=dtype)

    def forward(self, x: Tensor) -> Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.ffn(self.ln2(x))


class TransformerLM(nn.Module):
    def __init__(self, vocab_size: int, context_length: int, d_model: int, num_layers: int, num_heads: int,
                 d_ff: int, rope_theta: float = 10000.0, attention: str | AttentionFn = "naive",
                 checkpoint_blocks: int = 0, device=None, dtype=None):
        super().__init__()
        self.context_length = context_length
        self.checkpoint_blocks = checkpoint_blocks
        self.token_embeddings = Embedding(vocab_size, d_model, device=device, dtype=dtype)
        self.layers = nn.ModuleList(
            TransformerBlock(d_model, num_heads, d_ff, context_length, rope_theta, attention, device, dtype)
            for _ in range(num_layers)
        )
        self.ln_final = RMSNorm(d_model, device=device, dtype=dtype)
        self.lm_head = Linear(d_model, vocab_size, device=device, dtype=dtype)

    @property
    def checkpoint_blocks(self) -> int:
        return self._checkpoint_blocks

    @checkpoint_blocks.setter
    def checkpoint_blocks(self, k: int) -> None:
        if not isinstance(k, int) or k < 0:
            raise ValueError(f"checkpoint_blocks must be a non-negative integer (0 = off), got {k!r}")
        self._checkpoint_blocks = k

    def _run_blocks(self, x: Tensor, start: int, stop: int) -> Tensor:
        for layer in self.layers[start:stop]:
            x = layer(x)
        return x

    def forward(self, token_ids: Tensor) -> Tensor:
        if token_ids.shape[-1] > self.context_length:
            raise ValueError(f"sequence length {token_ids.shape[-1]} exceeds context_length {self.context_length}")
        x = self.token_embeddings(token_ids)
        k = self.checkpoint_blocks
        if k and torch.is_grad_enabled():
            # One level of checkpointing: only each group's input is kept; its blocks' activations
            # are recomputed in the backward pass.
            for start in range(0, len(self.layers), k):
                x = checkpoint(self._run_blocks, x, start, start + k, use_reentrant=False)
        else:
            x = self._run_blocks(x, 0, len(self.layers))
        return self.lm_head(self.ln_final(x))


def build_model(size: ModelSize | str, context_length: int, device: str | torch.device = "cpu",
                dtype: torch.dtype = torch.float32, attention: str | AttentionFn = "naive",
                checkpoint_blocks: int = 0) -> TransformerLM:
    """The Transformer of a registry size (`cs336sys.sizes`), with random weights."""
    s = get_size(size)
    return TransformerLM(s.vocab_size, context_length, s.d_model, s.num_layers, s.num_heads, s.d_ff,
                         rope_theta=s.rope_theta, attention=attention, checkpoint_blocks=checkpoint_blocks,
                         device=device, dtype=dtype)
