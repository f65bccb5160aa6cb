"""Experiment points (registry: optimized_step_rounds): the optimised-step series in interleaved rounds, so that
each technique's change to the step comes with the spread between rounds (analysis.optimized_rounds).

A job is one size: every configuration of the series once a round, the rounds one after another in one
process, round r starting from the series' r-th configuration (workflow/rules/benchmarking.smk orders them).
A drift of the GPU (its clock under the power cap, another process's heat) then falls on every configuration
alike, which the one-pass series (`optimized_step`: each configuration once, in the series' order) cannot
say. Each point is measured exactly as an `optimized_step` point is (`bench_optimized.run_point`: built
afresh, warmed up, its timed steps, their clocks and the job's own matmul ceiling); this module only labels
it with its round.
"""

from __future__ import annotations

from dataclasses import dataclass

from cs336sys.bench_optimized import OptimizedStepSettings
from cs336sys.bench_optimized import run_point as run_optimized_point
from cs336sys.jobs import Run


@dataclass(frozen=True)
class OptimizedRoundSettings(OptimizedStepSettings):
    """An optimised-step point of a job in rounds: `bench_optimized.OptimizedStepSettings`'s fields and its round."""

    round: int = 0
    """Which of its job's interleaved rounds this point is (each configuration runs once a round): a label."""


def run_point(settings: OptimizedRoundSettings, run: Run) -> dict:
    """One configuration in one round: the `optimized_step` point's metrics, and `sm_clock_mhz`, the median
    SM clock over its timed steps (None where nothing sampled it)."""
    metrics = run_optimized_point(settings, run)
    metrics["sm_clock_mhz"] = (metrics.get("step_clocks") or {}).get("sm_clock_mhz")
    return metrics
