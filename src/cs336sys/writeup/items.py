"""The report's numbered tables and figures as Snakemake report items: which file each one is, and the
caption, section and heading the rendered report gives it (the one source of every caption).

    python -m cs336sys.writeup.items writeup/report.md --sections results/sections/* --out writeup/report_items

reads the rendered report and writes into OUT:

- `index.json`: every captioned table and figure: its number, caption, heading, the category (the
  report's numbered section) and the file it is. A figure is its PNG; a table is the CSV beside the
  section's `.md` table whose text the report prints; a table the report's templates lay out
  themselves (the summary, the index, a few targets tables) is written here as `tables/<key>.csv`.
- `<section>.rst` and `report.rst`: the captions Snakemake's report shows, as the Jinja template it
  renders per file (`snakemake.wildcards.name`, `.ext`), each caption with its table printed below.

The workflow flags each section's folder, this folder and the PDF with `report(...)`; categories and
subcategories are read from `index.json` when `snakemake --report` runs (`ReportIndex`).
"""

from __future__ import annotations

import argparse
import csv
import html
import io
import json
import os
import re
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from cs336sys.io import write_atomic
from cs336sys.writeup import unnumbered

WRITEUP = "The writeup"  # the category of the report's own tables and of the PDF
OTHER_FILES = "Files the writeup does not number"  # subcategory of a section's other CSV and PNG files

_CAPTION = re.compile(r'^<a id="(tbl|fig)-([^"]+)"></a>\*\*(Table|Figure) (\d+)\.\*\* (.*)$')
_IMAGE = re.compile(r"^!\[Figure \d+\]\(([^)]+)\)\s*$")
_HEADING = re.compile(r"^(#{2,3}) (.*?)\s*$")
APPENDIX_MARK = "<!-- appendix -->"


@dataclass
class Item:
    kind: str  # "table" or "figure"
    number: str
    key: str  # the report's anchor key, without "tbl-"/"fig-"
    caption: str  # as the report prints it (Markdown)
    heading: str  # the level-3 heading it sits under (else its level-2 heading), as printed
    top: str  # its level-2 heading, as printed
    appendix: bool
    image: str | None = None  # a figure's path as the report links it
    body: str | None = None  # a table's pipe table as printed
    section: str | None = None  # the registry section whose folder holds its file; None: the report's own
    file: str | None = None  # its file: in the section's folder, or under OUT/tables
    category: str = ""

    @property
    def label(self) -> str:
        return f"{'Table' if self.kind == 'table' else 'Figure'} {self.number}"


def parse(text: str) -> list[Item]:
    """Every numbered table and figure of a rendered report, in order, with its heading and (a table)
    the pipe table that follows its caption or (a figure) the image above it."""
    lines = text.split("\n")
    items: list[Item] = []
    top = sub = ""
    appendix = fenced = False
    for i, line in enumerate(lines):
        if line.startswith("```"):
            fenced = not fenced
        if fenced:
            continue
        if line.strip() == APPENDIX_MARK:
            appendix = True
            continue
        if m := _HEADING.match(line):
            if len(m.group(1)) == 2:
                top, sub = m.group(2), ""
            else:
                sub = m.group(2)
            continue
        m = _CAPTION.match(line)
        if not m:
            continue
        kind = "table" if m.group(1) == "tbl" else "figure"
        item = Item(kind, m.group(4), m.group(2), m.group(5), sub or top, top, appendix)
        if kind == "figure":
            image = next((_IMAGE.match(lines[j]) for j in range(i - 1, -1, -1) if lines[j].strip()), None)
            if image is None:
                raise ValueError(f"line {i + 1}: figure {item.number} has no image above its caption")
            item.image = image.group(1)
        else:
            j = i + 1
            while j < len(lines) and not lines[j].startswith("|"):
                if lines[j].strip() and not lines[j].startswith("<!--"):
                    raise ValueError(f"line {i + 1}: table {item.number} is not followed by a pipe table")
                j += 1
            k = j
            while k < len(lines) and lines[k].startswith("|"):
                k += 1
            if j == k:
                raise ValueError(f"line {i + 1}: table {item.number} is not followed by a pipe table")
            item.body = "\n".join(lines[j:k])
        items.append(item)
    return items


