"""A section's context: the dataclass its analysis returns and its template reads.

Each section's `build(paths, out, **extra)` returns a context; `python -m cs336sys.analysis` writes it
as the section's `context.json` (`as_json`), which the report's template reads. A field is what one
template variable holds, with its type and a one-line docstring; a field left None is absent from the
JSON, as the template's `is defined` tests expect of a part without results.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any


@dataclass
class SectionContext:
    """What every section has: its results' environment and its tables."""

    env: dict[str, Any]
    """`analysis.common.environment_summary` of the section's results ({} without any)."""
    tables: dict[str, str] = field(default_factory=dict)
    """Table name -> the table as Markdown (`analysis.common.save_table`), also saved as CSV."""


def as_json(context: SectionContext | dict) -> dict[str, Any]:
    """The context as the template reads it: a dict of its fields, those left None left out."""
    if isinstance(context, dict):  # a section not yet typed
        return dict(context)
    return {k: v for k, v in dataclasses.asdict(context).items() if v is not None}
