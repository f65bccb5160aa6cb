import random
import re
import statistics
import subprocess
import sys

import pytest
import torch
from conftest import run_experiment

from cs336sys.bench import run_point, run_warmup_point
from cs336sys.precision import run_accumulation_point, run_autocast_dtypes_point
from cs336sys.training.step import StepSpec, build_step


@pytest.mark.parametrize("mode", ["forward", "forward_backward", "train_step"])
def test_benchmark_point_keeps_every_step(mode):
    m = run_experiment(run_point, size="tiny", context_length=16, mode=mode, warmup=1, steps=3)
    assert len(m["step_ms"]) == 3 and all(t > 0 for t in m["step_ms"])
    assert m["min_ms"] <= m["median_ms"] <= max(m["step_ms"])
    assert m["flops_per_step"] > 0 and m["achieved_tflops"] > 0
    assert m["peak_rss_bytes"] > 0  # on the CPU: the process's high-water mark


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_train_step_changes_every_weight_and_forward_changes_none(dtype):
    step = build_step(StepSpec("tiny", 16, mode="train_step", dtype=dtype), "cpu")
    before = {n: p.detach().clone() for n, p in step.model.named_parameters()}
    step.run()
    assert all(not torch.equal(before[n], p) for n, p in step.model.named_parameters())
    assert all(p.grad is None for p in step.model.parameters())  # zeroed after the step
    frozen = build_step(StepSpec("tiny", 16, mode="forward", dtype=dtype), "cpu")
    before = {n: p.detach().clone() for n, p in frozen.model.named_parameters()}
    frozen.run()
    assert all(torch.equal(before[n], p) for n, p in frozen.model.named_parameters())


def test_warmup_point_times_from_the_first_step():
    m = run_experiment(run_warmup_point, size="tiny", context_length=8, mode="forward", steps=4, warmups=[0, 1],
                       measured_steps=3)
    assert len(m["step_ms"]) == 4


@pytest.mark.parametrize("key, value, match", [("mode", "sideways", "unknown mode 'sideways'"),
                                               ("size", "huge", "unknown model size 'huge'"),
                                               ("dtype", "fp8", "unknown dtype 'fp8'")])
def test_bad_settings_are_clear_errors(key, value, match):
    point = dict(size="tiny", context_length=8, warmup=0, steps=2) | {key: value}
    with pytest.raises(ValueError, match=match):
        run_experiment(run_point, **point)


def test_unknown_or_mistyped_settings_name_the_key():
    with pytest.raises(ValueError, match=r"unknown setting\(s\) \['context'\]"):
        run_experiment(run_point, size="tiny", context=8)
    with pytest.raises(ValueError, match="context_length = '8' is not of type"):
        run_experiment(run_point, size="tiny", context_length="8")


def test_cli_prints_a_summary_and_rejects_bad_input():
    # the one run of `python -m cs336sys.bench` as a command; the rest call its main in this process
    ok = subprocess.run([sys.executable, "-m", "cs336sys.bench", "--size", "tiny", "--context-length", "8",
                         "--steps", "2", "--warmup", "0", "--device", "cpu"], capture_output=True, text=True)
    assert ok.returncode == 0, ok.stderr
    assert "ms" in ok.stdout and "TFLOP/s" in ok.stdout and "peak process RSS" in ok.stdout
    assert " 0.0 TFLOP/s" not in ok.stdout  # enough digits for small numbers
    bad = bench_cli("--size", "huge", device=None)
    assert bad.returncode != 0 and "known sizes" in bad.stderr
    helptext = bench_cli("--help", device=None)
    assert "(default: 512)" in helptext.stdout and "(default: forward_backward)" in helptext.stdout
    options = re.split(r"\n  (?=-)", helptext.stdout.split("\noptions:\n")[1])
    twice = [o.split()[0] for o in options if o.count("default") > 1]
    assert twice == [] and len(options) > 10  # each option's default said once


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message shown on machines without a GPU")
def test_cli_cuda_without_a_gpu_is_a_clear_error():
    bad = bench_cli("--size", "tiny", device="cuda")
    assert bad.returncode == 2 and "no CUDA GPU is visible" in bad.stderr and "Traceback" not in bad.stderr


def test_accumulation_shows_the_fp16_loss():
    m = run_experiment(run_accumulation_point)
    v = m["values"]
    assert abs(v["fp32 += fp32"] - 10) < 1e-3
    assert abs(v["fp16 += fp16"] - 10) > 0.01  # fp16 accumulation loses visibly
    assert v["fp32 += fp16"] == v["fp32 += fp16 upcast"]  # promotion makes the upcast a no-op


@pytest.mark.parametrize("dtype, low", [("bf16", "bfloat16"), ("fp16", "float16")])
def test_autocast_keeps_parameters_loss_and_grads_in_fp32(dtype, low):
    d = run_experiment(run_autocast_dtypes_point, autocast_dtype=dtype)["dtypes"]
    assert d["parameters"] == d["loss"] == d["gradients"] == "float32"
    assert d["fc1 output"] == d["logits"] == low


def test_backward_is_timed_alone_and_sums_with_the_forward():
    m = run_experiment(run_point, size="tiny", context_length=16, mode="forward_backward", warmup=1, steps=3)
    phases = m["phase_ms"]
    assert set(phases) == {"forward", "backward"} and all(len(v) == 3 for v in phases.values())
    assert all(t > 0 for v in phases.values() for t in v)
    assert m["phase_median_ms"]["backward"] == statistics.median(phases["backward"])
    assert "gpu_busy_ms" not in m  # no GPU: no busy time, rather than a CPU number under a GPU name
    train = run_experiment(run_point, size="tiny", context_length=16, mode="train_step", warmup=0, steps=2)
    assert set(train["phase_ms"]) == {"forward", "backward", "optimizer_step"}
    forward = run_experiment(run_point, size="tiny", context_length=16, mode="forward", warmup=0, steps=2)
    assert "phase_ms" not in forward


