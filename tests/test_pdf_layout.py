"""The PDF reads cleanly at print size: every table fits its columns, no text overlaps other text,
no word is split inside a table cell, no text is smaller than 8 pt, figures print at the text width
with text of at least 8 pt.

The report is rebuilt from the committed results (analysis -> templates -> pandoc -> typst, seconds,
no GPU) and the PDF is read back with pypdf: typst writes a tagged PDF, so the structure tree says
which text belongs to which table cell, and the content streams say where each piece of text lies.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

import pypdf
import pytest
from pypdf.generic import ArrayObject, ContentStream, DictionaryObject, IndirectObject

from cs336sys import report

REPO = Path(__file__).resolve().parent.parent
MAX_COLUMNS = 9  # a table with more columns goes to a CSV file that the report links
MAX_CELL_LINES = 3  # more lines in one cell is a column squeezed to a word per line
MIN_TEXT_PT = 8.0
TOLERANCE_PT = 0.5
HANGING_PT = 3.0  # typst lets a line's final comma or hyphen hang into the margin


# --- reading a PDF: text runs with their boxes, table cells, placed images -------------------------


@dataclass
class Run:
    """One piece of text as drawn: its box in PDF points (y up), baseline and size."""

    page: int
    text: str
    x0: float
    x1: float
    y0: float
    y1: float
    baseline: float
    size: float


@dataclass
class Layout:
    page_width: list[float] = field(default_factory=list)
    runs: list[Run] = field(default_factory=list)
    by_mcid: dict[tuple[int, int], list[Run]] = field(default_factory=dict)
    tables: list[list[list[list[Run]]]] = field(default_factory=list)  # table -> row -> cell -> runs
    images: list[tuple[int, float]] = field(default_factory=list)  # (page, placed width in pt)


def _mul(a, b):
    """Product of two PDF matrices [a b c d e f] (a applied first)."""
    return [a[0] * b[0] + a[1] * b[2], a[0] * b[1] + a[1] * b[3],
            a[2] * b[0] + a[3] * b[2], a[2] * b[1] + a[3] * b[3],
            a[4] * b[0] + a[5] * b[2] + b[4], a[4] * b[1] + a[5] * b[3] + b[5]]


def _apply(m, x, y):
    return m[0] * x + m[2] * y + m[4], m[1] * x + m[3] * y + m[5]


class _Font:
    """A Type0 (Identity-H) font as typst writes it: 2-byte codes, /W widths, a ToUnicode map."""

    def __init__(self, font: DictionaryObject):
        font = font.get_object()
        if font["/Subtype"] != "/Type0":
            raise NotImplementedError(f"font subtype {font['/Subtype']} (typst writes Type0 fonts)")
        cid = font["/DescendantFonts"][0].get_object()
        self.default = float(cid.get("/DW", 1000))
        self.widths: dict[int, float] = {}
        w = [x.get_object() for x in cid.get("/W", [])]  # c [w1 w2 ...] or c_first c_last w
        i = 0
        while i < len(w):
            first = int(w[i])
            if isinstance(w[i + 1], ArrayObject):
                for k, width in enumerate(w[i + 1]):
                    self.widths[first + k] = float(width)
                i += 2
            else:
                for c in range(first, int(w[i + 1]) + 1):
                    self.widths[c] = float(w[i + 2])
                i += 3
        self.unicode: dict[int, str] = {}
        if "/ToUnicode" in font:
            cmap = font["/ToUnicode"].get_object().get_data().decode("latin-1")
            for block in re.findall(r"beginbfchar(.*?)endbfchar", cmap, re.S):
                for src, dst in re.findall(r"<([0-9A-Fa-f]+)>\s*<([0-9A-Fa-f]+)>", block):
                    self.unicode[int(src, 16)] = bytes.fromhex(dst).decode("utf-16-be")
            for block in re.findall(r"beginbfrange(.*?)endbfrange", cmap, re.S):
                for lo, hi, dst in re.findall(r"<([0-9A-Fa-f]+)>\s*<([0-9A-Fa-f]+)>\s*<([0-9A-Fa-f]+)>", block):
                    start = int.from_bytes(bytes.fromhex(dst), "big")
                    for k, c in enumerate(range(int(lo, 16), int(hi, 16) + 1)):
                        self.unicode[c] = chr(start + k)

    def glyphs(self, data: bytes) -> list[tuple[str, float]]:
        """(text, advance in 1/1000 of the font size) of each 2-byte code."""
        codes = [int.from_bytes(data[i:i + 2], "big") for i in range(0, len(data) - 1, 2)]
        return [(self.unicode.get(c, "?"), self.widths.get(c, self.default)) for c in codes]


def _read_page(reader, index: int, layout: Layout) -> None:
    page = reader.pages[index]
    resources = page["/Resources"]
    fonts = {name: _Font(f) for name, f in resources.get("/Font", {}).items()}
    ctm, stack, marks = [1, 0, 0, 1, 0, 0], [], []
    tm = tlm = [1, 0, 0, 1, 0, 0]
    font, size, leading = None, 0.0, 0.0
    for operands, op in ContentStream(page.get_contents(), reader).operations:
        if op == b"q":
            stack.append(ctm)
        elif op == b"Q":
            ctm = stack.pop()
        elif op == b"cm":
            ctm = _mul([float(v) for v in operands], ctm)
        elif op == b"BDC":
            props = operands[1]
            marks.append(int(props["/MCID"]) if isinstance(props, DictionaryObject) and "/MCID" in props else None)
        elif op == b"BMC":
            marks.append(None)
        elif op == b"EMC":
            marks.pop()
        elif op == b"BT":
            tm = tlm = [1, 0, 0, 1, 0, 0]
        elif op == b"Tf":
            font, size = fonts[operands[0]], float(operands[1])
        elif op == b"TL":
            leading = float(operands[0])
        elif op == b"Tm":
            tm = tlm = [float(v) for v in operands]
        elif op in (b"Td", b"TD"):
            tm = tlm = _mul([1, 0, 0, 1, float(operands[0]), float(operands[1])], tlm)
        elif op == b"T*":
            tm = tlm = _mul([1, 0, 0, 1, 0, -leading], tlm)
        elif op in (b"TJ", b"Tj"):
            parts = operands[0] if op == b"TJ" else [operands[0]]
            # Each glyph's start and end along the line; spaces at either end of a run take no room.
            pos, inked, text = 0.0, [], ""
            for part in parts:
                if isinstance(part, (int, float)):  # a TJ adjustment, in 1/1000 of the font size
                    pos -= float(part)
                    continue
                data = part.original_bytes if isinstance(part, str) else bytes(part)
                for t, w in font.glyphs(data):
                    text += t
                    if t.strip():
                        inked.append((pos, pos + w))
                    pos += w
            trm = _mul(tm, ctm)
            tm = _mul([1, 0, 0, 1, pos * size / 1000, 0], tm)
            if not inked:
                continue
            x_from, x_to = inked[0][0] * size / 1000, inked[-1][1] * size / 1000
            corners = [_apply(trm, x, y) for x in (x_from, x_to) for y in (-0.2 * size, 0.75 * size)]
            xs, ys = [c[0] for c in corners], [c[1] for c in corners]
            scale = (trm[2] ** 2 + trm[3] ** 2) ** 0.5
            run = Run(index, text, min(xs), max(xs), min(ys), max(ys), _apply(trm, 0, 0)[1], size * scale)
            layout.runs.append(run)
            mcid = next((m for m in reversed(marks) if m is not None), None)
            if mcid is not None:
                layout.by_mcid.setdefault((index, mcid), []).append(run)
        elif op == b"Do":
            xobject = resources["/XObject"][operands[0]].get_object()
            if xobject.get("/Subtype") == "/Image":
                layout.images.append((index, (ctm[0] ** 2 + ctm[1] ** 2) ** 0.5))


def _tables(reader, layout: Layout) -> None:
    """Tables from the structure tree: Table > (THead|TBody|TFoot)? > TR > (TH|TD) > marked content."""
    if "/StructTreeRoot" not in reader.trailer["/Root"]:
        raise AssertionError("the PDF has no structure tree: typst writes tagged PDFs from 0.14 on")
    root = reader.trailer["/Root"]["/StructTreeRoot"]
    role = {k: v for k, v in root.get("/RoleMap", {}).items()}
    pages = {p.indirect_reference.idnum: i for i, p in enumerate(reader.pages)}

    def kind(node) -> str:
        s = node.get("/S")
        return str(role.get(s, s))

    def page_of(node, inherited):
        ref = node.raw_get("/Pg") if "/Pg" in node else None
        return pages[ref.idnum] if isinstance(ref, IndirectObject) else inherited

    def kids(node):
        k = node.get("/K")
        if k is None:
            return []
        return list(k) if isinstance(k, ArrayObject) else [k]

    def content(node, page) -> list[Run]:
        runs = []
        for k in kids(node):
            obj = k.get_object() if isinstance(k, IndirectObject) else k
            if isinstance(obj, int):
                runs += layout.by_mcid.get((page, int(obj)), [])
            elif isinstance(obj, DictionaryObject) and obj.get("/Type") == "/MCR":
                runs += layout.by_mcid.get((page_of(obj, page), int(obj["/MCID"])), [])
            elif isinstance(obj, DictionaryObject) and "/S" in obj:
                runs += content(obj, page_of(obj, page))
        return runs

    def walk(node, page):
        for k in kids(node):
            obj = k.get_object() if isinstance(k, IndirectObject) else k
            if not isinstance(obj, DictionaryObject) or "/S" not in obj:
                continue
            p = page_of(obj, page)
            if kind(obj) == "/Table":
                layout.tables.append(rows(obj, p))
            else:
                walk(obj, p)

    def rows(node, page):
        out = []
        for k in kids(node):
            obj = k.get_object() if isinstance(k, IndirectObject) else k
            if not isinstance(obj, DictionaryObject) or "/S" not in obj:
                continue
            p = page_of(obj, page)
            if kind(obj) == "/TR":
                out.append([content(c.get_object(), page_of(c.get_object(), p)) for c in kids(obj)
                            if isinstance(c.get_object(), DictionaryObject)
                            and kind(c.get_object()) in ("/TH", "/TD")])
            else:
                out += rows(obj, p)
        return out

    walk(root, None)


def read_layout(pdf: Path) -> Layout:
    reader = pypdf.PdfReader(pdf)
    layout = Layout(page_width=[float(p.mediabox.width) for p in reader.pages])
    for i in range(len(reader.pages)):
        _read_page(reader, i, layout)
    _tables(reader, layout)
    return layout


# --- what a clean page is ---------------------------------------------------------------------------


def _lines(runs: list[Run]) -> list[str]:
    """A cell's text line by line (runs grouped by baseline, left to right)."""
    lines: dict[float, list[Run]] = {}
    for r in runs:
        key = next((b for b in lines if abs(b - r.baseline) < 0.3 * r.size), r.baseline)
        lines.setdefault(key, []).append(r)
    return ["".join(r.text for r in sorted(rs, key=lambda r: r.x0)) for _, rs in sorted(lines.items(), reverse=True)]


