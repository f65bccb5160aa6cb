"""nsys_profile (d), inference against training, compared point by point: the kernel-class shares of a
forward against a train step's over the points where both modes ran (a train step out of memory leaves its
forward unpaired), so that a difference of means is not a difference of point sets
(`cs336sys.analysis.profiling` builds the section)."""

from __future__ import annotations

import statistics
from collections.abc import Callable

Key = tuple[str, int, str]  # size, context length, dtype
Span = dict[str, float]  # {"min", "max", "mean"} of a share over the paired points (%)


def _span(values: list[float]) -> Span | None:
    return {"min": min(values), "max": max(values), "mean": statistics.fmean(values)} if values else None


def paired_shares(forward: dict[Key, dict[str, float]], train: dict[Key, dict[str, float]],
                  forward_backward: dict[Key, float], label: Callable[[Key], str]) -> dict | None:
    """`forward`, `train`: per point, the shares (%) by class of the forward and of the whole train step;
    `forward_backward`: per point, the matmul share (%) of the train step's forward and backward alone (no
    optimizer step); `label(key)` names a point. Over the points in both: each class's span per mode, at how
    many points the train step's share is lower or higher, and which points go against the majority."""
    keys = [k for k in forward if k in train]  # in the caller's order
    if not keys:
        return None
    f = [forward[k]["matmul"] for k in keys]
    t = [train[k]["matmul"] for k in keys]
    lower = [k for k, a, b in zip(keys, f, t, strict=True) if b < a]
    higher = [k for k, a, b in zip(keys, f, t, strict=True) if b > a]
    fb_keys = [k for k in keys if k in forward_backward]
    fb = [forward_backward[k] for k in fb_keys]
    ef = [forward[k]["elementwise"] for k in keys]
    et = [train[k]["elementwise"] for k in keys]
    falls = statistics.fmean(t) < statistics.fmean(f)
    return {
        "points": len(keys), "unpaired": len(set(forward) ^ set(train)),
        "matmul": {"forward": _span(f), "train_step": _span(t), "forward_backward": _span(fb)},
        "falls": falls,
        "lower": len(lower), "higher": len(higher),
        # the points whose matmul share moves against the mean's direction
        "exceptions": [label(k) for k in (higher if falls else lower)],
        # forward and backward alone hold the forward's matmul share (on average): the optimizer step lowers it
        "fb_higher": sum(forward_backward[k] > forward[k]["matmul"] for k in fb_keys), "fb_points": len(fb_keys),
        "fb_keeps_forward_share": bool(fb) and statistics.fmean(fb) >= statistics.fmean(forward[k]["matmul"]
                                                                                    for k in fb_keys),
        "elementwise": {"forward": _span(ef), "train_step": _span(et)},
        "elementwise_higher": sum(b > a for a, b in zip(ef, et, strict=True)),
        "optimizer": _span([train[k].get("optimizer", 0.0) for k in keys]),
    }
