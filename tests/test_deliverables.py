"""The list of handout deliverables: keys unique and usable as anchors, sections registered, and (where the
handouts are beside the checkout, as on the project's machines) every problem box and lettered part of both
handouts has its entry."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from cs336sys import deliverables
from cs336sys.deliverables import DELIVERABLES, by_key, of_section
from cs336sys.registry import SECTIONS

HANDOUTS = Path(__file__).resolve().parent.parent.parent / "shared" / "reference"


def test_keys_are_unique_and_anchor_safe():
    keys = [d.key for d in DELIVERABLES]
    assert len(keys) == len(set(keys))
    assert all(re.fullmatch(r"[a-z0-9][a-z0-9_.-]*", k) for k in keys)


def test_every_deliverable_belongs_to_a_section_and_an_edition():
    assert {d.section for d in DELIVERABLES} == set(SECTIONS)  # and every section answers something
    assert all(set(d.editions) <= {"2025", "2026"} and d.editions for d in DELIVERABLES)
    assert sum(len(of_section(s)) for s in SECTIONS) == len(DELIVERABLES)


def test_an_unknown_key_is_named_with_the_closest_ones():
    assert by_key("nsys_profile-b").part == "b"
    with pytest.raises(ValueError, match="did you mean nsys_profile-b"):
        by_key("nsys_profile_b")
    with pytest.raises(ValueError, match="not in cs336sys.registry.SECTIONS"):
        of_section("nowhere")


def handout_parts(text: str) -> dict[str, set[str]]:
    """Problem name -> the lettered parts directly inside its box (the text up to the next problem box)."""
    parts: dict[str, set[str]] = {}
    current = None
    for line in text.splitlines():
        m = re.search(r"Problem \((\w+)\)", line)
        if m:
            current = m.group(1)
            parts.setdefault(current, set())
            continue
        m = re.match(r"^\s{0,12}\(([a-h])\)\s", line)
        if current and m:
            parts[current].add(m.group(1))
    return parts


@pytest.mark.parametrize("edition", ["2025", "2026"])
def test_every_problem_part_of_the_handout_has_an_entry(edition):
    path = HANDOUTS / f"handout_{edition}.txt"
    if not path.is_file():
        pytest.skip(f"the handout is not beside this checkout ({path})")
    parts = handout_parts(path.read_text())
    listed: dict[str, set[str]] = {}
    for d in DELIVERABLES:
        if edition in d.editions:
            listed.setdefault(d.problem, set()).add(d.part)
    assert set(parts) <= set(listed), sorted(set(parts) - set(listed))
    for problem, letters in parts.items():
        if problem == "pytorch_attention":  # its (a)..(f) are the steps of one script, listed under (a)
            letters = {"a"}
        assert letters == (listed[problem] - {""}), (problem, sorted(letters), sorted(listed[problem]))


def test_the_module_is_plain_data():
    assert not re.search(r"^\s*(import|from) torch", Path(deliverables.__file__).read_text(), re.M)