def layout_problems(layout: Layout, margin_pt: float) -> list[str]:
    problems = []
    for r in layout.runs:
        if r.size < MIN_TEXT_PT - 0.05:
            problems.append(f"page {r.page + 1}: {r.text!r} is set in {r.size:.1f} pt")
        if r.x0 < margin_pt - HANGING_PT or r.x1 > layout.page_width[r.page] - margin_pt + HANGING_PT:
            problems.append(f"page {r.page + 1}: {r.text!r} runs into the margin")
    by_page: dict[int, list[Run]] = {}
    for r in layout.runs:
        by_page.setdefault(r.page, []).append(r)
    for page, runs in by_page.items():
        runs = sorted(runs, key=lambda r: r.x0)
        for i, a in enumerate(runs):
            for b in runs[i + 1:]:
                if b.x0 >= a.x1 - TOLERANCE_PT:
                    break
                if min(a.y1, b.y1) - max(a.y0, b.y0) > 0.3 * min(a.size, b.size):
                    problems.append(f"page {page + 1}: {a.text!r} and {b.text!r} overlap")
    for t, table in enumerate(layout.tables, 1):
        where = f"table {t} (page {next((r.page + 1 for row in table for c in row for r in c), '?')})"
        head = " | ".join(" ".join(_lines(c)) for c in table[0]) if table else ""
        ncols = max((len(row) for row in table), default=0)
        if ncols > MAX_COLUMNS:
            problems.append(f"{where} has {ncols} columns (at most {MAX_COLUMNS}): {head}")
        # Columns left to right: everything in column j lies left of everything in column j+1.
        spans = []
        for j in range(ncols):
            runs = [r for row in table if j < len(row) for r in row[j]]
            if runs:
                spans.append((j, min(r.x0 for r in runs), max(r.x1 for r in runs)))
        for (j, _, right), (k, left, _) in zip(spans, spans[1:], strict=False):
            if right > left + TOLERANCE_PT:
                problems.append(f"{where}: column {j + 1} reaches into column {k + 1} by {right - left:.1f} pt: {head}")
        for row in table:
            for cell in row:
                lines = _lines(cell)
                if len(lines) > MAX_CELL_LINES:
                    problems.append(f"{where}: a cell takes {len(lines)} lines: {' / '.join(lines)}")
                # a line ending in a hyphen (typst writes its inserted hyphen as a soft hyphen or "-")
                split = [line for line in lines[:-1] if line.rstrip().endswith(("-", "\u00ad", "\u2010"))]
                if split:
                    problems.append(f"{where}: a word is split in a cell: {' / '.join(lines)}")
    return problems


