"""The report's cross-references: numbered sections, tables and figures, captions, a contents list and
the index of deliverables, written as Markdown that GitHub shows as it is and that `cs336sys.writeup.
typst` turns into captioned, linked Typst figures for the PDF.

Templates call these (Jinja globals) and never write a number of a section, table or figure:

    ## Time per step {: #bench-times}        a numbered heading; {: #key} names it for ref() and answers()
    {{ answers("benchmarking_script-b") }}   this heading answers that handout deliverable
    {{ table("bench-times", "Caption.") }}   a numbered caption; the pipe table follows after a blank line
    {{ figure("bench-warmup", fig("benchmarking", "warmup.png"), "Caption.") }}
    {{ ref("bench-times") }}                 "[Table 3](#tbl-bench-times)", "[Section 2.1](#21-time-per-step)"

`render` puts the numbers in once the whole report is rendered (a reference may come before what it
names: the summary on page 1 refers to every section). Level-2 headings are numbered 1, 2, ... and,
after the `APPENDIX` marker, A, B, ...; level-3 headings 1.1, A.1, ...; a heading with the class
`.unnumbered` (`## Summary {: .unnumbered}`) and the title (level 1) are not numbered. (The attribute
syntax is kramdown's, `{: ...}`: Jinja reads `{#` as the start of a comment.) Level 4 and below are
not used: a table or figure has a caption instead.
"""

from __future__ import annotations

import re
import string
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass, field

# Placeholders the Jinja helpers leave for `render`: they hold keys, never numbers.
_NUM = "\u27e6n:{}\u27e7"
_REF = "\u27e6ref:{}\u27e7"
_ANSWERS = "\u27e6answers:{}\u27e7"
TOC = "\u27e6toc\u27e7"
INDEX = "\u27e6index\u27e7"
APPENDIX = "\u27e6appendix\u27e7"
_PLACEHOLDER = re.compile("\u27e6(n|ref|answers):([^\u27e7]*)\u27e7")

# Markers the PDF conversion looks for (HTML comments: GitHub shows nothing of them).
TOC_BEGIN, TOC_END = "<!-- toc -->", "<!-- /toc -->"
APPENDIX_MARK = "<!-- appendix -->"
INDEX_BEGIN, INDEX_END = "<!-- index -->", "<!-- /index -->"

_KEY = re.compile(r"[a-z0-9][a-z0-9_.-]*")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)(?:\s+\{:([^}]*)\})?\s*$")
KINDS = {"tbl": "Table", "fig": "Figure"}


def _check_key(key: str) -> str:
    if not _KEY.fullmatch(key):
        raise ValueError(f"a report key is lower case letters, digits, '_', '.', '-': {key!r}")
    return key


def table(key: str, caption: str) -> str:
    """A table's caption paragraph (the anchor, 'Table N.' and the text); the template puts the pipe table
    after it, separated by one blank line."""
    key = f"tbl-{_check_key(key)}"
    return f'<a id="{key}"></a>**Table {_NUM.format(key)}.** {_one_line(caption)}'


def figure(key: str, path: str, caption: str) -> str:
    """An image with its caption paragraph below it."""
    key = f"fig-{_check_key(key)}"
    return (f"![Figure {_NUM.format(key)}]({path})\n\n"
            f'<a id="{key}"></a>**Figure {_NUM.format(key)}.** {_one_line(caption)}')


def ref(key: str) -> str:
    """A link to a table, figure or heading by its key, as 'Table 3', 'Figure 2' or 'Section 4.1'."""
    return _REF.format(_check_key(key))


def answers(*keys: str) -> str:
    """Marks the heading above as the answer to these deliverables (`cs336sys.deliverables` keys)."""
    return _ANSWERS.format(",".join(_check_key(k) for k in keys))


def _one_line(text: str) -> str:
    return " ".join(text.split())


def gfm_slug(text: str) -> str:
    """The anchor GitHub (and pandoc's gfm_auto_identifiers) gives a heading: lower case, punctuation
    other than '-' and '_' dropped, spaces to '-'."""
    out = []
    for ch in text.lower():
        cat = unicodedata.category(ch)
        if ch in " -_" or cat[0] in "LN" or cat == "Mn":
            out.append("-" if ch == " " else ch)
    return "".join(out)


@dataclass
class Heading:
    level: int
    number: str  # "" when unnumbered
    title: str  # without the number
    key: str | None
    anchor: str  # the slug of the printed heading text
    line: int
    answers: list[str] = field(default_factory=list)

    @property
    def text(self) -> str:
        return f"{self.number} {self.title}" if self.number else self.title

    @property
    def label(self) -> str:
        return f"Section {self.number}" if self.number else self.title


@dataclass
class Document:
    """What `render` found: headings, table and figure numbers, which heading answers which deliverable."""

    headings: list[Heading]
    numbers: dict[str, str]  # tbl-/fig- key -> number
    answered: dict[str, Heading]  # deliverable key -> heading

    def heading(self, key: str) -> Heading:
        for h in self.headings:
            if h.key == key:
                return h
        raise KeyError(key)


def _letters(n: int) -> str:
    return string.ascii_uppercase[n - 1] if n <= 26 else f"A{string.ascii_uppercase[n - 27]}"


