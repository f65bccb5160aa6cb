"""Kernel and op names short enough for a table cell (the profiling section's tables), kept apart where their
short forms coincide."""

from __future__ import annotations

import re

_TYPES = {"float", "double", "int", "char", "long", "unsigned", "bool", "short", "array", "Half", "BFloat16",
          "c10", "at", "std", "ul", "const", "void", "signed", "operator", "lambda", "TensorIteratorBase",
          "native", "detail", "OpaqueType", "int64_t", "uint32_t", "int32_t", "size_t", "true", "false"}
# PyTorch's generic launchers: the op is the identifier inside them (masked_fill_kernel, BinaryFunctor), not they
_LAUNCHERS = {"gpu_kernel_impl_nocast", "gpu_kernel_impl", "gpu_kernel", "unrolled_elementwise_kernel"}


def compact_name(name: str, width: int = 44) -> str:
    """A kernel or op name short enough for a table cell: the name before its template arguments,
    plus the first informative identifier inside them (a functor, say; PyTorch's generic launchers skipped);
    cut at `width`."""
    base, _, rest = name.partition("<")
    label = base.strip()
    if rest:
        skip = _TYPES | _LAUNCHERS
        inner = next((w for w in re.findall(r"[A-Za-z_]\w*", rest) if w not in skip and len(w) > 2), None)
        if inner:
            label = f"{label}<{inner}>"
    return label if len(label) <= width else label[: width - 1] + "…"


def distinct_names(names: list[str], width: int = 44) -> list[str]:
    """`compact_name` of each, except that names whose compact forms coincide say where they differ: the
    first identifier of the full name that the others of the group lack (the functor of an elementwise
    kernel, say), after the compact form's base; failing that, the text around the first character at
    which the full names differ (a cuBLAS kernel's tile shape)."""
    short = [compact_name(n, width) for n in names]
    for label in {s for s in short if short.count(s) > 1}:
        group = [i for i, s in enumerate(short) if s == label]
        full = [names[i] for i in group]
        words = [re.findall(r"[A-Za-z_]\w*", f) for f in full]
        own = [next((w for w in ws if len(w) > 2 and w not in _TYPES
                     and sum(w in other for other in words) == 1), None) for ws in words]
        base = label.partition("<")[0]
        said = [compact_name(f"{base}<{w}>", width) for w in own] if all(own) else []
        if len(set(said)) == len(group):
            for i, name in zip(group, said, strict=True):
                short[i] = name
            continue
        first = next((k for k in range(min(map(len, full))) if len({f[k] for f in full}) > 1), None)
        if first is None:
            continue
        head = min(16, width // 3)
        start = max(first - 6, head)
        for i in group:
            short[i] = names[i][:head] + "…" + names[i][start:start + width - head - 1]
    return short