def locate(items: list[Item], report: Path, section_dirs: list[Path]) -> None:
    """Each item's file: a figure's image in a section folder; a table's CSV, found by the section's `.md`
    table whose text is the one printed. Items found in no section folder keep `file` None. The category
    of a section's items is the level-2 heading (outside the appendix) that holds most of them."""
    dirs = {d.resolve(): d.name for d in section_dirs}
    printed: dict[str, tuple[str, str]] = {}
    for d in section_dirs:
        for md in sorted(d.glob("*.md")):
            printed.setdefault(md.read_text().strip(), (d.name, md.with_suffix(".csv").name))
    for item in items:
        if item.kind == "figure":
            path = (report.parent / item.image).resolve()
            if path.parent in dirs:
                item.section, item.file = dirs[path.parent], path.name
        elif (found := printed.get(item.body.strip())):
            item.section, item.file = found
    # The report's own items (not in any folder) belong to the section of their heading's other items.
    by_top: dict[str, dict[str, int]] = {}
    for item in items:
        if item.section:
            counts = by_top.setdefault(item.top, {})
            counts[item.section] = counts.get(item.section, 0) + 1
    for item in items:
        if item.section is None and item.top in by_top:
            counts = by_top[item.top]
            item.section = max(counts, key=counts.get)
    main: dict[str, dict[str, int]] = {}
    for item in items:
        if item.section and not item.appendix:
            counts = main.setdefault(item.section, {})
            counts[item.top] = counts.get(item.top, 0) + 1
    for item in items:
        if item.section and item.section in main:
            item.category = max(main[item.section], key=main[item.section].get)
        elif item.section:
            item.category = item.top
        else:
            item.category = WRITEUP


def inline_html(text: str) -> str:
    """The report's inline Markdown as HTML: code, bold, italics; links keep their text (their anchors
    point into the writeup)."""
    parts = re.split(r"(`[^`]*`)", text)
    out = []
    for part in parts:
        if part.startswith("`") and part.endswith("`") and len(part) >= 2:
            out.append(f"<code>{html.escape(part[1:-1])}</code>")
            continue
        part = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", part)
        part = html.escape(part, quote=False)
        part = re.sub(r"\*\*(.+?)\*\*", r"<b>\1</b>", part)
        part = re.sub(r"(?<![\w*])\*(?!\s)(.+?)(?<!\s)\*(?![\w*])", r"<i>\1</i>", part)
        out.append(part)
    return "".join(out)


def _cells(row: str) -> list[str]:
    row = row.strip()
    if row.startswith("|"):
        row = row[1:]
    if row.endswith("|"):
        row = row[:-1]
    return [c.strip().replace("\\|", "|") for c in re.split(r"(?<!\\)\|", row)]


def table_rows(body: str) -> tuple[list[str], list[str], list[list[str]]]:
    """A pipe table's header, column alignments ("left"/"right"/"center") and rows."""
    lines = body.strip().split("\n")
    header, rule, rows = _cells(lines[0]), _cells(lines[1]), [_cells(r) for r in lines[2:]]
    align = ["center" if r.startswith(":") and r.endswith(":") else "right" if r.endswith(":") else "left"
             for r in rule]
    return header, align, rows


def table_html(body: str) -> str:
    header, align, rows = table_rows(body)

    def row(cells: list[str], tag: str) -> str:
        return "<tr>" + "".join(f"<{tag}{'' if a == 'left' else f' align={a}'}>{inline_html(c)}</{tag}>"
                                for c, a in zip(cells, align, strict=True)) + "</tr>"

    return "\n".join(["<table>", row(header, "th"), *(row(r, "td") for r in rows), "</table>"])


