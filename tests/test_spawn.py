"""The spawn helper: results in rank order (tensors too), and a failing or dying rank ends the run
at once with an error naming it."""

from __future__ import annotations

import os
import time

import pytest
import torch
import torch.distributed as dist

from cs336sys.distributed.spawn import RankFailed, spawn


def _sum_of_ranks(info, scale):
    t = torch.tensor([float(info.rank + 1)])
    dist.all_reduce(t)
    return {"rank": info.rank, "sum": t * scale}  # a tensor in the result


def _raise_on_rank_1(info):
    if info.rank == 1:
        raise KeyError("planted")
    dist.barrier()  # rank 0 waits here for a rank that will never come


def _die_on_rank_0(info):
    if info.rank == 0:
        os._exit(5)
    dist.barrier()


def test_results_come_back_in_rank_order_tensors_included():
    results = spawn(_sum_of_ranks, 3, 2.0)
    assert [r["rank"] for r in results] == [0, 1, 2]
    assert all(torch.equal(r["sum"], torch.tensor([12.0])) for r in results)


@pytest.mark.parametrize("fn, rank, text", [(_raise_on_rank_1, 1, "KeyError: 'planted'"),
                                            (_die_on_rank_0, 0, "exit code 5")])
def test_a_failing_rank_ends_the_run_quickly_and_is_named(fn, rank, text):
    start = time.monotonic()
    with pytest.raises(RankFailed) as failure:
        spawn(fn, 2, pg_timeout_s=30)
    assert failure.value.rank == rank and text in str(failure.value)
    assert time.monotonic() - start < 25  # not the 30 s collective timeout: the helper stops the others
