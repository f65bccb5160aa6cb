"""Annotations, kernel tables and trace timelines, on CPU traces and on synthetic CUDA traces."""

import json

import pytest
import torch
import torch.distributed as dist

from cs336sys.attention.naive import naive_causal_attention
from cs336sys.model import build_model
from cs336sys.optim import AdamW, cross_entropy
from cs336sys.profiling.annotate import (
    ATTENTION_RANGES,
    PHASES,
    annotated_naive_causal_attention,
    annotating,
    annotations_enabled,
    phase,
)
from cs336sys.profiling.kernels import (
    attention_flops,
    attention_table,
    kernel_class,
    kernel_tables,
    short_kernel_name,
)
from cs336sys.profiling.timeline import render_timeline, summarize_timeline
from cs336sys.profiling.trace import intersection_length, parse_trace, record_trace, union_length
from cs336sys.sizes import get_size
from cs336sys.training.step import StepSpec, build_step

STEPS = 2


def _annotated_train_step(model, optimizer, tokens):
    def step():
        with phase("forward"):
            loss = cross_entropy(model(tokens), tokens)
        with phase("backward"):
            loss.backward()
        with phase("optimizer_step"):
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return step


@pytest.fixture(scope="module")
def cpu_trace(tmp_path_factory):
    """A real CPU trace: 2 profiled train steps (after 1 warm-up) of the tiny model, annotated."""
    torch.manual_seed(0)
    model = build_model("tiny", 32, attention=annotated_naive_causal_attention)
    tokens = torch.randint(0, 10_000, (2, 32))
    path = tmp_path_factory.mktemp("trace") / "train.json"
    record_trace(_annotated_train_step(model, AdamW(model.parameters()), tokens), STEPS, 1, "cpu", path)
    return path


def test_phase_is_a_shared_no_op_when_off():
    assert not annotating()
    assert phase("forward") is phase("backward")  # one shared null context: nothing allocated
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        with phase("forward"):
            torch.ones(3).sum()
    assert "forward" not in {e.name for e in prof.events()}


def test_phase_plugs_into_the_step_builder():
    step = build_step(StepSpec(size="tiny", context_length=16, mode="train_step"), "cpu")
    step.phase = phase
    parsed = parse_trace(record_trace(step.run, 1, 1, "cpu"))
    assert {"forward", "backward", "optimizer_step"} <= {r.name for r in parsed.ranges} <= {"step", *PHASES} | {
        r.name for r in parsed.ranges if r.name.startswith("Optimizer.")}


def test_annotations_enabled_nests_and_restores():
    with annotations_enabled():
        assert annotating()
        with annotations_enabled(False):
            assert not annotating()
        assert annotating()
    assert not annotating()


def test_ranges_are_present_in_a_cpu_profile(cpu_trace):
    parsed = parse_trace(cpu_trace)
    names = {r.name for r in parsed.ranges}
    assert {"step", "forward", "backward", "optimizer_step", "attention", *ATTENTION_RANGES} <= names
    assert len(parsed.occurrences("forward")) == STEPS  # the warm-up step is not in the trace
    layers = get_size("tiny").num_layers
    assert len(parsed.occurrences("attention/softmax")) == STEPS * layers


def test_annotated_attention_equals_naive_attention():
    q, k, v = (torch.randn(2, 3, 17, 8, dtype=torch.float64, requires_grad=True) for _ in range(3))
    grad = torch.randn(2, 3, 17, 8, dtype=torch.float64)
    expected = naive_causal_attention(q, k, v)
    expected_grads = torch.autograd.grad(expected, (q, k, v), grad)
    for enabled in (False, True):
        with annotations_enabled(enabled):
            out = annotated_naive_causal_attention(q, k, v)
        assert torch.equal(out, expected)
        for g, e in zip(torch.autograd.grad(out, (q, k, v), grad), expected_grads, strict=True):
            assert torch.equal(g, e)


