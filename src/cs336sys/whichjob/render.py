"""The answers as text: a file's rule, point and status (`render_which`), a rule's files (`render_rule`)."""

from __future__ import annotations

import json
from typing import Any


def _listed(names: list[str], most: int = 6) -> str:
    return ", ".join(names[:most]) + (f" and {len(names) - most} more" if len(names) > most else "")


def _what(d: dict[str, Any]) -> str:
    if d["kind"] == "experiment":
        return f"experiment {d['experiment']} ({d['function']})"
    if d["kind"] == "section":
        return f"section {d['section']} ({d['module']})"
    return "the report" if d["kind"] == "report" else "a target"


def _where(d: dict[str, Any]) -> str:
    """` (registered at workflow/rules/sharding.smk:16,25,34)`: where the rule comes from, by file (the
    part file's registering calls; for the report and targets, the rule itself)."""
    lines: dict[str, list[str]] = {}
    for place in d["registered_in"]:
        f, _, line = place.rpartition(":")
        lines.setdefault(f, []).append(line)
    verb = "registered" if d["kind"] in ("experiment", "section") else "defined"
    return f" ({verb} at {', '.join(f'{f}:' + ','.join(n) for f, n in lines.items())})" if lines else ""


def _verdict(d: dict[str, Any], status: str) -> str:
    """`up to date (code X)`, `up to date, pinned (code X; the code is now Y)`, or the status."""
    code, made = d["code"].get("rule"), d.get("made_with") or []
    if status == "up to date" and code:
        return f"up to date (code {', '.join(made) or code})"
    if status == "up to date, pinned":
        return f"up to date, pinned (code {', '.join(made)}; the code is now {d['code']['live']})"
    return status


def render_which(entries: list[dict[str, Any]]) -> str:
    lines: list[str] = []
    for e in entries:
        if "error" in e:
            continue
        if e.get("folder"):
            lines.append(f"{e['path']}/: files of {len(e['rules'])} rule(s)")
            for r in e["rules"]:
                state = "up to date" if r["up_to_date"] else "stale"
                lines.append(f"  {r['rule']:<36} {r['files']:>3} file(s)  {state:<10}  {_what(r)}")
            continue
        lines.append(e["path"] + (f"  (in {e['in']}/)" if "in" in e else ""))
        lines.append(f"  rule        {e['rule']}{_where(e)}")
        lines.append(f"  made by     {_what(e)}" + (f", its {e['role']}" if e["role"] in ("log", "benchmark") else ""))
        if "point" in e:
            point = json.dumps(e["point"], sort_keys=True)
            lines.append(f"  point       {e['point_index'] + 1} of {e['points']}: {point}")
        lines.append(f"  status      {_verdict(e, e['status'])}")
        lines += [f"              {line}" for line in e["why"]]
    return "\n".join(lines)


def render_rule(d: dict[str, Any]) -> str:
    job = ("up to date, pinned" if d["pinned"] else "up to date" if d["up_to_date"]
           else "stale: snakemake would run it")
    lines = [f"rule {d['rule']}{_where(d)}", f"  made by     {_what(d)}",
             f"  job         {_verdict(d, job)}"]
    lines += [f"              {line}" for line in d["why"]]
    for e in d["outputs"]:
        point = f"  point {e['point_index'] + 1}: {json.dumps(e['point'], sort_keys=True)}" if "point" in e else ""
        lines.append(f"  {e['role']:<10}  {e['path']}  [{e['status']}]{point}")
        lines += [f"                {line}" for line in e["why"]]
    lines += [f"  input       {f}" for f in d.get("inputs", [])]
    if not d["outputs"] and not d.get("inputs"):
        lines.append("  (no files)")
    return "\n".join(lines)


# --- the command line ----------------------------------------------------------------------------------
