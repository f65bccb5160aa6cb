"""FLOPs: of the handout's FFN layer (section 8) and of our whole Transformer (attention included).

Only matrix products are counted, 2 FLOPs per multiply-add: a product (m, k) x (k, n) costs 2mkn.
Elementwise work (norms, softmax, SiLU, RoPE, the optimizer) is a few FLOPs per element against
thousands per element for the products, and `torch.utils.flop_counter.FlopCounterMode` does not
count it either. The backward of a product Z = A B computes dA = dZ B^T and dB = A^T dZ, two products
of the same cost, so a backward pass costs twice its forward when every input needs a gradient.
"""

from __future__ import annotations

import sympy as sp

from cs336sys.accounting.symbols import D_FF, B, D, L, V, b, d, evaluate, f, h, s
from cs336sys.sizes import ModelSize, get_size


def matmul_flops(m: sp.Expr, k: sp.Expr, n: sp.Expr) -> sp.Expr:
    return 2 * m * k * n


# The handout's FFN, equations (20)-(30): x (B, D); W1, W2 (D, D_FF); W3 (D_FF, D).
FFN_FORWARD_PRODUCTS = {
    "x_1 = x W_1": (B, D, D_FF),
    "x_2 = x W_2": (B, D, D_FF),
    "y = z W_3": (B, D_FF, D),
}
FFN_BACKWARD_PRODUCTS = {
    "dz = dy W_3^T": (B, D, D_FF),
    "dx (from dx_1 W_1^T)": (B, D_FF, D),
    "dx (from dx_2 W_2^T)": (B, D_FF, D),
    "dW_3 = z^T dy": (D_FF, B, D),
    "dW_2 = x^T dx_2": (D, B, D_FF),
    "dW_1 = x^T dx_1": (D, B, D_FF),
}


def ffn_flops(products: dict[str, tuple]) -> sp.Expr:
    return sp.Add(*(matmul_flops(*shape) for shape in products.values()))


FFN_FORWARD_FLOPS = ffn_flops(FFN_FORWARD_PRODUCTS)  # 6 B D D_FF
FFN_BACKWARD_FLOPS = ffn_flops(FFN_BACKWARD_PRODUCTS)  # 12 B D D_FF


# Our Transformer: b sequences of s tokens, L blocks.
# `tp` divides what tensor parallelism splits (heads and d_ff, so every product inside a block);
# the LM head is kept whole on every device.
def dense_forward_flops(tp: sp.Expr = 1) -> sp.Expr:
    """Products with a weight: q, k, v, output projections (4 d^2 per token), SwiGLU's w1, w3, w2
    (3 d d_ff per token) in every block, and the LM head (d V per token). The embedding is a lookup."""
    return 2 * b * s * (L * (4 * d**2 + 3 * d * f) / tp + d * V)


def attention_forward_flops(causal: bool = False, tp: sp.Expr = 1) -> sp.Expr:
    """Q K^T and P V in every block: per head 2 s^2 d_head each, h d_head = d_model. `causal=False`
    counts every score, as the naive and the compiled attention compute them; `causal=True` counts
    only the s(s+1)/2 pairs a query may see, what a kernel that skips masked tiles approaches."""
    pairs = s * (s + 1) / 2 if causal else s**2
    return L * 2 * (2 * b * pairs * d) / tp


def forward_flops(causal: bool = False, tp: sp.Expr = 1) -> sp.Expr:
    return dense_forward_flops(tp) + attention_forward_flops(causal, tp)


def backward_flops(causal: bool = False, tp: sp.Expr = 1) -> sp.Expr:
    return 2 * forward_flops(causal, tp)


def train_step_flops(causal: bool = False, tp: sp.Expr = 1) -> sp.Expr:
    """Forward plus backward; the optimizer's elementwise update is not counted."""
    return forward_flops(causal, tp) + backward_flops(causal, tp)


def model_values(size: ModelSize | str, batch_size: int | None = None, context_length: int | None = None) -> dict:
    """{symbol: number} for a registry size (and a batch shape, when given)."""
    m = get_size(size)
    values = {L: m.num_layers, d: m.d_model, f: m.d_ff, h: m.num_heads, V: m.vocab_size}
    if batch_size is not None:
        values[b] = batch_size
    if context_length is not None:
        values[s] = context_length
    return values


def model_train_flops(size: ModelSize | str, batch_size: int, context_length: int, causal: bool = False) -> int:
    return evaluate(train_step_flops(causal), model_values(size, batch_size, context_length))