@pytest.mark.parametrize("name, expected", [
    ("sm90_xmma_gemm_f32f32_tf32f32_f32_nn_n_tilesize128x128x32_warpgroupsize1x1x1", "matmul"),
    ("nvjet_tst_128x192_64x4_2x1_v_bz_coopA_NNT", "matmul"),
    ("ampere_sgemm_128x64_tn", "matmul"),
    ("void cutlass::Kernel2<cutlass_80_tensorop_s1688gemm_128x128_16x4_tn_align4>(Params)", "matmul"),
    ("void (anonymous namespace)::softmax_warp_forward<float, float, float, 10, false, false>(float*)", "softmax"),
    ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float>(float*, float const*, int)", "softmax"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, "
     "std::array<char*, 3ul> >(int, at::native::CUDAFunctor_add<float>, std::array<char*, 3ul>)", "elementwise"),
    ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::MeanOps<float, float> > >",
     "reduction"),
    ("triton_poi_fused_mul_sigmoid_0", "elementwise"),
    ("triton_red_fused_mean_pow_1", "reduction"),
    ("void at::native::unrolled_elementwise_kernel<at::native::direct_copy_kernel_cuda(at::TensorIteratorBase&)",
     "copy"),
    ("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)", "communication"),
    ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<FusedAdamMathFunctor>", "optimizer"),
    ("flash_fwd_kernel", "attention"),
])
def test_gpu_kernel_classes(name, expected):
    assert kernel_class(name) == expected


@pytest.mark.parametrize("name, expected", [
    ("aten::mm", "matmul"), ("aten::bmm", "matmul"), ("aten::addmm", "matmul"), ("aten::_softmax", "softmax"),
    ("aten::mul", "elementwise"), ("aten::mul_", "elementwise"), ("aten::mean", "reduction"),
    ("aten::index", "indexing"), ("aten::copy_", "copy"), ("aten::view", "other"),
    ("c10d::allreduce_", "communication"),
])
def test_cpu_op_classes(name, expected):
    assert kernel_class(name, "cpu_op") == expected


def test_memcpy_and_collectives_by_kind():
    assert kernel_class("Memcpy HtoD (Pageable -> Device)", "memcpy") == "copy"
    assert kernel_class("gloo:all_reduce", "collective") == "communication"


def test_short_kernel_names():
    name = ("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float>, "
            "std::array<char*, 3ul> >(int, at::native::CUDAFunctor_add<float>, std::array<char*, 3ul>)")
    expected = "vectorized_elementwise_kernel<4, CUDAFunctor_add<float>, array<char*, 3ul> >"
    assert short_kernel_name(name, 200) == expected
    assert short_kernel_name("aten::mm") == "mm"
    assert len(short_kernel_name("x" * 300)) == 72


def test_kernel_tables_from_a_cpu_trace_are_labelled_cpu(cpu_trace):
    parsed = parse_trace(cpu_trace)
    tables = kernel_tables(parsed, top=5)
    assert tables["source"] == "cpu" and "CPU" in tables["tool"]
    assert set(tables["scopes"]) == {"forward", "backward", "optimizer_step", "forward+backward", "train_step"}
    forward = tables["scopes"]["forward"]
    assert forward["occurrences"] == STEPS
    assert 0 < forward["matmul_share"] < 1
    assert len(forward["top"]) == 5
    assert all(a["total_us"] >= b["total_us"] for a, b in zip(forward["top"], forward["top"][1:], strict=False))
    # aten::mm is looked up in the whole table: on a loaded CPU it need not be among the top 5
    everything = kernel_tables(parsed, top=10_000)["scopes"]["forward"]["top"]
    assert everything[:5] == forward["top"]
    mm = next(r for r in everything if r["name"] == "aten::mm")
    assert mm["class"] == "matmul" and mm["calls"] == STEPS * mm["calls_per_occurrence"]
    assert all(r["class"] != "matmul" for r in forward["top_non_matmul"])
    # scopes are unions: forward+backward holds exactly the forward's and the backward's work
    both = tables["scopes"]["forward+backward"]["device_us"]
    assert both == pytest.approx(tables["scopes"]["forward"]["device_us"] + tables["scopes"]["backward"]["device_us"])
    assert tables["ranges"]["forward"]["host_us_per_occurrence"] > 0
    json.dumps(tables)


def test_attention_table_from_a_cpu_trace(cpu_trace):
    size = get_size("tiny")
    table = attention_table(cpu_trace, 2, size.num_heads, 32, size.d_head)
    assert table["calls"] == STEPS * size.num_layers
    assert table["matmul_us"] > 0 and table["softmax_us"] > 0
    assert table["flop_ratio"] == pytest.approx(4 * size.d_head / 5)
    assert table["ranges"]["attention/softmax"]["matmul_us"] == 0


