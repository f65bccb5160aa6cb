"""Render the report: section contexts -> Jinja templates -> report.md -> (pandoc, typst) -> report.pdf.

    python -m cs336sys.report md --sections results/sections/* --templates writeup/templates --out writeup/report.md
    python -m cs336sys.report pdf writeup/report.md --out writeup/report.pdf

Templates see every section's context.json under `sections[<name>]`, `section_order` (the
registry's report order, `cs336sys.registry.SECTIONS`), `problems` (coverage of every assignment
problem), `grid` ("main", or "smoke" for the CPU smoke grid's report), a filter `num(x, digits)` and
a function `fig(section, name)` (a figure's path relative to the report).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

import jinja2

from cs336sys.io import write_atomic
from cs336sys.registry import PROBLEMS, SECTIONS


def _num(value, digits: int = 2) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, int):
        return f"{value:,}"
    return f"{value:,.{digits}f}"


def _built(context: dict | None) -> bool:
    """A section's context holds what it computed (beyond its environment and result counts)."""
    return bool(context) and any(v for k, v in context.items() if k not in ("env", "result_counts"))


def coverage(contexts: dict[str, dict]) -> list[dict]:
    """One row per assignment problem: where its results are, or that there are none yet."""
    counts: dict[str, int] = {}
    for ctx in contexts.values():
        # sections that read the same experiment (ddp and accounting both read the all-reduce
        # results) count the same files: the most any section read, not the sum
        for problem, n in ctx.get("result_counts", {}).items():
            counts[problem] = max(counts.get(problem, 0), n)
    rows = []
    for p in PROBLEMS:
        n = sum(counts.get(r, 0) for r in p.experiments)
        rows.append({"number": p.number, "name": p.name, "edition": p.edition, "section": p.section,
                     "points": n, "has_results": n > 0 or (p.derived and _built(contexts.get(p.section))),
                     "derived": p.derived})
    return rows


def render_markdown(section_dirs: list[Path], templates: Path, out: Path, grid: str = "main") -> str:
    contexts = {d.name: json.loads((d / "context.json").read_text()) for d in section_dirs}
    unknown = set(contexts) - set(SECTIONS)
    if unknown:
        raise ValueError(f"section directories {sorted(unknown)} are not sections of cs336sys.registry")
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(templates), undefined=jinja2.StrictUndefined,
                             keep_trailing_newline=True, trim_blocks=True, lstrip_blocks=True)
    env.filters["num"] = _num
    dirs = {d.name: d for d in section_dirs}

    def fig(section: str, name: str) -> str:
        return os.path.relpath(dirs[section] / name, out.parent)

    env.globals["fig"] = fig
    order = [name for name in SECTIONS if name in contexts]
    text = env.get_template("report.md.j2").render(sections=contexts, section_order=order,
                                                   problems=coverage(contexts), grid=grid)
    write_atomic(out, text)
    return text


# The printed page: A4, the body in 10 pt, tables in 9 pt. Figures are made exactly TEXT_WIDTH_CM wide
# (cs336sys.analysis.common) and set at the text width, so their font sizes are their printed sizes.
PAPER = "a4"
PAGE_WIDTH_CM = 21.0
MARGIN_X_CM = 2.0
MARGIN_Y_CM = 2.2
TEXT_WIDTH_CM = PAGE_WIDTH_CM - 2 * MARGIN_X_CM
BODY_PT = 10
TABLE_PT = 9
KEEP_TOGETHER_CM = 9  # a table at most this tall is not split across pages

# pandoc's typst template takes the page and body font from these variables (its `conf` function
# sets them, so `#set page`/`#set text` before the template would be overridden).
_PAGE_METADATA = json.dumps({"papersize": PAPER, "fontsize": f"{BODY_PT}pt",
                             "margin": {"x": f"{MARGIN_X_CM}cm", "y": f"{MARGIN_Y_CM}cm"}})
# Typst rules placed after the template's own (`--include-before-body`), so they win over its
# `#set table(inset: 6pt)` and its justified paragraphs.
_STYLE = f"""\
// Tables: one size smaller than the body, ragged lines, no hyphenation (no "ea-ger" in a cell).
// pandoc gives gfm pipe tables no widths (`columns: N`), so every column is as wide as its content;
// the sections keep tables narrow enough to fit (wide ones go to a CSV file the report links).
#show table: set text(size: {TABLE_PT}pt, hyphenate: false)
#show table: set par(justify: false)
#set table(inset: (x: 4.5pt, y: 3.5pt))
// Long tables continue on the next page (with their header) instead of overflowing it; a short one
// is kept whole rather than split after its first rows.
#show figure: set block(breakable: true)
#show figure.where(kind: table): it => context {{
  let height = measure(block(width: {TEXT_WIDTH_CM}cm, it)).height
  block(breakable: height > {KEEP_TOGETHER_CM}cm, it)
}}
// A table's label (a level-4 heading in the templates) stays with its table, out of the outline.
#show heading.where(level: 4): set heading(outlined: false, bookmarked: false)
#show heading.where(level: 4): set text(size: {BODY_PT}pt)
// Figures at the text width: they are drawn that wide, so their text prints at its own size.
#set image(width: 100%)
"""


def render_pdf(markdown: Path, out: Path) -> None:
    """Markdown -> Typst (pandoc, from pypandoc-binary) -> PDF (typst, from PyPI). Image paths in the
    Markdown are relative to its folder; Typst is rooted at the common parent so it may read them."""
    import pypandoc
    import typst

    root = Path(os.path.commonpath([markdown.resolve().parent.parent, Path.cwd().resolve()]))
    with tempfile.TemporaryDirectory(prefix="cs336sys-report-") as tmp:
        tmp = Path(tmp)
        (tmp / "page.yaml").write_text(_PAGE_METADATA)  # JSON is YAML
        (tmp / "style.typ").write_text(_STYLE)
        # --columns only wraps the Typst source; gfm tables carry no relative widths either way.
        typ_source = pypandoc.convert_file(str(markdown), "typst", format="gfm", extra_args=[
            "--standalone", "--columns=100", f"--metadata-file={tmp / 'page.yaml'}",
            f"--include-before-body={tmp / 'style.typ'}"])
        # Next to the Markdown, so the image paths resolve as they do from the Markdown.
        with tempfile.NamedTemporaryFile("w", suffix=".typ", dir=markdown.parent, delete=False) as f:
            f.write(typ_source)
            typ_path = Path(f.name)
        try:
            pdf = typst.compile(str(typ_path), root=str(root))
        finally:
            typ_path.unlink(missing_ok=True)
    write_atomic(out, pdf)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m cs336sys.report", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    md = sub.add_parser("md")
    md.add_argument("--sections", nargs="+", required=True, type=Path)
    md.add_argument("--templates", required=True, type=Path)
    md.add_argument("--out", required=True, type=Path)
    md.add_argument("--grid", default="main", choices=["main", "smoke"])
    pdf = sub.add_parser("pdf")
    pdf.add_argument("markdown", type=Path)
    pdf.add_argument("--out", required=True, type=Path)
    a = p.parse_args(argv)
    if a.command == "md":
        render_markdown(a.sections, a.templates, a.out, a.grid)
    else:
        render_pdf(a.markdown, a.out)
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
