"""Experiment points (registry: flash_leaderboard_gluon): the Gluon FlashAttention (Hopper).

The Gluon kernels at both leaderboards' attention shapes, measured as the `flash_leaderboard` points
are (`bench.measure_leaderboard_point`), so the section sets them beside ours (`tl`), cuDNN and SDPA's
FlashAttention-2 of the same GPU model.

impl "gluon": the Gluon forward and the `tl` backward with the point's backward tiles; "gluon_bwd":
the Gluon forward and the Gluon backward (warp-specialised, `flash_gluon_backward_ws`); "sdpa_cudnn": cuDNN through
SDPA as `bench.run_leaderboard_point` runs it, the baseline measured in the Gluon job's own process
(the ratios compare times of one process). The Gluon kernels are called eagerly (the `tl`
kernels' points go through torch.compile, which the Gluon launchers are not written for). Where the
Gluon kernels cannot run (no Hopper GPU, a Triton without Gluon, a head dimension or dtype they do not
take) the point is `unsupported`, with the reason.
"""

from __future__ import annotations

import torch

from cs336sys.attention.bench import (
    LeaderboardSettings,
    _require_gpu_model,
    measure_leaderboard_point,
    run_leaderboard_point,
)
from cs336sys.attention.bench_common import _random_qkv
from cs336sys.dtypes import torch_dtype
from cs336sys.jobs import Run, Unsupported

GLUON_IMPLS = {"gluon": "tl", "gluon_bwd": "gluon"}  # impl -> FlashAttentionGluon's backward


def run_point(settings: LeaderboardSettings, run: Run) -> dict:
    """One Gluon configuration at one leaderboard shape (settings as `bench.run_leaderboard_point`'s)."""
    from cs336sys.attention.flash_gluon import FlashAttentionGluon, GluonUnsupported, check_gluon_inputs

    s = settings
    if s.impl == "sdpa_cudnn":
        return run_leaderboard_point(s, run)
    if s.impl not in GLUON_IMPLS:
        raise ValueError(f"unknown Gluon implementation {s.impl!r}; known: {', '.join(GLUON_IMPLS)}, sdpa_cudnn")
    device = torch.device(run.device)
    if device.type != "cuda":
        raise Unsupported("the Gluon kernels need a Hopper CUDA GPU")
    _require_gpu_model(s.gpu_model, device)
    shape = (s.batch, s.heads, s.seq, s.d) if s.layout == "bhsd" else (s.batch, s.seq, s.d)
    q, k, v = _random_qkv(shape, torch_dtype(s.dtype), device)
    try:
        check_gluon_inputs(q, k, v, s.causal)
    except GluonUnsupported as refusal:
        raise Unsupported(str(refusal)) from refusal
    backward = GLUON_IMPLS[s.impl]
    tiles = s.backward_tiles if backward == "tl" else None

    def attend(q, k, v, causal):
        return FlashAttentionGluon.apply(q, k, v, causal, backward, tiles)

    return measure_leaderboard_point(attend, q, k, v, s, device)
