"""The optimised step's blocks and loss as functions of tensors (`cs336sys.training.optimized`), and the
attention they call.

    f = projected_block(model.layers[0])   # one function for every block: f(x, *weights, cos, sin) -> x
    g = kernel_block(model.layers[0])      # the same with our backward kernels: (x, branch) -> (x, branch)
    loss = head_loss(eps)(x, norm_weight, head_weight, targets)

- `bf16_block_forward`: the fused block (`cs336sys.leaderboard.fused_block`) with bf16 matrices;
- `projected_block`: the block's ops written out, q/k/v and w1/w3 each one product over a joined weight
  (`fused_projections`); `kernel_block` the same with `cs336sys.training.step_kernels`' RoPE and RMSNorm
  backwards, each residual add moved into the norm after it (`backward_kernels`);
- `head_loss`: the final norm, the LM head and the cross-entropy, one function to compile (`compiled_loss`);
- `rotate_pairs` and `joined_rotary_tables`: RoPE as one elementwise product of the joined projection;
- `step_flash_attention` and `pad_head_dim`: our FlashAttention-2 at the step's tiles, for any head
  dimension (`flash`).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import Tensor

from cs336sys.model import AttentionFn, TransformerBlock, silu
from cs336sys.optim import cross_entropy

FLASH_HEAD_DIMS = (16, 32, 64, 128)  # what our Triton kernels are compiled for
JOINED = {"attn.qkv": ("attn.q_proj.weight", "attn.k_proj.weight", "attn.v_proj.weight"),
          "ffn.w13": ("ffn.w1.weight", "ffn.w3.weight")}  # fused_projections: one bf16 matrix, the masters' rows


class _RMSNormToFunction(torch.autograd.Function):
    """The RMSNorm kernels of `cs336sys.leaderboard.fused_ops`, writing y in `out_dtype` (fp32 x in,
    bf16 y out: the norm and autocast's cast before the next matmul in one pass); dx in x's dtype."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, eps: float, out_dtype: torch.dtype) -> Tensor:
        import triton

        from cs336sys.leaderboard.fused_ops import _rows, _warps, rms_norm_forward_kernel

        rows = _rows(x)
        n_rows, d = rows.shape
        y = torch.empty((n_rows, d), dtype=out_dtype, device=x.device)
        rstd = torch.empty(n_rows, dtype=torch.float32, device=x.device)
        block = triton.next_power_of_2(d)
        rms_norm_forward_kernel[(n_rows,)](rows, weight, y, rstd, d, rows.stride(0), y.stride(0), eps,
                                           BLOCK_D=block, num_warps=_warps(block))
        ctx.save_for_backward(rows, weight, rstd)
        ctx.x_shape = x.shape
        return y.view(x.shape)

    @staticmethod
    def backward(ctx, dy: Tensor) -> tuple[Tensor, Tensor, None, None]:
        from cs336sys.leaderboard.fused_ops import _RMSNormFunction

        dx, dw, _ = _RMSNormFunction.backward(ctx, dy)
        return dx, dw, None, None


def rms_norm_to(x: Tensor, weight: Tensor, eps: float, out_dtype: torch.dtype) -> Tensor:
    """The model's RMSNorm of x (fp32 inside), rounded once to `out_dtype`."""
    from cs336sys.leaderboard.fused_ops import _use_kernels, rms_norm_reference

    if not _use_kernels(x, weight):
        return rms_norm_reference(x, weight, eps).to(out_dtype)
    return _RMSNormToFunction.apply(x, weight, eps, out_dtype)


def bf16_block_forward(block: TransformerBlock, params: dict[str, Tensor], x: Tensor) -> Tensor:
    """`fused_block_forward` with bf16 matrices: the norms write bf16 (what autocast would cast them
    to), the residual stream `x` stays fp32 (a bf16 branch added to it is upcast, as under autocast)."""
    from cs336sys.leaderboard.fused_ops import rotary, silu_gate

    attn = block.attn
    *lead, seq, _ = x.shape
    cos, sin = attn.rope.cos[:seq], attn.rope.sin[:seq]

    def heads(t: Tensor) -> Tensor:
        return t.view(*lead, seq, attn.num_heads, attn.d_head).transpose(-3, -2)

    h = rms_norm_to(x, params["ln1.weight"], block.ln1.eps, torch.bfloat16)
    if "attn.qkv" in params:  # (fused_projections)
        q, k, v = (h @ params["attn.qkv"].T).split(x.shape[-1], dim=-1)
    else:
        q, k, v = (h @ params[name].T for name in JOINED["attn.qkv"])
    out = attn.attention(rotary(heads(q), cos, sin), rotary(heads(k), cos, sin), heads(v))
    x = x + out.transpose(-3, -2).flatten(-2) @ params["attn.output_proj.weight"].T
    h = rms_norm_to(x, params["ln2.weight"], block.ln2.eps, torch.bfloat16)
    if "ffn.w13" in params:
        gate = silu_gate(*(h @ params["ffn.w13"].T).chunk(2, dim=-1))
    else:
        gate = silu_gate(*(h @ params[name].T for name in JOINED["ffn.w13"]))
    return x + gate @ params["ffn.w2.weight"].T


PROJECTED_BLOCK_INPUTS = ("ln1.weight", "attn.qkv", "attn.output_proj.weight", "ln2.weight", "ffn.w13",
                          "ffn.w2.weight")  # `projected_block`'s weights, in its order


def projected_block(block: TransformerBlock) -> Callable[..., Tensor]:
    """`block`'s forward (`TransformerBlock.forward`'s ops) as a function of tensors only, with q, k and v
    projected by one matmul over their joined weight (3 d_model, d_model) and w1, w3 by one over theirs
    (2 d_ff, d_model): f(x, *weights named by `PROJECTED_BLOCK_INPUTS`, cos, sin) for x of shape
    (batch, seq, d_model), with cos and sin `joined_rotary_tables`. The heads, norms' eps and attention
    are the block's (the same in every block of a model), so one compiled function serves every block.

    q, k and v stay one tensor until the attention: RoPE rotates all three in one pass (v by the
    identity), and one copy lays them out as three contiguous (batch, heads, seq, d_head) tensors for
    it. The backward then stacks the attention's three gradients with a plain copy before RoPE's
    backward, one pass over the joined gradient. Split right after the product, Inductor gathered the
    three (two through RoPE's backward) in one kernel that cost more than the joined products saved
    below "xl" (notes/runs/2026-11-27-h100-joined-projections). RoPE is `rotate_pairs`: written with
    even and odd slices (the model's ops), its backward was two kernels on the GPU, the second only
    interleaving the first's two halves (notes/runs/2026-11-28-h100-inductor-kernels)."""
    attention, num_heads, eps1, eps2 = block.attn.attention, block.attn.num_heads, block.ln1.eps, block.ln2.eps

    def forward(x: Tensor, ln1: Tensor, qkv: Tensor, output: Tensor, ln2: Tensor, w13: Tensor, w2: Tensor,
                cos: Tensor, sin: Tensor) -> Tensor:
        from cs336sys.leaderboard.fused_ops import rms_norm_reference

        batch, seq, d = x.shape
        projected = (rms_norm_reference(x, ln1, eps1) @ qkv.T).view(batch, seq, 3, num_heads, d // num_heads)
        # (batch, seq, 3, heads, d_head) -> three contiguous (batch, heads, seq, d_head)
        q, k, v = rotate_pairs(projected, cos, sin).permute(2, 0, 3, 1, 4).contiguous().unbind(0)
        x = x + attention(q, k, v).transpose(1, 2).flatten(-2) @ output.T
        a, b = (rms_norm_reference(x, ln2, eps2) @ w13.T).chunk(2, dim=-1)
        return x + (silu(a) * b) @ w2.T

    return forward


class _RotaryHeads(torch.autograd.Function):
    """`projected_block`'s RoPE and head layout, q, k, v = rotate_pairs(projected).permute(...).contiguous()
    for projected (batch, seq, 3, heads, d_head): the forward is those ops (compiled, Inductor's one
    kernel), the backward `step_kernels.rotary_heads_backward`, one kernel from the three gradients."""

    @staticmethod
    def forward(ctx, projected: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        ctx.save_for_backward(cos, sin)
        q, k, v = rotate_pairs(projected, cos, sin).permute(2, 0, 3, 1, 4).contiguous().unbind(0)
        return q, k, v

    @staticmethod
    def backward(ctx, dq: Tensor, dk: Tensor, dv: Tensor) -> tuple[Tensor, None, None]:
        from cs336sys.training.step_kernels import rotary_heads_backward

        return rotary_heads_backward(dq, dk, dv, *ctx.saved_tensors), None, None


def _rms_norm_bf16(ctx, x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """The model's RMSNorm of fp32 x, rounded to bf16 (as autocast casts it for the next product), with
    what `_norm_backward` needs saved on ctx."""
    rms = torch.sqrt(x.pow(2).mean(dim=-1, keepdim=True) + eps)
    ctx.save_for_backward(x, weight, rms.reciprocal().squeeze(-1))
    return (x / rms * weight).to(torch.bfloat16)


def _norm_backward(ctx, dh: Tensor, g: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
    from cs336sys.training.step_kernels import residual_rms_norm_backward

    return residual_rms_norm_backward(dh, *ctx.saved_tensors, g)


class _RMSNormBF16(torch.autograd.Function):
    """h = RMSNorm(x) in bf16 (the first block's first norm): the backward is one kernel, the weight's
    gradient summed in the same pass as x's (`step_kernels.residual_rms_norm_backward`)."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, eps: float) -> Tensor:
        return _rms_norm_bf16(ctx, x, weight, eps)

    @staticmethod
    def backward(ctx, dh: Tensor) -> tuple[Tensor, Tensor, None]:
        dx, _, dw = _norm_backward(ctx, dh, None)
        return dx, dw, None


class _ResidualRMSNormBF16(torch.autograd.Function):
    """(x + branch, RMSNorm(x + branch) in bf16) for the fp32 residual stream x and a bf16 branch: the
    residual add and the norm after it. The backward is one kernel: x's gradient is the norm's plus
    the sum's own (the next residual add's), written in fp32 for x and rounded once for the branch,
    and the weight's gradient comes from the same pass."""

    @staticmethod
    def forward(ctx, x: Tensor, branch: Tensor, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
        x = x + branch
        return x, _rms_norm_bf16(ctx, x, weight, eps)

    @staticmethod
    def backward(ctx, gx: Tensor | None, dh: Tensor) -> tuple[Tensor, Tensor, Tensor, None]:
        dx, dx_low, dw = _norm_backward(ctx, dh, gx)
        return dx, dx_low, dw, None


def residual_rms_norm(x: Tensor, branch: Tensor | None, weight: Tensor, eps: float) -> tuple[Tensor, Tensor]:
    """(x + branch, its RMSNorm in bf16), or (x, its RMSNorm) without a branch."""
    if branch is None:
        return x, _RMSNormBF16.apply(x, weight, eps)
    return _ResidualRMSNormBF16.apply(x, branch, weight, eps)


def kernel_block(block: TransformerBlock) -> Callable[..., tuple[Tensor, Tensor]]:
    """`projected_block` with the step's two backward kernels (`backward_kernels`): f(x, branch, *weights,
    cos, sin) -> (x, branch), where the block's input is x + branch (branch None: x) and its output
    the returned x + branch. Each residual add is made by the norm after it, so that the norm's backward
    can add the residual's gradient in its own pass (`_ResidualRMSNormBF16`): the block's last add is
    the next block's first (the final norm's, in `head_loss`, after the last block). RoPE's backward
    is one kernel too (`_RotaryHeads`). The forward's values are `projected_block`'s."""
    attention, num_heads, eps1, eps2 = block.attn.attention, block.attn.num_heads, block.ln1.eps, block.ln2.eps

    def forward(x: Tensor, branch: Tensor | None, ln1: Tensor, qkv: Tensor, output: Tensor, ln2: Tensor,
                w13: Tensor, w2: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
        batch, seq, d = x.shape
        x, h = residual_rms_norm(x, branch, ln1, eps1)
        q, k, v = _RotaryHeads.apply((h @ qkv.T).view(batch, seq, 3, num_heads, d // num_heads), cos, sin)
        x, h = residual_rms_norm(x, attention(q, k, v).transpose(1, 2).flatten(-2) @ output.T, ln2, eps2)
        a, b = (h @ w13.T).chunk(2, dim=-1)
        return x, (silu(a) * b) @ w2.T

    return forward


def head_loss(eps: float) -> Callable[..., Tensor]:
    """f(x, norm weight, LM head weight, targets, branch=None): the final RMSNorm (`eps`), the LM head and
    the mean cross-entropy (`cs336sys.optim.cross_entropy`) of the residual stream x (plus the last
    block's branch, from `kernel_block`): the ops the step runs after the last block, as one function
    to compile. Eager, they make about twenty passes over the (tokens, vocabulary) logits, forward and
    backward, most of them upcast to fp32."""
    from cs336sys.leaderboard.fused_ops import rms_norm_reference

    def loss(x: Tensor, weight: Tensor, head: Tensor, targets: Tensor, branch: Tensor | None = None) -> Tensor:
        if branch is not None:
            x = x + branch
        return cross_entropy(rms_norm_reference(x, weight, eps) @ head.T, targets)

    return loss


def joined_rotary_tables(cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
    """`rotate_pairs`' tables for `projected_block`, (seq, 3, 1, d_head) from the model's (seq, d_head / 2):
    for q and k each angle's cosine twice and its sine as (-sin, sin), for v the zero angle (cos 1,
    sin 0), which leaves v as it is, exactly."""
    c, s = torch.stack((cos, cos), dim=-1).flatten(-2), torch.stack((-sin, sin), dim=-1).flatten(-2)
    return (torch.stack((c, c, torch.ones_like(c)), dim=1).unsqueeze(2),
            torch.stack((s, s, torch.zeros_like(s)), dim=1).unsqueeze(2))


def rotate_pairs(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    """RoPE of x's consecutive pairs (x_2i, x_2i+1), as `cs336sys.model.RotaryEmbedding`, written as
    x cos + swap(x) sin with `joined_rotary_tables`' (..., d_head) tables: every output element is one
    product plus one, as in the model's (x_2i cos - x_2i+1 sin, x_2i sin + x_2i+1 cos), so eager results
    are the same bit for bit (the tables cast to x's dtype as the model casts its own). Its backward,
    g cos + swap(g sin), is as plain elementwise as its forward, with no slice to scatter back."""
    swapped = x.unflatten(-1, (-1, 2)).flip(-1).flatten(-2)
    return x * cos.to(x.dtype) + swapped * sin.to(x.dtype)


# The attention's tiles in the step (forward, backward; flash_configs strings) by head dimension. The
# table's were chosen at long sequences; at the step's batch 4 and context 512, timed alone on an H100,
# its 128-row forward tiles (which it takes from two waves of programs on: large and above) took 4-5 us
# a layer more than 64-row ones, and 32-row dK/dV steps took up to 2 us off the backward at d 64
# (notes/runs/2026-11-27-h100-step-attention). Only on CUDA: the interpreter keeps its own small tiles.
STEP_TILES = {64: ("64x64/w4/s3", "kv32x64/q64x32/w4/s3"), 128: ("64x64/w4/s3", None)}


def step_flash_attention(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
    """Causal `FlashAttention2Triton` with the step's tiles (`STEP_TILES`), the table's elsewhere."""
    from cs336sys.attention.flash_triton import FlashAttention2Triton

    forward, backward = STEP_TILES.get(q.shape[-1], (None, None)) if q.is_cuda else (None, None)
    return FlashAttention2Triton.apply(q, k, v, True, "tf32", forward, parsed_untraced(backward))


@torch.compiler.assume_constant_result
def parsed_untraced(backward_tiles: str | None) -> str | None:
    """`backward_tiles`, after parsing them eagerly: under torch.compile Dynamo calls this rather than
    tracing it, just before it traces `FlashAttention2Triton`'s forward, which parses them again. That
    second parse then finds its pattern in `re`'s cache. Compiling a pattern afresh runs `re`'s
    compiler in Python, which torch 2.11's Dynamo (the GPU hosts') cannot trace: the block fell back to
    two graphs split at the attention, with the block input's two gradients summed by an eager add
    (notes/runs/2026-11-28-cpu-dynamo-regex). torch 2.13's Dynamo traces it."""
    if backward_tiles:
        from cs336sys.attention.flash_configs import BackwardConfig

        BackwardConfig.parse(backward_tiles)
    return backward_tiles


class _ContiguousGrad(torch.autograd.Function):
    """The identity, whose backward hands the gradient on contiguous: inside a compiled function the
    copy is Inductor's, where the next node would otherwise make it eagerly (`pad_head_dim`)."""

    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:
        return grad.contiguous()


def pad_head_dim(attention: AttentionFn, head_dims: tuple[int, ...] = FLASH_HEAD_DIMS) -> AttentionFn:
    """`attention` for any head dimension up to max(head_dims): q, k, v zero-padded to the next one it
    takes, and the output cut back. Zero columns add nothing to q k^T, and the padded output columns
    are zero; q is scaled by sqrt(padded / d) so that the kernel's 1 / sqrt(padded) is 1 / sqrt(d).

    q, k and v reach `attention` contiguous: the heads are a transposed view of the projections, and
    the Triton kernels copy such a view into their layout, in the forward and again (the saved views)
    in the backward. Made contiguous here, inside the compiled block, the copies of q and k are fused
    into RoPE's kernel, and the autograd.Function saves the contiguous tensors. The output's gradient
    reaches the attention's backward contiguous too (`_ContiguousGrad`): it arrives as a transposed view
    of the output projection's product, which the kernels' backward copied with torch's own copy kernel,
    outside Inductor's (0.2 ms a step at medium on one H100, notes/runs/2026-11-28-h100-inductor-kernels)."""

    def padded(q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        d = q.shape[-1]
        if d in head_dims:
            return _ContiguousGrad.apply(attention(q.contiguous(), k.contiguous(), v.contiguous()))
        wider = sorted(w for w in head_dims if w > d)  # (not min(..., default=): a graph break under compile)
        if not wider:
            raise ValueError(f"head dimension {d} is above the largest the attention takes ({max(head_dims)})")
        width = wider[0]
        pad = lambda t: torch.nn.functional.pad(t, (0, width - d))  # noqa: E731
        return attention(pad(q * math.sqrt(width / d)), pad(k), pad(v))[..., :d]

    return padded
