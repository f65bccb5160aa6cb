"""The strongest PyTorch-native step we could build at our entry's memory: the comparison the
leaderboard section's headline ratio is taken against.

    step = build_pytorch_native_step(spec, "cuda:0", NativeOptions(checkpoint_saves="attention"))
    step.run()                                   # inside a process group, as the other variants

Only PyTorch's own parts, composed as PyTorch's large-model recipes compose them (checkpoint, then
compile, then shard, block by block):

- FSDP2 (`fully_shard`) on each TransformerBlock and on a root that owns the embedding, the final norm
  and the head, with `MixedPrecisionPolicy(param_dtype=<compute dtype>, reduce_dtype=<reduce_dtype>)`
  (fp32 reductions by default: what ours does), each block's all-gather prefetched one block ahead in
  the forward (`set_modules_to_forward_prefetch`; FSDP2 prefetches the backward's itself);
- attention through SDPA restricted to one backend (`sdpa_kernel`, cuDNN's by default) on CUDA; on the
  CPU the setting is ignored and SDPA picks its CPU kernel;
- PyTorch's checkpointing API per block (`torch.utils.checkpoint`, non-reentrant), with a policy:
  `spec.checkpoint_blocks` says which blocks are checkpointed (the others keep every activation), and
  `checkpoint_saves` what a checkpointed block still saves through selective activation checkpointing
  (`create_selective_checkpoint_contexts`): nothing, or attention's outputs (SDPA's fused op: its
  forward then runs once, not twice). The last `matmul_blocks` checkpointed blocks also save every
  matrix product's output, so their recompute is only the elementwise work (norms, RoPE, SiLU, adds);
- `torch.compile` of each (checkpointed) block, and of the loss's chunk;
- the LM head and cross-entropy in compiled, checkpointed chunks of `ce_chunk_tokens` tokens (one
  chunk's logits exist at a time, recomputed in the backward), each chunk's mean weighted by its share;
- `torch.optim.AdamW(fused=True)` on CUDA (foreach on the CPU, as the baseline).

Why this and not `pytorch_parts` alone: that recipe checkpoints every block and peaks near 78 GB a GPU,
where our entry keeps 10 blocks and attention's outputs and peaks at 130 GB; a ratio between the two
mixes a memory policy that PyTorch's checkpointing API can express with our kernels. The grid's
`pytorch_native_*` configs are points of this policy within our entry's peak (config/next.yaml says
the arithmetic).

The model's parameters keep their modules; only the module tree gains wrappers (`_Checkpointed`'s
`block.`, `torch.compile`'s `_orig_mod.`), which `plain_name` strips.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
from torch import Tensor, nn
from torch.utils.checkpoint import CheckpointPolicy, checkpoint, create_selective_checkpoint_contexts

from cs336sys.dtypes import torch_dtype
from cs336sys.leaderboard.baseline import PytorchPartsStep
from cs336sys.leaderboard.step import LeaderboardSpec, check_world_size, checkpointed_blocks, random_batch
from cs336sys.model import TransformerLM, build_model
from cs336sys.optim import cross_entropy
from cs336sys.sizes import parameter_count, train_step_flops

SAVES = ("nothing", "attention")
SDPA_BACKENDS = ("cudnn", "flash", "efficient", "math", "any")
REDUCE_DTYPES = ("fp32", "bf16")
BLOCK_POLICIES = ("kept", "recompute", "save_attention", "save_matmuls")

_aten = torch.ops.aten
# SDPA's fused forward ops (what `F.scaled_dot_product_attention` dispatches to, one per backend)
SDPA_OPS = frozenset([
    _aten._scaled_dot_product_cudnn_attention.default,
    _aten._scaled_dot_product_flash_attention.default,
    _aten._scaled_dot_product_efficient_attention.default,
    _aten._scaled_dot_product_flash_attention_for_cpu.default,
])
MATMUL_OPS = frozenset([_aten.mm.default, _aten.addmm.default, _aten.bmm.default])


@dataclass(frozen=True)
class NativeOptions:
    """The PyTorch-native step's settings beyond the spec (see the module docstring)."""

    checkpoint_saves: str = "nothing"
    matmul_blocks: int = 0
    compile_blocks: bool = True
    reduce_dtype: str = "fp32"
    sdpa_backend: str = "cudnn"

    def __post_init__(self) -> None:
        for name, allowed in (("checkpoint_saves", SAVES), ("sdpa_backend", SDPA_BACKENDS),
                              ("reduce_dtype", REDUCE_DTYPES)):
            if getattr(self, name) not in allowed:
                raise ValueError(f"{name} must be one of {', '.join(allowed)}, got {getattr(self, name)!r}")
        if not isinstance(self.matmul_blocks, int) or self.matmul_blocks < 0:
            raise ValueError(f"matmul_blocks must be a non-negative integer, got {self.matmul_blocks!r}")