def _parse_attributes(attrs: str | None) -> tuple[str | None, bool]:
    key, unnumbered = None, False
    for part in (attrs or "").split():
        if part.startswith("#"):
            key = _check_key(part[1:])
        elif part in (".unnumbered", "-"):
            unnumbered = True
        else:
            raise ValueError(f"heading attribute {part!r}: only {{: #key}} and {{: .unnumbered}} are known")
    return key, unnumbered


def _scan(lines: list[str]) -> Document:
    headings: list[Heading] = []
    numbers: dict[str, str] = {}
    answered: dict[str, Heading] = {}
    counts = {"tbl": 0, "fig": 0}
    top = sub = 0
    appendix = False
    slugs: dict[str, int] = {}
    fenced = False
    for i, line in enumerate(lines):
        if line.startswith("```"):
            fenced = not fenced
        if fenced:
            continue
        if line.strip() == APPENDIX:
            appendix, top, sub = True, 0, 0
            continue
        m = _HEADING.match(line)
        if m:
            level, title = len(m.group(1)), m.group(2)
            key, unnumbered = _parse_attributes(m.group(3))
            number = ""
            if level == 2 and not unnumbered:
                top, sub = top + 1, 0
                number = _letters(top) if appendix else str(top)
            elif level == 3 and not unnumbered:
                if top == 0:
                    raise ValueError(f"line {i + 1}: a level-3 heading before any numbered section: {title!r}")
                sub += 1
                number = f"{_letters(top) if appendix else top}.{sub}"
            elif level > 3:
                raise ValueError(f"line {i + 1}: heading level {level} ({title!r}): use a caption instead")
            text = f"{number} {title}" if number else title
            slug = gfm_slug(text)
            n = slugs.get(slug, 0)
            slugs[slug] = n + 1
            h = Heading(level, number, title, key, slug if n == 0 else f"{slug}-{n}", i)
            if key and any(o.key == key for o in headings):
                raise ValueError(f"heading key {key!r} is used twice")
            headings.append(h)
            continue
        for kind, key in re.findall(r'<a id="(tbl|fig)-([^"]+)"></a>', line):
            counts[kind] += 1
            full = f"{kind}-{key}"
            if full in numbers:
                raise ValueError(f"{KINDS[kind].lower()} key {key!r} is used twice")
            numbers[full] = str(counts[kind])
        for what, value in _PLACEHOLDER.findall(line):
            if what == "answers":
                if not headings:
                    raise ValueError(f"answers({value}) before any heading")
                for k in value.split(","):
                    if k in answered:
                        raise ValueError(f"deliverable {k!r} is answered twice: under {answered[k].text!r} "
                                         f"and {headings[-1].text!r}")
                    answered[k] = headings[-1]
                    headings[-1].answers.append(k)
    return Document(headings, numbers, answered)


def _resolve(key: str, doc: Document) -> str:
    for kind, word in KINDS.items():
        if f"{kind}-{key}" in doc.numbers:
            return f"[{word} {doc.numbers[f'{kind}-{key}']}](#{kind}-{key})"
    try:
        h = doc.heading(key)
    except KeyError:
        raise ValueError(f"ref({key!r}) names no table, figure or heading of the report") from None
    return f"[{h.label}](#{h.anchor})"


def _contents(doc: Document) -> str:
    """A nested list of the numbered headings, linked (the PDF draws its own, with page numbers)."""
    out = [TOC_BEGIN]
    for h in doc.headings:
        if h.number and h.level in (2, 3):
            indent = "  " * (h.level - 2)
            out.append(f"{indent}- [{h.text}](#{h.anchor})")
    out.append(TOC_END)
    return "\n".join(out)


def render(text: str, index: Callable[[Document], str] | None = None) -> tuple[str, Document]:
    """Numbers, references, contents and index put into a rendered report. `index(doc)` returns the
    Markdown of the deliverables index (it needs the headings' numbers)."""
    lines = text.split("\n")
    doc = _scan(lines)
    out = []
    for i, line in enumerate(lines):
        if line.strip() == APPENDIX:
            out.append(APPENDIX_MARK)
            continue
        h = next((h for h in doc.headings if h.line == i), None)
        if h is not None:
            if out and out[-1].strip():  # a heading starts its own block (pandoc's Markdown needs the blank line)
                out.append("")
            out.append(f"{'#' * h.level} {h.text}")
            continue

        def sub(m: re.Match) -> str:
            what, value = m.group(1), m.group(2)
            if what == "n":
                return doc.numbers[value]
            if what == "ref":
                return _resolve(value, doc)
            return ""

        line = _PLACEHOLDER.sub(sub, line)
        if line.strip() == TOC:
            line = _contents(doc)
        elif line.strip() == INDEX:
            if index is None:
                raise ValueError("the report has an index marker but no index was given")
            line = f"{INDEX_BEGIN}\n{index(doc)}\n{INDEX_END}"
        out.append(line)
    # An `answers()` line leaves an empty line behind; runs of blank lines are collapsed.
    return re.sub(r"\n{3,}", "\n\n", "\n".join(out)), doc
