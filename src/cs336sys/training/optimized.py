"""The handout's training step with the project's own speed-ups, each one an option that can be added alone.

    spec = OptimizedSpec("2.7B", 512, techniques=("fused_adamw", "fused_elementwise", "flash", "bf16_weights"))
    step = build_optimized_step(spec, "cuda:0")
    loss = step.run()                       # one whole step: forward+backward, optimizer, zero_grad

With no techniques this is `cs336sys.training.step.build_step`'s bf16 train step (autocast, our
per-parameter AdamW, the model's own forward, compiled per block by default), and the step is
built by it. The techniques (`TECHNIQUES`; the benchmark's series in config/main.yaml adds them in its own order):

- `fused_adamw`: `cs336sys.leaderboard.adamw.FusedAdamW`, one Triton kernel per parameter tensor
  (p, g, m, v read once, p, m, v written once) instead of seven torch ops;
- `fused_elementwise`: the blocks run through `cs336sys.leaderboard.fused_block.fused_block_forward`
  (RMSNorm, the SwiGLU gate and RoPE as one Triton kernel each way), eager (those kernels are what
  compiling the blocks fused before);
- `flash`: our causal Triton FlashAttention-2 (`cs336sys.attention.flash_triton`, with tiles chosen
  at the step's shapes: `STEP_TILES`) instead of the naive attention's materialised scores; a head
  dimension the kernels do not take (the "2.7B"'s 80) is zero-padded to the next one they do (`pad_head_dim`);
- `bf16_weights`: the matrices (projections, SwiGLU, LM head) are used through bf16 copies kept
  from step to step, which the optimizer rewrites in its own pass (`fused_adamw_`'s `out_lowp`),
  instead of autocast casting each fp32 weight in every forward; their gradients arrive in bf16 and
  are upcast inside the optimizer's kernel. The residual stream, the norms' weights and the
  embedding stay fp32, as under autocast; autocast stays on (it then casts nothing, but still runs
  the naive attention's softmax in fp32). Needs `fused_adamw`. With the fused forward the norms
  write bf16 directly; with the model's own forward (compiled or not) the copies replace the fp32
  matrices through `torch.func.functional_call`, and that forward is otherwise the plain one.
- `cuda_graph`: forward+backward captured once as a CUDA graph (after warm-up passes that compile
  and tune without updating anything) and replayed each step, so no kernel waits on the host's
  Python, autograd and launches; the optimizer runs after it as before (its step size changes every
  step). The capture allocates every gradient, and each replay writes them afresh, so `zero_grad`
  keeps them (setting them to None would drop the graph's buffers). Needs a CUDA device.
- `adamw_in_backward`: each parameter's fused AdamW update launched as soon as the backward has
  accumulated its gradient (`BackwardAdamW`, a post-accumulate-grad hook), on a side stream on CUDA,
  so that the optimizer's memory-bound passes run beside the rest of the backward's products instead
  of after them; the optimizer step is then empty. With `cuda_graph` the graph captures the updates
  too, their step size read from device memory (written before each replay). Needs `fused_adamw`.
- `fused_projections`: q, k and v's bf16 copies are row blocks of one matrix, as are w1's and w3's, so
  each block multiplies by one (3 d_model, d_model) and one (2 d_ff, d_model) weight: one matmul where
  there were three (two) in the forward, and in each of the backward's two products; the optimizer
  reads each master's gradient as its rows of the matrix's and writes its rows of the copy. The
  model's forward would issue the products one by one (Inductor does not merge them), so the blocks
  run `projected_block`, the block's ops written out with the joined products (compiled once for
  every block with compile "blocks"). Needs `bf16_weights`.
- `compiled_loss`: the final norm, the LM head and the cross-entropy compiled as one function
  (`head_loss`), where they ran eager after the compiled blocks. Needs `bf16_weights`.
- `backward_kernels`: the blocks run `kernel_block`, `projected_block` with two backwards of our own
  (`cs336sys.training.step_kernels`), where Inductor's ran below the copy bandwidth: RoPE's, one
  kernel from the attention's three gradients into the joined projection's, and each norm's, one pass
  that also sums the weight's gradient and adds the residual's (each residual add moves into the
  norm after it, the block's last into the next block's first). Needs `fused_projections`; with
  `fused_elementwise` (blocks with hand-written backwards of their own) it changes nothing.

The step's own compiled functions (`projected_block`, `head_loss`, not the model's blocks) are
compiled with Inductor's coordinate-descent tuning of each kernel's launch (`INDUCTOR_OPTIONS`): on one
H100 it took 0.1-0.35 ms off the steps of small to xl (notes/runs/2026-11-27-h100-loss-and-layout).

Exactness: under autocast a weight's gradient is the bf16 product's, upcast by the cast's backward,
so `bf16_weights` computes the same gradients; the fused kernels round once where the model's ops
round after every op, and flash accumulates in another order: the loss and updated parameters agree
with the plain step within bf16 rounding (tests/test_optimized_step.py).
"""