# --- the report, rebuilt from the committed results -----------------------------------------------

SECTION_INPUTS = {
    "benchmarking": ["results/benchmarking/**/*.json", "results/warmup/**/*.json", "results/matmul_peak/*.json",
                     "benchmarks/benchmarking/*.tsv", "benchmarks/warmup/*.tsv", "benchmarks/matmul_peak.tsv",
                     "benchmarks/mixed_precision_accumulation.tsv", "benchmarks/autocast_dtypes.tsv"],
    "attention": ["results/pytorch_attention/**/*.json", "results/flash_benchmarking/**/*.json",
                  "results/flash_leaderboard/*/*/*.json", "results/matmul_peak/*.json",
                  "benchmarks/flash_benchmarking/*.tsv"],
    "precision": ["results/mixed_precision_accumulation/*.json", "results/autocast_dtypes/*.json"],
}
EXTRA = {"attention": {"reference_ms": {"a published entry": 5.0}}}


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """Sections from the committed results, each figure's drawn text recorded, the report rendered."""
    import importlib

    from matplotlib.figure import Figure

    from cs336sys.analysis import common
    from cs336sys.analysis.context import as_json

    root = tmp_path_factory.mktemp("report")
    figures: dict[str, dict] = {}

    def spy(save):
        def save_figure(fig: Figure, out_dir: Path, name: str) -> str:
            savefig = fig.savefig

            def record(*args, **kwargs):
                savefig(*args, **kwargs)
                figures[f"{out_dir.name}/{name}"] = {"width_in": fig.get_size_inches()[0],
                                                     "texts": drawn_text(fig)}
            fig.savefig = record
            return save(fig, out_dir, name)
        return save_figure

    dirs = []
    with pytest.MonkeyPatch.context() as mp:
        for section, patterns in SECTION_INPUTS.items():
            paths = sorted({p for pattern in patterns for p in REPO.glob(pattern)})
            if not any(p.suffix == ".json" for p in paths):
                pytest.skip(f"no committed results for the {section} section")
            module = importlib.import_module(f"cs336sys.analysis.{section}")
            if hasattr(module, "save_figure"):
                mp.setattr(module, "save_figure", spy(common.save_figure))
            out = root / "sections" / section
            out.mkdir(parents=True)
            context = as_json(module.build(paths, out, **EXTRA.get(section, {})))
            context["result_counts"] = {}
            (out / "context.json").write_text(__import__("json").dumps(context, default=str))
            dirs.append(out)
    md = root / "writeup" / "report.md"
    report.render_markdown(dirs, REPO / "writeup" / "templates", md)
    pdf = root / "writeup" / "report.pdf"
    report.render_pdf(md, pdf)
    return {"markdown": md, "pdf": pdf, "layout": read_layout(pdf), "figures": figures}


