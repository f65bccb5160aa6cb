"""The memory section's typed context: what `cs336sys.analysis.memory.build` fills and
`sections/memory.md.j2` reads. Its own module so that its helper (memory_snapshots) can name it while
the section imports it: imports point one way."""

from __future__ import annotations

from dataclasses import dataclass, field

from cs336sys.analysis.context import SectionContext


@dataclass
class MemoryContext(SectionContext):
    figures: dict[str, str] = field(default_factory=dict)
    """Figure name -> its file (`analysis.common.save_figure`)."""
    machine_s: float | None = None
    """Wall seconds of the section's jobs (Snakemake's timing records)."""
    snapshot: dict | None = None
    """(5) The size whose snapshots are shown: its contexts, dtypes, unit, snapshot sources, points out of memory."""
    bf16_ratio: dict[str, dict] | None = None
    """(5c) Mode -> bf16's peak against fp32's at the same context: the ratio's "min" and "max", at how many of
    the "points" bf16's is "larger", its largest "excess" (unit) at "max_context"; "sites": at the largest
    excess where both peak in one phase, the bytes the code sites that shrink free and those that grow add."""
    timeline: dict | None = None
    """(5a) The point whose forward and train-step timelines are drawn, with each mode's peak and phases."""
    train_peak_phases: dict[str, list[str]] | None = None
    """(5a) Phase of the train step -> the points (context, dtype) that peaked in it."""
    residual: dict | None = None
    """(5d) The residual stream's size from the config, and the allocations of that size seen, at the context of
    the saved-tensor point (`at`: "saved_tensors") or else the longest ("longest"); the longest's size beside."""
    largest: dict | None = None
    """(5e) The largest allocation of the forward at the longest context that ran: size, site, code."""
    saved: dict | None = None
    """(5f, 6) One block's saved-for-backward tensors and gradients at the saved_tensors point."""
    rmsnorm: dict | None = None
    """(6) RMSNorm's saved bytes, eager against compiled, and their ratio."""
    snapshot_gradients: dict | None = None
    """(5f) What a train-step snapshot's phases say the forward saves and the backward frees, in GiB."""
    ckpt: dict | None = None
    """(6) The checkpointing sweep: its shape, group sizes, peaks, the model's prediction and the best k."""
    summary: list[dict] = field(default_factory=list)
    """The section's lines of the report's summary page."""
