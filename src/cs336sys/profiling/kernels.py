"""Kernel tables from a torch.profiler trace (problem 2): time per annotated range, top kernels per
phase with call counts, matmul vs the rest, softmax vs matmul inside attention against their FLOPs.

Work is mapped to ranges as `cs336sys.profiling.trace` documents (by the launching call's host
time, on any thread). On a CUDA trace the work is kernels and times are GPU times; on a CPU-only
trace it is CPU ops with their self times, and every table says so in `tool` and `source`.
Times are microseconds. Each table is a plain dict (JSON-ready) for the result files.
"""

from __future__ import annotations

import functools
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from cs336sys.profiling.annotate import ATTENTION_RANGES
from cs336sys.profiling.trace import HostRange, ParsedTrace, Work, parse_trace

KERNEL_CLASSES = ("matmul", "attention", "softmax", "reduction", "elementwise", "copy", "indexing", "optimizer",
                  "communication", "other")

# First match wins. GPU kernel names: cuBLAS/CUTLASS (gemm, xmma, sm90_..., nvjet on Hopper),
# PyTorch's native kernels, Triton/inductor (triton_poi/red/per/tem_...), NCCL.
_GPU_RULES = [
    ("communication", r"nccl"),
    ("attention", r"flash|fmha|attention|sdpa"),
    ("matmul", r"gemm|gemv|cutlass|cublas|xmma|nvjet|wgmma|splitkreduce|triton_tem|dot_kernel"),
    ("softmax", r"softmax"),
    ("optimizer", r"multi_tensor|adam|foreach"),
    ("reduction", r"reduce|triton_red|triton_per|norm|welford"),
    ("indexing", r"index|gather|scatter|embedding|triu|tril"),
    ("copy", r"copy|memcpy|memset|catarray|cat_"),
    ("elementwise", r"elementwise|triton_poi|pointwise|unary|binary|fill"),
]
# CPU op names (aten::...), for CPU-only traces.
_ELEMENTWISE = ("mul|add|sub|rsub|div|exp|exp2|log|sigmoid|silu|pow|sqrt|rsqrt|neg|masked_fill|where|cos|sin|tanh|"
                "relu|gelu|clamp|abs|reciprocal|lerp|addcmul|addcdiv|sign|maximum|minimum|gt|lt|ge|le|eq|ne|"
                "sigmoid_backward|silu_backward|threshold_backward")
_CPU_RULES = [
    ("communication", r"^(c10d::|gloo:|nccl:|mpi:)|record_param_comms"),
    ("attention", r"scaled_dot_product|flash_attention|efficient_attention"),
    ("matmul", r"^aten::(mm|bmm|addmm|baddbmm|addbmm|matmul|linear|_scaled_mm|mv|addmv|dot|einsum)$"
               r"|mkldnn.*(matmul|linear)"),
    ("softmax", r"softmax"),
    ("optimizer", r"_foreach|fused_adam"),
    ("reduction", r"^aten::(sum|mean|amax|amin|max|min|logsumexp|norm|linalg_vector_norm|var|std|argmax|cumsum|prod|"
                  r"rms_norm|layer_norm|native_layer_norm)$"),
    ("indexing", r"^aten::(index|gather|scatter|embedding|index_select|masked_select|take|triu|tril|index_put_?)$"),
    ("copy", r"^aten::(copy_|to|_to_copy|clone|contiguous|cat|stack|empty|empty_like|empty_strided|zeros|zeros_like|"
             r"ones|ones_like|fill_|zero_|resize_|set_|new_empty|new_zeros)$"),
    ("elementwise", rf"^aten::({_ELEMENTWISE})_?$"),
]
_GPU = [(label, re.compile(pattern)) for label, pattern in _GPU_RULES]
_CPU = [(label, re.compile(pattern)) for label, pattern in _CPU_RULES]

DEFAULT_SCOPES: dict[str, tuple[str, ...]] = {
    "forward": ("forward",),
    "backward": ("backward",),
    "sync": ("sync",),
    "optimizer_step": ("optimizer_step",),
    "forward+backward": ("forward", "backward"),
    "train_step": ("forward", "backward", "sync", "optimizer_step"),
}
SOFTMAX_FLOPS_PER_ELEMENT = 5  # max, subtract, exp, sum, divide


@functools.cache
def kernel_class(name: str, kind: str = "kernel") -> str:
    """One of KERNEL_CLASSES for a kernel name (kind kernel/memcpy/memset) or a CPU op name (cpu_op)."""
    if kind in ("memcpy", "memset"):
        return "copy"
    if kind == "collective":
        return "communication"
    rules = _CPU if kind == "cpu_op" else _GPU
    lowered = name if kind == "cpu_op" else name.lower()
    for label, pattern in rules:
        if pattern.search(lowered):
            return label
    return "other"


