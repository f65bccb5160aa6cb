"""Snapshot summaries and the memory timeline renderer; saved-tensor, gradient and residual bytes."""

import json
import linecache
import shutil

import pytest
import torch

import cs336sys.model
from cs336sys.model import RMSNorm, TransformerBlock, build_model
from cs336sys.optim import AdamW, cross_entropy
from cs336sys.profiling.memory import (
    BEFORE_RECORDING,
    CPU_SOURCE,
    CUDA_SOURCE,
    OTHER,
    allocation_site,
    cpu_snapshot,
    load_snapshot,
    render_memory_timeline,
    save_snapshot,
    summarize_snapshot,
)
from cs336sys.profiling.saved_tensors import (
    allocated_gradient_bytes,
    gradient_bytes_per_block,
    parameter_gradient_bytes,
    residual_stream_bytes,
    saved_tensor_accounting,
)
from cs336sys.sizes import get_size

MODEL = "/somewhere/src/cs336sys/model.py"
TORCH = "/site-packages/torch/nn/modules/module.py"
FORWARD = [{"filename": MODEL, "line": 48, "name": "forward"}, {"filename": TORCH, "line": 1782, "name": "_call_impl"},
           {"filename": MODEL, "line": 181, "name": "forward"}]
BACKWARD = [{"filename": "??", "line": 0, "name": "c10::cuda::CUDACachingAllocator::Native::malloc(...)"},
            {"filename": "??", "line": 0, "name": "torch::autograd::generated::MmBackward0::apply(...)"}]
OPTIMIZER = [{"filename": "/somewhere/src/cs336sys/optim.py", "line": 46, "name": "step"}]


def _event(action, addr, size, frames=(), phase=""):
    return {"action": action, "addr": addr, "size": size, "stream": 0, "frames": list(frames), "user_metadata": phase}


def synthetic_snapshot():
    """Seven alloc/free events with known totals (bytes after each event, from 114 before any):
    214, 514, 414, 364, 764 (peak), 464, 474."""
    trace = [
        _event("segment_alloc", 0, 1000),
        _event("alloc", 100, 100, FORWARD, "forward"),
        _event("alloc", 200, 300, FORWARD, "forward"),
        _event("free_requested", 100, 100, FORWARD, "forward"),
        _event("free_completed", 100, 100, FORWARD, "forward"),
        _event("free_completed", 900, 50, (), "backward"),  # allocated before recording began
        _event("segment_alloc", 5000, 2000, (), "backward"),
        _event("alloc", 300, 400, BACKWARD, "backward"),
        _event("free_completed", 200, 300, FORWARD, "backward"),
        _event("alloc", 400, 10, OPTIMIZER, "optimizer_step"),
    ]
    blocks = [{"address": 300, "size": 400, "state": "active_allocated", "frames": BACKWARD},
              {"address": 400, "size": 10, "state": "active_allocated", "frames": OPTIMIZER},
              {"address": 800, "size": 64, "state": "active_allocated", "frames": []},  # before recording, alive
              {"address": 864, "size": 136, "state": "inactive"}]
    segments = [{"device": 0, "address": 0, "total_size": 1000, "blocks": blocks},
                {"device": 0, "address": 5000, "total_size": 2000, "blocks": [{"size": 2000, "state": "inactive"}]}]
    return {"segments": segments, "device_traces": [trace]}


def test_summary_of_a_synthetic_snapshot():
    s = summarize_snapshot(synthetic_snapshot())
    assert s["source"] == CUDA_SOURCE and s["events"] == 7
    assert s["timeline"]["total"] == [114, 214, 514, 414, 364, 764, 464, 474]
    assert (s["peak_bytes"], s["peak_event"], s["baseline_bytes"], s["final_bytes"]) == (764, 5, 114, 474)
    assert s["peak_reserved_bytes"] == 3000
    assert s["categories"] == [BEFORE_RECORDING, "autograd: MmBackward0", "model.py:48 forward", "optim.py:46 step"]
    assert s["peak_by_category"] == {BEFORE_RECORDING: 64, "autograd: MmBackward0": 400, "model.py:48 forward": 300,
                                     "optim.py:46 step": 0}
    by_category = dict(zip(s["categories"], s["timeline"]["by_category"], strict=True))
    assert by_category[BEFORE_RECORDING] == [114, 114, 114, 114, 64, 64, 64, 64]
    assert [sum(v) for v in zip(*s["timeline"]["by_category"], strict=True)] == s["timeline"]["total"]
    assert s["phases"] == [{"name": "forward", "start_event": 1, "end_event": 3},
                           {"name": "backward", "start_event": 4, "end_event": 6},
                           {"name": "optimizer_step", "start_event": 7, "end_event": 7}]
    largest = s["largest_allocations"]
    assert [a["bytes"] for a in largest] == [400, 300, 100, 64, 50, 10]
    assert largest[1] == {"bytes": 300, "count": 1, "site": "model.py:48 forward", "phase": "forward",
                          "frames": ["model.py:48 forward", "model.py:181 forward"]}
    code = linecache.getline(cs336sys.model.__file__, 48).strip()
    assert s["category_code"].get("model.py:48 forward") == (code or None)
    json.dumps(s)


