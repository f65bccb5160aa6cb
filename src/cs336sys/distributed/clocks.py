"""The SM clock beside a distributed step's timing: each rank samples its own GPU while its timed steps
run (`cs336sys.gpu_clocks.ClockSampler`), and the result keeps rank 0's clock and power and the lowest and
highest clock of any rank, so two variants compared in one job can be checked to have run at the same
clocks. On the CPU (gloo) nothing is sampled and nothing is recorded."""

from __future__ import annotations

from cs336sys.gpu_clocks import ClockSampler


class _NoClocks:
    """Stands in for the sampler on the CPU: no samples, an empty summary."""

    def __enter__(self) -> _NoClocks:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def summary(self, start: float | None = None, end: float | None = None) -> dict:
        return {}


def clock_sampler(device: str) -> ClockSampler | _NoClocks:
    """A sampler of this rank's GPU (`device` is concrete, "cuda:<local rank>"), or none on the CPU."""
    return ClockSampler(device) if device.startswith("cuda") else _NoClocks()


def clock_metrics(per_rank: list[dict]) -> dict:
    """The timed steps' SM clock and power of rank 0 and the range of the ranks' clocks (each rank's median
    sample); nothing where no rank sampled (no nvidia-smi, the CPU)."""
    clocks = [r["sm_clock_mhz"] for r in per_rank if r.get("sm_clock_mhz") is not None]
    if not clocks:
        return {}
    first = per_rank[0]
    return {"sm_clock_mhz": first.get("sm_clock_mhz"), "sm_clock_ranks_mhz": [min(clocks), max(clocks)],
            "power_w": first.get("power_w"), "power_limit_w": first.get("power_limit_w")}