def table_csv(body: str) -> str:
    """A table the report lays out itself, as CSV: the cells as printed, links and code marks dropped."""
    header, _, rows = table_rows(body)
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")

    def plain(cell: str) -> str:
        return re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", cell).replace("`", "")

    for r in [header, *rows]:
        writer.writerow([plain(c) for c in r])
    return out.getvalue()


def caption_html(item: Item, source: str) -> str:
    """What Snakemake's report shows under the item: the caption as the report prints it, the table as
    printed, and where the writeup has it."""
    parts = [f"<p><b>{item.label}.</b> {inline_html(item.caption)}</p>"]
    if item.body:
        parts.append(table_html(item.body))
    parts.append(f"<p>In the writeup: {html.escape(item.heading)}. {source}</p>")
    return "\n".join(parts)


def caption_template(entries: list[tuple[str, str]], otherwise: str) -> str:
    """A caption file for one `report()` flag: Jinja that picks, by the file's name and extension, one
    reStructuredText raw-HTML block. `entries`: (file name, HTML)."""
    out = ['{% set file = snakemake.wildcards.name ~ "." ~ snakemake.wildcards.ext %}']
    for n, (name, body) in enumerate(entries):
        if "endraw" in body or '"' in name:
            raise ValueError(f"{name}: caption text cannot be quoted for the report's template")
        out.append(f'{{% {"if" if n == 0 else "elif"} file == "{name}" %}}')
        out.append("{% raw %}.. raw:: html\n\n" + _indent(body) + "\n{% endraw %}")
    if entries:
        out.append("{% else %}")
    out.append(otherwise)
    if entries:
        out.append("{% endif %}")
    return "\n".join(out) + "\n"


def _indent(text: str) -> str:
    return "\n".join("   " + line for line in text.split("\n"))


# The caption of a section file that is neither numbered nor described in cs336sys.writeup.unnumbered
# (tests/test_snakemake_report.py holds the committed results to none)
UNDESCRIBED = ("A file of the section {section} that the writeup does not show as a numbered table or figure, "
               "and that cs336sys.writeup.unnumbered does not describe yet.")


def _unnumbered_entries(folder: Path, numbered: list[Item], report_text: str) -> list[tuple[str, str]]:
    """(file, caption) of each CSV and PNG of a section folder that the writeup does not number and
    `unnumbered` describes; a numbered item of the same name (a figure of a printed table) is cited."""
    category = numbered[0].category if numbered else ""
    files = {i.file for i in numbered}
    entries = []
    for file in unnumbered.section_files(folder):
        if file in files:
            continue
        stem = file.rsplit(".", 1)[0]
        twins = [f"{i.label} ({i.heading})" for i in numbered if i.file.rsplit(".", 1)[0] == stem]
        if (text := unnumbered.caption_html(folder.name, file, category, twins, report_text)) is not None:
            entries.append((file, text))
    return entries


def write(report: Path, section_dirs: list[Path], out: Path) -> list[Item]:
    items = parse(report.read_text())
    locate(items, report, section_dirs)
    out.mkdir(parents=True, exist_ok=True)
    tables = out / "tables"
    tables.mkdir(exist_ok=True)
    for stale in tables.glob("*.csv"):
        stale.unlink()
    for stale in out.glob("*.rst"):
        stale.unlink()
    own = [i for i in items if i.file is None]
    for item in own:
        if item.kind == "figure":
            raise ValueError(f"figure {item.number} ({item.image}) is not in a section folder: Snakemake's report "
                             "lists only files a rule makes; put the image in its section's folder")
    own_ids = {id(i) for i in own}
    for item in own:
        write_atomic(tables / f"{item.key}.csv", table_csv(item.body))
        item.file = f"{item.key}.csv"
    report_text = report.read_text()
    for folder in sorted(section_dirs, key=lambda d: d.name):
        name = folder.name
        entries = [(i.file, caption_html(i, f"Made by the rule <code>{name}_section</code>."))
                   for i in items if i.section == name and id(i) not in own_ids]
        entries += _unnumbered_entries(folder, [i for i in items if i.section == name and id(i) not in own_ids],
                                       report_text)
        write_atomic(out / f"{name}.rst", caption_template(entries, UNDESCRIBED.format(section=name)))
    entries = [(i.file, caption_html(i, "Laid out by the report's templates from the sections' results."))
               for i in own]
    write_atomic(out / "report.rst", caption_template(entries, "A table of the report."))
    write_atomic(out / "index.json", json.dumps(
        {"items": [{k: v for k, v in asdict(i).items() if k != "body"} | {"own": id(i) in own_ids} for i in items]},
        indent=1, ensure_ascii=False) + "\n")
    return items


class ReportIndex:
    """`index.json` read when Snakemake's report asks (never at parse time: `snakemake -n` and runs never
    read it): category, subcategory and labels of each registered file."""

    def __init__(self, path: str):
        self.path = path
        self._items: list[dict] | None = None

    def items(self) -> list[dict]:
        if self._items is None:
            self._items = json.loads(Path(self.path).read_text())["items"] if os.path.exists(self.path) else []
        return self._items

    def find(self, section: str | None, file: str) -> dict | None:
        """The item of this file: of a section's folder (`section`), or of the report's own tables (None)."""
        for item in self.items():
            if item["file"] == file and (item["own"] if section is None else item["section"] == section
                                         and not item["own"]):
                return item
        return None

    def category(self, section: str | None, file: str, default: str) -> str:
        item = self.find(section, file)
        if item:
            return item["category"]
        same = [i["category"] for i in self.items() if i["section"] == section and not i["own"]]
        return same[0] if same else default

    def subcategory(self, section: str | None, file: str) -> str:
        item = self.find(section, file)
        return item["heading"] if item else OTHER_FILES

    def labels(self, section: str | None, file: str) -> dict[str, str]:
        item = self.find(section, file)
        what = f"{'Table' if item['kind'] == 'table' else 'Figure'} {item['number']}" if item else "not numbered"
        return {"in the writeup": what, "file": file}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m cs336sys.writeup.items", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("report", type=Path)
    p.add_argument("--sections", nargs="+", required=True, type=Path)
    p.add_argument("--out", required=True, type=Path)
    a = p.parse_args(argv)
    items = write(a.report, a.sections, a.out)
    print(f"wrote {a.out}: {len(items)} numbered tables and figures")
    return 0


if __name__ == "__main__":
    sys.exit(main())
