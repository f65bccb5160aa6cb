"""tools/ddp_host_profile.py's reading of a profiler trace: our hooks' calls and time, and the tensor
operations our Python calls directly (not those nested in them, not autograd's between hooks)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

TOOL = Path(__file__).resolve().parents[1] / "tools" / "ddp_host_profile.py"


def _tool():
    spec = importlib.util.spec_from_file_location("ddp_host_profile", TOOL)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _ev(name: str, ts: float, dur: float, cat: str = "cpu_op", tid: int = 1) -> dict:
    return {"ph": "X", "name": name, "ts": ts, "dur": dur, "cat": cat, "tid": tid}


def test_trace_summary_counts_what_our_code_calls_directly():
    hook = "ddp_views.py(70): _on_gradient_ready"
    finish = "ddp_views.py(95): finish_gradient_synchronization"
    events = [
        _ev("aten::mm", 0, 10),  # autograd's, outside every hook
        _ev(hook, 10, 20, "python_function"),
        _ev("aten::copy_", 12, 3), _ev("c10d::allreduce_", 16, 4),
        _ev("aten::empty", 17, 1),  # inside the all-reduce: its own, not ours
        _ev(hook, 40, 5, "python_function"),
        _ev("aten::clone", 41, 2), _ev("aten::empty_like", 41.5, 0.5), _ev("aten::copy_", 42, 0.5),
        _ev("aten::copy_", 41, 1, tid=2),  # another thread at the same time
        _ev(finish, 60, 30, "python_function"),
        _ev("aten::fill_", 61, 1), _ev("c10d::allreduce_", 63, 2), _ev("aten::_foreach_div_", 70, 5),
        _ev("aten::div_", 71, 1),  # inside _foreach_div_
    ]
    s = _tool().profile_summary({"traceEvents": events}, steps=1)
    assert s["hook_calls"] == 2 and s["hook_ms"] == 25 / 1e3
    assert (s["hook_copy"], s["hook_allreduce"], s["hook_alloc"], s["hook_ops"]) == (1, 1, 1, 3)
    assert s["hook_top_ops"] == {"aten::copy_": 1, "c10d::allreduce_": 1, "aten::clone": 1}
    assert (s["finish_calls"], s["finish_fill"], s["finish_allreduce"], s["finish_ops"]) == (1, 1, 1, 3)
    assert s["allreduce_per_step"] == 2 and s["allreduce_launch_ms"] == 6 / 1e3


def test_variant_names_parse():
    parse = _tool().parse_variant
    assert parse("none") == ("none", None) and parse("bucket_view:0") == ("bucket_view", 0.0)
