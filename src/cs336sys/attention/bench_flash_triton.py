"""Problem 11's grid, our Triton kernels' points (registry: flash_benchmarking, impl triton | triton_ieee):
the settings, inputs and measurement are the baselines' (cs336sys.attention.bench_flash); this module is
apart so that the baselines' code hash reaches no Triton module."""

from __future__ import annotations

import torch

from cs336sys.attention.bench import _check_triton_runs_here
from cs336sys.attention.bench_flash import TRITON_IMPLS, FlashSettings, _inputs, _measure
from cs336sys.dtypes import torch_dtype
from cs336sys.jobs import Run, Unsupported


def run_triton_point(settings: FlashSettings, run: Run) -> dict:
    """One point of ours (impl triton | triton_ieee), also timed as CUDA-graph replays on CUDA."""
    if settings.impl not in TRITON_IMPLS:
        raise ValueError(f"impl {settings.impl!r} is not ours ({' | '.join(TRITON_IMPLS)}): "
                         "bench_flash.run_baseline_point")
    from cs336sys.attention.flash_triton import FlashAttention2Triton

    device, dtype = torch.device(run.device), torch_dtype(settings.dtype)
    q, k, v = _inputs(settings, device)
    attend = FlashAttention2Triton.apply
    if settings.impl == "triton_ieee":  # float32 products in full IEEE float32, not TF32
        if q.dtype != torch.float32:
            raise Unsupported(f"triton_ieee sets how float32 products run; {q.dtype} inputs do not have any")
        attend = lambda q, k, v, is_causal: FlashAttention2Triton.apply(q, k, v, is_causal, "ieee")  # noqa: E731
    _check_triton_runs_here(device, dtype)
    return _measure(attend, {}, q, k, v, settings, graphed=True)
