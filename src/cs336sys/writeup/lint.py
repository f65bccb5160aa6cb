"""What a rendered report must not contain: the artefacts of generated text (`nan`, "-0%", "5 to 5"),
tables with a column that says nothing, uncaptioned tables and figures, long headings, impossible
negative values, mixed units, counts printed as floats, leftover template syntax; Markdown that would
survive into the PDF as source (a heading, an attribute list or a list item glued to the text before it:
a template that ate a line break), numbers printed unrounded, and links (the index's above all) whose
target is no rendered heading or anchor.

`problems(markdown)` lists every finding as one line ("line 120: ..."); the tests require none for the
main report and for the smoke report. Each check is here once, with the reason it exists.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from cs336sys.writeup.markup import INDEX_BEGIN, INDEX_END, gfm_slug

MAX_HEADING_CHARS = 80

_NOT_A_NUMBER = re.compile(r"(?<![\w`.])(nan|NaN|NAN|inf|Inf|-inf|infinity)(?![\w`])")
_MINUS_ZERO = re.compile(r"(?<![\d.])[-\u2212]0(?:\.0+)?\s?%")
# "51.2× to 51.2×", "between 2026-11-23 and 2026-11-23": a range whose ends are the same.
_SAME_ENDS = re.compile(r"(?<![\w.])(\d[\d.,:\-]*\s?(?:%|×|ms|s|GiB|MiB|KiB|GB/s|TFLOP/s)?)"
                        r"\s+(?:to|and|–)\s+\1(?![\w.])")
_DECIMAL_BYTES = re.compile(r"\d\.\d{4,}\s?(?:MB|GB|MiB|GiB|KB|KiB)\b")
_GB_MEMORY = re.compile(r"\d\s(?:GB|MB|KB)\b(?!/s)")
_TEMPLATE_LEFTOVER = re.compile(r"\{\{|\}\}|\{%|%\}|\{#|\u27e6|\u27e7|\bundefined\b|no result file yet")
_PYTHON_VALUE = re.compile(r"^(None|nan|NaN|inf|-inf|True|False|\[\]|\{\})$")
_MATH = re.compile(r"\$\$.*?\$\$|\$[^$\s][^$]*\$")
_CODE = re.compile(r"`[^`]*`")
_LINK_TARGET = re.compile(r"\]\([^)]*\)")
_CAPTION = re.compile(r'^<a id="(tbl|fig)-[^"]+"></a>\*\*(Table|Figure) [0-9A-Z.]+\.\*\*')
_NUMBER_CELL = re.compile(r"^[-\u2212+]?[\d,]*\.?\d+(?:\s?(?:%|×|ms|s|GiB|MiB))?$")
_ZERO_CELL = re.compile(r"^[-\u2212+]?0*\.?0+(?:\s?(?:%|×|ms|s|GiB|MiB))?$")
# Quantities that are never negative: times, sizes, rates, counts. A column headed by one of these
# words or units may hold a negative value only if its caption says what a negative value means.
_NON_NEGATIVE_HEADER = re.compile(r"\((?:ms|s|µs|us|GiB|MiB|KiB|GB/s|TFLOP/s|B)\)|\bcalls\b|\bcount\b|\bpoints\b|"
                                  r"\bsteps\b|\btime\b|\bbandwidth\b|\bpeak\b|\bmemory\b", re.I)
_SIGNED_HEADER = re.compile(r"change|differ|\bgap\b|saved|saving|Δ|delta|minus|−|- ", re.I)
_COUNT_HEADER = re.compile(r"\b(calls|count|groups|buckets|points|steps|blocks|layers|tensors|ranks|GPUs)\b", re.I)
_FLOAT_COUNT = re.compile(r"^\d[\d,]*\.\d+$")
# Markdown source that reaches the PDF as text. A Jinja block tag at the end of a line eats the line's
# newline (trim_blocks), which glues the next paragraph, heading or list item to the text before it:
# "figures.)### fsdp_accounting (b)", "figures.)**2.7B on 2 ranks.**", "unchanged).- **flash_benchmarking**".
_GLUED_HEADING = re.compile(r"(?<![&\w#\\])#{1,6}\s+\S")  # searched after a line's first character
_ATTRIBUTES = re.compile(r"\{:\s*[^}]*\}")  # kramdown's {: #key}, which markup takes off headings only
_GLUED_ITEM = re.compile(r"(?<=[.):;!?])(?:-|\d{1,2}\.)\s+\S")  # "unchanged).- x", "said).2. y"
# "figures.)**2.7B", "bf16's.[Section 9]", "(0.99×)(the course's", "(listed above)and no longer"
_GLUED_PARAGRAPH = re.compile(r"\.\)(?=[^\s,;:.)\]|'\"\u2019])|(?<=[\w'\u2019)])\.\["
                              r"|\)\((?=[A-Za-z])|(?<=[\w.])\)(?=[A-Za-z]{2})")
# "every sequence length.At short sequences", "2.7B 95.0 ms (1.09×, within).The FLOPs": a word or a closing
# bracket, its full stop, and the next sentence's (not a dotted name)
_GLUED_SENTENCE = re.compile(r"(?<![\w.])[a-z][a-z0-9]*\.(?=[A-Z][a-z]*\s+[a-z])|\)\.(?=[A-Z][a-z]*\s)")
# "save 10.87 to 21.21 GiB(73% to 81%", "on this machine(met by construction": a unit or a word glued to the
# bracket after it (a template's line break eaten)
_GLUED_UNIT = re.compile(r"\d\s?(?:GiB|MiB|KiB|GB/s|TFLOP/s|ms|µs|MHz|%|×)\((?!s\))|(?<=[a-z]{4})\((?=[a-z]+ [a-z])")
# "The largest relative difference is 0.000000": a zero printed to six places says neither how small the
# value is nor that it is exact; significant digits do not catch it (a zero has none).
_ZERO_DIGITS = re.compile(r"(?<![\w.])0\.0{5,}(?![\d])")
# A number with more digits than anything here is measured to: raw floats such as a sympy relation
# "B >= 25301.7106024295". Tables' columns are exempt (a CSV-like column may keep its digits).
MAX_SIGNIFICANT = 4
_DECIMAL = re.compile(r"(?<![\w.])\d[\d,]*\.\d+(?:[eE][-+]?\d+)?(?!\w|\.\d)")
_LINK_ANCHOR = re.compile(r"\]\(#([^)\s]+)\)")
_ANCHOR = re.compile(r'<a id="([^"]+)"></a>')
# A measured quantity's header names its unit; a number column without one is a key (d, seq, k).
_MEASURED_HEADER = re.compile(r"\(|×|%|/|TFLOP|speed|ratio|share|MFU", re.I)


@dataclass
class Table:
    line: int  # 1-based line of its header row
    caption: str
    header: list[str]
    rows: list[list[str]]


def _cells(line: str) -> list[str]:
    return [c.strip() for c in line.strip().strip("|").split("|")]


def tables(lines: list[str]) -> list[Table]:
    """Every pipe table with the caption paragraph above it ('' if none)."""
    out = []
    i = 0
    while i < len(lines):
        if lines[i].startswith("|") and i + 1 < len(lines) and re.match(r"^\|\s*:?-", lines[i + 1]):
            start = i
            j = i + 2
            while j < len(lines) and lines[j].startswith("|"):
                j += 1
            k = start - 1
            while k >= 0 and (not lines[k].strip() or re.fullmatch(r"\s*<!--.*-->\s*", lines[k])):
                k -= 1
            para_end = k
            while k >= 0 and lines[k].strip():
                k -= 1
            caption = " ".join(lines[k + 1:para_end + 1]) if para_end >= 0 else ""
            out.append(Table(start + 1, caption, _cells(lines[start]), [_cells(r) for r in lines[start + 2:j]]))
            i = j
        else:
            i += 1
    return out


def _prose(line: str) -> str:
    return _LINK_TARGET.sub("]", _MATH.sub("$math$", _CODE.sub("`code`", line)))


def _number(cell: str) -> float | None:
    cell = cell.replace("\u2212", "-").replace(",", "")
    m = re.match(r"^([-+]?\d*\.?\d+)", cell)
    return float(m.group(1)) if m and _NUMBER_CELL.match(cell.replace(",", "")) else None


def significant_digits(number: str) -> int:
    """The significant digits a decimal is printed with ("0.0120" -> 3, "25301.71" -> 7, "1.0000" -> 5)."""
    mantissa = re.split(r"[eE]", number)[0]
    return len(re.sub(r"\D", "", mantissa).lstrip("0"))


def _source_left(line: str, text: str) -> list[str]:
    """Markdown syntax on a line that the PDF would print as text (`text`: the line with code, maths and
    link targets masked)."""
    found = []
    heading = None if line.startswith("|") else _GLUED_HEADING.search(text, 1)  # a cell may say "# of GPUs"
    if heading and text[:heading.start()].strip():
        found.append(f"a heading glued to the text before it: {heading.group(0)!r}")
    for pattern, what in ((_ATTRIBUTES, "an attribute list left in the text"),
                          (_GLUED_ITEM, "a list item glued to the text before it"),
                          (_GLUED_PARAGRAPH, "a paragraph glued to the one before it"),
                          (_GLUED_SENTENCE, "a sentence glued to the one before it")):
        m = None if pattern is _GLUED_SENTENCE and line.startswith("|") else pattern.search(text)  # a cell's name
        if m:
            found.append(f"{what}: {text[max(0, m.start() - 12):m.end() + 12]!r}")
    return found


def _unrounded(line: str) -> list[str]:
    """Decimals of more than MAX_SIGNIFICANT significant digits in prose, captions, code and maths; not in
    tables, nor in the title block's software versions (a driver "570.00" is a name, not a measurement)."""
    if line.startswith(("|", "- **Software:**")):
        return []
    return [f"a number printed with {significant_digits(m.group(0))} significant digits (at most "
            f"{MAX_SIGNIFICANT} outside tables): {m.group(0)!r}"
            for m in _DECIMAL.finditer(_LINK_TARGET.sub("]", line)) if significant_digits(m.group(0)) > MAX_SIGNIFICANT]