def test_summary_keeps_the_peak_when_sampling_and_lumps_small_sites():
    s = summarize_snapshot(synthetic_snapshot(), max_points=3, top_categories=1)
    assert s["timeline"]["event"] == [0, 2, 5, 7]
    assert max(s["timeline"]["total"]) == 764
    assert s["categories"] == [BEFORE_RECORDING, "autograd: MmBackward0", OTHER]


def test_free_requested_is_used_when_no_free_completes():
    snapshot = synthetic_snapshot()
    trace = [e for e in snapshot["device_traces"][0] if e["action"] != "free_completed"]
    snapshot["device_traces"][0] = trace
    s = summarize_snapshot(snapshot)
    assert s["timeline"]["total"] == [64, 164, 464, 364, 764, 774]  # the 100 bytes freed on request


@pytest.mark.parametrize("frames, site", [
    (FORWARD, "model.py:48 forward"),
    (BACKWARD, "autograd: MmBackward0"),
    ([{"filename": "none", "line": 0, "name": "<built-in method pow of Tensor object at 0x7f>"},
      {"filename": "none", "line": 0, "name": "cs336sys/model.py(70): forward"}], "model.py:70 forward"),
    ([{"filename": "/x/cs336sys/profiling/memory.py", "line": 75, "name": "cpu_snapshot"},
      {"filename": "/x/torch/autograd/graph.py", "line": 829, "name": "_engine_run_backward"}],
     "autograd (backward)"),
    ([{"filename": "/x/torch/optim/adamw.py", "line": 10, "name": "_fused_adamw"}], "adamw.py:10 _fused_adamw"),
    ([], "(no stack)"),
])
def test_allocation_sites(frames, site):
    assert allocation_site(frames) == site


def test_render_a_synthetic_timeline(tmp_path):
    render_memory_timeline(summarize_snapshot(synthetic_snapshot()), tmp_path / "m.png", title="synthetic")
    assert (tmp_path / "m.png").stat().st_size > 5000


def test_snapshot_round_trip(tmp_path):
    save_snapshot(synthetic_snapshot(), tmp_path / "s.pickle")
    assert load_snapshot(tmp_path / "s.pickle") == synthetic_snapshot()


def test_cpu_snapshot_of_a_train_step(tmp_path):
    torch.manual_seed(0)
    model = build_model("tiny", 32)
    optimizer = AdamW(model.parameters())
    tokens = torch.randint(0, 10_000, (2, 32))

    def step():
        cross_entropy(model(tokens), tokens).backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    step()  # optimizer state exists before recording, as after a warm-up
    s = summarize_snapshot(cpu_snapshot(step))
    assert s["source"] == CPU_SOURCE and s["peak_reserved_bytes"] is None and s["category_code"] == {}
    weights_and_state = 3 * sum(p.numel() * 4 for p in model.parameters())  # weights, exp_avg, exp_avg_sq
    assert s["baseline_bytes"] >= weights_and_state
    assert s["peak_bytes"] > s["baseline_bytes"]
    assert sum(s["peak_by_category"].values()) == s["peak_bytes"]
    assert any(c.startswith("model.py:") for c in s["categories"])
    assert len(json.dumps(s)) < 200_000
    render_memory_timeline(s, tmp_path / "cpu.png")
    assert (tmp_path / "cpu.png").stat().st_size > 5000


# ---- saved tensors, gradients, residual stream --------------------------------------------------

