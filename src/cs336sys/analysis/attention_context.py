"""The attention section's typed context: what `cs336sys.analysis.attention.build` fills and
`sections/attention.md.j2` reads. Its own module so that the section's helpers (attention_leaderboard,
attention_flash) can name it while the section imports them: imports point one way."""

from __future__ import annotations

from dataclasses import dataclass, field

from cs336sys.analysis.context import SectionContext


@dataclass
class AttentionContext(SectionContext):
    figures: dict[str, str] = field(default_factory=dict)
    """Figure name -> its file; the section's figures are in flash_figures, so this stays empty."""
    # --- pytorch_attention (problem 7) and torch_compile (8a) ---
    pt_tables: dict[str, str] | None = None
    """(7, 8a) Implementation (eager, compiled) -> the table of its times and memory before the backward."""
    pt_batch: int | None = None
    """(7) The batch size of the naive attention grid."""
    pt_accounting: dict | None = None
    """(7) Memory accounting of the smallest point out of memory (or the largest that ran): GiB by part."""
    pt_oom: list[str] | None = None
    """(7) The points that ran out of memory, as "impl d=.. seq=..."."""
    pt_compact: str | None = None
    """(7) The main text's table: forward / backward (ms) per sequence length and d, the widest d's memory."""
    pt_compile_compact: str | None = None
    """(8a) The main text's table: compiled over eager, forward / backward, per sequence length and d."""
    pt_compile_table: str | None = None
    """(8a) Eager against compiled naive attention, with the forward and backward speed-ups."""
    pt_compile_forward_range: list[float] | None = None
    """(8a) The smallest and largest forward speed-up of compiled over eager."""
    # --- flash_benchmarking (problem 11) ---
    flash_tables: dict[str, str] | None = None
    """(11) "dtype part" -> the grid's times (forward, backward, fwd+bwd) or TFLOP/s table."""
    flash_figures: dict[str, str | None] | None = None
    """(11) "times" and "speedup" -> the figure's file (None where it could not be drawn)."""
    flash_grid: dict | None = None
    """(11) The grid's batch sizes, head counts, seq and d ranges, dtypes."""
    flash_graph_tables: dict[str, str] | None = None
    """(11) dtype -> ours against SDPA as CUDA-graph replays, beside the eager ratio."""
    sdpa_backends: dict[str, str] | None = None
    """(11) dtype -> the backend(s) SDPA chose."""
    sdpa_backend_names: dict[str, str] | None = None
    """(11) dtype -> those backends as the report names them ("FlashAttention-2", "memory-efficient")."""
    flash_compact: str | None = None
    """(11) The main text's table: bf16 at the two longest sequences, ours against SDPA and naive."""
    flash_targets: list[dict] | None = None
    """(11) Per bf16 point at seq >= 8192, d 64 and 128: ours over SDPA (eager, graphed), naive over ours, met."""
    flash_target_values: dict | None = None
    """(11) The targets' limits and the naive target's sequence length."""
    flash_floor: dict | None = None
    """(11) The shortest fwd+bwd of ours and SDPA (host-bound) and the sequence from which ours is faster."""
    flash_feasibility: list[dict] | None = None
    """(11) Per d, whether 20x naive at seq 16384 is reachable at the measured bf16 matmul peak."""
    flash_feasibility_measured: list[str] | None = None
    """(11) The measured ratios' columns of the feasibility table (every implementation any row has)."""
    # --- flash_leaderboard ---
    lb_table: str | None = None
    """Both leaderboards' attention shapes: every implementation's times and TFLOP/s (printed: ours, cuDNN, FA2)."""
    lb_reference_ms: dict[str, float] | None = None
    """Published figures for the leaderboard shape (label -> ms), from the config."""
    lb_editions: list[dict] | None = None
    """Per (GPU, edition): the shape, ours' times, ours over each SDPA backend, ours' tiles."""
    lb_backward_in_noise: int = 0
    """How many leaderboard points timed the forward alone no faster than forward+backward (backward blanked)."""
    lb_dtype: str | None = None
    """The leaderboard points' dtype."""
    lb_gpus: list[str] | None = None
    """The GPUs the leaderboard points ran on."""
    lb_kernels: str | None = None
    """Each GPU kernel of ours and of cuDNN at the leaderboard shapes, with its share of the call's time."""
    lb_gluon: dict | None = None
    """The Gluon kernels against cuDNN in the same job: the table, per (GPU, edition) ratios, clocks (and
    whether they differ from cuDNN's) and forward+backward times, the GPUs."""
    lb_rounds: dict | None = None
    """The leaderboard shapes in interleaved rounds (`attention_rounds.rounds`): the table, per (GPU, edition)
    each implementation's ratios to cuDNN with their per-round range, verdicts and clocks, the rounds."""
    lb_rounds_pending: list[str] | None = None
    """The rounds jobs that wait in the overlay `next` (none measured yet)."""
    lb_clock_tolerance: float | None = None
    """How far apart (relative) two SM clocks may be and count as one (`attention_leaderboard.CLOCK_TOLERANCE`)."""
    lb_public: dict | None = None
    """Our kernels' forward+backward at the 2025 shape on the H100 against the best verified entry of the
    course's published leaderboard (`attention_leaderboard.public_entry`), with its source."""
    # --- the section as a whole ---
    flash_grid_wall_s: dict | None = None
    """(11) Wall seconds of the grid's jobs: total, ours, and the number of jobs."""
    summary: list[dict] | None = None
    """The section's lines of the report's summary page."""
    limitations: list[str] | None = None
    """The section's lines of the conclusion's limitations."""
    flash_fp32_precision: dict | None = None
    """(11) fp32 at the longest sequence: ours with TF32 and with IEEE products over SDPA, and IEEE over TF32."""
