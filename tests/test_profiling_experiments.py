"""The profiling and memory experiments on the CPU with tiny models, the two report sections built
from their results (and from none), and the sections' templates rendered empty and filled."""

from __future__ import annotations

import json
import pickle
import shutil

import pytest
import torch
from conftest import run_experiment
from test_report import TEMPLATES, empty_sections

from cs336sys import jobs
from cs336sys.analysis import memory as memory_section
from cs336sys.analysis import profiling as profiling_section
from cs336sys.analysis.__main__ import main as analysis_main
from cs336sys.analysis.context import as_json
from cs336sys.jobs import parse_settings, settings_as_run, settings_type
from cs336sys.profiling import experiments_checkpointing
from cs336sys.profiling.annotate import ATTENTION_RANGES
from cs336sys.profiling.experiments import run_kernel_profile
from cs336sys.profiling.experiments_checkpointing import run_checkpointing
from cs336sys.profiling.experiments_memory import (
    compiler_available,
    run_memory_snapshot,
    run_saved_tensors,
)
from cs336sys.profiling.memory import CPU_SOURCE
from cs336sys.profiling.saved_tensors import saved_tensor_accounting
from cs336sys.registry import SECTIONS
from cs336sys.report import render_markdown
from cs336sys.results import write_result
from cs336sys.sizes import get_size
from cs336sys.writeup import lint

MAX_RESULT_BYTES = 200_000


def _point(root, experiment: str, name: str, fn, rendered: bool = False, **point) -> dict:
    """Run one point as the job runner would (its settings recorded with defaults) and write its result
    under root/results/<experiment>/<name>.json; the rendered folder beside it when asked."""
    out = root / "results" / experiment / f"{name}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    artifacts = root / "artifacts" / experiment / name
    rendered_dir = out.with_suffix("") if rendered else None
    metrics = run_experiment(fn, artifact_dir=artifacts, rendered_dir=rendered_dir, **point)
    settings = parse_settings(settings_type(fn), {"device": "cpu", **point})
    write_result(out, experiment, settings_as_run(settings), metrics)
    return {"path": out, "metrics": metrics, "artifacts": artifacts, "rendered": rendered_dir}


def _failed(root, experiment: str, name: str, fn, status: str = "oom", **point) -> None:
    out = root / "results" / experiment / f"{name}.json"
    settings = parse_settings(settings_type(fn), {"device": "cpu", **point})
    write_result(out, experiment, settings_as_run(settings), {}, status, "OutOfMemoryError: synthetic")


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("grid")
    r = {"root": root}
    for mode in ("forward", "train_step"):
        r[f"kernel_{mode}"] = _point(root, "kernel_profile", f"tiny/{mode}-fp32-ctx32", run_kernel_profile,
                                     size="tiny", context_length=32, mode=mode)
    for mode in ("forward", "train_step"):
        for dtype in ("fp32", "bf16"):
            r[f"snapshot_{mode}_{dtype}"] = _point(
                root, "memory_snapshot", f"tiny/{mode}-{dtype}-ctx32", run_memory_snapshot, rendered=True,
                size="tiny", context_length=32, mode=mode, dtype=dtype)
    _failed(root, "memory_snapshot", "tiny/train_step-fp32-ctx64", run_memory_snapshot, size="tiny",
            context_length=64, mode="train_step")
    r["saved"] = _point(root, "saved_tensors", "tiny/fp32-ctx32", run_saved_tensors, size="tiny", context_length=32)
    for k in (0, 1, 2):
        r[f"ckpt_{k}"] = _point(root, "checkpointing", f"tiny2/k{k}", run_checkpointing, size="tiny2",
                                context_length=32, checkpoint_blocks=k, batch_size=2)
    _failed(root, "checkpointing", "tiny2/k3", run_checkpointing, size="tiny2", context_length=32,
            checkpoint_blocks=3, batch_size=2)
    return r


def _results(root, *experiments):
    paths = []
    for e in experiments:
        base = root / "results" / e
        paths += sorted(base.rglob("*.json"))
        paths += sorted(p.with_suffix("") for p in base.rglob("*.json") if p.with_suffix("").is_dir())
    return [p for p in paths if p.name != "index.json" and p.name != "summary.json"]