def heading_anchors(lines: list[str]) -> set[str]:
    """The anchors of the rendered headings, numbered as GitHub numbers repeats ("x", "x-1")."""
    anchors: set[str] = set()
    seen: dict[str, int] = {}
    fenced = False
    for line in lines:
        fenced = fenced != line.startswith("```")
        m = None if fenced else re.match(r"^#{1,6}\s+(.*?)\s*$", line)
        if m:
            slug = gfm_slug(m.group(1))
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            anchors.add(slug if n == 0 else f"{slug}-{n}")
    return anchors


def _dangling_links(lines: list[str]) -> list[str]:
    """Links within the report whose target is neither a rendered heading nor an `<a id>` anchor; in the
    index of deliverables, each entry must lead to a heading."""
    headings = heading_anchors(lines)
    anchors = headings | {a for line in lines for a in _ANCHOR.findall(line)}
    found, in_index = [], False
    for n, line in enumerate(lines, 1):
        in_index = (in_index or line.strip() == INDEX_BEGIN) and line.strip() != INDEX_END
        for target in _LINK_ANCHOR.findall(line):
            if in_index and target not in headings:
                found.append(f"line {n}: an index entry whose target is not a rendered heading: #{target}")
            elif target not in anchors:
                found.append(f"line {n}: a link to an anchor the report does not have: #{target}")
    return found


