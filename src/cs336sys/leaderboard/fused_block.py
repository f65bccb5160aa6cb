"""A TransformerBlock's forward with the fused elementwise kernels of `cs336sys.leaderboard.fused_ops`.

    y = fused_block_forward(block, params, x)   # == functional_call(block, params, (x,)), up to rounding

`block` is a `cs336sys.model.TransformerBlock`, used for its shape, its attention function, its
RMSNorm eps and its RoPE tables; `params` maps the block's parameter names ("ln1.weight",
"attn.q_proj.weight", ...) to the tensors to compute with, as `BlockFSDP.run_unit` passes them.
The matmuls (`x @ W.T`, as `cs336sys.model.Linear`), the attention call and the residual adds are
the model's; RMSNorm, the SwiGLU gate and RoPE are one kernel each way. The block's input/output
behaviour is unchanged: `tests/test_leaderboard_fused_ops.py` checks it against the module.
"""

from __future__ import annotations

from collections.abc import Mapping

from torch import Tensor

from cs336sys.leaderboard.fused_ops import rms_norm, rotary, silu_gate
from cs336sys.model import TransformerBlock


def _linear(x: Tensor, weight: Tensor) -> Tensor:
    return x @ weight.T


def fused_block_forward(block: TransformerBlock, params: Mapping[str, Tensor], x: Tensor) -> Tensor:
    attn = block.attn
    *lead, seq, d_model = x.shape
    cos, sin = attn.rope.cos[:seq], attn.rope.sin[:seq]

    def heads(t: Tensor) -> Tensor:  # (..., seq, d_model) -> (..., heads, seq, d_head), a view
        return t.view(*lead, seq, attn.num_heads, attn.d_head).transpose(-3, -2)

    h = rms_norm(x, params["ln1.weight"], block.ln1.eps)
    q = rotary(heads(_linear(h, params["attn.q_proj.weight"])), cos, sin)
    k = rotary(heads(_linear(h, params["attn.k_proj.weight"])), cos, sin)
    v = heads(_linear(h, params["attn.v_proj.weight"]))
    out = attn.attention(q, k, v).transpose(-3, -2).flatten(-2)
    x = x + _linear(out, params["attn.output_proj.weight"])
    h = rms_norm(x, params["ln2.weight"], block.ln2.eps)
    gate = silu_gate(_linear(h, params["ffn.w1.weight"]), _linear(h, params["ffn.w3.weight"]))
    return x + _linear(gate, params["ffn.w2.weight"])
