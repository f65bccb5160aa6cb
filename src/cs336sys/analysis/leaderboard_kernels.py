"""The leaderboard section's kernel breakdown: each profiled step's kernel time by family (attention
forward and backward, matmuls, optimizer, communication, copies, other compute), ours against PyTorch's
parts family by family, and the two tables."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd

from cs336sys.analysis.common import save_table
from cs336sys.sizes import get_size

FAMILY_COLUMNS = ["attention forward", "attention backward", "matmuls", "other compute", "optimizer", "communication"]
SHORT = {"attention forward": "attn. fwd", "attention backward": "attn. bwd", "other compute": "other",
         "communication": "comm."}

# Kernel families, by name, tried in this order (cuDNN's attention kernels also say "wgmma", so attention
# is matched before the matmuls). Ours: flash_forward_kernel, backward_kernel and backward_delta_kernel
# (cs336sys.attention.flash_triton_*), the Gluon flash_forward_gluon(_ws)_kernel and
# flash_backward_gluon(_ws)_kernel (cs336sys.attention.flash_gluon_*); SDPA's: cuDNN "sdpa ... fprop/bprop"
# or FlashAttention "flash_fwd/bwd".
KERNEL_FAMILIES = (
    ("attention forward", ("flash_forward_kernel", "flash_forward_gluon", "sdpa_sm90_flash_fprop", "fprop",
                           "flash_fwd", "fmha_fwd")),
    ("attention backward", ("backward_kernel", "flash_backward_gluon", "backward_delta_kernel", "bprop", "flash_bwd",
                            "fmha_bwd")),
    ("matmuls", ("nvjet", "gemm", "xmma", "cutlass", "wgmma")),
    ("optimizer", ("adamw_kernel", "multi_tensor_apply", "fused_adam", "_fused_adamw")),
)


def kernel_family(name: str, category: str) -> str:
    """A kernel's family for the breakdown: communication, memory copies, the families above, or
    "other compute" (elementwise and reduction kernels: norms, activations, casts, the loss)."""
    if category == "communication":
        return "communication"
    if category in ("memcpy", "memset"):
        return "copies"
    lowered = name.lower()
    for family, needles in KERNEL_FAMILIES:
        if any(n.lower() in lowered for n in needles):
            return family
    return "other compute"


def kernel_breakdown(summary: dict) -> dict[str, float]:
    """Milliseconds of kernel time per family in one profiled step (`summarize_timeline`'s events:
    every stream; collectives overlap compute, so the families do not add up to the step)."""
    ev = summary["events"]
    out: dict[str, float] = {}
    for n, cat, dur in zip(ev["name"], ev["category"], ev["dur_us"], strict=True):
        family = kernel_family(summary["names"][n], cat)
        out[family] = out.get(family, 0.0) + dur / 1e3
    return out


def merged_share(summary: dict) -> float:
    """The share of a profiled step's kernel time in events the timeline summary merged with their neighbours
    (`summarize_timeline` keeps at most its `max_events`): such an event counts under its longest kernel's
    family, so where this share is above zero the families' split is approximate."""
    ev = summary["events"]
    total = sum(ev["dur_us"])
    merged = sum(d for d, c in zip(ev["dur_us"], ev.get("count", [1] * len(ev["dur_us"])), strict=True) if c > 1)
    return merged / total if total else 0.0


def kernels(paths: list[Path], rows: list[dict]) -> list[dict]:
    """Each ok config's kernel time by family, from the timeline rendered beside its result, and the share of
    it the summary merged (`merged_share`)."""
    timelines = {(p.parent.name, p.name): p / "timeline.json" for p in paths if (p / "timeline.json").is_file()}
    out = []
    for r in rows:
        path = timelines.get((r["job"], r["name"]))
        if r["status"] == "ok" and path is not None:
            summary = json.loads(path.read_text())
            out.append({"job": r["job"], "config": r["name"], "ms": kernel_breakdown(summary),
                        "merged_share": merged_share(summary)})
    return out


# Where a trace summary merged kernels, matmuls and the elementwise kernels between them fall into one event
# under the longest one's family: the two families are then given as one.
MERGED_FAMILY = "matmuls and other compute"


