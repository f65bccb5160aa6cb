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
  at the step's shapes: `step_blocks.STEP_TILES`) instead of the naive attention's materialised
  scores; a head dimension the kernels do not take (the "2.7B"'s 80) is zero-padded to the next one
  they do (`step_blocks.pad_head_dim`);
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
  accumulated its gradient (`step_updates.BackwardAdamW`, a post-accumulate-grad hook), on a side stream on CUDA,
  so that the optimizer's memory-bound passes run beside the rest of the backward's products instead
  of after them; the optimizer step is then empty. With `cuda_graph` the graph captures the updates
  too, their step size read from device memory (written before each replay). Needs `fused_adamw`.
- `fused_projections`: q, k and v's bf16 copies are row blocks of one matrix, as are w1's and w3's, so
  each block multiplies by one (3 d_model, d_model) and one (2 d_ff, d_model) weight: one matmul where
  there were three (two) in the forward, and in each of the backward's two products; the optimizer
  reads each master's gradient as its rows of the matrix's and writes its rows of the copy. The
  model's forward would issue the products one by one (Inductor does not merge them), so the blocks
  run `step_blocks.projected_block`, the block's ops written out with the joined products (compiled once for
  every block with compile "blocks"). Needs `bf16_weights`.
- `compiled_loss`: the final norm, the LM head and the cross-entropy compiled as one function
  (`step_blocks.head_loss`), where they ran eager after the compiled blocks. Needs `bf16_weights`.
- `backward_kernels`: the blocks run `step_blocks.kernel_block`, `projected_block` with two backwards of
  our own (`cs336sys.training.step_kernels`), where Inductor's ran below the copy bandwidth: RoPE's, one
  kernel from the attention's three gradients into the joined projection's, and each norm's, one pass
  that also sums the weight's gradient and adds the residual's (each residual add moves into the
  norm after it, the block's last into the next block's first). Needs `fused_projections`; with
  `fused_elementwise` (blocks with hand-written backwards of their own) it changes nothing.

The step's own compiled functions (`projected_block`, `head_loss`, not the model's blocks) are
compiled with Inductor's coordinate-descent tuning of each kernel's launch (`INDUCTOR_OPTIONS`): on one
H100 it took 0.1-0.35 ms off the steps of small to xl (notes/runs/2026-11-27-h100-loss-and-layout).

This module holds the configuration, the step and its building; the step's optimizers are in
`cs336sys.training.step_updates`, its blocks, loss and attention in `cs336sys.training.step_blocks`, and
the kernels only it uses in `cs336sys.training.step_kernels`.

Exactness: under autocast a weight's gradient is the bf16 product's, upcast by the cast's backward,
so `bf16_weights` computes the same gradients; the fused kernels round once where the model's ops
round after every op, and flash accumulates in another order: the loss and updated parameters agree
with the plain step within bf16 rounding (tests/test_optimized_step.py).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import Tensor, nn
from torch.func import functional_call

from cs336sys.dtypes import autocast
from cs336sys.leaderboard.adamw import FusedAdamW
from cs336sys.model import TransformerLM
from cs336sys.optim import cross_entropy
from cs336sys.sizes import get_size
from cs336sys.training.step import COMPILE, StepSpec, build_step
from cs336sys.training.step_blocks import (
    JOINED,
    PROJECTED_BLOCK_INPUTS,
    bf16_block_forward,
    head_loss,
    joined_rotary_tables,
    kernel_block,
    pad_head_dim,
    projected_block,
    rms_norm_to,
    step_flash_attention,
)
from cs336sys.training.step_updates import BackwardAdamW, CopyRows, MasterCopyAdamW

TECHNIQUES = ("fused_adamw", "fused_elementwise", "flash", "bf16_weights", "cuda_graph", "adamw_in_backward",
              "fused_projections", "compiled_loss", "backward_kernels")
NEEDS = {"bf16_weights": ("fused_adamw",), "adamw_in_backward": ("fused_adamw",),
         "fused_projections": ("bf16_weights",), "compiled_loss": ("bf16_weights",),
         "backward_kernels": ("fused_projections",)}
MATRICES = ("attn.q_proj.weight", "attn.k_proj.weight", "attn.v_proj.weight", "attn.output_proj.weight",
            "ffn.w1.weight", "ffn.w2.weight", "ffn.w3.weight")  # a block's weights kept in bf16
INDUCTOR_OPTIONS = {"coordinate_descent_tuning": True}  # the step's own compiled functions (not the model's blocks)


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
