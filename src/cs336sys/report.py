"""Render the report: section contexts -> Jinja templates -> report.md -> (pandoc, typst) -> report.pdf.

    python -m cs336sys.report md --sections results/sections/* --templates writeup/templates --out writeup/report.md
        (also writes writeup/earlier_code.md, the results kept across a code change, which the report links;
        fails, listing them, on any problem `cs336sys.writeup.lint` finds in what it rendered)
    python -m cs336sys.report pdf writeup/report.md --out writeup/report.pdf
    python -m cs336sys.report pages writeup/report.md --out /tmp/pages   # each page as a PNG, to look at

Templates see every section's context.json under `sections[<name>]`, `section_order` (the registry's
report order), `overview` (the machines, software, commits and dates of all results), `summary` (the
summary page's rows: `summary_rows`), `deliverables`
(`cs336sys.deliverables`), `pins` (results kept across a code change, `workflow/pins.yaml`), `grid`
("main", or "smoke" for the CPU smoke grid's report), a filter `num(x, digits)`, `fig(section, name)` and
`csv(section, name)` (a file's path relative to the report), and the cross-reference helpers of
`cs336sys.writeup.markup`: `table`, `figure`, `ref`, `answers`, and the markers `TOC`, `INDEX`, `APPENDIX`.
`render_section` renders one section alone (tests).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
from pathlib import Path

import jinja2

from cs336sys.analysis.formatting import no_minus_zero
from cs336sys.io import write_atomic
from cs336sys.registry import SECTIONS
from cs336sys.writeup import lint, markup
from cs336sys.writeup.layout import MARGIN_X_CM, TEXT_WIDTH_CM  # noqa: F401  (the tests read them here)
from cs336sys.writeup.typst import render_pages, render_pdf


def _num(value, digits: int = 2) -> str:
    """The templates' `num` filter: `digits` decimals, fewer where they would print more than
    `lint.MAX_SIGNIFICANT` significant digits ("50.765" as 50.77, "2,048.00" as 2,048): the report's prose
    rounds every measured number (an integer is a count and prints whole)."""
    if value is None:
        return "n/a"
    if isinstance(value, int):
        return f"{value:,}"
    text = f"{value:,.{digits}f}"
    while digits > 0 and lint.significant_digits(text) > lint.MAX_SIGNIFICANT and math.isfinite(value):
        digits -= 1
        text = f"{value:,.{digits}f}"
    return no_minus_zero(text)


def _span(pair, digits: int = 2) -> str:
    """A (low, high) range as printed: one number when both ends print the same, else "low to high"."""
    low, high = (_num(v, digits) for v in pair)
    return low if low == high else f"{low} to {high}"


def overview(contexts: dict[str, dict]) -> dict:
    """What every section's results were measured on, written once for the title block: each machine with
    the sections it ran, the software versions, commits, dates and point counts over all results."""
    machines: dict[str, list[str]] = {}
    software: dict[str, set[str]] = {}
    commits: set[str] = set()
    dates: set[str] = set()
    status: dict[str, int] = {}
    for name in SECTIONS:
        env = contexts.get(name, {}).get("env") or {}
        if not env:
            continue
        for machine in env.get("machines") or [env.get("device", "unknown")]:
            machines.setdefault(machine, []).append(SECTIONS[name].title)
        for key in ("torch", "triton", "cuda", "driver", "python"):
            software.setdefault(key, set()).update(v.strip() for v in str(env.get(key, "")).split(",")
                                                   if v.strip() and v.strip() not in ("none", "n/a"))
        commits.update(env.get("commits", []))
        dates.update(d for d in (env.get("first_date"), env.get("last_date")) if d)
        for k, v in env.get("status_counts", {}).items():
            status[k] = status.get(k, 0) + v
    first, last = (min(dates), max(dates)) if dates else ("", "")
    return {"machines": [{"machine": m, "sections": s} for m, s in machines.items()],
            "software": {k: sorted(v) for k, v in software.items() if v}, "commits": sorted(commits),
            "dates": first if first == last else f"{first} to {last}", "points": sum(status.values()),
            "status_counts": status}


# The summary page (docs/report.md): each section's first rows, its headline results in its own order, up to
# its quota here; at most MAX_SUMMARY_ROWS in all, so that the summary fits its page. Every row of every
# section still counts in the conclusions (targets met, missed or within the noise).
SUMMARY_ROWS = {"benchmarking": 3, "attention": 2, "memory": 1, "ddp": 2, "sharding": 2, "leaderboard": 2}
MAX_SUMMARY_ROWS = 12


def summary_rows(contexts: dict[str, dict]) -> list[dict]:
    """The rows of the summary table, in the registry's section order."""
    rows = []
    for name in SECTIONS:
        rows += (contexts.get(name, {}).get("summary") or [])[:SUMMARY_ROWS.get(name, 0)]
    return rows


