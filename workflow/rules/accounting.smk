# Problem 20 (communication_accounting, 2025) and the 2026 analysis problems: derived by
# cs336sys.accounting (no experiment of its own), checked against whatever we measured.

section(
    "accounting",
    results_of("matmul_peak", "allreduce", "ddp_step", "sharding_memory", "fsdp_step"),
)