def test_attention_flops():
    scores = 2 * 4 * 8 * 8  # batch * heads * seq * seq
    assert attention_flops(2, 4, 8, 16) == {"scores": 2 * scores * 16, "softmax": 5 * scores,
                                            "final_matmul": 2 * scores * 16}


# ---- synthetic CUDA traces: the exact numbers are known ----------------------------------------

def _x(cat, name, ts, dur, tid=1, **args):
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur, "args": args}


def _launch(name, ts, correlation, stream=7, start=None, dur=10.0, tid=1, cat="kernel"):
    """A runtime launch at host time ts and its kernel on `stream` (by default running later)."""
    start = ts + 5.0 if start is None else start
    return [_x("cuda_runtime", "cudaLaunchKernel", ts, 2.0, tid=tid, correlation=correlation),
            {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": stream, "ts": start, "dur": dur,
             "args": {"correlation": correlation, "stream": stream, "device": 0}}]


def synthetic_cuda_trace():
    """One step: forward launches 2 gemms and a softmax inside attention ranges; the backward's
    kernels are launched by another thread (the autograd engine); an NCCL all-reduce on stream 13
    overlaps the last backward gemm; the optimizer's kernel is launched inside its range but runs
    after the range has closed."""
    events = [
        _x("user_annotation", "step", 0.0, 400.0),
        _x("user_annotation", "forward", 10.0, 90.0),
        _x("user_annotation", "attention/scores", 20.0, 10.0),
        _x("user_annotation", "attention/softmax", 40.0, 10.0),
        _x("user_annotation", "attention/final_matmul", 60.0, 10.0),
        _x("user_annotation", "backward", 110.0, 150.0),
        _x("user_annotation", "nccl:all_reduce", 184.0, 5.0),
        _x("user_annotation", "optimizer_step", 300.0, 20.0),
    ]
    events += _launch("ampere_sgemm_128x64_tn", 22.0, 1, start=27.0, dur=30.0)
    events += _launch("softmax_warp_forward", 42.0, 2, start=60.0, dur=10.0)
    events += _launch("ampere_sgemm_128x64_tn", 62.0, 3, start=75.0, dur=30.0)
    events += _launch("ampere_sgemm_64x64_nn", 120.0, 4, tid=2, start=150.0, dur=60.0)
    events += _launch("vectorized_elementwise_kernel<mul>", 130.0, 5, tid=2, start=210.0, dur=20.0)
    events += _launch("ncclDevKernel_AllReduce_Sum_f32", 185.0, 6, stream=13, start=190.0, dur=40.0)
    events += _launch("multi_tensor_apply_kernel<adam>", 310.0, 7, start=330.0, dur=15.0)
    events += [{"ph": "X", "cat": "gpu_memcpy", "name": "Memcpy DtoD", "pid": 0, "tid": 7, "ts": 105.0,
                "dur": 3.0, "args": {"stream": 7}}]  # no launch in the trace: attributed by its start
    return {"traceEvents": events}


def test_kernels_are_mapped_to_ranges_by_their_launch():
    tables = kernel_tables(synthetic_cuda_trace())
    assert tables["source"] == "cuda" and "CUPTI" in tables["tool"]
    assert tables["unmatched_launches"] == 1
    ranges = tables["ranges"]
    assert ranges["forward"]["device_us"] == 70.0 and ranges["forward"]["matmul_us"] == 60.0
    assert ranges["forward"]["device_span_us_per_occurrence"] == 105.0 - 27.0
    assert ranges["backward"]["device_us"] == 60.0 + 20.0 + 40.0  # launched by another thread
    assert ranges["optimizer_step"]["device_us"] == 15.0  # runs after its range closed
    assert ranges["optimizer_step"]["by_class"] == {"optimizer": 15.0}
    assert ranges["attention/softmax"]["by_class"] == {"softmax": 10.0}
    top = tables["scopes"]["forward"]["top"][0]
    assert (top["name"], top["calls"], top["calls_per_occurrence"], top["total_us"]) == \
        ("ampere_sgemm_128x64_tn", 2, 2.0, 60.0)
    train = tables["scopes"]["train_step"]
    assert train["matmul_share"] == pytest.approx(120.0 / (70.0 + 120.0 + 15.0))
    assert train["by_class"]["communication"] == 40.0
    assert "nccl:all_reduce" not in ranges  # a collective's annotation is not a range of ours