def kernel_gap(kernels: list[dict], verdict: dict | None) -> dict | None:
    """Ours against PyTorch's parts, family by family, in the verdict's job; matmuls and other compute as one
    family (`MERGED_FAMILY`) where either step's summary merged kernels. The merged shares: `merged_share`."""
    if not verdict or "base_s" not in verdict:
        return None
    by = {(k["job"], k["config"]): k for k in kernels}
    ours, base = by.get((verdict["job"], verdict["config"])), by.get((verdict["job"], "pytorch_parts"))
    if ours is None or base is None:
        return None
    merged = ours.get("merged_share", 0.0) or base.get("merged_share", 0.0)
    ours, base = ours["ms"], base["ms"]
    if merged:
        ours, base = ({**{k: v for k, v in ms.items() if k not in ("matmuls", "other compute")},
                       MERGED_FAMILY: ms.get("matmuls", 0.0) + ms.get("other compute", 0.0)} for ms in (ours, base))
    families = sorted(set(ours) | set(base))
    return {f: {"ours_ms": ours.get(f, 0.0), "base_ms": base.get(f, 0.0),
                "diff_ms": ours.get(f, 0.0) - base.get(f, 0.0)} for f in families}


def gap_merged_share(kernels: list[dict], verdict: dict | None) -> dict | None:
    """The merged shares (`merged_share`) of the two profiled steps `kernel_gap` sets side by side, where
    either is above zero; else None."""
    if not verdict:
        return None
    by = {(k["job"], k["config"]): k.get("merged_share", 0.0) for k in kernels}
    shares = {"ours": by.get((verdict["job"], verdict["config"])), "base": by.get((verdict["job"], "pytorch_parts"))}
    return shares if any(shares.values()) else None


def kernels_table(kernels: list[dict], out: Path) -> str:
    """Each profiled config's seconds per kernel family, leaving out the families no step ran."""
    present = [c for c in FAMILY_COLUMNS if any(k["ms"].get(c) for k in kernels)]
    return save_table(pd.DataFrame(
        [{"job": k["job"], "config": k["config"]}
         | {f"{SHORT.get(c, c)} (s)": k["ms"].get(c, 0.0) / 1e3 for c in present} for k in kernels]),
        out, "kernels", digits=3)


def kernel_gap_table(gap: dict, out: Path) -> str:
    """Ours against PyTorch's parts per kernel family, the largest difference first."""
    return save_table(pd.DataFrame(
        [{"kernel family": f, "ours (s)": k["ours_ms"] / 1e3, "PyTorch's parts (s)": k["base_ms"] / 1e3,
          "difference (s)": k["diff_ms"] / 1e3}
         for f, k in sorted(((f, k) for f, k in gap.items() if f in (*FAMILY_COLUMNS, MERGED_FAMILY)),
                            key=lambda fk: -abs(fk[1]["diff_ms"]))
         if k["ours_ms"] or k["base_ms"]]), out, "kernel_gap", digits=3)


def entry_time(kernels: list[dict], entry: dict | None, rows: list[dict]) -> dict | None:
    """Where our entry's step goes: its profiled step's kernel seconds by family, the rate its matrix
    products ran at, and what recomputing its checkpointed blocks costs in products.

    The products' FLOPs per GPU are the dense layers' and the LM head's forward and backward (3 x 2 FLOPs a
    parameter a token) and, for each checkpointed block, its dense forward again in the backward (attention's
    products are counted with attention, not here); their rate is those FLOPs over the matmul family's time.
    `merged_share`: the share of the step's kernel time its trace summary merged (the families' split, and the
    products' rate with it, approximate where above zero).
    """
    if entry is None:
        return None
    row = next((r for r in rows if r["job"] == entry["job"] and r["name"] == entry["config"]), None)
    found = next((k for k in kernels if (k["job"], k["config"]) == (entry["job"], entry["config"])), None)
    ms = found["ms"] if found else None
    if row is None or ms is None or not ms.get("matmuls") or row.get("size") is None:
        return None
    s = get_size(row["size"])
    tokens = row["context_length"] * row.get("batch_per_rank", 1)  # one rank's
    block = 4 * s.d_model**2 + 3 * s.d_model * s.d_ff
    ckpt = row.get("checkpoint_blocks", "all")
    checkpointed = (s.num_layers if ckpt == "all" else 0 if ckpt in (None, "none") else
                    len(ckpt) if isinstance(ckpt, (list, tuple)) else int(ckpt))  # "all", "none", k, or indices
    dense = 3 * 2 * tokens * (s.num_layers * block + s.d_model * s.vocab_size)
    recompute = checkpointed * 2 * tokens * block
    rate = (dense + recompute) / (ms["matmuls"] / 1e3)
    return {"job": entry["job"], "config": entry["config"], "step_s": row["step_s"],
            "seconds": {f: ms.get(f, 0.0) / 1e3 for f in FAMILY_COLUMNS},
            "matmul_pf": (dense + recompute) / 1e15, "matmul_tflops": rate / 1e12,
            "checkpointed": checkpointed, "layers": s.num_layers, "recompute_pf": recompute / 1e15,
            "recompute_s": recompute / rate, "merged_share": found.get("merged_share", 0.0)}