def block_policies(spec: LeaderboardSpec, options: NativeOptions) -> list[str]:
    """Each block's policy (one of BLOCK_POLICIES): blocks not checkpointed are "kept"; of the checkpointed
    ones, the last `matmul_blocks` save the products' and attention's outputs, the others what
    `checkpoint_saves` says. ValueError when more matmul blocks are asked for than are checkpointed."""
    layers = spec.model_size.num_layers
    checkpointed = sorted(checkpointed_blocks(spec.checkpoint_blocks, layers))
    if options.matmul_blocks > len(checkpointed):
        raise ValueError(f"matmul_blocks={options.matmul_blocks}, but only {len(checkpointed)} blocks are "
                         "checkpointed")
    matmuls = set(checkpointed[len(checkpointed) - options.matmul_blocks:])
    default = "recompute" if options.checkpoint_saves == "nothing" else "save_attention"
    return ["kept" if i not in checkpointed else "save_matmuls" if i in matmuls else default for i in range(layers)]


def _saving(ops: frozenset) -> Callable:
    def policy(ctx, op, *args, **kwargs) -> CheckpointPolicy:
        return CheckpointPolicy.MUST_SAVE if op in ops else CheckpointPolicy.PREFER_RECOMPUTE

    return functools.partial(create_selective_checkpoint_contexts, policy)


_SAVE_ATTENTION = _saving(SDPA_OPS)
_SAVE_MATMULS = _saving(SDPA_OPS | MATMUL_OPS)


class _Checkpointed(nn.Module):
    """A block run under `torch.utils.checkpoint` (non-reentrant), recomputing everything but its input.

    One class per policy, each naming its context in its own `forward`: dynamo keys a compiled graph by
    the module's type and does not guard an attribute that holds the context, so blocks of two policies
    sharing one class shared the first one's graph (counted on the CPU: 2 graphs for 3 kinds of block)."""

    def __init__(self, block: nn.Module):
        super().__init__()
        self.block = block

    def forward(self, x: Tensor) -> Tensor:
        return checkpoint(self.block, x, use_reentrant=False, preserve_rng_state=False)


class _SavingAttention(_Checkpointed):
    """Selective checkpointing: SDPA's outputs saved, everything else recomputed."""

    def forward(self, x: Tensor) -> Tensor:
        return checkpoint(self.block, x, use_reentrant=False, preserve_rng_state=False, context_fn=_SAVE_ATTENTION)


class _SavingMatmuls(_Checkpointed):
    """Selective checkpointing: SDPA's and every matrix product's outputs saved, the elementwise work recomputed."""

    def forward(self, x: Tensor) -> Tensor:
        return checkpoint(self.block, x, use_reentrant=False, preserve_rng_state=False, context_fn=_SAVE_MATMULS)


WRAPPERS: dict[str, type[_Checkpointed]] = {"recompute": _Checkpointed, "save_attention": _SavingAttention,
                                            "save_matmuls": _SavingMatmuls}


def _chunk_loss(h: Tensor, weight: Tensor, targets: Tensor, share: float) -> Tensor:
    return cross_entropy(h @ weight.T, targets) * share


def _checkpointed_chunk_loss(h: Tensor, weight: Tensor, targets: Tensor, share: float) -> Tensor:
    return checkpoint(_chunk_loss, h, weight, targets, share, use_reentrant=False)


class _NativeRoot(nn.Module):
    """tokens, targets -> mean cross-entropy: embedding, the (wrapped) blocks, ln_final, chunked head + loss."""

    def __init__(self, model: TransformerLM, chunk_tokens: int, chunk_loss: Callable):
        super().__init__()
        self.model = model
        self.chunk_tokens = chunk_tokens
        self.chunk_loss = chunk_loss

    def forward(self, tokens: Tensor, targets: Tensor) -> Tensor:
        model = self.model
        x = model.token_embeddings(tokens)
        for layer in model.layers:
            x = layer(x)
        h = model.ln_final(x)
        h, targets = h.reshape(-1, h.shape[-1]), targets.reshape(-1)
        n = h.shape[0]
        loss = None
        for start in range(0, n, self.chunk_tokens):
            end = min(start + self.chunk_tokens, n)
            part = self.chunk_loss(h[start:end], model.lm_head.weight, targets[start:end], (end - start) / n)
            loss = part if loss is None else loss + part
        return loss


