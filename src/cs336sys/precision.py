"""Problems mixed_precision_accumulation and benchmarking_mixed_precision (a, b).

Accumulation: add 0.01 a thousand times in four ways; the exact answer is 10.
Autocast dtypes: run the handout's toy model under autocast and record the dtype of every
intermediate (parameters, fc1 output, LayerNorm output, logits, loss, gradients).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from cs336sys.dtypes import torch_dtype
from cs336sys.jobs import Run

ACCUMULATION_VARIANTS = {
    "fp32 += fp32": (torch.float32, torch.float32, False),
    "fp16 += fp16": (torch.float16, torch.float16, False),
    "fp32 += fp16": (torch.float32, torch.float16, False),
    "fp32 += fp16 upcast": (torch.float32, torch.float16, True),
}


def accumulate(accumulator: torch.dtype, increment: torch.dtype, upcast: bool, device: str = "cpu",
               n: int = 1000, value: float = 0.01) -> float:
    s = torch.tensor(0, dtype=accumulator, device=device)
    for _ in range(n):
        x = torch.tensor(value, dtype=increment, device=device)
        s += x.type(torch.float32) if upcast else x
    return float(s)


@dataclass(frozen=True)
class AccumulationSettings:
    n: int = 1000
    """Number of additions of `value` to the accumulator."""
    value: float = 0.01
    """The increment added each time; the exact sum is n * value."""
    device: str = "cuda"
    """Device kind: cuda | cpu (the grid's `device`); the job runner picks this rank's GPU."""


@dataclass(frozen=True)
class AutocastSettings:
    autocast_dtype: str
    """Autocast dtype the toy model runs under: fp16 | bf16."""
    device: str = "cuda"
    """Device kind: cuda | cpu (the grid's `device`); the job runner picks this rank's GPU."""


def run_accumulation_point(settings: AccumulationSettings, run: Run) -> dict:
    """All four loops in one point: they are one experiment and take microseconds."""
    n, value = settings.n, settings.value
    values = {name: accumulate(*spec, device=run.device, n=n, value=value)
              for name, spec in ACCUMULATION_VARIANTS.items()}
    exact = n * value
    # fp16 spacing (one unit in the last place) where the fp16 sum stalls: [2^k, 2^(k+1)) has spacing 2^(k-10).
    stall_at = 2.0 ** int(torch.floor(torch.log2(torch.tensor(values["fp16 += fp16"]))))
    return {"n": n, "value": value, "exact": exact, "values": values,
            "abs_error": {k: abs(v - exact) for k, v in values.items()},
            "fp16_of_value": float(torch.tensor(value, dtype=torch.float16)),
            "fp16_mantissa_bits": -int(torch.log2(torch.tensor(torch.finfo(torch.float16).eps))),
            "fp16_spacing_from": stall_at, "fp16_spacing": stall_at * torch.finfo(torch.float16).eps}


class ToyModel(nn.Module):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.fc1 = nn.Linear(in_features, 10, bias=False)
        self.ln = nn.LayerNorm(10)
        self.fc2 = nn.Linear(10, out_features, bias=False)
        self.relu = nn.ReLU()

    def forward(self, x):
        return self.fc2(self.ln(self.relu(self.fc1(x))))


def autocast_dtypes(dtype: torch.dtype, device: str = "cpu") -> dict[str, str]:
    """The dtype of each quantity the handout asks about, observed with forward hooks."""
    torch.manual_seed(0)
    model = ToyModel(16, 4).to(device)
    seen: dict[str, str] = {}

    def record(name: str):
        def hook(module, inputs, output) -> None:  # returning None keeps the output unchanged
            seen[name] = str(output.dtype)
        return hook

    model.fc1.register_forward_hook(record("fc1 output"))
    model.ln.register_forward_hook(record("LayerNorm output"))
    x = torch.randn(8, 16, device=device)
    y = torch.randint(0, 4, (8,), device=device)
    with torch.autocast(device_type=torch.device(device).type, dtype=dtype):
        seen["parameters"] = str(next(model.parameters()).dtype)
        logits = model(x)
        seen["logits"] = str(logits.dtype)
        loss = nn.functional.cross_entropy(logits, y)
        seen["loss"] = str(loss.dtype)
    loss.backward()
    seen["gradients"] = str(model.fc1.weight.grad.dtype)
    return {k: v.replace("torch.", "") for k, v in seen.items()}


def run_autocast_dtypes_point(settings: AutocastSettings, run: Run) -> dict:
    if settings.autocast_dtype not in ("fp16", "bf16"):
        raise ValueError(f"autocast_dtype must be fp16 or bf16, got {settings.autocast_dtype!r}")
    return {"dtypes": autocast_dtypes(torch_dtype(settings.autocast_dtype), run.device)}
