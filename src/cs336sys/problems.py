"""The assignment's problems (SPEC numbering), and which result problems and report section cover each."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Problem:
    number: int
    name: str
    edition: str
    section: str
    results: tuple[str, ...] = ()  # the `problem` field of result files that answer it


PROBLEMS: list[Problem] = [
    Problem(1, "benchmarking_script", "both", "benchmarking", ("benchmarking", "warmup")),
    Problem(2, "nsys_profile", "both", "profiling"),
    Problem(3, "mixed_precision_accumulation", "both", "precision", ("mixed_precision_accumulation",)),
    Problem(4, "benchmarking_mixed_precision", "both", "precision", ("autocast_dtypes", "benchmarking")),
    Problem(5, "memory_profiling", "both", "memory"),
    Problem(6, "gradient_checkpointing", "2026", "memory"),
    Problem(7, "pytorch_attention", "both", "attention", ("pytorch_attention",)),
    Problem(8, "torch_compile", "both", "attention", ("pytorch_attention", "benchmarking")),
    Problem(9, "flash_forward", "both", "attention", ("flash_benchmarking",)),
    Problem(10, "flash_backward", "both", "attention", ("flash_benchmarking",)),
    Problem(11, "flash_benchmarking", "both", "attention", ("flash_benchmarking", "flash_leaderboard")),
    Problem(12, "distributed_communication_single_node", "both", "ddp"),
    Problem(13, "naive_ddp", "both", "ddp"),
    Problem(14, "naive_ddp_benchmarking", "both", "ddp"),
    Problem(15, "minimal_ddp_flat_benchmarking", "both", "ddp"),
    Problem(16, "ddp_overlap_individual_parameters", "both", "ddp"),
    Problem(17, "ddp_overlap_individual_parameters_benchmarking", "both", "ddp"),
    Problem(18, "ddp_overlap_bucketed", "2025", "ddp"),
    Problem(19, "ddp_bucketed_benchmarking", "2025", "ddp"),
    Problem(20, "communication_accounting and 2026 analysis problems", "both", "accounting"),
    Problem(21, "optimizer_state_sharding", "both", "sharding"),
    Problem(22, "optimizer_state_sharding_accounting", "both", "sharding"),
    Problem(23, "fsdp", "2026", "sharding"),
    Problem(24, "fsdp_accounting", "2026", "sharding"),
    Problem(25, "leaderboard (8B training step)", "2026", "leaderboard"),
]