# --- experiments -------------------------------------------------------------------------------------

def test_kernel_profile_train_step_on_the_cpu(runs):
    r = runs["kernel_train_step"]
    m = r["metrics"]
    assert (r["artifacts"] / "trace.json").stat().st_size > 0
    assert m["tool"] == "torch.profiler (CPU ops, no kernels)" and m["trace_source"] == "cpu"
    assert {"forward", "backward", "optimizer_step", "forward+backward", "train_step"} <= set(m["scopes"])
    assert m["ranges"]["forward"]["occurrences"] == 2  # the profiled steps only: warm-up is never in a trace
    assert m["attention"]["calls"] == 2 * get_size("tiny").num_layers
    assert set(m["attention"]["ranges"]) == set(ATTENTION_RANGES)
    assert m["scopes"]["forward"]["top"][0]["calls"] > 0 and len(m["scopes"]["forward"]["top"]) <= 8
    assert len(m["python_step_ms"]) == 2 and m["python_profiled_ms"]["mean_ms"] > 0
    assert len(json.dumps(m)) < MAX_RESULT_BYTES


def test_kernel_profile_forward_times_its_forward(runs):
    m = runs["kernel_forward"]["metrics"]
    assert set(m["scopes"]) == {"forward"}
    assert 0 < m["profiler_forward_busy_ms"] <= m["profiler_forward_ms"] <= m["profiler_step_ms"]
    assert m["attention"]["flop_ratio"] > 1


def test_memory_snapshot_writes_its_summary_figure_and_raw_snapshot(runs):
    r = runs["snapshot_train_step_fp32"]
    m = r["metrics"]
    assert m["source"] == CPU_SOURCE
    with open(r["artifacts"] / "snapshot.pickle", "rb") as f:
        assert "device_traces" in pickle.load(f)
    summary = json.loads((r["rendered"] / "summary.json").read_text())
    assert summary["peak_bytes"] == m["peak_bytes"] > m["baseline_bytes"] > 0
    assert (r["rendered"] / "timeline.png").stat().st_size > 5000
    assert m["files"] == {"summary": "summary.json", "timeline": "timeline.png"}
    size = get_size("tiny")
    assert m["residual_bytes"] == size.batch_size * 32 * size.d_model * 4
    assert m["residual"]["nearest_bytes"] == m["residual_bytes"] and m["residual"]["exact_matches"] > 0
    assert m["largest_allocations"][0]["bytes"] >= m["largest_allocations"][-1]["bytes"]
    assert m["phase_end_bytes"] is None and m["peak_allocated_bytes"] is None  # CUDA only
    assert len(json.dumps(m)) < MAX_RESULT_BYTES


def test_saved_tensors_of_a_tiny_block(runs):
    m = runs["saved"]["metrics"]
    size = get_size("tiny")
    torch.manual_seed(0)
    from cs336sys.training.step import StepSpec, build_step

    block = build_step(StepSpec(size="tiny", context_length=32, mode="forward_backward"), "cpu").model.layers[0]
    direct = saved_tensor_accounting(block, torch.randn(size.batch_size, 32, size.d_model, requires_grad=True))
    assert m["block"]["total_bytes"] == direct["total_bytes"]
    assert [t["op"] for t in m["block"]["top"]] == [t["op"] for t in direct["top"]] and len(m["block"]["top"]) == 5
    per_block = 4 * (4 * size.d_model**2 + 3 * size.d_model * size.d_ff + 2 * size.d_model)
    assert m["gradient_bytes_per_block"] == m["gradient_bytes_measured"] == per_block
    full = size.batch_size * 32 * size.d_model * 4
    assert m["rmsnorm"]["eager"]["total_bytes"] == 2 * full + size.batch_size * 32 * 4
    if compiler_available() is None:
        assert m["rmsnorm"]["compiled"]["total_bytes"] == full + size.batch_size * 32 * 4
    else:
        assert "compiled" not in m["rmsnorm"] and m["rmsnorm"]["compiled_skipped"]


