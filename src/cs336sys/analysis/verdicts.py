"""The verdicts the report's text states, decided here so that a section's template only lays out the
words a verdict selects: one mean time against another (faster, slower, or within the noise), a value
against its limit (a target met), a ratio against one within a tolerance, and how many of a set of
events waited. Each returns plain values, so a section's context (JSON) carries them as they are."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal


@dataclass(frozen=True)
class Comparison:
    """Mean time `a` against mean time `b`: `ratio` is a / b (None where b is zero); `within_noise` when
    the means differ by no more than the two standard deviations together; otherwise exactly one of
    `faster` (a below b) and `slower` (a above b) holds."""

    ratio: float | None
    within_noise: bool
    faster: bool
    slower: bool

    def as_dict(self) -> dict:
        return asdict(self)


def within_noise(mean_a: float, std_a: float | None, mean_b: float, std_b: float | None) -> bool:
    """Whether two means differ by at most the sum of their standard deviations (a missing deviation
    counts as zero); equality at the boundary counts as within."""
    return abs(mean_a - mean_b) <= (std_a or 0.0) + (std_b or 0.0)


def compare_times(mean_a: float, std_a: float | None, mean_b: float, std_b: float | None) -> Comparison:
    """Mean time `a` against `b`, each with its step-to-step standard deviation (see `Comparison`)."""
    noise = within_noise(mean_a, std_a, mean_b, std_b)
    return Comparison(ratio=mean_a / mean_b if mean_b else None, within_noise=noise,
                      faster=not noise and mean_a < mean_b, slower=not noise and mean_a > mean_b)


def at_most(value: float | None, limit: float) -> bool | None:
    """A target of the form "at most `limit`": met when `value` <= `limit`; None when not measured."""
    return None if value is None else bool(value <= limit)


def within_tolerance(ratio: float | None, tolerance: float) -> bool | None:
    """A ratio to a prediction within ±`tolerance` of one (the boundary included); None when absent."""
    return None if ratio is None else bool(abs(ratio - 1) <= tolerance)


def slower(ratio: float | None) -> bool:
    """Whether a time ratio (ours over a reference) says ours is slower: above one. None is not slower."""
    return ratio is not None and ratio > 1


WaitVerdict = Literal["none", "at_most_half", "more_than_half"]


def waits(waited: int, events: int) -> WaitVerdict:
    """How many of `events` waited: none, at most half of them (half included), or more than half."""
    if waited == 0:
        return "none"
    return "at_most_half" if 2 * waited <= events else "more_than_half"


Verdict = bool | Literal["noise"]


def against_limit(lo: float | None, hi: float | None, limit: float) -> Verdict | None:
    """A target "at most `limit`" judged on a range of a measurement (a ratio's range across interleaved
    rounds): met (True) when all of it is within the limit, missed (False) when none of it is, and "noise"
    when the range straddles the limit, so the measurement cannot tell; None when not measured."""
    if lo is None or hi is None:
        return None
    if hi <= limit:
        return True
    if lo > limit:
        return False
    return "noise"


def all_of(verdicts: list[Verdict | None]) -> Verdict | None:
    """One verdict for several measurements of one target: missed if any missed, met if all met, else
    within noise; None when none was measured."""
    measured = [v for v in verdicts if v is not None]
    if not measured:
        return None
    if any(v is False for v in measured):
        return False
    return True if all(v is True for v in measured) else "noise"


def overlaps(a: tuple[float, float], b: tuple[float, float]) -> bool:
    """Whether two ranges (low, high) share a value: two measurements of one comparison agree within their
    spreads (the ends included)."""
    return a[0] <= b[1] and b[0] <= a[1]


def between_jobs(verdict: Verdict | None, own: tuple[float, float],
                 others: list[tuple[float, float]]) -> Verdict | None:
    """A job's verdict on a range, given the ranges other jobs measured for the same comparison: kept where
    every other range overlaps the job's; where one does not, the comparison is not reproducible between jobs
    and its verdict is "noise" (neither met nor missed); None stays None."""
    if verdict is None or all(overlaps(own, o) for o in others):
        return verdict
    return "noise"