def drawn_text(fig) -> list[tuple[str, float]]:
    """Every piece of text the figure draws, with its font size in points."""
    renderer = fig.canvas.get_renderer()
    texts = []
    draw_text = renderer.draw_text

    def record(gc, x, y, s, prop, angle, ismath=False, mtext=None):
        if s.strip():
            texts.append((s, prop.get_size_in_points()))
        return draw_text(gc, x, y, s, prop, angle, ismath=ismath, mtext=mtext)

    renderer.draw_text = record
    try:
        fig.draw(renderer)
    finally:
        del renderer.draw_text
    return texts


def test_every_table_of_the_report_reads_cleanly(built):
    layout = built["layout"]
    assert len(layout.tables) >= 10, "the structure tree should list the report's tables"
    assert layout_problems(layout, report.MARGIN_X_CM / 2.54 * 72) == []


def test_figures_are_set_at_the_text_width_with_text_of_at_least_8_pt(built):
    figures, layout = built["figures"], built["layout"]
    assert figures, "the sections made no figure"
    text_width_in = report.TEXT_WIDTH_CM / 2.54
    for name, f in figures.items():
        assert f["width_in"] == pytest.approx(text_width_in, rel=0.01), name
        printed = [(s, size * text_width_in / f["width_in"]) for s, size in f["texts"]]
        assert min(size for _, size in printed) >= MIN_TEXT_PT, (name, [t for t in printed if t[1] < MIN_TEXT_PT])
    assert len(layout.images) == built["markdown"].read_text().count("![")
    for page, width in layout.images:
        assert width == pytest.approx(text_width_in * 72, abs=1), f"an image on page {page + 1} is {width:.0f} pt wide"