def test_attention_table_on_a_synthetic_trace():
    table = attention_table(synthetic_cuda_trace(), 1, 1, 4, 2)
    assert table["calls"] == 1 and table["matmul_us"] == 60.0 and table["softmax_us"] == 10.0
    assert table["time_ratio"] == 6.0
    assert table["flop_ratio"] == (2 * 16 * 2 * 2) / (5 * 16)


def test_interval_arithmetic():
    assert union_length([(0, 2), (1, 3), (5, 6)]) == 4
    assert intersection_length([(0, 2), (4, 6)], [(1, 5)]) == 2
    assert intersection_length([], [(0, 1)]) == 0


def test_timeline_of_a_synthetic_step(tmp_path):
    summary = summarize_timeline(synthetic_cuda_trace())
    assert summary["window"]["name"] == "step" and summary["source"] == "cuda"
    labels = [lane["label"] for lane in summary["lanes"]]
    assert labels == ["stream 7 (compute)", "stream 13 (communication)"]
    totals = summary["totals"]
    assert totals["communication_us"] == 40.0
    assert totals["compute_us"] == 30 + 10 + 30 + 60 + 20 + 15  # kernels on stream 7 do not overlap
    assert totals["communication_overlapped_us"] == 20.0 + 20.0  # [190, 210) gemm and [210, 230) mul
    assert totals["memcpy_us"] == 3.0
    events = summary["events"]
    assert len(events["name"]) == 8 and len(set(map(len, events.values()))) == 1
    assert summary["names"][events["name"][0]]  # names are indices into the table
    backward = next(r for r in summary["ranges"] if r["name"] == "backward")
    assert (backward["device_start_us"], backward["device_dur_us"]) == (150.0, 80.0)
    assert len(json.dumps(summary)) < 5000
    render_timeline([summary, summary], tmp_path / "t.png", titles=["naive", "overlapped"])
    assert (tmp_path / "t.png").stat().st_size > 5000


def test_timeline_merges_to_stay_small():
    events = [_x("user_annotation", "step", 0.0, 10_000.0)]
    for i in range(500):
        events += _launch(f"kernel_{i % 7}", 1.0 + i, i, start=10.0 + 10 * i, dur=9.5)
    full = summarize_timeline({"traceEvents": events})
    small = summarize_timeline({"traceEvents": events}, max_events=40)
    assert small["merged"] and len(small["events"]["name"]) <= 40
    assert sum(small["events"]["busy_us"]) == pytest.approx(sum(full["events"]["busy_us"]))
    assert sum(small["events"]["count"]) == 500
    assert small["totals"] == full["totals"]


def test_timeline_window_picks_one_occurrence():
    events = []
    for step in range(3):
        events.append(_x("user_annotation", "step", 1000.0 * step, 500.0))
        events += _launch("ampere_sgemm", 1000.0 * step + 10, step, dur=50.0 + step)
    first = summarize_timeline({"traceEvents": events}, occurrence=0)
    last = summarize_timeline({"traceEvents": events})
    assert first["events"]["dur_us"] == [50.0] and last["events"]["dur_us"] == [52.0]
    assert last["events"]["start_us"] == [15.0]  # times are from the window's start


def test_timeline_of_a_cpu_trace_labels_gloo_collectives(tmp_path):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        torch.manual_seed(0)
        model = build_model("tiny", 16)
        tokens = torch.randint(0, 10_000, (2, 16))

        def step():
            with phase("forward"):
                loss = cross_entropy(model(tokens), tokens)
            with phase("backward"):
                loss.backward()
                for work in [dist.all_reduce(p.grad, async_op=True) for p in model.parameters()]:
                    work.wait()
            model.zero_grad(set_to_none=True)

        record_trace(step, 1, 1, "cpu", tmp_path / "ddp.json")
    finally:
        dist.destroy_process_group()
    summary = summarize_timeline(tmp_path / "ddp.json")
    assert summary["source"] == "cpu"
    names = [summary["names"][i] for i, c in zip(summary["events"]["name"], summary["events"]["category"],
                                                   strict=True) if c == "communication"]
    assert names and all(n.startswith(("gloo:", "c10d::")) for n in names)
    assert summary["totals"]["communication_us"] > 0 and summary["totals"]["compute_us"] > 0
    assert {"forward", "backward"} <= {r["name"] for r in summary["ranges"]}
    render_timeline(summary, tmp_path / "ddp.png")
    assert (tmp_path / "ddp.png").stat().st_size > 5000