def test_checkpointing_points(runs):
    none, one = runs["ckpt_0"]["metrics"], runs["ckpt_1"]["metrics"]
    size = get_size("tiny2")
    assert none["groups"] == 0 and one["groups"] == size.num_layers
    assert none["block_saved_bytes"] == one["block_saved_bytes"] > 0
    assert none["boundary_bytes"] == 2 * 32 * size.d_model * 4
    assert none["predicted_activation_bytes"] == size.num_layers * none["block_saved_bytes"]
    assert one["peak_memory_bytes"] > one["baseline_bytes"] > 0 and "CPU" in one["peak_source"]
    assert len(one["step_times_ms"]) == 2


def test_checkpointing_out_of_memory_is_a_result(monkeypatch):
    def no_memory(*args, **kwargs):
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(experiments_checkpointing, "time_steps", no_memory)
    settings = parse_settings(settings_type(run_checkpointing), {"size": "tiny", "context_length": 16,
                                                                 "checkpoint_blocks": 0, "device": "cpu"})
    outcome = jobs.attempt(run_checkpointing, settings, jobs.Run())
    assert outcome.status == "oom" and "out of memory" in outcome.reason


# --- sections and templates ----------------------------------------------------------------------------

def test_sections_build_from_no_results(tmp_path):
    for module in (profiling_section, memory_section):
        out = tmp_path / module.__name__.rsplit(".", 1)[1]
        out.mkdir()
        ctx = as_json(module.build([], out))
        assert {k: v for k, v in ctx.items() if k != "summary"} == {"env": {}, "tables": {}, "figures": {}}
        assert ctx.get("summary", []) == []


def _build_sections(runs, root):
    dirs = {}
    for name, experiments in (("profiling", ["kernel_profile"]),
                              ("memory", ["memory_snapshot", "saved_tensors", "checkpointing"])):
        out = root / "sections" / name
        out.parent.mkdir(parents=True, exist_ok=True)
        assert analysis_main([name, "--results", *map(str, _results(runs["root"], *experiments)),
                              "--out", str(out)]) == 0
        dirs[name] = out
    return dirs


def test_sections_build_from_the_results(runs, tmp_path):
    dirs = _build_sections(runs, tmp_path)
    prof = json.loads((dirs["profiling"] / "context.json").read_text())
    assert not prof["is_cuda_trace"] and prof["unit"] == "CPU op"
    assert {"forward_time", "top_summary", "top_forward", "top_fb", "non_matmul", "classes", "attention"} <= set(
        prof["tables"])
    assert (dirs["profiling"] / prof["figures"]["classes"]).is_file()
    assert prof["result_counts"] == {"kernel_profile": 2}
    for table in prof["tables"].values():
        assert len(table.splitlines()[0].split("|")) - 2 <= 9  # at most 9 columns in print

    mem = json.loads((dirs["memory"] / "context.json").read_text())
    assert {"peaks", "residual", "largest", "block_top", "rmsnorm", "checkpointing"} <= set(mem["tables"])
    assert "oom" in mem["tables"]["peaks"] and mem["snapshot"]["oom"]
    assert [t["mode"] for t in mem["timeline"]["modes"]] == ["forward", "train step"]
    assert all((dirs["memory"] / t["figure"]).is_file() for t in mem["timeline"]["modes"])
    assert set(mem["bf16_ratio"]) == {"forward", "train step"}
    # (d) answered at the saved-tensor point's context, which the snapshots ran (issue 60: say which and why)
    assert mem["residual"]["at"] == "saved_tensors" and mem["residual"]["context_length"] == 32
    ckpt = mem["ckpt"]
    assert ckpt["group_sizes"] == [0, 1, 2, 3] and ckpt["oom"] == [3]
    # on the CPU the tiny model's peak is the logits', the same for every k: the best is the lowest peak
    # measured among the group sizes (no checkpointing, k = 0, is reported apart), ties to the smaller k;
    # its neighbours are group sizes too
    peaks = {k: runs[f"ckpt_{k}"]["metrics"]["peak_memory_bytes"] for k in (1, 2)}
    best = min(peaks, key=lambda k: (peaks[k], k))
    assert ckpt["best"]["k"] == best and ckpt["none"]["k"] == 0
    neighbours = [q["k"] for q in (ckpt["smaller"], ckpt["larger"]) if q]
    assert 0 not in neighbours and neighbours == [k for k in (best - 1, best + 1) if k in (1, 2, 3)]
    assert ckpt["num_layers"] == get_size("tiny2").num_layers
    assert ckpt["nested"]["recompute_forwards"] == 6  # 3 + 2 + 1 block forwards for three blocks
    assert (dirs["memory"] / mem["figures"]["checkpointing"]).is_file()
    assert mem["saved"]["gradient_match"]
    for table in mem["tables"].values():
        assert len(table.splitlines()[0].split("|")) - 2 <= 9


