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