def plain_name(name: str) -> str:
    """A parameter's name in the plain model: the wrappers' path components dropped."""
    return ".".join(p for p in name.split(".") if p not in ("_orig_mod", "block", "model"))


def _sdpa_backend(name: str, device: str) -> contextlib.AbstractContextManager:
    if name == "any" or torch.device(device).type != "cuda":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    backend = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION,
               "efficient": SDPBackend.EFFICIENT_ATTENTION, "math": SDPBackend.MATH}[name]
    return sdpa_kernel(backend)


@dataclass
class PytorchNativeStep(PytorchPartsStep):
    """`PytorchPartsStep`'s loop (FSDP2 finishes its own reductions) with the SDPA backend held over the
    forward and the backward (the backward's recomputes call SDPA again)."""

    policies: list[str] = field(default_factory=list)
    sdpa: str = "any"

    def forward_backward(self) -> Tensor:
        with _sdpa_backend(self.sdpa, self.device):
            return super().forward_backward()


def wrap_blocks(model: TransformerLM, policies: list[str], backend: str | None = "inductor") -> list[nn.Module]:
    """Each block in its policy's checkpoint wrapper (none where "kept"), then compiled by `backend` (None:
    not compiled), in place in `model.layers`; returns the new blocks."""
    for i, policy in enumerate(policies):
        block = model.layers[i]
        if policy != "kept":
            block = WRAPPERS[policy](block)
        model.layers[i] = block if backend is None else torch.compile(block, backend=backend)
    return list(model.layers)


def build_pytorch_native_step(spec: LeaderboardSpec, device: str | torch.device, options: NativeOptions,
                              data_seed: int | None = None) -> PytorchNativeStep:
    """FSDP2 needs a process group: ValueError without one. Every build starts from dynamo's reset and
    empty in-memory Inductor caches, so a config's warm-up compiles its own graphs (a cold start, as the
    handout's 10 minutes count it) whatever ran before it in the process."""
    from torch._inductor.utils import clear_inductor_caches
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    if not dist.is_initialized():
        raise ValueError("the PyTorch-native step needs a process group (FSDP2 shards over a device mesh of it); "
                         "run it under torchrun or cs336sys.distributed.spawn")
    rank, world = check_world_size(spec)
    policies = block_policies(spec, options)
    size = spec.model_size
    device = str(device)
    torch._dynamo.reset()
    clear_inductor_caches()  # the graphs compiled for an earlier config stay in memory otherwise (fresh dirs or not)
    torch.manual_seed(spec.seed)
    model = build_model(size, spec.context_length, device=device, attention="sdpa")
    chunk_loss = torch.compile(_checkpointed_chunk_loss) if options.compile_blocks else _checkpointed_chunk_loss
    root = _NativeRoot(model, spec.ce_chunk_tokens, chunk_loss)
    mp = MixedPrecisionPolicy(param_dtype=torch_dtype(spec.compute_dtype),
                              reduce_dtype=torch_dtype(options.reduce_dtype))
    blocks = wrap_blocks(model, policies, "inductor" if options.compile_blocks else None)
    for block in blocks:
        fully_shard(block, mp_policy=mp, reshard_after_forward=spec.reshard_after_forward)
    fully_shard(root, mp_policy=mp)  # every rank built the same seed: nothing to broadcast
    for block, following in zip(blocks, blocks[1:], strict=False):
        block.set_modules_to_forward_prefetch([following])
    params = list(root.parameters())
    fused = {"fused": True} if torch.device(device).type == "cuda" else {"foreach": True}
    optimizer = torch.optim.AdamW(params, lr=spec.lr, eps=spec.eps, weight_decay=spec.weight_decay, **fused)
    tokens, targets = random_batch(size, spec.batch_per_rank, spec.context_length,
                                   spec.seed + 1 + rank if data_seed is None else data_seed, device)
    batch = spec.batch_per_rank * world
    info = {"batch_size": batch, "batch_per_rank": spec.batch_per_rank, "world_size": world,
            "parameters": parameter_count(size), "flops_per_step": train_step_flops(size, batch, spec.context_length),
            "block_policies": policies}
    return PytorchNativeStep(spec, model, root, optimizer, tokens, targets, device, info, policies=policies,
                             sdpa=options.sdpa_backend)
