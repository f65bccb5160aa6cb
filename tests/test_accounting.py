"""The accounting calculator, its command line, and the predicted-vs-measured checks on synthetic
results (`synthetic_results` writes them through the real result writer)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from cs336sys.accounting import checks
from cs336sys.accounting.__main__ import main
from cs336sys.accounting.hardware import PRESETS, get_hardware, preset_for_gpu
from cs336sys.accounting.plan import make_setup, plan
from cs336sys.results import load_results, write_result
from cs336sys.sizes import parameter_count


# The calculator.
def test_ddp_plan_by_hand():
    # Gradients of P fp32 parameters all-reduced over 2 GPUs: 2 * (1/2) * 4P / W seconds.
    p = plan(make_setup("xl", 2, "ddp", "h100", batch_size=1, context_length=128))
    w = PRESETS["h100"].bandwidth
    assert p.value("parameters") == parameter_count("xl")
    assert p.value("gradients") == 4 * parameter_count("xl")
    comm = [r for r in p.rows if r.group == "communication per GPU" and r.quantity != "total"]
    assert len(comm) == 1 and comm[0].value == pytest.approx(4 * parameter_count("xl") / w)
    assert p.value("tokens per step (all GPUs)") == 2 * 128


def test_fsdp_plan_shards_the_state_and_tp_divides_the_flops():
    full = plan(make_setup("2.7B", 1, "single", "h100"))
    fsdp = plan(make_setup("2.7B", 8, "fsdp", "h100"))
    tp = plan(make_setup("2.7B", 4, "tp", "h100"))
    assert fsdp.value("optimizer state (AdamW)") < full.value("optimizer state (AdamW)") / 7
    assert fsdp.value("train-step FLOPs") == full.value("train-step FLOPs")  # same per-rank batch
    assert tp.value("train-step FLOPs") < full.value("train-step FLOPs") / 3  # all but the LM head divided


@pytest.mark.parametrize("args, message", [
    (["--model", "huge"], "unknown model size"),
    (["--strategy", "pipeline"], "unknown strategy"),
    (["--hardware", "tpu-v9"], "unknown hardware"),
    (["--strategy", "single", "--gpus", "2"], "one GPU"),
    (["--strategy", "fsdp_tp", "--gpus", "8", "--tp", "3"], "--tp dividing"),
    (["--strategy", "tp", "--gpus", "3"], "divide the heads"),
    (["--strategy", "ddp", "--tp", "2"], "applies to strategies"),
    (["--gpus", "0"], "at least 1"),
])
def test_cli_rejects_bad_input(args, message, capsys):
    with pytest.raises(SystemExit) as e:
        main(args)
    assert e.value.code == 2
    assert message in capsys.readouterr().err


def test_cli_prints_a_table_json_and_formulas(capsys):
    assert main(["--model", "2.7B", "--gpus", "8", "--strategy", "fsdp"]) == 0
    out = capsys.readouterr().out
    assert "all-gather" in out and "reduce-scatter" in out and "optimizer state" in out
    assert main(["--model", "10B", "--gpus", "16", "--strategy", "fsdp_tp", "--tp", "4", "--json",
                 "--bandwidth", "100", "--flops", "500"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["setup"]["hardware"]["bandwidth"] == 100e9
    assert "command line" in data["setup"]["hardware"]["bandwidth_source"]
    assert main(["--model", "small", "--gpus", "2", "--strategy", "zero1", "--formulas"]) == 0
    assert "P_block" in capsys.readouterr().out


def test_cli_as_a_module_documents_its_defaults():
    proc = subprocess.run([sys.executable, "-m", "cs336sys.accounting", "--help"], capture_output=True, text=True)
    assert proc.returncode == 0
    text = " ".join(proc.stdout.split())  # argparse wraps lines
    assert "(default: 2.7B)" in text and "(default: fsdp)" in text and "(default: h100)" in text


def test_hardware_presets_name_their_sources():
    for hw in PRESETS.values():
        assert hw.flops_source and hw.bandwidth_source and hw.memory_source
    assert get_hardware("handout").flops == 4.6e14 and get_hardware("handout").bandwidth == 1.8e11
    assert preset_for_gpu("NVIDIA H100 80GB HBM3").name == "h100" and preset_for_gpu(None) is None


# Checks against results (synthetic ones, written through the real writer).
def synthetic_results(root: Path) -> list[Path]:
    w = 100e9  # 100 GB/s bus bandwidth at the largest size
    paths = []

    def add(name: str, problem: str, settings: dict, metrics: dict) -> None:
        paths.append(root / f"{name}.json")
        write_result(paths[-1], problem, settings, metrics)

    for size_bytes in (2**20, 2**30):  # 1 MiB and 1 GiB, as the grid runs them
        t = 2 * 0.5 * size_bytes / w
        add(f"ar{size_bytes}", "allreduce", {"backend": "nccl", "world_size": 2, "size_bytes": size_bytes,
                                            "dtype": "fp32"},
            {"median_ms": t * 1e3 * (3 if size_bytes < 2**30 else 1), "algbw_gbps": size_bytes / t / 1e9,
             "busbw_gbps": w / 1e9})
    grad = 4 * parameter_count("tiny")
    t_grad = 2 * 0.5 * grad / w * 1e3
    # As cs336sys.distributed.experiments writes them: world_size among the metrics, the wait as sync_wait_ms.
    shape = {"size": "tiny", "context_length": 16, "batch_size": 2, "dtype": "fp32", "bucket_size_mb": None}
    add("ddp_none", "ddp_step", {**shape, "variant": "none"}, {"mean_ms": 5.0, "sync_wait_ms": 0.0,
                                                              "grad_bytes": grad, "world_size": 2})
    add("ddp", "ddp_step", {**shape, "variant": "flat"},
        {"mean_ms": 5.0 + 2 * t_grad, "sync_wait_ms": 1.25 * t_grad, "grad_bytes": grad, "world_size": 2})
    p = parameter_count("tiny")
    add("shard", "sharding_memory", {"size": "tiny", "variant": "sharded", "world_size": 2},
        {"param_bytes": 4 * p, "grad_bytes": 4 * p, "optimizer_state_bytes": 4 * p, "peak_after_step_bytes": 13 * p})
    add("peak", "matmul_peak", {"device": "cuda", "dtype": "bf16", "n": 8192}, {"tflops": 700.0})
    peak = json.loads(paths[-1].read_text())
    peak["env"]["gpu"] = "NVIDIA H100 80GB HBM3"  # as a GPU host records it
    paths[-1].write_text(json.dumps(peak))
    add("fsdp", "fsdp_step", {"size": "tiny", "compute_dtype": "bf16", "variant": "ours", "world_size": 2},
        {"mean_ms": 3.0, "peak_bytes": 10 * p, "sharded_param_bytes": 2 * p})
    return paths


def test_measured_checks_compute_ratios_from_results(tmp_path):
    frame = load_results(synthetic_results(tmp_path))
    assert checks.measured_bandwidth(frame, 2) == pytest.approx(100e9)
    ar = checks.allreduce_rows(frame)
    assert [round(r["ratio"], 6) for r in ar] == [3.0, 1.0]  # latency shows at 1 MB only
    ddp = {r["quantity"].split(",")[0]: r for r in checks.ddp_rows(frame)}
    assert set(ddp) == {"gradient bytes", "communication after backward", "step time over no communication"}
    assert ddp["gradient bytes"]["ratio"] == pytest.approx(1.0)
    assert ddp["communication after backward"]["ratio"] == pytest.approx(1.25)
    assert ddp["step time over no communication"]["ratio"] == pytest.approx(2.0)
    assert "measured NCCL bus bandwidth" in ddp["communication after backward"]["basis"]
    sharding = {r["quantity"].split(",")[0]: r for r in checks.sharding_rows(frame)}
    assert sharding["optimizer state"]["ratio"] == pytest.approx(1.0)  # 8P / 2 ranks
    assert sharding["peak after step"]["ratio"] == pytest.approx(13 / 12)
    peak = checks.peak_rows(frame)
    assert len(peak) == 1 and peak[0]["ratio"] == pytest.approx(700.0 / 743.9)
    assert checks.peak_rows(frame[frame.problem != "matmul_peak"])[0]["measured"] == checks.NOT_MEASURED
    fsdp = {r["quantity"].split(",")[0]: r for r in checks.fsdp_rows(frame)}
    assert set(fsdp) == {"sharded parameters", "peak"}
    assert 0.5 < fsdp["sharded parameters"]["ratio"] < 1.0  # the tiny model's norms stay whole


def test_missing_results_give_predictions_marked_not_yet_measured():
    for fn in checks.MEASURED_CHECKS.values():
        rows = fn(None)
        assert rows and all(r["measured"] == checks.NOT_MEASURED and r["predicted"] > 0 for r in rows)
