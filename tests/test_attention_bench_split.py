"""The FlashAttention grid's jobs reach only their own family's code (issue 64, item 4): the naive,
compiled and SDPA points run `bench_flash.run_baseline_point`, whose code hash (cs336sys.codehash, as the
workflow computes it) covers no Triton module, so an edit of a Triton helper re-runs the Triton jobs only."""

import shutil

import pytest

from cs336sys import codehash, registry

SRC = codehash.SRC  # .../src
TRITON = ("triton", "triton_ieee")
BASELINES = ("naive", "naive_compiled", "sdpa")
MASK_HELPER = "cs336sys/attention/flash_triton_forward.py"


def entries(impl: str) -> tuple[str, str]:
    """What the workflow hashes for a flash_benchmarking job of `impl` (workflow/rules/rules.smk)."""
    return registry.function_of("flash_benchmarking", [{"impl": impl, "d": 16, "seq": 128}]), "cs336sys.run"


def triton_modules(modules: list[str]) -> list[str]:
    return [m for m in modules if m.startswith("cs336sys.attention.flash_")]


@pytest.mark.parametrize("impl", BASELINES)
def test_a_baseline_job_reaches_no_triton_module(impl):
    assert triton_modules(codehash.closure(*entries(impl))) == []


@pytest.mark.parametrize("impl", TRITON)
def test_a_triton_job_reaches_the_triton_kernels(impl):
    assert {"cs336sys.attention.flash_triton", "cs336sys.attention.flash_triton_forward",
            "cs336sys.attention.flash_triton_backward"} <= set(codehash.closure(*entries(impl)))


def test_a_job_mixing_families_is_refused():
    with pytest.raises(ValueError, match="mixes implementations"):
        registry.function_of("flash_benchmarking", [{"impl": "naive"}, {"impl": "triton"}])


def test_a_triton_helper_constant_changes_the_triton_jobs_hashes_only(tmp_path):
    copy = tmp_path / "src"
    shutil.copytree(SRC / "cs336sys", copy / "cs336sys", ignore=shutil.ignore_patterns("__pycache__"))
    helper = copy / MASK_HELPER
    text = helper.read_text()
    assert text.count("-1.0e6") == 1  # the causal mask's score in mask_scores
    helper.write_text(text.replace("-1.0e6", "-1.0e5"))
    before, after = codehash.Tree(SRC), codehash.Tree(copy)
    impls = TRITON + BASELINES
    changed = {impl for impl in impls if before.code_hash(*entries(impl)) != after.code_hash(*entries(impl))}
    assert changed == set(TRITON)
    pytorch_attention = (registry.experiment("pytorch_attention").function, "cs336sys.run")
    assert before.code_hash(*pytorch_attention) == after.code_hash(*pytorch_attention)
