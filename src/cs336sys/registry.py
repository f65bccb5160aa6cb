"""The one registry: report sections, the experiments whose result files feed them, and the
assignment's problems (SPEC numbering) with the experiments that answer them.

Everything that names a section or an experiment reads it from here: the workflow's rules
(`workflow/rules/common.smk`), the analysis command, the report's section order and coverage
table, the tests and `.ci/run`. Sizes are registered in `cs336sys.sizes`, dtype names in
`cs336sys.dtypes`. Plain data, no torch: the workflow imports this at parse time.

Adding an experiment: an `Experiment` here (problem name, function, section), a rule that produces
its result files, and its section's analysis reads them (README, "Adding an experiment").
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Section:
    """A report section: `cs336sys.analysis.<name>` builds it, `sections/<name>.md.j2` renders it,
    the rule `<name>_section` makes `results/sections/<name>/`."""

    name: str
    title: str

    @property
    def module(self) -> str:
        return f"cs336sys.analysis.{self.name}"

    @property
    def template(self) -> str:
        return f"sections/{self.name}.md.j2"

    @property
    def rule(self) -> str:
        return f"{self.name}_section"


@dataclass(frozen=True)
class Experiment:
    """An experiment: result files whose `problem` field is `name`, each written by the job runner
    from `function(settings, run) -> metrics` (`module:function`), read by `section`. A job whose
    points all have an `impl` that `by_impl` lists runs that function instead (the same settings), so
    that its code hash covers only that implementation's code (`function_of`)."""

    name: str
    function: str
    section: str
    gpu: bool = True  # on the main grid it needs CUDA GPUs (resources: gpu=N); the smoke grid runs it on CPU
    by_impl: tuple[tuple[str, str], ...] = ()  # (impl, module:function)

    @property
    def functions(self) -> list[str]:
        """Every function its jobs may run: its own, then those of `by_impl`."""
        return [self.function] + sorted({f for _, f in self.by_impl} - {self.function})


@dataclass(frozen=True)
class Problem:
    number: int
    name: str
    edition: str
    section: str
    experiments: tuple[str, ...] = ()  # the experiments whose results answer it
    derived: bool = False  # answered by computation in its section (formulas), not by measurement


# Report order.
SECTIONS: dict[str, Section] = {s.name: s for s in [
    Section("benchmarking", "Benchmarking the Transformer LM"),
    Section("precision", "Mixed precision"),
    Section("profiling", "Profiling: kernels of a step"),
    Section("memory", "Memory: snapshots, saved tensors, checkpointing"),
    Section("attention", "Attention: naive, compiled, FlashAttention-2"),
    Section("ddp", "Distributed data parallel"),
    Section("sharding", "Optimizer state sharding and FSDP"),
    Section("accounting", "Parallelism accounting"),
    Section("leaderboard", "The leaderboard: the 8B training step"),
]}

EXPERIMENTS: dict[str, Experiment] = {e.name: e for e in [
    Experiment("benchmarking", "cs336sys.bench:run_point", "benchmarking"),
    Experiment("warmup", "cs336sys.bench:run_warmup_point", "benchmarking"),
    Experiment("matmul_peak", "cs336sys.peak:run_point", "benchmarking"),
    Experiment("optimized_step", "cs336sys.bench_optimized:run_point", "benchmarking"),
    Experiment("optimized_step_rounds", "cs336sys.bench_optimized_rounds:run_point", "benchmarking"),
    Experiment("mixed_precision_accumulation", "cs336sys.precision:run_accumulation_point", "precision"),
    Experiment("autocast_dtypes", "cs336sys.precision:run_autocast_dtypes_point", "precision"),
    Experiment("kernel_profile", "cs336sys.profiling.experiments:run_kernel_profile", "profiling"),
    Experiment("memory_snapshot", "cs336sys.profiling.experiments_memory:run_memory_snapshot", "memory"),
    Experiment("saved_tensors", "cs336sys.profiling.experiments_memory:run_saved_tensors", "memory"),
    Experiment("checkpointing", "cs336sys.profiling.experiments_checkpointing:run_checkpointing", "memory"),
    Experiment("pytorch_attention", "cs336sys.attention.bench_naive:run_pytorch_attention_point", "attention"),
    Experiment("flash_benchmarking", "cs336sys.attention.bench_flash_triton:run_triton_point", "attention",
               by_impl=tuple((impl, "cs336sys.attention.bench_flash:run_baseline_point")
                             for impl in ("naive", "naive_compiled", "sdpa"))),
    Experiment("flash_leaderboard", "cs336sys.attention.bench:run_leaderboard_point", "attention"),
    Experiment("flash_leaderboard_gluon", "cs336sys.attention.bench_gluon:run_point", "attention"),
    Experiment("flash_leaderboard_rounds", "cs336sys.attention.bench_rounds:run_point", "attention"),
    Experiment("allreduce", "cs336sys.distributed.experiments:run_allreduce_point", "ddp"),
    Experiment("ddp_step", "cs336sys.distributed.experiments:run_ddp_step_point", "ddp"),
    Experiment("ddp_trace", "cs336sys.distributed.experiments:run_ddp_trace_point", "ddp"),
    Experiment("sharding_memory", "cs336sys.distributed.sharding_experiments:run_sharding_memory_point", "sharding"),
    Experiment("fsdp_step", "cs336sys.distributed.sharding_experiments:run_fsdp_step_point", "sharding"),
    Experiment("fsdp_trace", "cs336sys.distributed.sharding_experiments:run_fsdp_trace_point", "sharding"),
    Experiment("leaderboard_step", "cs336sys.leaderboard.experiments:run_leaderboard_point", "leaderboard"),
    Experiment("leaderboard_proxy", "cs336sys.leaderboard.proxy:run_proxy_point", "leaderboard"),
]}

