"""Captions for the section files that the writeup does not number: what each file is and which section of
the writeup uses it, so that every item of Snakemake's report has a caption of its own.

A section's folder holds, beside the tables and figures the writeup numbers, files it only links or quotes,
and figures of data the writeup prints as a table. Each such file needs a line in `UNNUMBERED` below (what
it holds, in the words of the analysis that writes it); the caption adds, from the rendered report, the
section and heading that use it: where the report links it, and the numbered table whose data it draws.
`missing(...)` lists the files with no line here (a test holds the committed results to none).
"""

from __future__ import annotations

import html
import re
from pathlib import Path

from cs336sys.sizes import SIZES

# (section, file name pattern) -> what the file holds; a pattern's groups fill {0}, {1}, ... of its text.
UNNUMBERED: dict[tuple[str, str], str] = {
    ("benchmarking", r"all_points\.csv"):
        "Every benchmarking point, one row per model size, context length, mode, dtype and compile setting: "
        "its status, the mean, standard deviation, median and minimum time per step (ms), TFLOP/s, MFU (%) "
        "and peak memory (GiB). Too wide to print: the writeup links it (points_summary.csv is its digest).",
    ("benchmarking", r"points_summary\.csv"):
        "The digest of all_points.csv per model size and context length: how many points, how many ran and "
        "how many ran out of memory, the largest peak memory (GiB) and the best TFLOP/s among them.",
    ("benchmarking", r"bf16_speedup\.png"):
        "Bar chart of the bf16-autocast speed-up (fp32 time over bf16-autocast time per step) per model size, "
        "one bar per mode, at the main context length, eager.",
    ("benchmarking", r"compile_speedup\.png"):
        "The torch.compile speed-up (eager time over compiled time per step) against model size, one line per "
        "mode, dtype and compile method.",
    ("attention", r"flash_speedup\.png"):
        "Forward+backward time of naive PyTorch attention (left) and of PyTorch SDPA (right) over our Triton "
        "FlashAttention-2's, against sequence length, one line per dtype and head dimension (log scales).",
    ("sharding", r"sharding_allocator_(.+)\.csv"):
        "The CUDA allocator's readings for the {0} model on the first rank: memory allocated and its peak "
        "after init, before the step and after it (GiB), unsharded, with our sharded optimizer and with "
        "torch's ZeroRedundancyOptimizer. The writeup quotes them in its text on the sharded optimizer's "
        "memory; its numbered tables break the same points down by what holds the memory.",
}


def _unslug(part: str) -> str:
    """A model size as a file name spells it (2_7B) back as the report names it (2.7B)."""
    return next((name for name in SIZES if re.sub(r"\W", "_", name) == part), part)


def description(section: str, file: str) -> str | None:
    """What `UNNUMBERED` says the file holds, or None where it says nothing."""
    for (s, pattern), text in UNNUMBERED.items():
        if s == section and (m := re.fullmatch(pattern, file)):
            return text.format(*map(_unslug, m.groups()))
    return None


def section_files(folder: Path) -> list[str]:
    """The files of a section folder that Snakemake's report lists (its CSV and PNG files)."""
    return sorted(p.name for p in folder.iterdir() if p.suffix in (".csv", ".png"))


def missing(section_dirs: list[Path], numbered: set[tuple[str, str]]) -> list[str]:
    """`section/file` of every CSV and PNG that is neither numbered (in `numbered`) nor described."""
    return [f"{d.name}/{f}" for d in section_dirs for f in section_files(d)
            if (d.name, f) not in numbered and description(d.name, f) is None]


def linked_under(report_text: str, section: str, file: str) -> list[str]:
    """The headings (level 2 or 3, as printed) under which the report links the file."""
    heading, found = "", []
    target = f"sections/{section}/{file})"
    for line in report_text.split("\n"):
        if m := re.match(r"^#{2,3} (.*?)\s*$", line):
            heading = m.group(1)
        elif target in line and heading not in found:
            found.append(heading)
    return found


def _esc(text: str) -> str:
    return html.escape(text, quote=False)  # raw HTML in reStructuredText: only <, > and & need it


def caption_html(section: str, file: str, category: str, twins: list[str], report_text: str) -> str | None:
    """The caption of an unnumbered file: what it is, where the writeup links it, the numbered items of the
    same name (`twins`: "Table 37 (its heading)"), and the section that uses it; None without a description."""
    text = description(section, file)
    if text is None:
        return None
    parts = [f"<p><b>{_esc(file)}</b> (not numbered in the writeup). {_esc(text)}</p>"]
    if twins:
        parts.append(f"<p>Its numbers are in {_esc(', '.join(twins))}.</p>")
    if links := linked_under(report_text, section, file):
        parts.append(f"<p>The writeup links it under {_esc('; '.join(links))}.</p>")
    where = f"the writeup's section {category}" if category else "the writeup"
    parts.append(f"<p>Used by {_esc(where)}. Made by the rule <code>{section}_section</code>.</p>")
    return "\n".join(parts)
