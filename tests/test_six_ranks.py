"""Six ranks (issue 61): the NCCL all-reduce, DDP, optimizer sharding and FSDP jobs at 6 ranks are in the grid
but wait in the overlay `next` until an 8-GPU host is lent, and the report's limitations say so, grouped."""

from __future__ import annotations

from test_registry import list_rules

from cs336sys.analysis.ddp import _by_world
from cs336sys.analysis.sharding import _unrun

SIX = {"allreduce_nccl_6", "ddp_step_xl_fp32_ws6", "ddp_step_xl_bf16_ws6", "ddp_step_2_7B_fp32_ws6",
       "ddp_step_2_7B_bf16_ws6", "sharding_memory_xl_ws6", "sharding_memory_2_7B_ws6", "fsdp_step_xl_ws6",
       "fsdp_step_2_7B_ws6"}


def test_the_six_rank_jobs_wait_in_next_and_not_in_main():
    main, waiting = list_rules(), list_rules("--config", "grid=next")
    assert not SIX & main
    assert SIX <= waiting


def test_pending_ddp_jobs_are_said_by_world_size():
    said = _by_world(["xl-fp32-ws4", "2.7B-fp32-ws4", "xl-bf16-ws6", "2.7B-bf16-ws6"])
    assert said == "at 4 ranks (2.7B-fp32, xl-fp32) and 6 ranks (2.7B-bf16, xl-bf16)"
    assert _by_world(["xl-fp32"]) == "jobs xl-fp32"


def test_pending_sharding_jobs_share_a_line_where_their_sizes_agree():
    both = ["sharding_memory/xl-ws6", "sharding_memory/2.7B-ws6", "fsdp_step/xl-ws6", "fsdp_step/2.7B-ws6"]
    assert _unrun(both) == "optimizer sharding and FSDP at 6 ranks (2.7B, xl)"
    assert _unrun(["fsdp_step/2.7B-ws4", "sharding_memory/xl-ws6"]) == (
        "optimizer sharding at 6 ranks (xl); FSDP at 4 ranks (2.7B)")  # the optimizer's part first, as the section
