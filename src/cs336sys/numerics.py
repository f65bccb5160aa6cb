"""Accuracy measure shared by the tests and the tuning tools."""

from __future__ import annotations

import torch


def rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    """||a - b|| / ||b||, computed in float64."""
    return ((a.double() - b.double()).norm() / b.double().norm()).item()
