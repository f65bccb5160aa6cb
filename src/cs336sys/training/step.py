"""One step builder for every experiment that runs the Transformer: a small spec in, model,
optimizer, data and a step function out.

    spec = StepSpec(size="2.7B", context_length=512, mode="train_step", dtype="bf16")
    step = build_step(spec, device="cuda:0")                       # single GPU
    step = build_step(spec, device, parallelize=BucketedDDP, ...)  # applied from outside the model
    step.run()                                                      # one step

Parallelism is applied to an unchanged model from outside (torchtitan style): `parallelize`
wraps the model (DDP, FSDP ...); `optimizer_factory` builds the optimizer over the wrapped module's
parameters (a sharded optimizer, say). A wrapper may define `on_train_batch_start()` (called before
the forward) and `finish_gradient_synchronization()` (called after the backward, before the
optimizer step), the hooks the course's DDP and FSDP adapters name. Names in the spec are what the
result records; the callables come from the experiment, so that a module's code hash covers exactly
what it runs (this module imports no parallelism and no Triton).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import torch
from torch import nn

from cs336sys.dtypes import autocast, check_dtype
from cs336sys.model import AttentionFn, TransformerLM, build_model
from cs336sys.optim import cross_entropy, make_optimizer
from cs336sys.sizes import forward_flops, get_size, parameter_count, train_step_flops

MODES = ("forward", "forward_backward", "train_step")
COMPILE = ("eager", "blocks", "full")


@dataclass(frozen=True)
class StepSpec:
    """What one step is. `dtype` is the autocast dtype (fp32 = none); parameters stay fp32."""

    size: str
    context_length: int
    batch_size: int | None = None  # None: the size's default
    mode: str = "train_step"  # forward | forward_backward | train_step
    dtype: str = "fp32"
    compile: str = "eager"  # eager | blocks (each TransformerBlock) | full (the whole model)
    attention: str = "naive"  # a name the model knows ("naive", "sdpa"), or the name of `attention_fn`
    checkpoint_blocks: int = 0
    optimizer: str = "ours"  # ours | torch_fused, or the name of `optimizer_factory`
    seed: int = 0

    def __post_init__(self) -> None:
        get_size(self.size)
        check_dtype(self.dtype)
        if self.mode not in MODES:
            raise ValueError(f"unknown mode {self.mode!r}; known: {', '.join(MODES)}")
        if self.compile not in COMPILE:
            raise ValueError(f"unknown compile mode {self.compile!r}; known: {', '.join(COMPILE)}")
        if self.context_length < 1:
            raise ValueError(f"context_length must be positive, got {self.context_length}")

    @property
    def batch(self) -> int:
        return self.batch_size or get_size(self.size).batch_size


def _no_range(name: str) -> contextlib.AbstractContextManager:
    return contextlib.nullcontext()


@dataclass
class Step:
    """A built step. `run()` does one whole step; the parts are exposed for experiments that time
    phases separately (forward_backward, sync, optimizer_step). `phase(name)` brackets each phase
    ("forward", "backward", "sync", "optimizer_step"); profiling runs set it to a function that
    opens a profiler/NVTX range, everything else leaves it a no-op."""

    spec: StepSpec
    model: TransformerLM  # the unwrapped model
    module: nn.Module  # what is called: the model, wrapped and/or compiled
    optimizer: torch.optim.Optimizer | None
    tokens: torch.Tensor
    targets: torch.Tensor
    device: str
    info: dict = field(default_factory=dict)
    phase: Callable[[str], contextlib.AbstractContextManager] = _no_range

    def forward(self) -> None:
        with self.phase("forward"), torch.no_grad(), autocast(self.spec.dtype, self.device):
            self.module(self.tokens)

    def forward_backward(self) -> torch.Tensor:
        start = getattr(self.module, "on_train_batch_start", None)
        if start is not None:
            start()
        with self.phase("forward"), autocast(self.spec.dtype, self.device):
            loss = cross_entropy(self.module(self.tokens), self.targets)
        with self.phase("backward"):
            loss.backward()
        return loss

    def sync(self) -> None:
        finish = getattr(self.module, "finish_gradient_synchronization", None)
        if finish is not None:
            with self.phase("sync"):
                finish()

    def optimizer_step(self) -> None:
        if self.optimizer is not None:
            with self.phase("optimizer_step"):
                self.optimizer.step()

    def zero_grad(self) -> None:
        if self.optimizer is not None:
            self.optimizer.zero_grad(set_to_none=True)
        self.module.zero_grad(set_to_none=True)

    def run(self) -> None:
        if self.spec.mode == "forward":
            self.forward()
            return
        self.forward_backward()
        self.sync()
        if self.spec.mode == "train_step":
            self.optimizer_step()
        self.zero_grad()


def build_step(spec: StepSpec, device: str, *, attention_fn: AttentionFn | None = None,
               parallelize: Callable[[nn.Module], nn.Module] | None = None,
               optimizer_factory: Callable[[Iterable[nn.Parameter]], torch.optim.Optimizer] | None = None,
               data_seed: int | None = None) -> Step:
    """Build the model (seeded by `spec.seed`, identical on every rank), wrap it, compile it, make
    the optimizer (train_step only) and a random batch (seeded by `data_seed`: give each rank its
    own)."""
    size = get_size(spec.size)
    torch.manual_seed(spec.seed)
    if attention_fn is None and spec.attention not in ("naive", "sdpa"):
        raise ValueError(f"attention {spec.attention!r} needs its function passed as attention_fn")
    model = build_model(size, spec.context_length, device=device, attention=attention_fn or spec.attention,
                        checkpoint_blocks=spec.checkpoint_blocks)
    if spec.compile != "eager":
        torch._dynamo.reset()  # each build compiles afresh; no guards or graphs left from the last one
    if spec.compile == "blocks":
        for block in model.layers:
            block.compile()
    module: nn.Module = parallelize(model) if parallelize is not None else model
    if spec.compile == "full":
        module = torch.compile(module)
    optimizer = None
    if spec.mode == "train_step":
        if optimizer_factory is not None:
            optimizer = optimizer_factory(module.parameters())
        else:
            optimizer = make_optimizer(module.parameters(), spec.optimizer)
    generator = torch.Generator(device="cpu").manual_seed(spec.seed if data_seed is None else data_seed)
    tokens, targets = (torch.randint(0, size.vocab_size, (spec.batch, spec.context_length), generator=generator)
                       .to(device) for _ in range(2))
    flops = (forward_flops if spec.mode == "forward" else train_step_flops)(size, spec.batch, spec.context_length)
    info = {"batch_size": spec.batch, "parameters": parameter_count(size), "flops_per_step": flops}
    return Step(spec, model, module, optimizer, tokens, targets, device, info)
