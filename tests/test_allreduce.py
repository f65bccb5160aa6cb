"""All-reduce benchmark functions: sane timings on 2 gloo ranks, known-answer bandwidth formulas."""

from __future__ import annotations

import math
import time

import pytest

from cs336sys.distributed.allreduce import algorithm_bandwidth, bus_bandwidth, max_across_ranks, time_all_reduce
from cs336sys.distributed.spawn import spawn

SIZE = 2**20  # 1 MiB of float32
ITERS = 4


LATE_START_S = 1.0


def _time_and_gather(info) -> tuple[list[float], list[float]]:
    if info.rank == 1:
        time.sleep(LATE_START_S)  # rank 0 waits for it in the untimed warm-up, not in a timed call
    times = time_all_reduce(SIZE, warmup=1, iters=ITERS, device=info.device)
    return times, max_across_ranks(times)


def test_timings_are_per_call_positive_and_the_maximum_is_shared():
    per_rank = spawn(_time_and_gather, 2, timeout_s=60, pg_timeout_s=30)
    slowest = per_rank[0][1]
    assert len(slowest) == ITERS
    for times, maxima in per_rank:
        assert len(times) == ITERS
        assert all(0 < t < LATE_START_S / 2 for t in times), times  # 1 MiB over loopback: milliseconds
        assert maxima == slowest, "every rank gets the same per-call maxima"
        assert all(m >= t for m, t in zip(maxima, times, strict=True))
    assert slowest == [max(r[0][i] for r in per_rank) for i in range(ITERS)]


def test_bandwidth_formulas_known_answers():
    assert algorithm_bandwidth(10**9, 0.5) == 2e9
    # nccl-tests: busbw = algbw * 2(n-1)/n
    assert bus_bandwidth(10**9, 0.5, world_size=2) == pytest.approx(2e9)
    assert bus_bandwidth(10**9, 0.5, world_size=4) == pytest.approx(3e9)
    assert bus_bandwidth(10**9, 0.5, world_size=8) == pytest.approx(3.5e9)
    assert bus_bandwidth(10**9, 0.5, world_size=1) == 0.0
    assert math.isclose(bus_bandwidth(3e6, 2e-3, world_size=6), 3e6 / 2e-3 * 10 / 6)


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError):
        algorithm_bandwidth(1000, 0.0)
    with pytest.raises(ValueError):
        bus_bandwidth(1000, 1.0, world_size=0)
    with pytest.raises(ValueError, match="multiple of 4"):
        time_all_reduce(1001)  # refused before any collective, so no process group is needed
    with pytest.raises(ValueError, match="iters"):
        time_all_reduce(1024, iters=0)
