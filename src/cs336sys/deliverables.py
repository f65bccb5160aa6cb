"""Every deliverable of the two handouts (CS336 Assignment 2, 2025 and 2026 editions), as plain data.

Transcribed by hand from the handouts' problem boxes: one entry per lettered part, or one for a problem
without parts; one entry for both editions where the part asks the same thing (the 2026 edition calls the
2.7B model "xl"), separate entries where an edition asks something else or alone. `ask` is our summary of the
question, `form` the form the handout asks for. The report's index maps each entry to the heading that
answers it (`cs336sys.writeup.markup.answers`); `tests/test_deliverables.py` checks the list against the
handouts' problem boxes where the handouts are present.

No torch here: the workflow imports this at parse time.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from cs336sys.registry import SECTIONS

BOTH = ("2025", "2026")
OLD = ("2025",)
NEW = ("2026",)


@dataclass(frozen=True)
class Deliverable:
    problem: str  # the handout's problem name
    part: str  # "a", "b", ... or "" for a problem without lettered parts
    editions: tuple[str, ...]
    ask: str  # what is asked, in our words
    form: str  # the deliverable's form as the handout states it
    section: str  # the report section that answers it (cs336sys.registry.SECTIONS)

    @property
    def key(self) -> str:
        return f"{self.problem}-{self.part}" if self.part else self.problem


def _d(problem: str, part: str, editions: tuple[str, ...], ask: str, form: str, section: str) -> Deliverable:
    return Deliverable(problem, part, editions, ask, form, section)


DELIVERABLES: tuple[Deliverable, ...] = (
    # Profiling and benchmarking
    _d("benchmarking_script", "a", BOTH, "A script timing forward, forward+backward and a full train step",
       "code", "benchmarking"),
    _d("benchmarking_script", "b", BOTH, "Forward and backward times for every model size; is the spread small?",
       "1-2 sentences", "benchmarking"),
    _d("benchmarking_script", "c", BOTH, "The same without warm-up and with 1-2 warm-up steps: what changes, why",
       "2-3 sentences", "benchmarking"),
    _d("nsys_profile", "a", BOTH, "Total forward time from the profiler against the Python timer",
       "1-2 sentences", "profiling"),
    _d("nsys_profile", "b", BOTH, "The kernel with the most GPU time in the forward, its calls; also with backward?",
       "1-2 sentences", "profiling"),
    _d("nsys_profile", "c", BOTH, "Non-matmul kernels that take noticeable time in the forward",
       "1-2 sentences", "profiling"),
    _d("nsys_profile", "d", BOTH, "How the matmul share changes from inference to a full train step",
       "1-2 sentences", "profiling"),
    _d("nsys_profile", "e", BOTH, "Softmax against the attention matmuls: runtime against FLOPs",
       "1-2 sentences", "profiling"),
    _d("mixed_precision_accumulation", "", BOTH, "The four accumulation loops: their values and why",
       "2-3 sentences", "precision"),
    _d("benchmarking_mixed_precision", "a", BOTH, "dtypes of parameters, activations, loss and gradients under "
       "autocast", "the dtypes", "precision"),
    _d("benchmarking_mixed_precision", "b", BOTH, "Why layer norm is special under fp16, and whether bf16 changes it",
       "2-3 sentences", "precision"),
    _d("benchmarking_mixed_precision", "c", BOTH, "fp32 against bf16 autocast timings for every size, and the trend",
       "2-3 sentences", "benchmarking"),
    _d("memory_profiling", "a", BOTH, "Active-memory timelines of a forward pass and of a train step",
       "two images + 2-3 sentences", "memory"),
    _d("memory_profiling", "b", BOTH, "Peak memory per context length, forward and train step",
       "a table", "memory"),
    _d("memory_profiling", "c", BOTH, "Peak memory of the 2.7B (2026: xl) model with mixed precision",
       "2-3 sentences", "memory"),
    _d("memory_profiling", "d", BOTH, "The size of one residual-stream activation, derived",
       "1-2 sentences with the derivation", "memory"),
    _d("memory_profiling", "e", BOTH, "The largest allocations and the code they come from",
       "1-2 sentences", "memory"),
    _d("memory_profiling", "f", NEW, "Saved-for-backward bytes of one TransformerBlock, its top five ops, gradients",
       "1-2 sentences + numbers", "memory"),
    _d("gradient_checkpointing", "a", NEW, "The memory-optimal checkpointing strategy, its memory and compute",
       "strategy + asymptotics", "memory"),
    _d("gradient_checkpointing", "b", NEW, "One level of checkpointing on the xl model: peak memory by block size",
       "measurements + 2-3 sentences", "memory"),
    # Attention
    _d("pytorch_attention", "a", BOTH, "Naive attention timed over d and sequence length; memory; the OOM accounting",
       "table + accounting + 1-2 paragraphs", "attention"),
    _d("torch_compile", "a", BOTH, "Compiled against eager attention over the same grid", "a table", "attention"),
    _d("torch_compile", "b", BOTH, "The whole model compiled against eager: forward and full train step",
       "a table", "benchmarking"),
    _d("flash_forward", "a", BOTH, "FlashAttention-2 forward as a tiled PyTorch autograd.Function",
       "code", "attention"),
    _d("flash_forward", "b", BOTH, "The forward as one fused Triton kernel", "code", "attention"),
    _d("flash_forward", "c", BOTH, "A causal-masking flag", "code", "attention"),
    _d("flash_backward", "", BOTH, "The backward by recomputation (compiled PyTorch, or Triton)", "code",
       "attention"),
    _d("flash_benchmarking", "a", BOTH, "do_bench of ours against PyTorch: forward, backward and both, over the grid",
       "a table", "attention"),
    # Distributed data parallel
    _d("distributed_communication_single_node", "", BOTH, "All-reduce time over sizes and process counts, "
       "gloo and NCCL", "plots/tables + 2-3 sentences", "ddp"),
    _d("naive_ddp", "", BOTH, "DDP by all-reducing each gradient, checked against single-process training",
       "code", "ddp"),
    _d("naive_ddp_benchmarking", "", BOTH, "Step time and time communicating of naive DDP on 2 GPUs",
       "1-2 sentences", "ddp"),
    _d("minimal_ddp_flat_benchmarking", "", BOTH, "One flattened all-reduce, compared with naive DDP",
       "1-2 sentences", "ddp"),
    _d("ddp_overlap_individual_parameters", "", BOTH, "A DDP wrapper that overlaps all-reduces with the backward",
       "code", "ddp"),
    _d("ddp_overlap_individual_parameters_benchmarking", "a", BOTH, "Its step time against the previous two",
       "1-2 sentences", "ddp"),
    _d("ddp_overlap_individual_parameters_benchmarking", "b", BOTH, "Profiler timelines showing overlap in one "
       "and not in the other", "2 screenshots", "ddp"),
    _d("ddp_overlap_bucketed", "", OLD, "DDP with gradient buckets of a given size", "code", "ddp"),
    _d("ddp_bucketed_benchmarking", "a", OLD, "Step time for the four bucket sizes the handout names",
       "1-2 sentences", "ddp"),
    _d("ddp_bucketed_benchmarking", "b", OLD, "A model of bucketing overhead and the optimal bucket size",
       "equations", "ddp"),
    # Sharding
    _d("optimizer_state_sharding", "", BOTH, "A sharded optimizer wrapping any optimizer class", "code", "sharding"),
    _d("optimizer_state_sharding_accounting", "a", BOTH, "Peak memory with and without optimizer sharding, "
       "by phase", "2-3 sentences + breakdown", "sharding"),
    _d("optimizer_state_sharding_accounting", "b", BOTH, "Step time with and without optimizer sharding",
       "2-3 sentences", "sharding"),
    _d("optimizer_state_sharding_accounting", "c", BOTH, "How our sharding differs from ZeRO stage 1",
       "2-3 sentences", "sharding"),
    _d("fsdp", "", NEW, "FSDP of Linear and Embedding weights with prefetched all-gathers", "code", "sharding"),
    _d("fsdp_accounting", "a", NEW, "The memory FSDP should save, against what it saves", "1-2 sentences",
       "sharding"),
    _d("fsdp_accounting", "b", NEW, "Do the all-gathers finish before each layer needs them?", "timeline + 1-2 "
       "sentences", "sharding"),
    # Accounting
    _d("communication_accounting", "a", OLD, "Memory of weights, gradients and optimizer state of the XXL model",
       "calculation + 1 sentence", "accounting"),
    _d("communication_accounting", "b", OLD, "Devices FSDP needs for the XXL model under a memory limit",
       "an expression", "accounting"),
    _d("communication_accounting", "c", OLD, "The batch per device at which FSDP + TP becomes compute-bound",
       "a number + the working", "accounting"),
    _d("communication_accounting", "d", OLD, "How to shrink the batch and keep throughput", "1-2 paragraphs",
       "accounting"),
    _d("alternate_ring_all_reduce", "", NEW, "Time of the alternate ring all-reduce against the ring's",
       "an expression + 1 sentence", "accounting"),
    _d("data_parallel_calcs", "a", NEW, "Backward FLOPs with data parallelism", "an expression", "accounting"),
    _d("data_parallel_calcs", "b", NEW, "Backward communication time with data parallelism", "an expression",
       "accounting"),
    _d("data_parallel_calcs", "c", NEW, "How large the data-parallel degree can grow before communication-bound",
       "an expression", "accounting"),
    _d("fsdp_calcs", "a", NEW, "Forward and backward FLOPs with FSDP", "expressions", "accounting"),
    _d("fsdp_calcs", "b", NEW, "Forward and backward communication time with FSDP", "expressions", "accounting"),
    _d("fsdp_calcs", "c", NEW, "How large the FSDP degree can grow before communication-bound", "an expression",
       "accounting"),
    _d("tp_calcs", "a", NEW, "The backward pass of the tensor-parallel FFN, written out", "equations",
       "accounting"),
    _d("tp_calcs", "b", NEW, "Forward and backward FLOPs with tensor parallelism", "expressions", "accounting"),
    _d("tp_calcs", "c", NEW, "Forward and backward communication time with tensor parallelism", "expressions",
       "accounting"),
    _d("tp_calcs", "d", NEW, "How large the TP degree can grow before communication-bound", "an expression",
       "accounting"),
    _d("fsdp_tp_calcs", "a", NEW, "Forward FLOPs with FSDP and TP together", "an expression", "accounting"),
    _d("fsdp_tp_calcs", "b", NEW, "Forward communication time with FSDP and TP", "an expression", "accounting"),
    _d("fsdp_tp_calcs", "c", NEW, "The largest N under the best split, the axes overlapped", "an expression",
       "accounting"),
    _d("fsdp_tp_calcs", "d", NEW, "The same when the two axes share the network", "an expression", "accounting"),
    # Leaderboards
    _d("flash_leaderboard", "", OLD, "Fastest FlashAttention-2 forward+backward at 16 heads, 16,384 tokens, d 64",
       "a time", "attention"),
    _d("leaderboard", "", NEW, "Fastest full training step of the 8B model on two GPUs", "a time", "leaderboard"),
)


def by_key(key: str) -> Deliverable:
    for d in DELIVERABLES:
        if d.key == key:
            return d
    close = difflib.get_close_matches(key, [d.key for d in DELIVERABLES], n=3)
    raise ValueError(f"no deliverable {key!r}" + (f"; did you mean {', '.join(close)}?" if close else ""))


def of_section(section: str) -> list[Deliverable]:
    if section not in SECTIONS:
        raise ValueError(f"section {section!r} is not in cs336sys.registry.SECTIONS")
    return [d for d in DELIVERABLES if d.section == section]
