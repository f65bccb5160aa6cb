"""The SM clock beside a distributed step's timing (cs336sys.distributed.clocks): what a result keeps of
its ranks' samples, and nothing sampled or recorded on the CPU."""

from __future__ import annotations

import random

from cs336sys.distributed.clocks import clock_metrics, clock_sampler


def test_a_result_keeps_rank_zeros_clock_and_the_ranks_range():
    clocks = [random.uniform(1600, 1980) for _ in range(4)]
    per_rank = [{"sm_clock_mhz": c, "power_w": 500.0 + i, "power_limit_w": 700.0} for i, c in enumerate(clocks)]
    m = clock_metrics(per_rank)
    assert m["sm_clock_mhz"] == clocks[0] and m["sm_clock_ranks_mhz"] == [min(clocks), max(clocks)]
    assert m["power_w"] == 500.0 and m["power_limit_w"] == 700.0


def test_nothing_is_recorded_where_no_rank_sampled():
    assert clock_metrics([{"mean_ms": 1.0}, {"mean_ms": 2.0}]) == {}
    with clock_sampler("cpu") as clocks:
        pass
    assert clocks.summary() == {} and clocks.summary(0.0, 1.0) == {}


def test_the_cpu_ddp_step_records_its_round_and_no_clock():
    """A DDP step point on one gloo rank group of two, as the smoke grid runs it: the round is a label of
    the settings, and the CPU result holds no clock."""
    from conftest import spawn_checks

    _, results = spawn_checks(_ddp_round_worker, 2)
    for r in results:
        assert r["round"] == 2 and "sm_clock_mhz" not in r["metrics"] and len(r["metrics"]["step_ms"]) == 2


def _ddp_round_worker(info, seed):
    from cs336sys.distributed.experiments import DDPStepSettings, run_ddp_step_point
    from cs336sys.jobs import Run

    settings = DDPStepSettings(size="tiny", variant="flat", context_length=16, batch_size=2, warmup=1, steps=2,
                               device="cpu", round=2)
    run = Run(device="cpu", rank=info.rank, world_size=info.world_size, backend="gloo")
    return {"round": settings.round, "metrics": run_ddp_step_point(settings, run)}
