"""The verdicts of cs336sys.analysis.verdicts, on hand-made numbers on both sides of each threshold and at it."""

from __future__ import annotations

import pytest

from cs336sys.analysis.verdicts import (
    Comparison,
    at_most,
    compare_times,
    slower,
    waits,
    within_noise,
    within_tolerance,
)


def test_within_noise_boundary_and_sides():
    assert within_noise(10.0, 1.0, 12.0, 1.0)  # differ by exactly the two deviations: within
    assert within_noise(12.0, 1.0, 10.0, 1.0)  # either order
    assert not within_noise(10.0, 1.0, 12.5, 1.0)
    assert within_noise(10.0, 0.5, 10.25, 0.0)
    assert not within_noise(10.0, None, 10.25, None)  # a missing deviation counts as zero
    assert within_noise(10.0, None, 10.0, None)


def test_compare_times_each_verdict():
    assert compare_times(10.0, 1.0, 12.0, 1.0) == Comparison(ratio=10.0 / 12.0, within_noise=True,
                                                              faster=False, slower=False)
    c = compare_times(13.0, 0.5, 10.0, 0.5)
    assert (c.within_noise, c.faster, c.slower, c.ratio) == (False, False, True, 1.3)
    c = compare_times(8.0, 0.5, 10.0, 0.5)
    assert (c.within_noise, c.faster, c.slower) == (False, True, False)
    assert compare_times(1.0, 0.0, 0.0, 0.0).ratio is None  # no ratio to a zero time
    assert compare_times(13.0, 0.5, 10.0, 0.5).as_dict() == {"ratio": 1.3, "within_noise": False,
                                                              "faster": False, "slower": True}


def test_at_most_and_within_tolerance():
    assert at_most(1.02, 1.02) is True
    assert at_most(1.0, 1.02) is True
    assert at_most(1.03, 1.02) is False
    assert at_most(None, 1.02) is None
    assert within_tolerance(1.25, 0.25) is True  # the boundary counts
    assert within_tolerance(0.75, 0.25) is True
    assert within_tolerance(1.5, 0.25) is False
    assert within_tolerance(0.5, 0.25) is False
    assert within_tolerance(None, 0.25) is None


def test_slower_ratio():
    assert slower(1.5)
    assert not slower(1.0)  # equal time is not slower
    assert not slower(0.9)
    assert not slower(None)


@pytest.mark.parametrize(("waited", "events", "verdict"), [
    (0, 10, "none"), (1, 10, "at_most_half"), (5, 10, "at_most_half"), (6, 10, "more_than_half"),
    (10, 10, "more_than_half"), (1, 1, "more_than_half"), (0, 0, "none")])
def test_waits(waited, events, verdict):
    assert waits(waited, events) == verdict