def problems(markdown: str) -> list[str]:
    lines = markdown.split("\n")
    found: list[str] = _dangling_links(lines)
    fenced = False
    has_gib = "GiB" in markdown
    for n, line in enumerate(lines, 1):
        if line.startswith("```"):
            fenced = not fenced
        if fenced:
            continue
        text = _prose(line)
        checks = [
            (_NOT_A_NUMBER, "a value that is not a number"),
            (_MINUS_ZERO, "a percentage of minus zero"),
            (_SAME_ENDS, "a range whose two ends are equal"),
            (_DECIMAL_BYTES, "a byte size with many decimals (write 1 MiB, not 1.04858 MB)"),
            (_TEMPLATE_LEFTOVER, "template syntax or a Python value left in the text"),
            (_GLUED_UNIT, "a unit or a word glued to the bracket after it"),
        ]
        if not line.startswith("|"):
            checks.append((_ZERO_DIGITS, "a zero printed to many decimals (say how small, or that it is exact)"))
        if has_gib:
            checks.append((_GB_MEMORY, "decimal GB/MB beside GiB elsewhere: one unit convention (GiB, MiB)"))
        for pattern, what in checks:
            m = pattern.search(text)
            if m:
                found.append(f"line {n}: {what}: {m.group(0)!r} in {line.strip()[:100]!r}")
        found += [f"line {n}: {what}" for what in _source_left(line, text) + _unrounded(line)]
        m = re.match(r"^(#{1,6})\s+(.*)$", line)
        if m and len(m.group(2)) > MAX_HEADING_CHARS:
            found.append(f"line {n}: a heading of {len(m.group(2))} characters (at most {MAX_HEADING_CHARS}): "
                         f"{m.group(2)[:60]!r}...")
        if re.match(r"^!\[", line.strip()):
            k = n
            while k < len(lines) and not lines[k].strip():
                k += 1
            if k >= len(lines) or not _CAPTION.match(lines[k]) or "**Figure" not in lines[k]:
                found.append(f"line {n}: a figure without a numbered caption below it: {line.strip()[:80]!r}")
    for t in tables(lines):
        where = f"line {t.line} (table {t.header[:3]})"
        if not _CAPTION.match(t.caption) or "**Table" not in t.caption:
            found.append(f"{where}: a table without a numbered caption above it")
        if not t.rows:
            found.append(f"{where}: a table with no rows")
            continue
        for r in t.rows:
            bad = [c for c in r if _PYTHON_VALUE.match(c)]
            if bad:
                found.append(f"{where}: a cell holds a Python value {bad[0]!r}")
                break
        label_cols = []
        for c, head in enumerate(t.header):
            column = [r[c] if c < len(r) else "" for r in t.rows]
            if all(not v for v in column):
                found.append(f"{where}: column {head!r} is empty in every row")
                continue
            if all(_ZERO_CELL.match(v.replace(",", "")) for v in column if v) and all(column):
                found.append(f"{where}: column {head!r} is zero in every row")
            values = [_number(v) for v in column]
            numeric = [v for v in values if v is not None]
            if c == 0 or not numeric or not _MEASURED_HEADER.search(head):  # the first column, text, or a
                label_cols.append(c)                                       # number without a unit (d, seq)
            if (numeric and min(numeric) < 0 and _NON_NEGATIVE_HEADER.search(head)
                    and not _SIGNED_HEADER.search(head) and "negative" not in t.caption.lower()):
                found.append(f"{where}: column {head!r} holds a negative value ({min(numeric)}) and the caption "
                             f"does not say what a negative value means")
            if _COUNT_HEADER.search(head) and "(" not in head and any(_FLOAT_COUNT.match(v) for v in column if v):
                found.append(f"{where}: column {head!r} counts things but prints fractions "
                             f"({next(v for v in column if _FLOAT_COUNT.match(v))})")
        if label_cols:
            keys = [tuple(r[c] if c < len(r) else "" for c in label_cols) for r in t.rows]
            repeated = sorted({k for k in keys if keys.count(k) > 1})
            if repeated:
                found.append(f"{where}: rows share the same label {' | '.join(repeated[0])!r}: a column that tells "
                             f"them apart is missing")
    return found
