"""Every model size the 2025 and 2026 handouts name, and what follows from one: parameters, FLOPs.

Plain data and arithmetic, no torch: the accounting calculator, the workflow and the report read
this without importing the model, and an edit to the model does not change this module's hash.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class ModelSize:
    name: str
    d_model: int
    d_ff: int
    num_layers: int
    num_heads: int
    vocab_size: int = 10_000
    batch_size: int = 4
    edition: str = "both"
    rope_theta: float = 10_000.0

    @property
    def d_head(self) -> int:
        return self.d_model // self.num_heads

    def as_dict(self) -> dict:
        return asdict(self)


SIZES: dict[str, ModelSize] = {s.name: s for s in [
    ModelSize("small", 768, 3072, 12, 12),
    ModelSize("medium", 1024, 4096, 24, 16),
    ModelSize("large", 1280, 5120, 36, 20),
    ModelSize("xl", 1600, 6400, 48, 25, edition="2025"),
    ModelSize("2.7B", 2560, 10240, 32, 32, edition="2025 (2026 calls it xl)"),
    ModelSize("10B", 4608, 12288, 50, 36, edition="2026"),
    ModelSize("8B", 4096, 11008, 34, 32, vocab_size=151_936, batch_size=2, edition="2026 leaderboard"),
    # Tiny shapes for the CPU smoke grid and the tests; never in the report's GPU tables.
    ModelSize("tiny", 64, 256, 2, 4, batch_size=2, edition="smoke"),
    ModelSize("tiny2", 96, 384, 3, 4, batch_size=2, edition="smoke"),
]}
# Sizes that only the smoke grid and the tests use.
SMOKE_SIZES = ("tiny", "tiny2")


def get_size(size: ModelSize | str) -> ModelSize:
    if isinstance(size, ModelSize):
        return size
    try:
        return SIZES[size]
    except KeyError:
        raise ValueError(f"unknown model size {size!r}; known sizes: {', '.join(SIZES)}") from None


def parameter_count(size: ModelSize | str) -> int:
    """Exact count for the architecture in cs336sys.model (untied embedding and head, no biases)."""
    s = get_size(size)
    per_block = 4 * s.d_model**2 + 3 * s.d_model * s.d_ff + 2 * s.d_model
    return 2 * s.vocab_size * s.d_model + s.num_layers * per_block + s.d_model


def forward_flops(size: ModelSize | str, batch_size: int, context_length: int) -> int:
    """Matrix-multiply FLOPs of one forward pass (2 per multiply-add).

    Attention counts the full seq x seq score and value products, as the naive implementation
    computes them (causal masking does not skip work there).
    """
    s = get_size(size)
    tokens = batch_size * context_length
    dense = s.num_layers * (4 * s.d_model**2 + 3 * s.d_model * s.d_ff) + s.d_model * s.vocab_size
    attention = s.num_layers * 2 * 2 * batch_size * context_length**2 * s.d_model
    return 2 * tokens * dense + attention


def train_step_flops(size: ModelSize | str, batch_size: int, context_length: int) -> int:
    """Forward plus backward (twice the forward's matmul work); the optimizer's FLOPs are negligible."""
    return 3 * forward_flops(size, batch_size, context_length)
