"""The roofline of one training step on one GPU: matmul FLOPs at the matmul ceiling plus the
optimizer's and the gradients' fp32 bytes at the copy bandwidth.

    r = step_roofline("2.7B", batch_size=4, context_length=512, matmul_flops_per_s=744e12,
                      copy_bytes_per_s=3.0e12)
    r.total_ms   # 93.6: 42.6 TFLOP in 57.2 ms + 109 GB in 36.4 ms

A floor, not a prediction: the two terms are added, not overlapped (the optimizer runs after the
backward), and everything else a step does (norms, activations, attention's softmax, the loss) is
taken as free. FLOPs are `cs336sys.sizes.train_step_flops` (every product of the forward and the
backward, attention's full seq x seq scores counted as the naive attention computes them). Bytes
are counted per parameter, in fp32 (`BYTES_PER_PARAMETER`):

- AdamW reads the parameter, its gradient and the two moments (4 x 4 B) and writes the parameter
  and the moments back (3 x 4 B): 28 B;
- the backward writes each gradient once (4 B): `zero_grad(set_to_none=True)` drops it after the
  step, so the next backward writes it afresh instead of accumulating (a read and a write).

32 B per parameter; with `lowp_copy` the optimizer also writes a bf16 copy of each parameter (2 B),
what a step that keeps bf16 weights between steps adds. Plain arithmetic, no torch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from cs336sys.sizes import ModelSize, get_size, parameter_count, train_step_flops

BYTES_PER_PARAMETER: dict[str, int] = {
    "adamw reads p, g, m, v (fp32)": 16,
    "adamw writes p, m, v (fp32)": 12,
    "backward writes the gradient (fp32)": 4,
}
LOWP_COPY_BYTES = 2  # the optimizer's bf16 copy of each parameter, written in the same pass


@dataclass(frozen=True)
class Roofline:
    flops: int
    bytes: int
    matmul_flops_per_s: float
    copy_bytes_per_s: float

    @property
    def matmul_ms(self) -> float:
        return self.flops / self.matmul_flops_per_s * 1e3

    @property
    def memory_ms(self) -> float:
        return self.bytes / self.copy_bytes_per_s * 1e3

    @property
    def total_ms(self) -> float:
        return self.matmul_ms + self.memory_ms

    def as_dict(self) -> dict:
        return {**asdict(self), "matmul_ms": self.matmul_ms, "memory_ms": self.memory_ms, "total_ms": self.total_ms}


def step_bytes(size: ModelSize | str, lowp_copy: bool = False) -> int:
    """The optimizer's and the gradients' bytes of one step (see the module docstring)."""
    per_parameter = sum(BYTES_PER_PARAMETER.values()) + (LOWP_COPY_BYTES if lowp_copy else 0)
    return per_parameter * parameter_count(get_size(size))


def step_roofline(size: ModelSize | str, batch_size: int, context_length: int, matmul_flops_per_s: float,
                  copy_bytes_per_s: float, lowp_copy: bool = False) -> Roofline:
    """The roofline of one training step of `size` on `batch_size` sequences of `context_length` tokens."""
    if matmul_flops_per_s <= 0 or copy_bytes_per_s <= 0:
        raise ValueError(f"ceilings must be positive, got {matmul_flops_per_s} FLOP/s and {copy_bytes_per_s} B/s")
    return Roofline(train_step_flops(size, batch_size, context_length), step_bytes(size, lowp_copy),
                    matmul_flops_per_s, copy_bytes_per_s)
