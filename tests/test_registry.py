"""One registry: every section, experiment, problem, size and dtype named anywhere is registered,
and everything registered exists where it should (analysis module, template, rule, settings)."""

from __future__ import annotations

import importlib
import inspect
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from cs336sys import registry
from cs336sys.dtypes import DTYPE_NAMES
from cs336sys.jobs import settings_type
from cs336sys.sizes import SIZES

REPO = Path(__file__).resolve().parents[1]
TEMPLATES = REPO / "writeup" / "templates"
SCHEMA = yaml.safe_load((REPO / "workflow" / "schemas" / "grid.schema.yaml").read_text())


def test_registry_is_consistent():
    registry.check()  # every problem's experiments and every experiment's section are registered
    assert [p.number for p in registry.PROBLEMS] == list(range(1, len(registry.PROBLEMS) + 1))


def test_a_measured_problem_in_an_unregistered_section_fails_the_check(monkeypatch):
    stray = registry.Problem(99, "stray", "both", "no_such_section", ("benchmarking",))
    monkeypatch.setattr(registry, "PROBLEMS", [*registry.PROBLEMS, stray])
    with pytest.raises(ValueError, match="no_such_section"):
        registry.check()


@pytest.mark.parametrize("name", list(registry.SECTIONS))
def test_each_section_has_its_analysis_and_template(name):
    section = registry.SECTIONS[name]
    module = importlib.import_module(section.module)
    assert list(inspect.signature(module.build).parameters)[:2] == ["paths", "out"]
    template = TEMPLATES / section.template
    assert template.is_file(), f"{template} is missing"
    assert f"sections.{name}" in template.read_text()


def test_every_section_template_is_a_registered_section():
    templates = {p.name.removesuffix(".md.j2") for p in (TEMPLATES / "sections").glob("*.md.j2")}
    assert templates == set(registry.SECTIONS)


@pytest.mark.parametrize("name", list(registry.EXPERIMENTS))
def test_each_experiment_function_takes_typed_settings(name):
    module, _, func = registry.EXPERIMENTS[name].function.partition(":")
    fn = getattr(importlib.import_module(module), func)
    cls = settings_type(fn)
    assert "device" in cls.__dataclass_fields__, "the runner reads the device kind from the settings"


def test_sizes_and_dtypes_of_the_config_schema_are_the_registered_ones():
    assert SCHEMA["$defs"]["size"]["enum"] == list(SIZES)
    assert set(SCHEMA["$defs"]["dtype"]["enum"]) <= set(DTYPE_NAMES)


def test_report_order_and_coverage_come_from_the_registry():
    text = (TEMPLATES / "report.md.j2").read_text()
    assert "section_order" in text and not any(f'"{s}"' in text for s in registry.SECTIONS)


def list_rules(*args: str) -> set[str]:
    listed = subprocess.run([sys.executable, "-m", "snakemake", "--list-rules", *args], cwd=REPO, capture_output=True,
                            text=True, timeout=120)
    assert listed.returncode == 0, listed.stderr[-2000:]
    return set(listed.stdout.split())


def test_rules_are_made_for_every_registered_experiment_and_section():
    main, smoke = list_rules(), list_rules("--config", "grid=smoke")
    for rules in (main, smoke):
        assert {s.rule for s in registry.SECTIONS.values()} <= rules
    # Every experiment runs in the smoke grid; the main grid may leave one out until it is measured.
    experiments = smoke - registry.local_rules()
    for name in registry.EXPERIMENTS:
        assert any(r == name or r.startswith(name + "_") for r in experiments), name
