"""report.md -> report.pdf: the GitHub Markdown of the report made into pandoc Markdown (captions as
real figure captions, headings labelled, the contents and the index with page numbers), then Typst
(pandoc, from pypandoc-binary) and a PDF (typst, from PyPI).

Only the constructs `cs336sys.writeup.markup` writes are rewritten; everything else passes through.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path

from cs336sys.io import write_atomic
from cs336sys.writeup import layout, markup

# pandoc's own Markdown, read as close to GitHub's as it goes: TeX maths between dollars (as GitHub
# does), no sub/superscripts (~ and ^ in text), straight quotes, lists that follow a paragraph line, GitHub's
# heading identifiers. Pipe tables, implicit figures, captions and raw Typst come with it.
READER = ("markdown-tex_math_single_backslash-superscript-subscript-raw_tex-smart"
          "-yaml_metadata_block-citations-example_lists-fancy_lists-definition_lists-native_divs"
          "-native_spans-inline_notes-auto_identifiers+gfm_auto_identifiers+lists_without_preceding_blankline"
          "+autolink_bare_uris-blank_before_header")

_TABLE_CAPTION = re.compile(r'^<a id="(tbl-[^"]+)"></a>(.*)$')
_FIGURE_CAPTION = re.compile(r'^<a id="(fig-[^"]+)"></a>(.*)$')
_IMAGE = re.compile(r"^!\[[^\]]*\]\(([^)\s]+)\)\s*$")
_LINK = re.compile(r"\]\(#([^)\s]+)\)")
# In a table row: link targets (kept whole), and names of three or more parts joined by underscores
# (`ours_sdpa_fused_keep_attention_checkpoint_24`, in code or not), which get a break opportunity after
# each underscore, as a table's narrow column needs; Typst breaks nothing else inside a word.
_KEPT = re.compile(r"(\]\([^)]*\))")
_LONG_NAME = re.compile(r"\b[A-Za-z0-9.]+(?:_[A-Za-z0-9.]+){2,}\b")


def _raw(typst: str) -> str:
    return f"```{{=typst}}\n{typst}\n```"


def _paragraph(lines: list[str], i: int) -> tuple[str, int]:
    """The paragraph starting at line i, joined, and the index after it."""
    j = i
    while j < len(lines) and lines[j].strip():
        j += 1
    return " ".join(s.strip() for s in lines[i:j]), j


def breakable(row: str) -> str:
    """A table row with a zero-width space after each underscore of a long name outside link targets."""
    return "".join(part if i % 2 else _LONG_NAME.sub(lambda m: m.group(0).replace("_", "_\u200b"), part)
                   for i, part in enumerate(_KEPT.split(row)))


def _skip_blank(lines: list[str], i: int) -> int:
    while i < len(lines) and not lines[i].strip():
        i += 1
    return i


def to_pandoc(md: str) -> tuple[str, str | None]:
    """(pandoc Markdown, the title) of a report written by `markup.render`."""
    lines = md.split("\n")
    out: list[str] = []
    title = None
    slugs: dict[str, int] = {}
    i = 0
    while i < len(lines):
        line = lines[i]
        if line.startswith("```"):  # a code block passes unchanged
            j = i + 1
            while j < len(lines) and not lines[j].startswith("```"):
                j += 1
            out.extend(lines[i:j + 1])
            i = j + 1
            continue
        m = re.match(r"^(#{1,3})\s+(.*?)\s*$", line)
        if m:
            level, text = len(m.group(1)), m.group(2)
            if level == 1 and title is None:
                title = text
                i += 1
                continue
            slug = markup.gfm_slug(text)
            n = slugs.get(slug, 0)
            slugs[slug] = n + 1
            # a heading without a number (summary, contents) stays out of the PDF's outline
            unlisted = "" if re.match(r"^[0-9A-Z]+(\.\d+)* ", text) else " .unlisted"
            out.append(f"{m.group(1)} {text} {{#{slug if n == 0 else f'{slug}-{n}'}{unlisted}}}")
            i += 1
            continue
        m = _TABLE_CAPTION.match(line)
        if m:
            caption, j = _paragraph(lines, i)
            caption = _TABLE_CAPTION.match(caption).group(2)
            k = _skip_blank(lines, j)
            index = k < len(lines) and lines[k].strip() == markup.INDEX_BEGIN
            k += index
            end = k
            while end < len(lines) and lines[end].startswith("|"):
                end += 1
            if end == k:
                raise ValueError(f"the caption of {m.group(1)} is not followed by a table: {caption[:60]!r}")
            rows = [breakable(row) for row in lines[k:end]]
            if index:  # each link to a heading also gets its page (the PDF has pages; GitHub has not)
                rows = [_LINK.sub(lambda m: f"](#{m.group(1)}), p. `#context counter(page).at(<{m.group(1)}>)"
                                            f".first()`{{=typst}}", row) for row in rows]
                end += end < len(lines) and lines[end].strip() == markup.INDEX_END
            out.extend(rows)
            out.extend(["", f"Table: {caption} {{#{m.group(1)}}}"])
            i = end
            continue
        m = _IMAGE.match(line)
        if m:
            k = _skip_blank(lines, i + 1)
            c = _FIGURE_CAPTION.match(lines[k]) if k < len(lines) else None
            if c:
                caption, j = _paragraph(lines, k)
                caption = _FIGURE_CAPTION.match(caption).group(2)
                out.append(f"![{caption}]({m.group(1)}){{#{c.group(1)}}}")
                i = j
                continue
        if line.strip() == markup.TOC_BEGIN:
            j = lines.index(markup.TOC_END, i)
            out.append(_raw("#outline(title: none, depth: 2, indent: 1.2em)"))
            i = j + 1
            continue
        if line.strip() == markup.APPENDIX_MARK:
            out.append(_raw("#pagebreak(weak: true)"))
            i += 1
            continue
        out.append(line)
        i += 1
    return "\n".join(out), title


def is_smoke(md: str) -> bool:
    """The smoke grid's report (its template marks it): every page gets SMOKE_HEADER."""
    return "<!-- grid: smoke -->" in md


