"""Experiment points (registry: flash_leaderboard_rounds): the leaderboard shapes' implementations timed in
interleaved rounds, so that their ratios come with the spread between rounds (analysis.attention_rounds).

A job is one GPU model and one leaderboard shape; its points are every implementation once a round, the
rounds one after another in one process (workflow/rules/attention.smk orders them). Each point is measured
exactly as a `flash_leaderboard` or `flash_leaderboard_gluon` point is (`bench.run_leaderboard_point`,
`bench_gluon.run_point`: seconds of warm calls, then do_bench for at least a second, the SM clock sampled
throughout); this module only routes a point to its runner and labels it with its round.

Where an implementation cannot run (the Gluon kernels off a Hopper GPU, cuDNN on the CPU) the point is
`unsupported` with the runner's reason, in every round.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from cs336sys.attention.bench import LeaderboardSettings, run_leaderboard_point
from cs336sys.attention.bench_gluon import GLUON_IMPLS
from cs336sys.attention.bench_gluon import run_point as run_gluon_point
from cs336sys.jobs import Run


@dataclass(frozen=True)
class LeaderboardRoundsSettings:
    """A leaderboard point of a job in rounds: `bench.LeaderboardSettings`'s fields and its round."""

    impl: str
    """ours | sdpa_<backend> (flash, cudnn, efficient, math) | naive | gluon | gluon_bwd (bench_gluon's)."""
    round: int = 0
    """Which of its job's interleaved rounds this point is (each implementation runs once a round): a label."""
    batch: int = 1
    """Batch size (layout bsd: samples times heads, as the 2025 harness builds it)."""
    heads: int = 16
    """Heads per sample (layout bhsd only)."""
    seq: int = 16384
    """Sequence length (queries and keys)."""
    d: int = 64
    """Head dimension."""
    dtype: str = "bf16"
    """dtype of q, k and v: bf16 | fp16 | fp32."""
    causal: bool = True
    """Causal mask (key j <= query i)."""
    layout: str = "bhsd"
    """bhsd: q, k, v of (batch, heads, seq, d) | bsd: (batch, seq, d), heads folded into the batch."""
    forward_tiles: str | None = None
    """Ours only: forward tiles as `flash_configs.Tiles` text ("256x64/w8/s3"); None: the table's."""
    backward_tiles: str | None = None
    """Ours and gluon: backward tiles as `BackwardConfig` text; None: the table's (flash_configs)."""
    edition: str = "2025"
    """Whose leaderboard the shape is from (2025 | 2026): a label for the report."""
    gpu_model: str = "any"
    """GPU model this point must run on: H100 | H200 | any (another GPU is an error)."""
    device: str = "cuda"
    """Device kind: cuda | cpu (the grid's `device`); the job runner picks this rank's GPU."""


def run_point(settings: LeaderboardRoundsSettings, run: Run) -> dict:
    """One implementation at one leaderboard shape in one round: the `flash_leaderboard` point's metrics
    (fwd_ms, bwd_ms, fwd_bwd_ms, TFLOP/s, the SM clocks of each timing), each GPU kernel's time in round 0
    only (one profile a job says where the time goes), and `sm_clock_mhz`: the forward+backward's clock."""
    point = LeaderboardSettings(**{f.name: getattr(settings, f.name) for f in fields(LeaderboardSettings)})
    runner = run_gluon_point if settings.impl in GLUON_IMPLS else run_leaderboard_point
    metrics = runner(point, run)
    if settings.round > 0:
        metrics.pop("kernels", None)
    metrics["sm_clock_mhz"] = (metrics.get("fwd_bwd_clocks") or {}).get("sm_clock_mhz")
    return metrics