def test_templates_render_empty_and_filled(runs, tmp_path):
    empty = empty_sections(tmp_path / "empty")
    text = render_markdown(empty, TEMPLATES, tmp_path / "empty" / "report.md")
    assert "Profiling a step" in text and "Memory: snapshots" in text

    filled_root = tmp_path / "filled"
    dirs = {d.name: d for d in empty_sections(filled_root)}
    for name, built in _build_sections(runs, tmp_path / "built").items():
        shutil.rmtree(dirs[name])
        shutil.copytree(built, dirs[name])
    text = render_markdown([dirs[s] for s in SECTIONS], TEMPLATES, filled_root / "writeup" / "report.md")
    assert lint.problems(text) == [], "\n".join(lint.problems(text))
    profiling = text.split(" Profiling a step\n")[1].split("\n## ")[0]
    memory = text.split(" Memory: snapshots, saved tensors, checkpointing\n")[1].split("\n## ")[0]
    assert "CPU numbers from the smoke grid" in profiling and "CPU ops, not kernels" in profiling
    assert "torch.profiler (CPU ops, no kernels)" in profiling
    assert "nsys_profile (a)" in profiling and "nsys_profile (e)" in profiling
    assert "CPU numbers from the smoke grid" in memory and CPU_SOURCE in memory
    for heading in ("active-memory timelines", "peak memory", "residual-stream", "largest allocations",
                    "saved for backward", "RMSNorm, eager against compiled", "one level of checkpointing"):
        assert heading in memory, heading
    assert "n/a" not in memory.replace("`n/a`", "")
    # the class shares and the checkpointing sweep are secondary figures: printed in the appendix
    assert "timeline_forward.png" in memory
    appendix = text.split(" Index of deliverables")[-1]
    assert "profiling/time_by_class.png" in appendix and "memory/checkpointing_sweep.png" in appendix


def test_the_longest_context_that_ran_is_read_per_size_and_mode():
    # nsys_profile (2026): per mode, each size's longest context that ran; "+" when the grid's longest ran; the
    # first context out of memory after it; a size run on another GPU model than most is named
    import random

    def point(size, ctx, mode, status, gpu="NVIDIA H200"):
        return {"settings": {"size": size, "context_length": ctx, "mode": mode}, "status": status,
                "env": {"gpu": gpu}}

    fits = random.choice([256, 512, 1024])
    grid = [128, 256, 512, 1024, 2048]
    results = [point("small", c, m, "ok") for c in grid for m in ("forward", "train_step")]
    results += [point("xl", c, "train_step", "ok" if c <= fits else "oom") for c in grid]
    results += [point("xl", c, "forward", "ok") for c in grid]
    results += [point("2.7B", c, m, "oom" if (m, c) == ("train_step", 1024) else "ok", "NVIDIA H100 80GB HBM3")
                for c in grid[:4] for m in ("forward", "train_step")]
    random.shuffle(results)
    from cs336sys.analysis.profiling_grid import longest_contexts

    longest = longest_contexts(results)
    assert longest["train_step"] == ["small 2048+", f"xl {fits} ({grid[grid.index(fits) + 1]} out of memory)",
                                     "2.7B 512 (1024 out of memory, on the H100)"]
    assert longest["forward"] == ["small to xl 2048+", "2.7B 1024+ (on the H100)"]  # one answer in a row: joined