def index_table(doc: markup.Document) -> str:
    """The deliverables index: every problem part of both handouts -> the heading that answers it. Long
    problem names may break after an underscore (a zero-width space) and the asks keep their hyphenated
    words whole (non-breaking hyphens), so the table fits the page."""
    from cs336sys.deliverables import DELIVERABLES

    rows = ["| problem (part) | edition | what is asked | answered in |", "|:---|:---|:---|:---|"]
    for d in DELIVERABLES:
        h = doc.answered.get(d.key)
        where = f"[{h.number or h.title}](#{h.anchor})" if h else "not answered"
        name = d.problem.replace("_", "_\u200b") + (f" ({d.part})" if d.part else "")
        editions = "both" if len(d.editions) > 1 else d.editions[0]
        rows.append(f"| {name} | {editions} | {d.ask.replace('-', chr(0x2011))} | {where} |")
    return "\n".join(rows)


def environment(templates: Path, fig=None) -> jinja2.Environment:
    """The templates' Jinja environment: strict undefined names, the `num` filter, the markup helpers and
    `fig`/`csv` (a section file's path relative to the report; default: the name alone)."""
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(templates), undefined=jinja2.StrictUndefined,
                             keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True,
                             extensions=["jinja2.ext.do"])
    env.filters["num"] = _num
    env.filters["span"] = _span
    fig = fig or (lambda section, name: name)
    env.globals.update(fig=fig, csv=fig, table=markup.table, figure=markup.figure, ref=markup.ref,
                       answers=markup.answers, TOC=markup.TOC, INDEX=markup.INDEX, APPENDIX=markup.APPENDIX)
    return env


def render_section(name: str, context: dict, templates: Path, pins: list[dict] | None = None) -> str:
    """One section alone with its appendix (if it has one), numbered as if they were the whole report, with
    `pins` (`cs336sys.pins` entries, as the report lists them) in effect: for tests. References between the
    parts resolve."""
    appendix = f"sections/appendix/{name}.md.j2"
    wrapper = ('{% import "macros.md.j2" as m %}' + f'{{% include "{SECTIONS[name].template}" %}}\n'
               + "{{ APPENDIX }}\n" + f'{{% include ["{appendix}"] ignore missing %}}')
    text = environment(templates).from_string(wrapper).render(sections={name: context}, grid="main", pins=pins or [])
    return markup.render(text)[0]


def render_markdown(section_dirs: list[Path], templates: Path, out: Path, grid: str = "main",
                    pins: list[dict] | None = None) -> str:
    contexts = {d.name: json.loads((d / "context.json").read_text()) for d in section_dirs}
    unknown = set(contexts) - set(SECTIONS)
    if unknown:
        raise ValueError(f"section directories {sorted(unknown)} are not sections of cs336sys.registry")
    dirs = {d.name: d for d in section_dirs}

    def fig(section: str, name: str) -> str:
        return os.path.relpath(dirs[section] / name, out.parent)

    from cs336sys.deliverables import DELIVERABLES

    order = [name for name in SECTIONS if name in contexts]
    text = environment(templates, fig).get_template("report.md.j2").render(
        sections=contexts, section_order=order, grid=grid, overview=overview(contexts), summary=summary_rows(contexts),
        deliverables=DELIVERABLES, pins=pins or [])
    text, _ = markup.render(text, index=index_table)
    write_atomic(out, text)
    earlier = environment(templates).get_template("earlier_code.md.j2").render(pins=pins or [])
    write_atomic(earlier_code_path(out), re.sub(r"\n{3,}", "\n\n", earlier))
    return text


def earlier_code_path(report: Path) -> Path:
    """The list of results kept across a code change (`workflow/pins.yaml`), written beside the report,
    which links it: reasons that run to pages, for a reader of the repository rather than of the PDF."""
    return report.with_name("earlier_code.md")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m cs336sys.report", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    md = sub.add_parser("md")
    md.add_argument("--sections", nargs="+", required=True, type=Path)
    md.add_argument("--templates", required=True, type=Path)
    md.add_argument("--out", required=True, type=Path)
    md.add_argument("--grid", default="main", choices=["main", "smoke", "next"])
    md.add_argument("--pins", default="[]", help="JSON: the result pins in effect (cs336sys.pins.for_report)")
    pdf = sub.add_parser("pdf")
    pdf.add_argument("markdown", type=Path)
    pdf.add_argument("--out", required=True, type=Path)
    pages = sub.add_parser("pages", help="every page of the report as a PNG, to look at")
    pages.add_argument("markdown", type=Path)
    pages.add_argument("--out", required=True, type=Path)
    pages.add_argument("--ppi", type=int, default=60)
    a = p.parse_args(argv)
    if a.command == "md":
        text = render_markdown(a.sections, a.templates, a.out, a.grid, pins=json.loads(a.pins))
        found = lint.problems(text) + lint.problems(earlier_code_path(a.out).read_text())
        if found:  # the build fails on what a reader would see as a fault (docs/report.md)
            print(f"{a.out}: {len(found)} problems (cs336sys.writeup.lint):", *found, sep="\n", file=sys.stderr)
            return 1
    elif a.command == "pdf":
        render_pdf(a.markdown, a.out)
    else:
        render_pages(a.markdown, a.out, a.ppi)
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