def _saved_by_graph(output: torch.Tensor, module: torch.nn.Module) -> tuple[int, int]:
    """(unique storage bytes, tensor count) of every tensor the autograd graph holds, read from the
    nodes' `_saved_*` attributes; parameters' storages left out. Independent of the hooks. A Python
    scalar operand (the 1/sqrt(d) of the scores) is saved as a 0-dim CPU "wrapped number" without
    going through the hooks; those are left out too."""
    parameters = {p.untyped_storage().data_ptr() for p in module.parameters()}
    storages, count, seen, stack = {}, 0, set(), [output.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        for name in dir(node):
            if not name.startswith("_saved_"):
                continue
            value = getattr(node, name)
            for t in value if isinstance(value, tuple | list) else [value]:
                if (isinstance(t, torch.Tensor) and t.dim() > 0
                        and t.untyped_storage().data_ptr() not in parameters):
                    storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
                    count += 1
        stack.extend(fn for fn, _ in node.next_functions)
    return sum(storages.values()), count


def test_saved_bytes_of_a_block_equal_the_graphs_saved_tensors():
    torch.manual_seed(0)
    block = TransformerBlock(32, 4, 64, 16, 10_000.0)
    x = torch.randn(2, 16, 32, requires_grad=True)
    report = saved_tensor_accounting(block, x, keep_output=True)
    total, count = _saved_by_graph(report["output"], block)
    assert report["total_bytes"] == total
    assert report["saved"] == count
    assert report["parameter_bytes"] > 0  # the weights' transposes are seen, and left out
    assert sum(r["bytes"] for r in report["by_producer"]) == report["total_bytes"]
    assert sum(r["bytes"] for r in report["by_saver"]) == report["total_bytes"]
    assert len(report["top"]) == 5
    assert report["input_bytes"] == x.numel() * 4
    # the attention probabilities (batch, heads, seq, seq) are saved by softmax and by the final matmul
    probs = [t for t in report["tensors"] if t["produced_by"] == "attn/softmax"]
    assert {t["saved_by"] for t in probs} == {"attn/softmax", "attn/matmul"}
    assert sum(t["bytes"] for t in probs) == 2 * 4 * 16 * 16 * 4
    assert report["tensor_bytes"] > report["total_bytes"]  # duplicates count once in total_bytes


def test_rmsnorm_eager_saves_its_input_twice_over():
    x = torch.randn(4, 16, 64, requires_grad=True)
    report = saved_tensor_accounting(RMSNorm(64), x)
    full = x.numel() * 4
    assert report["total_bytes"] == 2 * full + 4 * 16 * 4  # x, x / rms, and rms
    assert {r["op"] for r in report["by_saver"]} >= {"RMSNorm/pow", "RMSNorm/div", "RMSNorm/mul"}


@pytest.mark.skipif(not (shutil.which("g++") or shutil.which("clang++")),
                    reason="torch.compile's inductor needs a C++ compiler on the CPU")
def test_compiled_rmsnorm_saves_less():
    x = torch.randn(4, 16, 64, requires_grad=True)
    eager = saved_tensor_accounting(RMSNorm(64), x)
    compiled = saved_tensor_accounting(torch.compile(RMSNorm(64)), x)
    assert compiled["saved"] < eager["saved"]
    assert compiled["total_bytes"] == x.numel() * 4 + 4 * 16 * 4  # x and one statistic per row
    assert all(r["op"] == "_orig_mod" for r in compiled["by_saver"])


def test_residual_stream_bytes():
    size = get_size("2.7B")
    assert residual_stream_bytes(4, 512, size.d_model) == 20 * 2**20
    assert residual_stream_bytes(4, 2048, size.d_model) == 80 * 2**20
    assert residual_stream_bytes(4, 2048, size.d_model, bytes_per_element=2) == 40 * 2**20


def test_gradient_bytes_per_block():
    size = get_size("tiny")
    model = build_model(size, 16)
    per_block = 4 * size.d_model**2 + 3 * size.d_model * size.d_ff + 2 * size.d_model
    assert gradient_bytes_per_block(model) == [4 * per_block] * size.num_layers
    tokens = torch.randint(0, 10_000, (2, 16))
    cross_entropy(model(tokens), tokens).backward()
    assert allocated_gradient_bytes(model.layers[0]) == parameter_gradient_bytes(model.layers[0]) == 4 * per_block
