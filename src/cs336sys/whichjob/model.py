"""The rule model: a rule of the parsed workflow and its files, as the registry and the part files name them
(`Rule`, `Output`), and the errors a question about them can end in."""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPORT_RULES = ("report_markdown", "report_pdf")


class Unknown(LookupError):
    """A path no rule makes, or a rule the workflow does not have; the message names close matches."""


@dataclass
class Output:
    """One file or folder a rule declares (relative to the workflow's working directory)."""

    path: str
    rule: str
    role: str  # result | rendered | output | log | benchmark
    index: int | None = None  # the point's position among the job's points (result and rendered files)


@dataclass
class Rule:
    """A rule as the parsed workflow has it, with what the project's registry says it is."""

    name: str
    kind: str  # experiment | section | report | target
    outputs: list[Output]
    params: dict[str, Any]
    experiment: str | None = None
    function: str | None = None
    section: str | None = None
    points: list[dict] = field(default_factory=list)
    registered_in: list[str] = field(default_factory=list)

    @property
    def results(self) -> list[str]:
        return [o.path for o in self.outputs if o.role == "result"]

    @property
    def declared(self) -> list[str]:
        """What Snakemake knows as the rule's outputs (logs and timing records are not)."""
        return [o.path for o in self.outputs if o.role in ("result", "rendered", "output")]


def find_repo(start: Path | None = None) -> Path:
    """The checkout: the nearest folder at or above `start` (default: here) with a Snakefile, else the one
    this package lies in."""
    here = (start or Path.cwd()).resolve()
    for folder in [here, *here.parents]:
        if (folder / "Snakefile").is_file():
            return folder
    return Path(__file__).resolve().parents[2]


def _registrations(repo: Path) -> dict[str, list[str]]:
    """`experiment:NAME` / `section:NAME` -> the `file:line` of each part-file call that registers it."""
    found: dict[str, list[str]] = {}
    call = re.compile(r"\b(experiment_job|section)\(\s*[\"'](\w+)[\"']")
    for smk in sorted((repo / "workflow" / "rules").glob("*.smk")):
        text = smk.read_text()
        for m in call.finditer(text):
            what = "experiment" if m.group(1) == "experiment_job" else "section"
            line = text.count("\n", 0, m.start()) + 1
            found.setdefault(f"{what}:{m.group(2)}", []).append(f"{smk.relative_to(repo)}:{line}")
    return found


def _recorded_point(rec: dict | None, path: str) -> dict | None:
    """The point a provenance record's job passed for `path` (from its `points` and `results` parameters)."""
    values = []
    for p in (rec or {}).get("params", []):
        try:
            values.append(ast.literal_eval(p))
        except (ValueError, SyntaxError):
            continue
    results = next((v for v in values if isinstance(v, list) and path in v), None)
    if results is None:
        return None
    for v in values:
        if isinstance(v, str) and v.startswith("["):
            try:
                points = json.loads(v)
            except ValueError:
                continue
            if isinstance(points, list) and len(points) == len(results):
                return points[results.index(path)]
    return None


def _point_diff(before: dict, after: dict) -> list[str]:
    return [f"{k}: {json.dumps(before.get(k))} -> {json.dumps(after.get(k))}"
            for k in sorted(set(before) | set(after)) if before.get(k) != after.get(k)]


class WorkflowParseError(RuntimeError):
    """Snakemake could not parse the workflow; the message holds what it printed."""
