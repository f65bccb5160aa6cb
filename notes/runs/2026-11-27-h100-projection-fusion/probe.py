"""The three matmuls of a projection per step (forward, input gradient, weight gradient) for q, k, v as
three weights against one weight of three times the rows, and for w1, w3 as two against one, at each
size's 2048 rows (batch 4, context 512), bf16, do_bench medians. Run on a GPU host from the checkout:
`python3 notes/runs/2026-11-27-h100-projection-fusion/probe.py`."""

import torch
import triton.testing

SIZES = {"small": (768, 3072), "medium": (1024, 4096), "large": (1280, 5120), "xl": (1600, 6400),
         "2.7B": (2560, 10240)}  # d_model, d_ff
ROWS = 2048


def us(fn) -> float:
    return 1e3 * triton.testing.do_bench(fn, warmup=50, rep=300, return_mode="median")


def randn(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, device="cuda", dtype=torch.bfloat16)


def three_products(x: torch.Tensor, weights: list[torch.Tensor], grads: list[torch.Tensor]) -> None:
    for w, g in zip(weights, grads, strict=True):
        x @ w.T, g @ w, g.T @ x


def compare(x: torch.Tensor, rows: int, parts: int) -> tuple[float, float]:
    """(separate, fused) microseconds for `parts` weights of (rows, d) against one of (parts * rows, d)."""
    weights = [randn(rows, x.shape[1]) for _ in range(parts)]
    grad = randn(ROWS, parts * rows)
    grads = [grad[:, i * rows:(i + 1) * rows].contiguous() for i in range(parts)]
    fused = torch.cat(weights)
    return us(lambda: three_products(x, weights, grads)), us(lambda: three_products(x, [fused], [grad]))


for name, (d, d_ff) in SIZES.items():
    x = randn(ROWS, d)
    qkv, qkv_fused = compare(x, d, 3)
    w13, w13_fused = compare(x, d_ff, 2)
    print(f"{name}: qkv fwd+bwd 3 GEMM sets {qkv:.0f} us, fused {qkv_fused:.0f} us ({qkv / qkv_fused:.2f}x); "
          f"w1|w3 {w13:.0f} us, fused {w13_fused:.0f} us ({w13 / w13_fused:.2f}x); "
          f"per-layer saving {qkv - qkv_fused + w13 - w13_fused:.0f} us", flush=True)
