"""The verdicts the sharding and ddp sections state (cs336sys.analysis.verdicts and the sections' uses
of it), on hand-made numbers on both sides of each threshold and at it."""

from __future__ import annotations

import pytest

from cs336sys.analysis import ddp, ddp_steps, sharding
from cs336sys.analysis.verdicts import (
    Comparison,
    at_most,
    between_jobs,
    compare_times,
    overlaps,
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


def _exposure(events: int, waited_after_first: int) -> dict:
    return {"phases": {"forward": {"gathers": {"events": events, "waited_after_first": waited_after_first}}}}


def test_forward_gathers_verdict():
    assert sharding.forward_gathers_verdict({"phases": {}}) is None  # no forward phase
    assert sharding.forward_gathers_verdict(_exposure(1, 0)) is None  # only the first gather
    assert sharding.forward_gathers_verdict(_exposure(2, 0)).items() >= {"later": 1, "waited": 0,
                                                                          "verdict": "none", "answer": "yes"}.items()
    assert sharding.forward_gathers_verdict(_exposure(11, 5))["verdict"] == "at_most_half"
    assert sharding.forward_gathers_verdict(_exposure(11, 6))["verdict"] == "more_than_half"
    # few gathers waited for, but most of their time with compute idle: not hidden, whatever the count says
    exposed = _exposure(11, 1)
    exposed["phases"]["forward"]["gathers"] |= {"total_us": 100.0, "exposed_us": 94.0}
    fw = sharding.forward_gathers_verdict(exposed)
    assert fw["verdict"] == "at_most_half" and fw["hidden"] is False and fw["answer"] == "not_hidden"
    exposed["phases"]["forward"]["gathers"]["exposed_us"] = 30.0
    assert sharding.forward_gathers_verdict(exposed)["answer"] == "mostly"


def _p(variant: str, mean_ms: float, bucket_mb: float | None = None) -> dict:
    return {"variant": variant, "mean_ms": mean_ms, "std_ms": 0.0, "bucket_mb": bucket_mb, "steps": 10,
            "key": ddp_steps.variant_key(variant, bucket_mb)}


def test_ddp_answers_ratios_to_naive():
    by = {p["key"]: p for p in (_p("none", 50.0), _p("naive", 100.0), _p("flat", 80.0), _p("overlap", 90.0),
                                _p("bucketed", 70.0, 10.0), _p("bucketed", 75.0, 25.0))}
    for p in by.values():
        p["comm_ms"], p["comm_share"] = p["mean_ms"] - 50.0, (p["mean_ms"] - 50.0) / p["mean_ms"]
    a = ddp_steps.answers(by)
    assert a["flat"]["over_naive"] == pytest.approx(0.8)
    assert a["buckets"]["best_over_naive"] == pytest.approx(0.7)
    assert a["buckets"]["best_mb"] == 10.0


def test_ddp_targets_met_at_the_limit():
    limit = ddp_steps.TARGETS["overlap_vs_torch"]
    default = _p("torch_ddp", 1.0, ddp_steps.TORCH_DDP_DEFAULT_MB)
    for mean, ok in ((limit, True), (0.5, True), (limit + 0.01, False)):
        t = ddp_steps.targets({default["key"]: default, "overlap": _p("overlap", mean)})
        assert t["overlap"]["ok"] is ok


def test_grid_time_cpu_only_and_target(tmp_path):
    bench = tmp_path / "benchmarks" / "allreduce"
    bench.mkdir(parents=True)
    (bench / "nccl-2.tsv").write_text(f"s\n{ddp.GRID_TARGET_S}\n")
    g = ddp.grid_time([bench / "nccl-2.tsv"])
    assert (g["has_cpu_only"], g["ok"]) == (False, True)  # exactly the target: met
    (bench / "gloo-2.tsv").write_text("s\n1\n")
    g = ddp.grid_time([bench / "nccl-2.tsv", bench / "gloo-2.tsv"])
    assert (g["has_cpu_only"], g["ok"]) == (True, False)


def test_two_jobs_ranges_agree_where_they_overlap():
    assert overlaps((1.0, 1.1), (1.05, 1.2)) and overlaps((1.0, 1.1), (1.1, 1.2))  # the ends count
    assert not overlaps((1.10, 1.22), (0.90, 1.04)) and not overlaps((0.90, 1.04), (1.10, 1.22))


def test_a_verdict_two_jobs_disagree_on_is_within_the_noise():
    """xl bf16 on 2 ranks: overlap over PyTorch DDP read 1.102-1.223 in one job (missed: above 1.10) and
    0.900-1.039 in another of the same ranks: not reproducible between jobs, so neither met nor missed."""
    assert between_jobs(False, (1.102, 1.223), [(0.900, 1.039)]) == "noise"
    assert between_jobs(True, (0.95, 1.0), [(1.05, 1.1)]) == "noise"
    assert between_jobs(False, (1.13, 1.14), [(1.12, 1.15)]) is False  # the other job agrees: kept
    assert between_jobs(True, (0.95, 1.0), []) is True and between_jobs(None, (1.0, 1.1), [(2.0, 3.0)]) is None
