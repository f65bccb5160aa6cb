"""The benchmarking section's typed context: what `cs336sys.analysis.benchmarking.build` fills and
`sections/benchmarking.md.j2` reads. Its own module so that the section's helpers (benchmarking_runs,
benchmarking_speedups) can name it while the section imports them: imports point one way."""

from __future__ import annotations

from dataclasses import dataclass, field

from cs336sys.analysis.context import SectionContext


@dataclass
class BenchmarkingContext(SectionContext):
    figures: dict[str, str] = field(default_factory=dict)
    """Figure name -> its file (`analysis.common.save_figure`): the times against size."""
    peak_tflops: dict[str, float] = field(default_factory=dict)
    """(MFU) Dtype -> the dense matmul ceiling measured on the GPU (TFLOP/s, `matmul_peak` results)."""
    peak_rounds: dict[str, dict] = field(default_factory=dict)
    """(MFU) Dtype -> the ceiling's rounds within its job: lowest and highest TFLOP/s, the rounds' median SM
    clock (MHz; None where none was sampled). Empty for results measured in one round."""
    peak_gpu: str | None = None
    """(MFU) The GPU model those ceilings were measured on ("H200"); a point run on another GPU model is set
    against that model's own measured ceiling (`ceilings`), never against this one."""
    ceilings: dict[str, dict[str, float]] = field(default_factory=dict)
    """(MFU, roofline) GPU name -> dtype -> ceiling (TFLOP/s): the `matmul_peak` results for their GPU, and for
    a GPU with points but no such results, its hardware preset's ceiling where the project measured it
    (`cs336sys.accounting.hardware`)."""
    ceiling_notes: list[str] = field(default_factory=list)
    """(MFU) One phrase per ceiling taken from a preset: which GPU, which figure, from where."""
    own_ceiling: dict | None = None
    """(MFU) Where bf16 points timed the 8192-cube product in their own job (their MFU's ceiling then): how
    many, of how many bf16 points, its range (TFLOP/s) and the ranges of the SM clock under the products and
    under the steps (MHz; None where not sampled). None when no point did."""
    on_eager: str | None = None
    """Where the eager points ran, as a caption says it ("one H200"): the eager tables' captions."""
    cross_gpu: list[str] = field(default_factory=list)
    """(8b) Compiled points whose eager twin ran on another GPU model: no ratio is taken across GPUs."""
    # benchmarking_script (a, b): the grid and its times
    protocol: dict[str, list[int]] | None = None
    """(b) The warm-up steps, timed steps and batch sizes the result files record: {"warmup", "steps", "batch"}."""
    context_lengths: list[int] = field(default_factory=list)
    """(b) The eager grid's context lengths, ascending; one timing table each."""
    sizes: list[str] = field(default_factory=list)
    """(b) The grid's model sizes, smallest first."""
    backward_timed_alone: bool | None = None
    """(a, b) Whether every backward cell was timed alone (else forward+backward less forward)."""
    timing_context_main: int | None = None
    """(b) The longest context: its timing table is printed in the section, the others in the appendix."""
    backward_ratio: list[float] | None = None
    """(b) The timing table's backward over its forward (means) at the main context, [lowest, highest] over
    the sizes: one definition, the table's."""
    backward_ratio_sizes: list[str] | None = None
    """(b) The sizes of those two ratios, [lowest's, highest's]."""
    # benchmarking_mixed_precision (c): bf16 autocast against fp32
    tables_bf16: str | None = None
    """(4c) fp32 and bf16-autocast mean times and the speed-up of every eager point (Markdown)."""
    tables_bf16_compact: str | None = None
    """(4c) The speed-up per size and mode at the longest context (Markdown)."""
    figure_bf16: str | None = None
    """(4c) The speed-up figure's file."""
    bf16_train_speedup: dict[str, float] | None = None
    """(4c) Size -> the train step's bf16 speed-up at the longest context."""
    bf16_slower: list[str] | None = None
    """(4c) The eager points slower in bf16 than in fp32 ("size mode (context c)")."""
    bf16_context_length: int | None = None
    """(4c) The context the compact table and the train-step speed-ups are at."""
    # wall time against the GPU's busy time: which points wait on the host
    tables_busy: str | None = None
    """(b, 4c) Median wall and GPU-busy time per size and mode at the busy context (Markdown)."""
    busy_context: int | None = None
    """(b, 4c) The context of the busy table: the longest."""
    host_bound_busy_pct: float | None = None
    """(b) The busy share (%) below which a point waits on the host."""
    host_bound: list[str] | None = None
    """(b) The eager points below that share ("size mode dtype ctx c")."""
    busy_pct_range: list[float] | None = None
    """(b) GPU-busy over wall time (%) over the eager points, [lowest, highest]."""
    tables_host_bound: str | None = None
    """(b) Every host-bound point's wall and busy times (Markdown); absent without any."""
    bf16_busy_train_speedup: dict[str, float] | None = None
    """(4c) Size -> the train step's bf16 speed-up in GPU-busy time at the busy context."""
    bf16_trend: dict | None = None
    """(4c) Whether the train step's bf16 speed-up rises with size in busy time and in wall time
    (`busy_rises`, `wall_rises`), and the sizes whose bf16 train step there is host-bound (`host_bound_train`)."""
    # torch_compile (b): the compiled model against eager
    tables_compile: str | None = None
    """(8b) Eager and compiled mean times and the speed-up of every pair of points (Markdown)."""
    tables_compile_compact: str | None = None
    """(8b) The speed-up per size, by mode, dtype (and way of compiling) (Markdown)."""
    figure_compile: str | None = None
    """(8b) The speed-up figure's file."""
    compile_method: list[str] | None = None
    """(8b) The ways of compiling measured ("blocks", "full")."""
    compile_speedup_range: list[float] | None = None
    """(8b) The compiled speed-up over every pair, [lowest, highest]."""
    compile_speedup_by_method: dict[str, list[float]] | None = None
    """(8b) Way of compiling -> its speed-up, [lowest, highest]."""
    compile_days_apart: dict | None = None
    """(8b) The pairs whose eager and compiled points ran on different days: {"pairs", "of", "days"}
    (`benchmarking_speedups._days_apart`)."""
    compile_busy_by_method: dict[str, dict[str, list[float]]] | None = None
    """(8b) Way of compiling -> dtype -> its speed-up in GPU-busy time, [lowest, highest]: the kernels' own gain,
    without the launches compiling saves (which the host's speed sets)."""
    compile_busy_trend: dict | None = None
    """(8b) Whether every bf16 pair's busy-time speed-up is above every fp32 pair's (`bf16_above_fp32`), and
    whether the largest bf16 one per size falls at every step from the smallest size (`falls_with_size`)."""
    # model FLOPs utilisation, the timings' spread
    mfu_context: int | None = None
    """(MFU) The context of the compact MFU table: the longest train step's."""
    best_mfu: dict | None = None
    """(MFU) The train step with the highest MFU: {"pct", "size", "dtype", "compile", "context_length"}."""
    best_mfu_by_dtype: dict[str, dict] | None = None
    """(MFU) Dtype -> its train step with the highest MFU, as `best_mfu`."""
    cv: dict | None = None
    """(b) The coefficient of variation (%) of the timed steps: {"median_pct", "max_pct", "max_what"}."""
    oom_points: list[str] = field(default_factory=list)
    """(b) The points that ran out of memory ("size mode dtype compile ctx c")."""
    # benchmarking_script (c): the cold start
    tables_warmup: str | None = None
    """(c) Mean ± std of the measured steps after each number of warm-up steps, per size and mode (Markdown)."""
    figure_warmup: str | None = None
    """(c) The cold-start figure's file: step times from a process's first step."""
    warmup_first_step_ratio: dict[str, float] | None = None
    """(c) "size mode" -> the first step's time over the settled median."""
    warmup_worst: dict | None = None
    """(c) The largest of those ratios: {"what", "ratio"}."""
    warmup_values: list[int] | None = None
    """(c) The numbers of warm-up steps compared."""
    warmup_context_length: int | None = None
    """(c) The context the cold starts ran at."""
    # the pipeline's own cost
    tables_overhead: str | None = None
    """Each job's wall time against the time inside its points, and the difference (Markdown)."""
    overhead: dict | None = None
    """The jobs' totals: {"wall_s", "overhead_s", "share_pct", "jobs"}."""
    # every technique in one step
    optimized: dict | None = None
    """The optimised-step series against its roofline (`analysis.optimized_step`); absent without results."""
    optimized_rounds: dict | None = None
    """The same series in interleaved rounds (`analysis.optimized_rounds`); absent without results."""
    summary: list[dict] = field(default_factory=list)
    """The section's lines of the report's summary page."""
    limitations: list[str] = field(default_factory=list)
    """What the wall times cannot say where the host, not the GPU, sets them."""