# In the preamble, before pandoc's template sets out the title: a `set page` rule in the body would
# end the title's page there, leaving page 1 with the title alone.
SMOKE_HEADER = """#set page(header: align(center, text(size: 8pt, fill: rgb("#a00000"))[
  CPU smoke grid: a pipeline check, not results]))"""

# Typst rules placed after pandoc's template (`--include-before-body`), so they win over its own.
STYLE = f"""\
// Ragged right: justified lines open wide gaps around inline code.
#set par(justify: false)
// Captions carry their own numbers ("Table 3."), written into the Markdown so that GitHub shows them too.
#set figure(numbering: none)
// An image that does not fit below the text floats to the top of the next page instead of leaving the
// rest of this one blank; its number and caption go with it, and the text refers to it by number.
#show figure.where(kind: image): set figure(placement: auto)
#show figure.caption: set text(size: {layout.TABLE_PT}pt)
#show figure.caption: set align(left)
#show figure.caption: set par(justify: false)
#show figure: set block(above: 1.2em, below: 1.4em)
#show link: set text(fill: rgb("#1a4a8a"))
// Inline code at 0.9 of the text around it (Typst sets raw text at 0.8em, under 8 pt in 9-pt tables;
// this scales that by 1.125).
#show raw: set text(size: 1.125em)
#show heading.where(level: 2): set block(above: 1.6em, below: 0.9em)
#show outline.entry.where(level: 1): set block(above: 0.8em)
// Tables: one size smaller than the body, ragged lines, no hyphenation (no "ea-ger" in a cell).
// pandoc gives pipe tables no widths (`columns: N`), so every column is as wide as its content;
// the sections keep tables narrow enough to fit (wide ones go to a CSV file the report links).
#show table: set text(size: {layout.TABLE_PT}pt, hyphenate: false)
#show table: set par(justify: false)
#set table(inset: (x: 4.5pt, y: 3.5pt))
// Long tables continue on the next page (with their header) instead of overflowing it; a short one
// is kept whole rather than split after its first rows.
#show figure: set block(breakable: true)
#show figure.where(kind: table): it => context {{
  let height = measure(block(width: {layout.TEXT_WIDTH_CM}cm, it)).height
  block(breakable: height > {layout.KEEP_TOGETHER_CM}cm, it)
}}
// Figures at the text width: they are drawn that wide, so their text prints at its own size.
#set image(width: 100%)
"""


def _compile(markdown: Path, **typst_args):
    """Markdown -> pandoc -> Typst -> what `typst.compile` returns for `typst_args` (a PDF's bytes, or a
    list of PNG pages). Image paths in the Markdown are relative to its folder; Typst is rooted at the
    common parent so it may read them."""
    import pypandoc
    import typst

    md = markdown.read_text()
    source, title = to_pandoc(md)
    root = Path(os.path.commonpath([markdown.resolve().parent.parent, Path.cwd().resolve()]))
    meta = {"papersize": layout.PAPER, "fontsize": f"{layout.BODY_PT}pt", "page-numbering": "1",
            "margin": {"x": f"{layout.MARGIN_X_CM}cm", "y": f"{layout.MARGIN_Y_CM}cm"}}
    if title:
        meta["title"] = title
    with tempfile.TemporaryDirectory(prefix="cs336sys-report-") as tmp:
        tmp = Path(tmp)
        (tmp / "page.yaml").write_text(json.dumps(meta))  # JSON is YAML
        (tmp / "style.typ").write_text(STYLE)
        (tmp / "header.typ").write_text(SMOKE_HEADER if is_smoke(md) else "")
        # --columns: pipe tables keep their natural widths (a long source line would make pandoc give
        # them relative widths) and the Typst source is not re-wrapped.
        typ_source = pypandoc.convert_text(source, "typst", format=READER, extra_args=[
            "--standalone", "--columns=100000", f"--metadata-file={tmp / 'page.yaml'}",
            f"--include-in-header={tmp / 'header.typ'}", f"--include-before-body={tmp / 'style.typ'}"])
        # Next to the Markdown, so the image paths resolve as they do from the Markdown.
        with tempfile.NamedTemporaryFile("w", suffix=".typ", dir=markdown.parent, delete=False) as f:
            f.write(typ_source)
            typ_path = Path(f.name)
        try:
            return typst.compile(str(typ_path), root=str(root), **typst_args)
        finally:
            typ_path.unlink(missing_ok=True)


def render_pdf(markdown: Path, out: Path) -> None:
    """report.md -> report.pdf."""
    write_atomic(out, _compile(markdown))


def render_pages(markdown: Path, out_dir: Path, ppi: int = 60) -> list[Path]:
    """Every page of the report as a PNG (page-001.png, ...): to look at each page."""
    pages = _compile(markdown, format="png", ppi=ppi)
    pages = pages if isinstance(pages, list) else [pages]
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for n, png in enumerate(pages, 1):
        paths.append(out_dir / f"page-{n:03d}.png")
        paths[-1].write_bytes(png)
    return paths
