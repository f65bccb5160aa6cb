import subprocess
import sys

import pytest

from cs336sys.bench import run_point, run_warmup_point
from cs336sys.precision import run_accumulation_point, run_autocast_dtypes_point


@pytest.mark.parametrize("mode", ["forward", "forward_backward", "train_step"])
def test_benchmark_point_keeps_every_step(mode):
    m = run_point(dict(size="tiny", context_length=16, mode=mode, dtype="fp32", compile="eager",
                       warmup=1, steps=3, device="cpu"))
    assert len(m["step_ms"]) == 3 and all(t > 0 for t in m["step_ms"])
    assert m["min_ms"] <= m["median_ms"] <= max(m["step_ms"])
    assert m["flops_per_step"] > 0 and m["achieved_tflops"] > 0


def test_train_step_changes_the_weights_and_bf16_runs():
    m = run_point(dict(size="tiny", context_length=16, mode="train_step", dtype="bf16", compile="eager",
                       warmup=0, steps=2, device="cpu"))
    assert m["mean_ms"] > 0


def test_warmup_point_times_from_the_first_step():
    m = run_warmup_point(dict(size="tiny", context_length=8, mode="forward", dtype="fp32", compile="eager",
                              steps=4, device="cpu", warmups=[0, 1], measured_steps=3))
    assert len(m["step_ms"]) == 4


def test_bad_mode_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown mode 'sideways'"):
        run_point(dict(size="tiny", context_length=8, mode="sideways", dtype="fp32", warmup=0, steps=2,
                       device="cpu"))


def test_cli_prints_a_summary_and_rejects_unknown_sizes():
    ok = subprocess.run([sys.executable, "-m", "cs336sys.bench", "--size", "tiny", "--context-length", "8",
                         "--steps", "2", "--warmup", "0", "--device", "cpu"], capture_output=True, text=True)
    assert ok.returncode == 0 and "ms" in ok.stdout
    bad = subprocess.run([sys.executable, "-m", "cs336sys.bench", "--size", "huge"], capture_output=True, text=True)
    assert bad.returncode != 0 and "known sizes" in bad.stderr


def test_accumulation_shows_the_fp16_loss():
    m = run_accumulation_point({"device": "cpu"})
    v = m["values"]
    assert abs(v["fp32 += fp32"] - 10) < 1e-3
    assert abs(v["fp16 += fp16"] - 10) > 0.01  # fp16 accumulation loses visibly
    assert v["fp32 += fp16"] == v["fp32 += fp16 upcast"]  # promotion makes the upcast a no-op


@pytest.mark.parametrize("dtype, low", [("bf16", "bfloat16"), ("fp16", "float16")])
def test_autocast_keeps_parameters_loss_and_grads_in_fp32(dtype, low):
    d = run_autocast_dtypes_point({"device": "cpu", "autocast_dtype": dtype})["dtypes"]
    assert d["parameters"] == d["loss"] == d["gradients"] == "float32"
    assert d["fc1 output"] == d["logits"] == low