def short_kernel_name(name: str, width: int = 72) -> str:
    """A readable kernel name: no `void`, no namespaces, no parameter list; cut at `width`."""
    short = re.sub(r"^void\s+", "", name)
    if short.endswith(")") and "(" in short:  # drop the parameter list of a demangled signature
        depth = 0
        for i in range(len(short) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(short[i], 0)
            if depth == 0:
                short = short[:i] if i > 0 else short
                break
    short = re.sub(r"\(anonymous namespace\)::", "", short)
    short = re.sub(r"\b\w+::", "", short)
    return short if len(short) <= width else short[: width - 1] + "…"


def _is_matmul(w: Work) -> bool:
    return kernel_class(w.name, w.kind) == "matmul"


def _by_class(work: Iterable[Work]) -> dict[str, float]:
    totals: dict[str, float] = defaultdict(float)
    for w in work:
        totals[kernel_class(w.name, w.kind)] += w.self_dur
    return {c: totals[c] for c in KERNEL_CLASSES if totals.get(c)}


def _span(work: Sequence[Work]) -> float:
    return max(w.end for w in work) - min(w.start for w in work) if work else 0.0


def range_row(parsed: ParsedTrace, occurrences: Sequence[HostRange]) -> dict[str, Any]:
    """Host and device time of the occurrences of one range."""
    work = [parsed.work[i] for i in parsed.work_indices(occurrences)]
    device = sum((w.self_dur for w in work), 0.0)
    matmul = sum((w.self_dur for w in work if _is_matmul(w)), 0.0)
    n = len(occurrences)
    spans = [_span([parsed.work[i] for i in parsed.work_indices([r])]) for r in occurrences]
    return {
        "occurrences": n,
        "host_us": sum(r.dur for r in occurrences),
        "host_us_per_occurrence": sum(r.dur for r in occurrences) / n if n else 0.0,
        "device_us": device,
        "device_us_per_occurrence": device / n if n else 0.0,
        "device_span_us_per_occurrence": sum(spans) / n if n else 0.0,
        "work_items": len(work),
        "matmul_us": matmul,
        "matmul_share": matmul / device if device else 0.0,
        "by_class": _by_class(work),
    }


def top_kernels(work: Sequence[Work], occurrences: int, top: int = 10,
                exclude_matmul: bool = False) -> list[dict[str, Any]]:
    """Kernels (CPU ops on a CPU trace) by cumulative time, identical names summed."""
    total = sum((w.self_dur for w in work), 0.0)
    groups: dict[tuple[str, str], list[float]] = defaultdict(list)
    for w in work:
        groups[(w.name, w.kind)].append(w.self_dur)
    rows = []
    for (name, kind), durs in groups.items():
        cls = kernel_class(name, kind)
        if exclude_matmul and cls == "matmul":
            continue
        rows.append({
            "name": name,
            "short_name": short_kernel_name(name),
            "class": cls,
            "calls": len(durs),
            "calls_per_occurrence": len(durs) / occurrences if occurrences else float(len(durs)),
            "total_us": sum(durs),
            "mean_us": sum(durs) / len(durs),
            "share": sum(durs) / total if total else 0.0,
        })
    rows.sort(key=lambda r: -r["total_us"])
    return rows[:top]


def kernel_tables(source: Any, scopes: Mapping[str, Sequence[str]] = DEFAULT_SCOPES, top: int = 10) -> dict[str, Any]:
    """Every table of problem 2 from one trace (a path, a trace dict, a profile or a ParsedTrace).

    Returns {"tool", "source" ("cuda" | "cpu"), "unmatched_launches", "ranges": {range name:
    range_row}, "scopes": {scope: {"ranges", "occurrences", "device_us", "device_us_per_occurrence",
    "matmul_us", "matmul_share", "by_class", "top", "top_non_matmul"}}}. A scope is one or more
    ranges taken together ("forward+backward"); its `occurrences` are those of its first range, so
    `calls_per_occurrence` of a kernel in scope "forward" is its calls per forward pass. Scopes
    whose ranges do not occur in the trace are left out.
    """
    parsed = source if isinstance(source, ParsedTrace) else parse_trace(source)
    names = sorted({r.name for r in parsed.ranges})
    ranges = {name: range_row(parsed, parsed.occurrences(name)) for name in names}
    scope_tables = {}
    for label, members in scopes.items():
        occurrences = [r for m in members for r in parsed.occurrences(m)]
        if not occurrences or not parsed.occurrences(members[0]):
            continue
        work = [parsed.work[i] for i in parsed.work_indices(occurrences)]
        n = len(parsed.occurrences(members[0]))
        device = sum((w.self_dur for w in work), 0.0)
        matmul = sum((w.self_dur for w in work if _is_matmul(w)), 0.0)
        scope_tables[label] = {
            "ranges": list(members),
            "occurrences": n,
            "device_us": device,
            "device_us_per_occurrence": device / n,
            "matmul_us": matmul,
            "matmul_share": matmul / device if device else 0.0,
            "by_class": _by_class(work),
            "top": top_kernels(work, n, top),
            "top_non_matmul": top_kernels(work, n, top, exclude_matmul=True),
        }
    return {"tool": parsed.tool, "source": parsed.source, "unmatched_launches": parsed.unmatched,
            "ranges": ranges, "scopes": scope_tables}


def attention_flops(batch_size: int, num_heads: int, seq_len: int, d_head: int,
                    softmax_flops_per_element: int = SOFTMAX_FLOPS_PER_ELEMENT) -> dict[str, int]:
    """FLOPs of one naive causal attention call over (batch, heads, seq, d_head) inputs.

    scores: Q K^T, 2 * B*H*S*S*D (a multiply and an add per term; the mask does not skip work);
    softmax: `softmax_flops_per_element` per score (max, subtract, exp, sum, divide);
    final_matmul: P V, again 2 * B*H*S*S*D. The scaling and masking of the scores are elementwise
    and not counted.
    """
    scores = batch_size * num_heads * seq_len * seq_len
    matmul = 2 * scores * d_head
    return {"scores": matmul, "softmax": softmax_flops_per_element * scores, "final_matmul": matmul}


def _inside(r: HostRange, outer: Sequence[HostRange]) -> bool:
    return any(o.start <= r.start and r.end <= o.end for o in outer)


def attention_table(source: Any, batch_size: int, num_heads: int, seq_len: int, d_head: int,
                    within: str | None = "forward") -> dict[str, Any]:
    """Softmax vs matmul time inside the attention ranges (problem 2e), against their FLOP ratio.

    Only range occurrences inside a `within` range count (default: the forward pass, so that a
    checkpointing recompute in the backward is left out). Returns {"tool", "source", "calls",
    "ranges": {"attention/scores" | "attention/softmax" | "attention/final_matmul": {"calls",
    "device_us", "us_per_call", "matmul_us", "non_matmul_us", "flops_per_call"}}, "matmul_us"
    (matmul work in the scores and final-matmul ranges), "softmax_us" (all work in the softmax
    range), "matmul_flops", "softmax_flops", "time_ratio" (matmul_us / softmax_us), "flop_ratio"
    (matmul_flops / softmax_flops), "matmul_flop_per_s", "softmax_flop_per_s"}.
    """
    parsed = source if isinstance(source, ParsedTrace) else parse_trace(source)
    outer = parsed.occurrences(within) if within else None
    flops = attention_flops(batch_size, num_heads, seq_len, d_head)
    rows = {}
    for name, key in zip(ATTENTION_RANGES, ("scores", "softmax", "final_matmul"), strict=True):
        occurrences = [r for r in parsed.occurrences(name) if outer is None or _inside(r, outer)]
        work = [parsed.work[i] for i in parsed.work_indices(occurrences)]
        device = sum((w.self_dur for w in work), 0.0)
        matmul = sum((w.self_dur for w in work if _is_matmul(w)), 0.0)
        n = len(occurrences)
        rows[name] = {"calls": n, "device_us": device, "us_per_call": device / n if n else 0.0,
                      "matmul_us": matmul, "non_matmul_us": device - matmul, "flops_per_call": flops[key]}
    calls = rows[ATTENTION_RANGES[1]]["calls"]
    matmul_us = rows[ATTENTION_RANGES[0]]["matmul_us"] + rows[ATTENTION_RANGES[2]]["matmul_us"]
    softmax_us = rows[ATTENTION_RANGES[1]]["device_us"]
    matmul_flops = (flops["scores"] + flops["final_matmul"]) * calls
    softmax_flops = flops["softmax"] * calls
    return {
        "tool": parsed.tool, "source": parsed.source, "calls": calls, "ranges": rows,
        "matmul_us": matmul_us, "softmax_us": softmax_us,
        "matmul_flops": matmul_flops, "softmax_flops": softmax_flops,
        "time_ratio": matmul_us / softmax_us if softmax_us else None,
        "flop_ratio": matmul_flops / softmax_flops if softmax_flops else None,
        "matmul_flop_per_s": matmul_flops / (matmul_us * 1e-6) if matmul_us else None,
        "softmax_flop_per_s": softmax_flops / (softmax_us * 1e-6) if softmax_us else None,
    }
