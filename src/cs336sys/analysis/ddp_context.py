"""The ddp section's context: what `sections/ddp.md.j2` reads, one typed field per template variable. Its
own module, so that the section's parts (`ddp_steps`, `ddp_trace`, `ddp_scaling`) fill it without importing
the section that assembles them (`analysis.ddp`): imports point one way only."""

from __future__ import annotations

from dataclasses import dataclass, field

from cs336sys.analysis.context import SectionContext


@dataclass
class DDPContext(SectionContext):
    figures: dict[str, str] = field(default_factory=dict)
    """Figure name -> its file; left empty: each figure has a field of its own below."""
    model_formulas: dict[str, str] = field(default_factory=dict)
    """(19b) The bucket overhead model's formulas as LaTeX, derived by sympy (`ddp_model.formulas`)."""
    gloo_env: dict | None = None
    """(12) The gloo points' own environment line when they sit beside GPU points: CPU, cores, oversubscribed."""
    allreduce_table: str | None = None
    """(12) Every all-reduce point: median, min–max, calls, algorithm and bus bandwidth (or its status)."""
    allreduce_busbw_factor: str | None = None
    """(12) Bus over algorithm bandwidth for r ranks, as LaTeX: 2(r-1)/r."""
    allreduce_nominal_gbps: float | None = None
    """(12) NVLink's nominal bandwidth, GPU 0's links summed, one direction (GB/s); None where not recorded."""
    allreduce_calls: int | None = None
    """(12) Timed calls per point (the fewest of any point)."""
    allreduce_warmup: int | None = None
    """(12) Untimed calls before them (the fewest of any point)."""
    allreduce_figure: str | None = None
    """(12) Bus bandwidth and time per call against size, per backend and rank count."""
    allreduce_targets: list[dict] | None = None
    """(12) NCCL per rank count: bus bandwidth at 1 GiB against the best any size reaches, and NVLink's nominal."""
    allreduce_reference: dict[str, float] | None = None
    """(12) NCCL's bus bandwidth at 1 GiB measured alone on the same kind of host, per rank count (GB/s), and
    its source: the all-reduce target's reference (config allreduce.reference_busbw_gbps)."""
    allreduce_reference_source: str | None = None
    """(12) Where that reference comes from."""
    allreduce_reference_share: float | None = None
    """(12) The target: NCCL's bus bandwidth at 1 GiB at least this share of the reference's."""
    clock_tolerance_mhz: float | None = None
    """How far apart (MHz) two variants' median SM clocks may be before the text says they differ."""
    min_rounds: int | None = None
    """A job's ratios get a verdict (✓ ✗ ≈) from at least this many interleaved rounds."""
    allreduce_target_values: dict | None = None
    """(12) The bus bandwidth target: its share of the best ("fraction") and its size per rank ("size")."""
    allreduce_fits: dict[str, dict[str, float]] | None = None
    """(12, 19b) "backend-ranks" -> t = o + size/w fitted to the sweep: {"o_s", "inv_w"}."""
    allreduce_fit_table: str | None = None
    """(12) Those fits as a table: o (µs) and w (GB/s) per backend and rank count."""
    allreduce_facts: list[dict] | None = None
    """(12) Per backend and rank count: bus bandwidth at every size, whether it rises at every step in size, and
    the share of the smallest size's time the fit's fixed cost explains."""
    allreduce_shape: dict | None = None
    """(12) The curves by shape: "rising" at every step in size and "not_rising" (with their bus bandwidths);
    by the fit's fixed cost at the smallest size: "latency_bound", "some_fixed_cost", "no_fixed_cost"."""
    allreduce_nccl_worlds: dict[str, list[int]] | None = None
    """(12) NCCL's rank counts "measured", and gloo's it could not run ("missing": one GPU per rank)."""
    allreduce_compare: dict | None = None
    """(12) NCCL over gloo at their largest shared size ("nccl_over_gloo"); gloo across rank counts ("gloo_worlds")."""
    ddp_jobs: list[dict] | None = None
    """(14, 15, 17a, 19) Per (size, dtype) job: every variant's step, the table, targets, answers, bucket model."""
    ddp_bucket_table: str | None = None
    """(19a) Each job's mean step at each bucket size beside PyTorch DDP's (the fastest size starred)."""
    ddp_figure: str | None = None
    """(19a) Step time against bucket size, a panel per job; "" where no job has a bucketed point."""
    ddp_bucketing_short: list[str] | None = None
    """(19a) The jobs ("size, dtype") whose best bucketed step is slower than overlap's or flat's."""
    ddp_has_bf16: bool | None = None
    """(14) Some job runs in bf16 (autocast: the gradients all-reduced stay fp32)."""
    ddp_targets: dict[str, float] | None = None
    """(17a, 19a) The targets' limits over PyTorch DDP's step, its default bucket size, a good fit's R²."""
    ddp_rounds: list[int] | None = None
    """How many interleaved rounds the jobs ran (each variant once a round), the distinct counts."""
    ddp_one_round: list[str] | None = None
    """The jobs measured in one round, before rounds ("size, dtype, N ranks")."""
    ddp_no_clocks: list[str] | None = None
    """The jobs whose points record no SM clock ("size, dtype, N ranks"): their clocks are not compared."""
    ddp_scaling: list[dict] | None = None
    """(12, 14) Per (size, dtype) measured at several rank counts: each variant's step and communication at
    each, and the ring all-reduce's prediction of the gradients' all-reduce from the measured bus bandwidth."""
    ddp_none_across: dict | None = None
    """(14) The no-communication step from one rank count to another: within the noise or beyond it, per (size,
    dtype), and its largest move between two jobs of one rank count (`ddp_scaling.none_across`)."""
    ddp_host_jobs: list[dict] | None = None
    """(19) The "host" series' jobs apart: gradients as bucket views and single-rank proxies, each a table."""
    trace_rows: list[dict] | None = None
    """(17b) Per traced variant: step span, compute, communication, its share under compute."""
    trace_verdict: dict | None = None
    """(17b) naive's share of communication under compute against the others'; {} without both to compare."""
    trace_none_overlapped: bool | None = None
    """(17b) No traced variant ran any communication under compute."""
    trace_table: str | None = None
    """(17b) The traced steps' phases and communication as a table."""
    trace_settings: dict | None = None
    """(17b) The traced configuration: size, dtype, tool, context length, batch size, trace source."""
    trace_figure: str | None = None
    """(17b) The traced steps' timelines on one time axis."""
    trace_vs_bench_table: str | None = None
    """(17b) Each profiled step beside the benchmark's step of its variant, and its NCCL kernels' time."""
    trace_vs_bench: list[dict] | None = None
    """(17b) The same per variant: span over the benchmark's mean, kernel time against the bus bandwidth's bound."""
    trace_order: dict | None = None
    """(17b) Profiling's slowdown (the profiled spans over the benchmark's means, lowest and highest) and the
    variants fastest first by profiled span and by benchmark mean ("differs" where the two orders disagree)."""
    trace_busbw_gbps: float | None = None
    """(17b) NCCL's bus bandwidth at its largest size with the traced ranks (GB/s); 0.0 without NCCL points."""
    trace_busbw_ranks: int | None = None
    """(17b) The rank count of that bus bandwidth."""
    grid_time: dict | None = None
    """Wall time of the section's experiments (Snakemake's timing records) against the grid's target."""
    summary: list[dict] = field(default_factory=list)
    """The section's lines of the report's summary page."""
    limitations: list[str] = field(default_factory=list)
    """The NCCL rank counts that could not run, for the report's limitations."""