from __future__ import annotations

import contextlib
import math
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn
from torch.func import functional_call

from cs336sys.dtypes import autocast
from cs336sys.leaderboard.adamw import FusedAdamW, fused_adamw_
from cs336sys.model import AttentionFn, TransformerBlock, TransformerLM, silu
from cs336sys.optim import adamw_step_size, cross_entropy
from cs336sys.sizes import get_size
from cs336sys.training.step import COMPILE, StepSpec, build_step

TECHNIQUES = ("fused_adamw", "fused_elementwise", "flash", "bf16_weights", "cuda_graph", "adamw_in_backward",
              "fused_projections", "compiled_loss", "backward_kernels")
NEEDS = {"bf16_weights": ("fused_adamw",), "adamw_in_backward": ("fused_adamw",),
         "fused_projections": ("bf16_weights",), "compiled_loss": ("bf16_weights",),
         "backward_kernels": ("fused_projections",)}
FLASH_HEAD_DIMS = (16, 32, 64, 128)  # what our Triton kernels are compiled for
MATRICES = ("attn.q_proj.weight", "attn.k_proj.weight", "attn.v_proj.weight", "attn.output_proj.weight",
            "ffn.w1.weight", "ffn.w2.weight", "ffn.w3.weight")  # a block's weights kept in bf16
INDUCTOR_OPTIONS = {"coordinate_descent_tuning": True}  # the step's own compiled functions (not the model's blocks)
JOINED = {"attn.qkv": ("attn.q_proj.weight", "attn.k_proj.weight", "attn.v_proj.weight"),
          "ffn.w13": ("ffn.w1.weight", "ffn.w3.weight")}  # fused_projections: one bf16 matrix, the masters' rows


@dataclass(frozen=True)
class OptimizedSpec:
    """One configuration of the step: bf16 autocast, the size's batch, `techniques` from `TECHNIQUES`.
    `compile` applies to the model's own forward (no `fused_elementwise`); the fused forward is eager."""

    size: str
    context_length: int
    batch_size: int | None = None
    techniques: tuple[str, ...] = ()
    compile: str = "blocks"
    seed: int = 0

    def __post_init__(self) -> None:
        get_size(self.size)
        unknown = [t for t in self.techniques if t not in TECHNIQUES]
        if unknown:
            raise ValueError(f"unknown techniques {unknown}; known: {', '.join(TECHNIQUES)}")
        for technique, needs in NEEDS.items():
            missing = [n for n in needs if technique in self.techniques and n not in self.techniques]
            if missing:
                raise ValueError(f"{technique} needs {', '.join(missing)} too")
        if self.compile not in COMPILE:
            raise ValueError(f"unknown compile mode {self.compile!r}; known: {', '.join(COMPILE)}")
        if self.uses("bf16_weights") and not self.uses("fused_elementwise") and self.compile == "full":
            raise ValueError("bf16_weights swaps the model's matrices for their copies, which a whole-model "
                             "compile would not see; use compile 'blocks' or 'eager'")

    @property
    def batch(self) -> int:
        return self.batch_size or get_size(self.size).batch_size

    def uses(self, technique: str) -> bool:
        return technique in self.techniques


def _adamw_state(state: dict, p: Tensor) -> dict:
    """`state`, given AdamW's step count and moments (zero) if it has none yet."""
    if not state:
        state["step"] = 0
        state["exp_avg"] = torch.zeros_like(p, memory_format=torch.contiguous_format)
        state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.contiguous_format)
    return state


