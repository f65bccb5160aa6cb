"""What bounds each launch of our FlashAttention-2 and of cuDNN's, at both leaderboard shapes: a
target for Nsight Compute that runs every launch once inside a profiler range (issue 23).

    ncu --profile-from-start off --section SpeedOfLight --section Occupancy --section WarpStateStats \
        --csv --page details python3 notes/runs/2026-11-24-h100/flash_ncu_target.py > ncu.csv

Ours with the tiles the attention leaderboard job uses (config/main.yaml: the table's at the 2025
shape, the 8B step's at the 2026 shape); SDPA's cuDNN backend forward and forward+backward.
Each launch runs once warm before the range, so compilation and autotuning stay outside it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

from cs336sys.attention import flash_triton_backward as bwd
from cs336sys.attention import flash_triton_forward as fwd
from cs336sys.attention.flash_configs import BackwardConfig, Tiles, backward_config, forward_config

SHAPES = {  # name: (shape, forward tiles, backward tiles); None: the table's
    "lb25": ((16, 16384, 64), None, None),
    "lb26": ((1, 32, 32768, 128), Tiles.parse("256x64/w8/s3"), BackwardConfig.parse("kv64x128/q128x64/w8/s3/split")),
}


def launches():
    for name, (shape, ft, bc) in SHAPES.items():
        *lead, seq, d = shape
        bh = 1
        for n in lead:
            bh *= n
        q, k, v, do = (torch.randn(shape, device="cuda", dtype=torch.bfloat16) for _ in range(4))
        ft = ft or forward_config(d, q.dtype, seq, bh, True)
        bc = bc or backward_config(d, q.dtype, seq, bh, True)
        o, lse = fwd.flash_forward(q, k, v, True, ft)
        q4, k4, v4, do4 = (t if t.dim() == 4 else t.unsqueeze(1) for t in (q, k, v, do))
        qg, kg, vg = (t.detach().requires_grad_() for t in (q4, k4, v4))

        def cudnn_fwd_bwd(qg=qg, kg=kg, vg=vg, do4=do4):
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                F.scaled_dot_product_attention(qg, kg, vg, is_causal=True).backward(do4)

        yield f"{name} ours forward {ft}", lambda q=q, k=k, v=v, ft=ft: fwd.flash_forward(q, k, v, True, ft)
        yield f"{name} ours backward {bc}", lambda q=q, k=k, v=v, o=o, lse=lse, do=do, bc=bc: bwd.flash_backward(
            q, k, v, o, lse, do, True, bc)
        yield f"{name} cudnn forward+backward", cudnn_fwd_bwd


def main() -> None:
    work = list(launches())
    for _, fn in work:  # compile and warm everything outside the profiled range
        fn()
    torch.cuda.synchronize()
    for label, fn in work:
        print(f"== {label}", flush=True)
        torch.cuda.profiler.start()
        fn()
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()


if __name__ == "__main__":
    main()
