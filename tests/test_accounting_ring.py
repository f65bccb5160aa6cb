"""The ring simulator against the collective formulas: steps, bytes per link per step, bytes each
device sends, time, and the values each device ends with (the exact sum)."""

from __future__ import annotations

import numpy as np
import pytest

from cs336sys.accounting import communication as comm
from cs336sys.accounting import ring
from cs336sys.accounting.symbols import N, S, W, evaluate


def _inputs(n: int, elements: int, seed: int = 0) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    # Integer values in float64: every partial sum is exact, so "equal to the sum" means equal.
    return [rng.integers(-1000, 1000, elements).astype(np.float64) for _ in range(n)]


@pytest.mark.parametrize("n", [2, 3, 4, 8])
@pytest.mark.parametrize("run, collective", [(ring.ring_all_reduce, "all_reduce"),
                                             (ring.alternate_all_reduce, "alternate_all_reduce")])
def test_simulated_all_reduce_matches_the_formulas_and_the_sum(n, run, collective):
    xs = _inputs(n, elements=6 * n)  # n divides the length: equal chunks
    size = xs[0].nbytes
    result, trace = run(xs)
    total = np.sum(xs, axis=0)
    for r in result:
        np.testing.assert_array_equal(r, total)
    assert trace.steps == evaluate(comm.steps(collective), {N: n})
    message = size if collective == "alternate_all_reduce" else size // n
    links = trace.bytes_per_link_per_step()
    # Every step uses every ring link i -> i+1 exactly once, with one message of the formula's size.
    assert set(links) == {(t, i, (i + 1) % n) for t in range(1, trace.steps + 1) for i in range(n)}
    assert set(links.values()) == {message}
    for device in range(n):
        assert trace.bytes_sent(device) == evaluate(comm.bytes_sent_per_device(collective, S), {N: n, S: size})
    assert trace.time(bandwidth=1e9) == pytest.approx(evaluate(comm.collective_time(collective, S), {N: n, S: size,
                                                                                                    W: 1e9}))


def test_reduce_scatter_and_all_gather_alone():
    n = 5
    xs = _inputs(n, elements=20)
    partial, trace = ring.reduce_scatter(xs)
    chunks = np.array_split(np.sum(xs, axis=0), n)
    for i in range(n):
        np.testing.assert_array_equal(partial[i][i], chunks[i])  # device i holds the full sum of chunk i
    assert trace.steps == n - 1
    gathered, trace = ring.all_gather(chunks)
    for g in gathered:
        np.testing.assert_array_equal(g, np.sum(xs, axis=0))
    assert trace.bytes_sent(0) == evaluate(comm.bytes_sent_per_device("all_gather", S), {N: n, S: xs[0].nbytes})


def test_unequal_chunks_still_give_the_sum():
    xs = _inputs(4, elements=11)  # 11 values over 4 devices: chunks of 3, 3, 3, 2
    result, trace = ring.ring_all_reduce(xs)
    for r in result:
        np.testing.assert_array_equal(r, np.sum(xs, axis=0))
    assert max(trace.bytes_per_link_per_step().values()) == 3 * 8


def test_worked_example_by_hand():
    # 4 devices, S = 1,000 bytes, W = 100 bytes/s.
    # Ring: 6 steps of 250 bytes = 15 s. Alternate: 3 steps of 1,000 bytes = 30 s.
    v = {N: 4, S: 1000, W: 100}
    assert evaluate(comm.collective_time("all_reduce", S), v) == 15
    assert evaluate(comm.collective_time("alternate_all_reduce", S), v) == 30
    assert evaluate(comm.collective_time("all_gather", S), v) == 7.5
    assert evaluate(comm.bus_bandwidth_factor("all_reduce"), {N: 4}) == 1.5