@dataclass(frozen=True, eq=False)
class CopyRows:
    """Where a master parameter's bf16 copy lives: rows `rows` of `leaf`, a bf16 leaf that requires grad
    (all of it, unless `fused_projections` stacked several masters in it). The master's gradient is
    the same rows of the leaf's."""

    leaf: Tensor
    rows: slice

    def grad(self) -> Tensor | None:
        return None if self.leaf.grad is None else self.leaf.grad[self.rows]

    def copy(self) -> Tensor:
        """The rows, outside autograd: what the optimizer's kernel writes."""
        return self.leaf.detach()[self.rows]


class MasterCopyAdamW(torch.optim.Optimizer):
    """`FusedAdamW` over fp32 master parameters of which some are used, forward and backward, through
    bf16 copies: such a parameter's gradient is its copy's (bf16, upcast in the kernel), and the kernel
    writes the updated parameter into the copy in the same pass. `copies` maps master -> `CopyRows`."""

    def __init__(self, params: Iterable[Tensor], copies: dict[Tensor, CopyRows], lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8, weight_decay: float = 0.01):
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))
        self.copies = copies

    def zero_grad(self, set_to_none: bool = True) -> None:
        super().zero_grad(set_to_none)
        for copy in self.copies.values():
            copy.leaf.grad = None

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None):
        for group in self.param_groups:
            lr, (beta1, beta2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
            for p in group["params"]:
                copy = self.copies.get(p)
                grad = copy.grad() if copy is not None else p.grad
                if grad is None:
                    continue
                state = _adamw_state(self.state[p], p)
                state["step"] += 1
                fused_adamw_(p, grad.contiguous(), state["exp_avg"], state["exp_avg_sq"],
                             step_size=adamw_step_size(lr, beta1, beta2, state["step"]), lr=lr, eps=eps,
                             weight_decay=wd, beta1=beta1, beta2=beta2,
                             out_lowp=copy.copy() if copy is not None else None)
        return None


def _hook(this: weakref.ref, targets: tuple[int, ...]) -> Callable[[Tensor], None]:
    """`BackwardAdamW`'s hook for the parameters `targets` (indices) whose gradient is (part of) the
    tensor's it is registered on (nothing once the object is gone)."""

    def hook(leaf: Tensor) -> None:
        updates = this()
        if updates is not None:
            for i in targets:
                updates._update(i, leaf.grad)

    return hook


class BackwardAdamW:
    """The updates of `optimizer` (`FusedAdamW` or `MasterCopyAdamW`) made during the backward: each
    parameter's `fused_adamw_` launched by a post-accumulate-grad hook on the tensor whose gradient
    arrives (the parameter, or its bf16 copy: one hook for every master whose rows it holds), once the
    backward has accumulated that gradient, so every node that reads the parameter has run. On CUDA the
    updates go to a side stream (of normal priority: a captured step's backward has a higher one, see
    `OptimizedStep.capture`) that first waits for the backward's stream, and `join` (after the
    backward) makes that stream wait for them.
    Each update is the optimizer step's for that parameter (the same kernel, state and step size), so
    the parameters come out bitwise as `optimizer.step()` after the backward would leave them.

    `begin_step()` before each forward+backward counts the step and writes each group's step size
    into a device tensor the kernels read when they run, which a CUDA graph that captured them
    needs (the step size changes every step); `armed` False skips the updates (a graph's warm-up).
    Every parameter is taken to get a gradient in every backward (the model's all do): a step counts
    for all of them, where `optimizer.step()` would skip a parameter without one."""

    def __init__(self, optimizer: torch.optim.Optimizer, device: str):
        if not isinstance(optimizer, FusedAdamW | MasterCopyAdamW):
            raise TypeError(f"the updates in the backward are the fused AdamW's, not {type(optimizer).__name__}'s")
        self.optimizer = optimizer
        self.side = torch.cuda.Stream(device, priority=0) if torch.device(device).type == "cuda" else None
        self.armed = True
        self.step_sizes = [torch.zeros(1, dtype=torch.float32, device=device) for _ in optimizer.param_groups]
        self.step_size_values = [0.0] * len(optimizer.param_groups)
        copies = getattr(optimizer, "copies", {})
        lowp = getattr(optimizer, "_lowp", {})
        # (group, parameter, its low-precision copy, its rows of the gradient that arrives)
        self.targets: list[tuple[int, Tensor, Tensor | None, slice]] = []
        arrives: dict[int, tuple[Tensor, list[int]]] = {}  # id -> the tensor whose gradient arrives, its targets
        for g, group in enumerate(optimizer.param_groups):
            for p in group["params"]:
                _adamw_state(optimizer.state[p], p)  # allocated now: a graph captures their addresses
                copy = copies.get(p)
                leaf, out, rows = (copy.leaf, copy.copy(), copy.rows) if copy else (p, lowp.get(p), slice(None))
                self.targets.append((g, p, out, rows))
                arrives.setdefault(id(leaf), (leaf, []))[1].append(len(self.targets) - 1)
        # a hook holds no tensor and only a weak reference to this object: the tensor it is registered on
        # keeps its hooks, and a strong reference back would keep the model alive (CPU test)
        this = weakref.ref(self)
        self.hooks = [leaf.register_post_accumulate_grad_hook(_hook(this, tuple(targets)))
                      for leaf, targets in arrives.values()]

    def begin_step(self) -> None:
        for g, group in enumerate(self.optimizer.param_groups):
            t = 0
            for p in group["params"]:
                state = self.optimizer.state[p]
                state["step"] += 1
                t = state["step"]
            value = adamw_step_size(group["lr"], *group["betas"], t)
            self.step_size_values[g] = value
            self.step_sizes[g].fill_(value)

    @torch.no_grad()
    def _update(self, i: int, grad: Tensor) -> None:
        if not self.armed:
            return
        g, p, out_lowp, rows = self.targets[i]
        group, state = self.optimizer.param_groups[g], self.optimizer.state[p]
        if self.side is None:  # the CPU: in order, with the host's step size (the step's own float)
            step_size, stream = self.step_size_values[g], contextlib.nullcontext()
        else:
            step_size, stream = self.step_sizes[g], torch.cuda.stream(self.side)
            self.side.wait_stream(torch.cuda.current_stream(p.device))
        with stream:
            fused_adamw_(p, grad[rows].contiguous(), state["exp_avg"], state["exp_avg_sq"], step_size=step_size,
                         lr=group["lr"], eps=group["eps"], weight_decay=group["weight_decay"],
                         beta1=group["betas"][0], beta2=group["betas"][1], out_lowp=out_lowp)

    def join(self) -> None:
        if self.side is not None:
            torch.cuda.current_stream(self.side.device).wait_stream(self.side)


@dataclass
class OptimizedStep:
    """A built step. `forward_backward()` returns the loss (detached); `run()` is one whole step in
    the plain step's order (forward+backward, optimizer step, zero_grad) and returns the loss."""

    spec: OptimizedSpec
    model: TransformerLM
    module: nn.Module  # the model, or its compiled form (the plain forward)
    optimizer: torch.optim.Optimizer
    tokens: Tensor
    targets: Tensor
    device: str
    block_params: list[dict[str, Tensor]] = field(default_factory=list)  # what each fused block computes with
    head_weight: Tensor | None = None  # the LM head's weight as the forward uses it
    info: dict = field(default_factory=dict)
    graph: torch.cuda.CUDAGraph | None = None  # forward+backward, captured (cuda_graph)
    graph_loss: Tensor | None = None  # the captured loss, rewritten by each replay
    in_backward: BackwardAdamW | None = None  # the optimizer's updates, made in the backward (adamw_in_backward)
    block_fn: Callable[..., Tensor] | None = None  # every block's forward over joined projections (fused_projections)
    loss_fn: Callable[..., Tensor] | None = None  # the final norm, LM head and loss, compiled (compiled_loss)
    rotary_tables: tuple[Tensor, Tensor] | None = None  # block_fn's cos and sin, in bf16 (fused_projections)

    def _fused_logits(self) -> Tensor:
        """Without bf16_weights: the logits of the fused blocks."""
        from cs336sys.leaderboard.fused_block import fused_block_forward

        model = self.model
        x = model.token_embeddings(self.tokens)  # fp32, as under autocast (a lookup is not cast)
        for block, params in zip(model.layers, self.block_params, strict=True):
            x = fused_block_forward(block, params, x)
        return model.lm_head(rms_norm_to(x, model.ln_final.weight, model.ln_final.eps, x.dtype))

    def _hidden(self) -> tuple[Tensor, Tensor | None]:
        """With bf16_weights: the last block's output (fp32, the residual stream), before the final norm,
        as (x, None), or as (x, branch) whose sum it is (`kernel_block`)."""
        model = self.model
        x = model.token_embeddings(self.tokens)  # fp32, as under autocast (a lookup is not cast)
        if self.spec.uses("fused_elementwise"):
            for block, params in zip(model.layers, self.block_params, strict=True):
                x = bf16_block_forward(block, params, x)
        elif self.block_fn is not None and self.spec.uses("backward_kernels"):
            branch = None
            for params in self.block_params:
                x, branch = self.block_fn(x, branch, *(params[name] for name in PROJECTED_BLOCK_INPUTS),
                                          *self.rotary_tables)
            return x, branch
        elif self.block_fn is not None:
            for params in self.block_params:
                x = self.block_fn(x, *(params[name] for name in PROJECTED_BLOCK_INPUTS), *self.rotary_tables)
        else:  # the model's blocks (compiled in place with compile "blocks") over the copies
            for block, params in zip(model.layers, self.block_params, strict=True):
                x = functional_call(block, {name: p for name, p in params.items() if name in MATRICES}, (x,),
                                    strict=False)
        return x, None

    def _loss(self) -> Tensor:
        if not self.spec.uses("bf16_weights"):
            logits = self._fused_logits() if self.spec.uses("fused_elementwise") else self.module(self.tokens)
            return cross_entropy(logits, self.targets)
        (x, branch), norm = self._hidden(), self.model.ln_final
        if self.loss_fn is not None:
            return self.loss_fn(x, norm.weight, self.head_weight, self.targets, branch)
        if branch is not None:
            x = x + branch
        if self.spec.uses("fused_elementwise"):  # (the norm writes bf16, what autocast casts it to)
            return cross_entropy(rms_norm_to(x, norm.weight, norm.eps, torch.bfloat16) @ self.head_weight.T,
                                 self.targets)
        return cross_entropy(norm(x) @ self.head_weight.T, self.targets)

    def _forward_backward(self) -> Tensor:
        with autocast("bf16", self.device):
            loss = self._loss()
        loss.backward()
        if self.in_backward is not None:
            self.in_backward.join()
        return loss.detach()

    def forward_backward(self) -> Tensor:
        """The loss; with `adamw_in_backward` the parameters' updates too."""
        if self.in_backward is not None:
            self.in_backward.begin_step()
        if self.graph is None:
            return self._forward_backward()
        self.graph.replay()
        return self.graph_loss.clone()

    def optimizer_step(self) -> None:
        if self.in_backward is None:  # (else the backward made the updates)
            self.optimizer.step()

    def zero_grad(self) -> None:
        if self.graph is None:  # (a graph's next replay overwrites the gradients in its own buffers)
            self._clear_grads()

    def capture(self, warmup: int = 3) -> None:
        """Capture forward+backward as a CUDA graph: `warmup` passes on a side stream first (compiling,
        autotuning; no parameter changes), then one captured pass with every gradient unset, so the
        graph allocates the gradients and each replay writes them.

        Both on a stream of high priority, which the graph's kernels keep: with the updates inside the
        backward (on a stream of normal priority), the block scheduler starts the backward's blocks
        first and gives the updates what they leave. On one H100 that took 0.15-0.55 ms off the steps
        of small to large, against equal priorities or the updates first
        (notes/runs/2026-11-27-h100-loss-and-layout)."""
        stream = torch.cuda.Stream(self.device, priority=-1)
        stream.wait_stream(torch.cuda.current_stream(self.device))
        if self.in_backward is not None:
            self.in_backward.armed = False
        with torch.cuda.stream(stream):
            for _ in range(warmup):
                self._forward_backward()
                self._clear_grads()
        torch.cuda.current_stream(self.device).wait_stream(stream)
        self._clear_grads()
        if self.in_backward is not None:
            self.in_backward.armed = True
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, stream=stream):
            self.graph_loss = self._forward_backward()

    def _clear_grads(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        self.module.zero_grad(set_to_none=True)

    def run(self) -> Tensor:
        loss = self.forward_backward()
        self.optimizer_step()
        self.zero_grad()
        return loss


# ------------------------------------------------------------------- the bf16 block's own pieces


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


# ---------------------------------------------------------------------------------------- building


def build_optimized_step(spec: OptimizedSpec, device: str, data_seed: int | None = None) -> OptimizedStep:
    """The model, its optimizer and a random batch, built by the plain step builder (same seeds, so the
    same weights and tokens as `build_step` for the same size and seed), then the techniques applied."""
    attention_fn = None
    if spec.uses("flash"):
        attention_fn = pad_head_dim(step_flash_attention)
    factory, optimizer_name = None, "ours"
    if spec.uses("bf16_weights"):
        factory, optimizer_name = (lambda params: MasterCopyAdamW(params, {})), "fused_triton_bf16_copies"
    elif spec.uses("fused_adamw"):
        factory, optimizer_name = FusedAdamW, "fused_triton"
    plain = build_step(StepSpec(size=spec.size, context_length=spec.context_length, batch_size=spec.batch,
                                mode="train_step", dtype="bf16",
                                compile="eager" if spec.uses("fused_elementwise") else spec.compile,
                                attention="flash" if spec.uses("flash") else "naive", optimizer=optimizer_name,
                                seed=spec.seed),
                       device, attention_fn=attention_fn, optimizer_factory=factory, data_seed=data_seed)
    model = plain.model
    blocks = [dict(block.named_parameters()) for block in model.layers]
    head = model.lm_head.weight
    if spec.uses("bf16_weights"):
        copies = plain.optimizer.copies

        def bf16_copy(*masters: Tensor) -> Tensor:
            """One bf16 leaf holding `masters` as consecutive row blocks, each one's rows recorded."""
            leaf = torch.cat([p.detach() for p in masters]).to(torch.bfloat16).requires_grad_()
            start = 0
            for p in masters:
                copies[p] = CopyRows(leaf, slice(start, start + p.shape[0]))
                start += p.shape[0]
            return leaf

        joined = JOINED if spec.uses("fused_projections") else {}
        stacked = {name for names in joined.values() for name in names}

        def bf16_block(params: dict[str, Tensor]) -> dict[str, Tensor]:
            kept = {name: p for name, p in params.items() if name not in MATRICES}
            kept.update({name: bf16_copy(*(params[n] for n in names)) for name, names in joined.items()})
            return kept | {name: bf16_copy(params[name]) for name in MATRICES if name not in stacked}

        blocks = [bf16_block(params) for params in blocks]
        head = bf16_copy(model.lm_head.weight)
    step = OptimizedStep(spec, model, plain.module, plain.optimizer, plain.tokens, plain.targets, device, blocks,
                         head, dict(plain.info))
    if spec.uses("fused_projections") and not spec.uses("fused_elementwise"):
        # the joined tables, made once and cast once to the products' dtype: rotate_pairs' own cast is then
        # the identity (the same values), where every block cast both, in the forward (48 kernels a step at
        # medium, with the tables' own half dozen)
        rope = model.layers[0].attn.rope  # (every block's tables are the same)
        step.rotary_tables = tuple(t.to(torch.bfloat16) for t in joined_rotary_tables(
            rope.cos[: spec.context_length], rope.sin[: spec.context_length]))
        forward = (kernel_block if spec.uses("backward_kernels") else projected_block)(model.layers[0])
        step.block_fn = torch.compile(forward, options=INDUCTOR_OPTIONS) if spec.compile == "blocks" else forward
    if spec.uses("compiled_loss"):
        step.loss_fn = torch.compile(head_loss(model.ln_final.eps), options=INDUCTOR_OPTIONS)
    if spec.uses("adamw_in_backward"):
        step.in_backward = BackwardAdamW(plain.optimizer, device)
    if spec.uses("cuda_graph"):
        if torch.device(device).type != "cuda":
            raise ValueError(f"cuda_graph needs a CUDA device, not {device!r}")
        step.capture()
    return step