def bench_cli(*args: str, device: str | None = "cpu") -> subprocess.CompletedProcess:
    """`python -m cs336sys.bench [--device DEVICE] ARGS` as its main runs it, in this process (a fresh
    interpreter would spend seconds importing torch); its exit status and output as a command's."""
    import contextlib
    import io

    from cs336sys.bench import cli

    argv = [*(["--device", device] if device else []), *args]
    out, err = io.StringIO(), io.StringIO()  # not terminals, as a command's captured output
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            cli.main(argv)
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else 1
    return subprocess.CompletedProcess(["python", "-m", "cs336sys.bench", *argv], code, out.getvalue(), err.getvalue())


def test_cli_json_is_clean_and_states_the_batch():
    import json

    out = bench_cli("--size", "tiny", "--context-length", "8", "--steps", "2", "--warmup", "1", "--batch-size", "3",
                    "--json", "--progress", "on")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)  # nothing but the JSON on stdout
    assert data["settings"]["batch_size"] == 3 and len(data["metrics"]["step_ms"]) == 2
    assert "warm-up 1/1" in out.stderr and "step 2/2, median so far" in out.stderr  # progress on stderr
    quiet = bench_cli("--size", "tiny", "--context-length", "8", "--steps", "1", "--warmup", "0")
    assert quiet.returncode == 0 and "batch=2" in quiet.stdout and "step 1/1" not in quiet.stderr  # not a terminal


def test_cli_refuses_a_size_that_cannot_fit_before_building_it():
    import time

    start = time.monotonic()
    out = bench_cli("--size", "10B", "--context-length", "2048", "--mode", "train_step", "--batch-size", "64")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert "needs about" in out.stderr and "optimizer state" in out.stderr and "--force" in out.stderr
    assert time.monotonic() - start < 60  # refused from the estimate, not after minutes of building


def test_memory_estimate_counts_what_each_mode_keeps():
    from cs336sys.bench import BenchSettings
    from cs336sys.bench.cli import memory_estimate

    s = BenchSettings(size="tiny", context_length=64, mode="train_step", device="cpu")
    parts = memory_estimate(s)
    assert set(parts) == {"parameters", "gradients", "saved activations", "optimizer state"}
    assert parts["optimizer state"] == 2 * parts["parameters"] == 2 * parts["gradients"]
    forward = memory_estimate(BenchSettings(size="tiny", context_length=64, mode="forward", device="cpu"))
    assert forward == {"parameters": parts["parameters"]}


class _Sampler:
    """A ClockSampler stand-in: a known clock per window, and the windows it was asked about."""

    def __init__(self, *args, **kwargs):
        self.windows = []

    def __enter__(self):
        _Sampler.last = self
        return self

    def __exit__(self, *exc):
        return None

    def summary(self, start=None, end=None):
        self.windows.append((start, end))
        return {"sm_clock_mhz": 1500.0 + 100 * len(self.windows)}


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_a_bf16_point_times_its_own_ceiling_after_its_steps_with_the_clocks_of_both(monkeypatch, dtype):
    # on CUDA a bf16 point times the 8192-cube product after its steps (its MFU's ceiling, from its own job);
    # the clock is sampled over the timed steps' window and over the product's
    import cs336sys.bench as bench
    from cs336sys.jobs import Run

    rate = random.uniform(600.0, 800.0)
    called = []
    monkeypatch.setattr(bench, "ClockSampler", _Sampler)
    monkeypatch.setattr(bench, "matmul_tflops", lambda *a: called.append(a) or rate)
    monkeypatch.setattr(Run, "is_cuda", property(lambda self: True))
    settings = bench.BenchSettings(size="tiny", context_length=16, mode="train_step", dtype=dtype, warmup=1, steps=3,
                                   device="cpu")
    m = bench.run_point(settings, Run(device="cpu"))
    (start, end), *rest = _Sampler.last.windows
    assert m["step_clocks"] == {"sm_clock_mhz": 1600.0}
    assert end - start == pytest.approx(sum(m["step_ms"]) / 1e3)  # just the timed steps' window
    if dtype == "bf16":
        assert called == [("bf16", 8192, "cpu", bench.CEILING_REPEATS)] and m["matmul_bf16_tflops"] == rate
        assert m["matmul_clocks"] == {"sm_clock_mhz": 1700.0} and rest[0][0] >= end
    else:  # an fp32 point's ceiling is the CUDA cores' (matmul_peak's): no product timed here
        assert called == [] and "matmul_bf16_tflops" not in m and rest == []


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (none visible)")
def test_a_bf16_point_on_the_gpu_records_its_ceiling_and_both_clocks():
    # the real sampler and product: a ceiling a dense bf16 product reaches on a datacenter GPU, the clocks
    # sampled over the steps and the product where nvidia-smi runs
    import shutil

    import cs336sys.bench as bench
    from cs336sys.jobs import Run

    settings = bench.BenchSettings(size="small", context_length=512, mode="train_step", dtype="bf16", warmup=3,
                                   steps=10, device="cuda")
    m = bench.run_point(settings, Run(device="cuda:0"))
    assert 100.0 < m["matmul_bf16_tflops"] < 2500.0 and m["achieved_tflops"] < m["matmul_bf16_tflops"]
    if shutil.which("nvidia-smi"):
        assert m["step_clocks"]["sm_clock_mhz"] > 0 and m["matmul_clocks"]["sm_clock_mhz"] > 0
