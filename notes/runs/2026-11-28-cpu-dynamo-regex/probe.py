"""Does Dynamo trace the optimised step's projected block, with our flash attention and the step's d 64
tiles, as one graph? Run on the CPU under TRITON_INTERPRET=1 (the interpreter runs the kernels), in a
fresh process, with `re`'s cache purged first, as the first trace of a step process finds it.

    TRITON_INTERPRET=1 PYTHONPATH=src python probe.py {direct,untraced,layout}

direct: the Function gets the tile strings as they are; untraced: the backward tiles pass through
`parsed_untraced` (assume_constant_result) first; layout: untraced, through `pad_head_dim` (as the step
calls it), and the block compiled and run forward and backward, printing the layout of the output's
gradient as the kernels' backward receives it (../2026-11-28-cpu-contiguous-grad)."""

import re
import sys
from types import SimpleNamespace

import torch

import cs336sys.attention.flash_triton as flash_triton
from cs336sys.attention.flash_triton import FlashAttention2Triton
from cs336sys.training.optimized import STEP_TILES, joined_rotary_tables, pad_head_dim, parsed_untraced, projected_block

mode = sys.argv[1]
forward_tiles, backward_tiles = STEP_TILES[64]


def attention(q, k, v):
    tiles = backward_tiles if mode == "direct" else parsed_untraced(backward_tiles)
    return FlashAttention2Triton.apply(q, k, v, True, "tf32", forward_tiles, tiles)


batch, seq, heads, d_head, d_ff = 1, 64, 2, 64, 256
d = heads * d_head
block = SimpleNamespace(attn=SimpleNamespace(attention=pad_head_dim(attention) if mode == "layout" else attention,
                                             num_heads=heads),
                        ln1=SimpleNamespace(eps=1e-5), ln2=SimpleNamespace(eps=1e-5))
angles = torch.outer(torch.arange(seq, dtype=torch.float32), torch.rand(d_head // 2))
cos, sin = joined_rotary_tables(angles.cos(), angles.sin())
x = torch.randn(batch, seq, d, requires_grad=True)
weights = [torch.ones(d), torch.randn(3 * d, d) / d**0.5, torch.randn(d, d) / d**0.5, torch.ones(d),
           torch.randn(2 * d_ff, d) / d**0.5, torch.randn(d, d_ff) / d_ff**0.5]
re.purge()
torch._dynamo.reset()
e = torch._dynamo.explain(projected_block(block))(x, *weights, cos, sin)
print(f"python {sys.version.split()[0]}, torch {torch.__version__}, {mode}: "
      f"{e.graph_count} graph(s), {e.graph_break_count} break(s)")
for b in e.break_reasons:
    print("  break:", str(b.reason).splitlines()[0][:200])
if mode == "layout":
    received, kernels_backward = [], flash_triton.flash_attention_triton_backward

    def recording(q, k, v, out, lse, grad_out, *args):
        received.append((grad_out.stride(), grad_out.is_contiguous()))
        return kernels_backward(q, k, v, out, lse, grad_out, *args)

    flash_triton.flash_attention_triton_backward = recording
    torch._dynamo.reset()
    torch.compile(projected_block(block))(x, *weights, cos, sin).sum().backward()
    print("the output's gradient at the kernels' backward (strides, contiguous):", received)
