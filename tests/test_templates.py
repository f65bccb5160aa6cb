"""Every number in the report comes from a result file: the templates' prose has no typed numbers."""

import re
from pathlib import Path

import pytest

TEMPLATES = sorted((Path(__file__).parent.parent / "writeup" / "templates").rglob("*.j2"))
# Jinja expressions, statements and comments; inline code and link targets are not prose.
NOT_PROSE = re.compile(r"\{\{.*?\}\}|\{%.*?%\}|\{#.*?#\}|`[^`]*`|\]\([^)]*\)", re.S)
# A number standing alone: not part of a name such as fp32, bf16, H100, FlashAttention-2 or 2.7B.
NUMBER = re.compile(r"(?<![\w.\-])\d+(?:[.,]\d+)*(?![\w\-])")


def typed_numbers(text: str) -> list[str]:
    return NUMBER.findall(NOT_PROSE.sub(" ", text))


def test_the_checker_catches_typed_numbers():
    assert typed_numbers("speed-up of 2.5× at 512 tokens") == ["2.5", "512"]
    assert typed_numbers("fp32 and bf16 on the H100, {{ x | num(2) }} ms") == []


@pytest.mark.parametrize("template", TEMPLATES, ids=lambda p: p.name)
def test_no_number_in_prose_is_typed_by_hand(template):
    assert typed_numbers(template.read_text()) == []


# A block tag ending a line eats that line's newline (trim_blocks), so text before it joins the next line's
# with no space: "(listed above)and", "figures.)### fsdp_accounting (b)", "unchanged).- **flash**" (issue 60).
_TRAILING_TAGS = re.compile(r"(?:\{%(?:(?!%\}).)*%\}\s*)+$")


def glued_lines(text: str) -> list[str]:
    """Lines whose literal text ends in block tags with no space before them while the next line that prints
    starts with text."""
    lines = text.split("\n")
    found = []
    for i, line in enumerate(lines):
        m = _TRAILING_TAGS.search(line)
        before = line[:m.start()] if m else ""
        # literal text before the tags (what an expression prints, e.g. " " on a loop's last pass, is not
        # known here), outside a macro's definition (it prints where it is called)
        if not before.strip() or before[-1].isspace() or before.endswith("}}") or "{% macro" in line:
            continue
        j = i + 1  # lines of tags alone print nothing and lose their newlines too
        while j < len(lines) and lines[j].strip() and _TRAILING_TAGS.fullmatch(lines[j].strip()) \
                and "macro" not in lines[j]:
            j += 1
        after = lines[j] if j < len(lines) and "macro" not in lines[j] else ""
        after = re.sub(r"^(?:\{%(?:(?!%\}).)*%\})+", "", after)  # what the line prints starts after its tags
        if after[:1] and not after[0].isspace() and not after.startswith("{#"):
            found.append(f"line {i + 1}: {line.strip()[-50:]!r} then {after[:30]!r}")
    return found


def test_the_checker_finds_text_a_block_tag_would_glue():
    assert glued_lines("listed above){% endif %}\nand no longer") != []
    assert glued_lines("figures.){% endif %}\n{% endfor %}\n### (b) next") != []  # through a line of tags alone
    assert glued_lines("figures.){% endif %}\n\n{% endfor %}\n### (b) next") == []  # a blank line ends it
    assert glued_lines("a sum{% if e %}\n (largest error){% endif %}.") == []  # the space is kept
    assert glued_lines("{% if x %}\ntext\n{% endif %}\nmore") == []  # tags on their own lines


@pytest.mark.parametrize("template", TEMPLATES, ids=lambda p: p.name)
def test_no_block_tag_glues_two_lines_of_text(template):
    assert glued_lines(template.read_text()) == []
