"""Memory, FLOPs and communication of one training step of our Transformer, per GPU.

    python -m cs336sys.accounting --model 2.7B --gpus 8 --strategy fsdp
    python -m cs336sys.accounting --model 10B --gpus 16 --strategy fsdp_tp --tp 4 --hardware h200 --formulas
    python -m cs336sys.accounting --model 8B --gpus 2 --batch-size 1 --context-length 32768 --attention flash \
        --hardware h200 --checkpoint every --loss-chunk-tokens 4096 --compute-copy    # the leaderboard step
    python -m cs336sys.accounting --model 8B --gpus 2 --batch-size 1 --context-length 32768 --attention flash \
        --hardware h200 --checkpoint selective --checkpoint-blocks 24 --loss-chunk-tokens 4096 --compute-copy \
        --fused-elementwise    # ... with fused kernels, attention kept, 24 of 34 blocks checkpointed

Strategies: single (one GPU), ddp (gradients all-reduced), zero1 (DDP + optimizer state sharded, our
ShardedOptimizer), fsdp (matrices sharded, gathered per use), tp (Megatron-style blocks), fsdp_tp
(tensor-parallel groups of --tp GPUs, FSDP across groups). The network model is the handout's: each
GPU sends W bytes/s, collectives are rings (see cs336sys.accounting.communication).
"""

from __future__ import annotations

import argparse
import json
import sys

from cs336sys.accounting.hardware import PRESETS
from cs336sys.accounting.memory import CHECKPOINT_MODES, STRATEGIES
from cs336sys.accounting.plan import BYTES, as_json, make_setup, plan, render
from cs336sys.sizes import SIZES


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m cs336sys.accounting", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="2.7B", help=f"model size, one of: {', '.join(SIZES)} (default: %(default)s)")
    p.add_argument("--gpus", type=int, default=8, help="GPUs in all (default: %(default)s)")
    p.add_argument("--strategy", default="fsdp", help=f"one of: {', '.join(STRATEGIES)} (default: %(default)s)")
    p.add_argument("--tp", type=int, default=None, help="tensor-parallel group size; fsdp_tp needs it, "
                   "tp uses all GPUs (default: none)")
    p.add_argument("--batch-size", type=int, default=None,
                   help="sequences per data-parallel rank (default: the size's batch, 4 for most)")
    p.add_argument("--context-length", type=int, default=2048, help="tokens per sequence (default: %(default)s)")
    p.add_argument("--hardware", default="h100", help=f"preset, one of: {', '.join(PRESETS)} (default: %(default)s)")
    p.add_argument("--flops", type=float, default=None, help="C in TFLOP/s, replacing the preset's")
    p.add_argument("--bandwidth", type=float, default=None,
                   help="W in GB/s (per GPU, each way), replacing the preset's")
    p.add_argument("--memory", type=float, default=None, help="GPU memory in GB, replacing the preset's")
    p.add_argument("--master-dtype", default="fp32", choices=sorted(BYTES),
                   help="parameters, gradients, AdamW moments (default: %(default)s)")
    p.add_argument("--compute-dtype", default="bf16", choices=sorted(BYTES),
                   help="activations and what FSDP and TP send (default: %(default)s)")
    p.add_argument("--attention", default="naive", choices=["naive", "flash"],
                   help="naive keeps the softmax probabilities; flash keeps O and the log-sum-exp "
                        "and skips masked tiles (default: %(default)s)")
    p.add_argument("--checkpoint", default="none", choices=CHECKPOINT_MODES,
                   help="activation checkpointing: none keeps every block's activations; every: a checkpointed "
                        "block keeps only its input and recomputes the rest in its backward; selective: it also "
                        "keeps attention's output (flash only), so the recompute skips it (default: %(default)s)")
    p.add_argument("--checkpoint-blocks", type=int, default=None, metavar="K",
                   help="how many of the L blocks are checkpointed, 0 <= K <= L (default: all, with --checkpoint "
                        "every or selective)")
    p.add_argument("--loss-chunk-tokens", type=int, default=None, metavar="C",
                   help="the loss is computed over chunks of C tokens, so one chunk's logits exist at a time "
                        "(default: the whole logits)")
    p.add_argument("--compute-copy", action="store_true",
                   help="count a copy of the parameters in the compute dtype kept beside the master weights "
                        "(the leaderboard step's optimizer keeps one per FSDP shard)")
    p.add_argument("--fused-elementwise", action="store_true",
                   help="blocks run RMSNorm, the SwiGLU gate and RoPE as the fused kernels of "
                        "cs336sys.leaderboard.fused_ops, which save fewer activations (the leaderboard step's "
                        "fused_elementwise)")
    p.add_argument("--formulas", action="store_true", help="print each row's formula under it")
    p.add_argument("--json", action="store_true", help="print JSON instead of a table")
    return p


def main(argv: list[str] | None = None) -> int:
    p = parser()
    a = p.parse_args(argv)
    try:
        from cs336sys.accounting.hardware import get_hardware
        from cs336sys.sizes import get_size

        hardware = get_hardware(a.hardware).with_overrides(
            flops=a.flops * 1e12 if a.flops else None, bandwidth=a.bandwidth * 1e9 if a.bandwidth else None,
            memory=a.memory * 1e9 if a.memory else None)
        batch = a.batch_size if a.batch_size is not None else get_size(a.model).batch_size
        setup = make_setup(a.model, a.gpus, a.strategy, hardware, tp=a.tp, batch_size=batch,
                           context_length=a.context_length, master_dtype=a.master_dtype,
                           compute_dtype=a.compute_dtype, attention=a.attention, checkpoint=a.checkpoint,
                           checkpoint_blocks=a.checkpoint_blocks, loss_chunk_tokens=a.loss_chunk_tokens,
                           compute_copy=a.compute_copy, fused_elementwise=a.fused_elementwise)
    except ValueError as e:
        p.error(str(e))
    result = plan(setup)
    sys.stdout.write(json.dumps(as_json(result), indent=1) + "\n" if a.json else render(result, a.formulas))
    return 0


if __name__ == "__main__":
    sys.exit(main())
