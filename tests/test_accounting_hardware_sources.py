"""The hardware figures the accounting section uses say where they come from, truly: a GPU with a current
matmul_peak result has its C and memory read from it; a constant kept from an earlier measurement names the
commit and the GPU it was measured on, and that commit's result holds the constant."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from cs336sys.accounting.hardware import PRESETS
from cs336sys.analysis import accounting
from cs336sys.analysis.common import results_frame
from cs336sys.analysis.rounds import with_rounds_pooled

REPO = Path(__file__).resolve().parents[1]
PEAK = REPO / "results" / "matmul_peak" / "bf16.json"


def test_a_gpu_with_a_current_result_reads_its_figures_from_it():
    result = json.loads(PEAK.read_text())
    frame = with_rounds_pooled(results_frame(sorted(PEAK.parent.glob("*.json"))))
    hw = accounting.hardware_context(accounting.measured_presets(frame))
    name = "h200" if "H200" in result["env"]["gpu"] else "h100"
    assert hw[name]["flops_tflops"] == pytest.approx(result["metrics"]["tflops"])
    assert hw[name]["memory_gib"] == pytest.approx(result["env"]["gpu_memory_bytes"] / 2**30)
    source = hw[name]["flops_source"]
    assert "results/matmul_peak/bf16.json" in source and result["env"]["gpu"] in source
    assert hw[name]["flops_kind"] == "measured"
    other = {"h100": "h200", "h200": "h100"}[name]
    # the other GPU keeps its preset, and no source of it points at a file that holds another GPU's figures
    assert hw[other]["flops_tflops"] == pytest.approx(PRESETS[other].flops / 1e12)
    assert "results/matmul_peak" not in hw[other]["flops_source"] + hw[other]["memory_source"]
    # without results every preset is its constants
    plain = accounting.hardware_context(accounting.measured_presets(with_rounds_pooled(results_frame([]))))
    assert plain[name]["flops_tflops"] == pytest.approx(PRESETS[name].flops / 1e12)


def test_the_h100_constant_is_the_measurement_its_source_names():
    h100 = PRESETS["h100"]
    assert "a constant since" in h100.flops_source and "H100 80GB HBM3" in h100.flops_source
    commit = h100.flops_source.split("at commit ")[1].split()[0].rstrip(")")
    path = h100.flops_source.split(", ")[-1].split(" at commit")[0]
    shown = subprocess.run(["git", "show", f"{commit}:{path}"], cwd=REPO, capture_output=True, text=True)
    if shown.returncode != 0:
        pytest.skip(f"commit {commit} is not in this clone")
    then = json.loads(shown.stdout)
    assert then["env"]["gpu"] == "NVIDIA H100 80GB HBM3" and then["settings"]["dtype"] == "bf16"
    assert h100.flops == pytest.approx(then["metrics"]["tflops"] * 1e12, rel=1e-3)
    assert h100.memory == then["env"]["gpu_memory_bytes"]
    assert then["env"]["timestamp"].startswith(h100.flops_source.split("(")[1][:10])
