"""Is a result file whole and of the schema? Checked by the workflow before any job runs, so that a
truncated or hand-edited result is named in one line instead of failing deep inside a section job
(after Snakemake has deleted that section's committed outputs).

Kept apart from `cs336sys.results`, which every experiment imports: a check added here changes no
experiment's code hash.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from cs336sys.results import SCHEMA_VERSION, STATUSES

# key: (type, what a reader is told it should be)
_FIELDS = {
    "schema": (int, "an integer"),
    "problem": (str, "a string"),
    "settings": (dict, "an object"),
    "status": (str, "a string"),
    "metrics": (dict, "an object"),
    "env": (dict, "an object"),
}


def problem_of(path: str | Path, experiment: str | None = None) -> str | None:
    """What is wrong with the result file at `path` (one short phrase), or None if it is sound.
    `experiment`: the experiment whose rule makes it, which its `problem` must name."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        return f"cannot be read ({e.strerror})"
    except UnicodeDecodeError:
        return "is not text (not UTF-8)"
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        cut = " (truncated?)" if e.pos >= len(text.rstrip()) - 1 else ""
        return f"is not valid JSON: {e.msg} at line {e.lineno} column {e.colno}, {len(text)} bytes{cut}"
    if not isinstance(data, dict):
        return f"is not a result: JSON {type(data).__name__}, not an object"
    missing = [k for k in _FIELDS if k not in data]
    if missing:
        return f"is not a result: no {', '.join(repr(k) for k in missing)}"
    for key, (kind, said) in _FIELDS.items():
        if not isinstance(data[key], kind) or isinstance(data[key], bool):
            return f"{key!r} is {type(data[key]).__name__}, not {said}"
    if data["schema"] != SCHEMA_VERSION:
        return f"schema {data['schema']}, not {SCHEMA_VERSION}"
    if data["status"] not in STATUSES:
        return f"status {data['status']!r} is not one of {', '.join(STATUSES)}"
    if data["status"] != "ok" and not (isinstance(data.get("reason"), str) and data["reason"]):
        return f"status {data['status']!r} without a reason"
    if experiment is not None and data["problem"] != experiment:
        return f"problem {data['problem']!r}, but its rule runs {experiment!r}"
    return None


def corrupt(files: Iterable[tuple[str, str | None]]) -> list[tuple[str, str]]:
    """(path, what is wrong) for each unsound file of `(path, experiment)` pairs that exists."""
    found = []
    for path, experiment in files:
        if Path(path).exists():
            why = problem_of(path, experiment)
            if why:
                found.append((str(path), why))
    return found
