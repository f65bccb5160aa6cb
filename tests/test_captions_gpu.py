"""A caption says the GPU its results ran on, read from the results (`env.on`), so results re-made on another
GPU model (the FlashAttention grid moved from the H100 to the H200) are never captioned with the old one."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

from cs336sys.analysis.common import environment_summary, gpu_model

REPO = Path(__file__).resolve().parent.parent


def _frame(rows: list[tuple[str, str | None]]) -> pd.DataFrame:
    return pd.DataFrame([{"problem": p, "env.gpu": g, "status": "ok", "env.timestamp": "2026-11-28T00:00:00"}
                         for p, g in rows])


def test_each_experiment_is_placed_on_the_gpus_its_results_name():
    env = environment_summary(_frame([
        ("benchmarking", "NVIDIA H100 80GB HBM3"), ("benchmarking", "NVIDIA H100 80GB HBM3"),
        ("flash_benchmarking", "NVIDIA H200"), ("flash_benchmarking", "NVIDIA H100 80GB HBM3"),
        ("allreduce", None), ("allreduce", float("nan")),  # CPU results: no GPU, or a NaN where a frame has none
    ]))
    assert env["on"] == {"benchmarking": "one H100", "flash_benchmarking": "one H100 or one H200",
                         "allreduce": "the CPU"}


def test_gpu_model_shortens_known_names_and_keeps_others():
    assert gpu_model("NVIDIA H100 80GB HBM3") == "H100"
    assert gpu_model("NVIDIA H200") == "H200"
    assert gpu_model("Some Future GPU") == "Some Future GPU"


def test_no_caption_names_a_single_gpu_by_hand():
    """'one H100' typed in a caption was true only until a job moved; the section contexts say it now."""
    typed = [f"{p.relative_to(REPO)}:{i}" for p in sorted((REPO / "writeup" / "templates").rglob("*.j2"))
             for i, line in enumerate(p.read_text().splitlines(), 1)
             if re.search(r'(?:table|figure)\(".*\bone (?:H100|H200)\b', line)]
    assert not typed, typed