def test_the_checker_finds_the_garbled_tables_of_old(tmp_path):
    """Tables as the report had them, rendered as render_pdf did before its table style (pandoc's
    template alone: 11 pt, justified, hyphenated): the 13-column table of every point and the
    feasibility table whose last column was prose. Each kind of garbling is found."""
    import pypandoc
    import typst

    header = ["size", "context_length", "mode", "dtype", "compile", "status", "mean_ms", "std_ms", "median_ms",
              "min_ms", "achieved_tflops", "mfu_pct", "peak_memory_gib"]
    row = ["small", "128", "forward_backward", "bf16", "eager", "ok"] + ["123.45"] * 7
    wide = "| " + " | ".join(header) + " |\n|" + "---|" * 13 + "\n" + ("| " + " | ".join(row) + " |\n") * 3
    prose = ("| d | naive fwd+bwd ms | allowed ms | needed TFLOP/s | share of the ceiling "
             "| naive / floor at the ceiling | measured naive / x |\n|---:|---:|---:|---:|---:|---:|---|\n"
             "| 16 | 5.714 | 0.286 | 105 | 14% | 141.4 | ours eager 11.8; ours graphed 16.9; SDPA eager 8.3; "
             "SDPA graphed 8.4 |\n")
    md = tmp_path / "old.md"
    md.write_text(wide + "\n" + prose)
    typ = tmp_path / "old.typ"
    typ.write_text(pypandoc.convert_file(str(md), "typst", format="gfm", extra_args=["--standalone"]))
    pdf = tmp_path / "old.pdf"
    pdf.write_bytes(typst.compile(str(typ)))
    found = "\n".join(layout_problems(read_layout(pdf), margin_pt=1.25 * 72))  # the template's margin
    for what in ("has 13 columns", "overlap", "reaches into column", "a word is split in a cell", "a cell takes"):
        assert what in found, what

    # The same tables through render_pdf: only the 13 columns remain a problem (they go to a CSV file).
    pdf = tmp_path / "new.pdf"
    report.render_pdf(md, pdf)
    found = layout_problems(read_layout(pdf), report.MARGIN_X_CM / 2.54 * 72)
    assert any("has 13 columns" in p for p in found)


MAIN_TEXT_PAGES = 28  # issue 60: the summary on page 1, the main text in at most 28 pages (docs/report.md)


def test_the_committed_report_has_its_summary_on_one_page_its_main_text_in_28_and_clean_tables():
    """writeup/report.pdf as committed: the title in its metadata, the whole summary on the first page (the
    note after its table is there too), the appendix (the index of deliverables) starting by page 29 (28 pages
    of main text: docs/report.md), and every table of the whole report fitting its columns. (Running text is
    not checked here: the accounting section's mathematics sets sub- and superscripts that overlap by design.)"""
    pdf = REPO / "writeup" / "report.pdf"
    reader = pypdf.PdfReader(pdf)
    assert (reader.metadata.title or "").startswith("CS336")
    assert "Every problem part of both handouts" in reader.pages[0].extract_text(), "the summary runs past page 1"
    appendix = next(i for i, page in enumerate(reader.pages[3:], 4) if "Index of deliverables" in page.extract_text())
    assert appendix <= MAIN_TEXT_PAGES + 1, f"the main text takes {appendix - 1} pages"
    tables = [p for p in layout_problems(read_layout(pdf), report.MARGIN_X_CM / 2.54 * 72) if p.startswith("table")]
    assert tables == []


def test_no_page_of_the_main_text_is_more_than_40_percent_blank(tmp_path):
    """Each page of the committed report drawn as a PNG: below its last ink, at most 40 % of the text area is
    blank, except on the page before the appendix (figures float to the next page instead of leaving a gap)."""
    import matplotlib.image as mpimg
    import numpy as np

    pages = report.render_pages(REPO / "writeup" / "report.md", tmp_path, ppi=30)
    reader = pypdf.PdfReader(REPO / "writeup" / "report.pdf")
    appendix = next(i for i, page in enumerate(reader.pages[3:], 4) if "Index of deliverables" in page.extract_text())
    blank = {}
    for n, png in enumerate(pages[:appendix - 2], 1):  # up to the page before the one before the appendix
        grey = mpimg.imread(png)[..., :3].mean(axis=2)
        top, bottom = int(0.06 * len(grey)), int(0.90 * len(grey))  # the margins and the page number
        ink = np.where((grey[top:bottom] < 0.95).any(axis=1))[0]
        blank[n] = 1 - (ink.max() / (bottom - top) if len(ink) else 0)
    assert {n: round(b, 2) for n, b in blank.items() if b > 0.40} == {}