PROBLEMS: list[Problem] = [
    Problem(1, "benchmarking_script", "both", "benchmarking", ("benchmarking", "warmup")),
    Problem(2, "nsys_profile", "both", "profiling", ("kernel_profile",)),
    Problem(3, "mixed_precision_accumulation", "both", "precision", ("mixed_precision_accumulation",)),
    Problem(4, "benchmarking_mixed_precision", "both", "precision", ("autocast_dtypes", "benchmarking")),
    Problem(5, "memory_profiling", "both", "memory", ("memory_snapshot", "saved_tensors")),
    Problem(6, "gradient_checkpointing", "2026", "memory", ("saved_tensors", "checkpointing")),
    Problem(7, "pytorch_attention", "both", "attention", ("pytorch_attention",)),
    Problem(8, "torch_compile", "both", "attention", ("pytorch_attention", "benchmarking")),
    Problem(9, "flash_forward", "both", "attention", ("flash_benchmarking",)),
    Problem(10, "flash_backward", "both", "attention", ("flash_benchmarking",)),
    Problem(11, "flash_benchmarking", "both", "attention", ("flash_benchmarking", "flash_leaderboard",
                                                                  "flash_leaderboard_gluon",
                                                                  "flash_leaderboard_rounds")),
    Problem(12, "distributed_communication_single_node", "both", "ddp", ("allreduce",)),
    Problem(13, "naive_ddp", "both", "ddp", ("ddp_step",)),
    Problem(14, "naive_ddp_benchmarking", "both", "ddp", ("ddp_step",)),
    Problem(15, "minimal_ddp_flat_benchmarking", "both", "ddp", ("ddp_step",)),
    Problem(16, "ddp_overlap_individual_parameters", "both", "ddp", ("ddp_step",)),
    Problem(17, "ddp_overlap_individual_parameters_benchmarking", "both", "ddp", ("ddp_step", "ddp_trace")),
    Problem(18, "ddp_overlap_bucketed", "2025", "ddp", ("ddp_step",)),
    Problem(19, "ddp_bucketed_benchmarking", "2025", "ddp", ("ddp_step",)),
    Problem(20, "communication_accounting and 2026 analysis problems", "both", "accounting",
            ("allreduce", "ddp_step"), derived=True),
    Problem(21, "optimizer_state_sharding", "both", "sharding", ("sharding_memory",)),
    Problem(22, "optimizer_state_sharding_accounting", "both", "sharding", ("sharding_memory",)),
    Problem(23, "fsdp", "2026", "sharding", ("fsdp_step",)),
    Problem(24, "fsdp_accounting", "2026", "sharding", ("fsdp_step", "fsdp_trace")),
    Problem(25, "leaderboard (8B training step)", "2026", "leaderboard", ("leaderboard_step",)),
]


def experiment(name: str) -> Experiment:
    try:
        return EXPERIMENTS[name]
    except KeyError:
        raise ValueError(f"experiment {name!r} is not in cs336sys.registry.EXPERIMENTS "
                         f"(known: {', '.join(EXPERIMENTS)})") from None


def function_of(name: str, points: list[dict]) -> str:
    """The function a job of experiment `name` with these points runs: by their one `impl`, if the
    experiment lists it in `by_impl`, else the experiment's."""
    e = experiment(name)
    impls = {p.get("impl") for p in points}
    chosen = {dict(e.by_impl).get(impl, e.function) for impl in impls} or {e.function}
    if len(chosen) > 1:
        raise ValueError(f"a job of {name} mixes implementations that run different functions: {sorted(chosen)}")
    return chosen.pop()


def section(name: str) -> Section:
    try:
        return SECTIONS[name]
    except KeyError:
        raise ValueError(f"section {name!r} is not in cs336sys.registry.SECTIONS "
                         f"(known: {', '.join(SECTIONS)})") from None


def local_rules() -> set[str]:
    """Rules that only read results (sections, report): everything else runs an experiment."""
    return {s.rule for s in SECTIONS.values()} | {"report_markdown", "report_pdf", "all"}


def check() -> None:
    """Every name used refers to something registered (the tests and the workflow call this)."""
    for e in EXPERIMENTS.values():
        section(e.section)
    for p in PROBLEMS:
        for name in p.experiments:
            experiment(name)
        if p.experiments or p.derived:  # a problem with no experiments yet names the section it will have
            section(p.section)
