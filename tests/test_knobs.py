"""Each knob is declared once, in its experiment's settings dataclass: the workflow's source reader
agrees with the dataclasses, every field says what it is, every grid's points are valid settings,
and the grid schema's types agree with the fields the rules pass through."""

import dataclasses
import json
import typing
from pathlib import Path

import pytest
import yaml

from cs336sys import jobs, knobs, registry
from cs336sys.run import resolve
from cs336sys.whichjob import Workflow

REPO = Path(__file__).resolve().parent.parent
SCHEMA = yaml.safe_load((REPO / "workflow" / "schemas" / "grid.schema.yaml").read_text())


def settings_class(experiment: str) -> type:
    return jobs.settings_type(resolve(registry.experiment(experiment).function))


@pytest.mark.parametrize("experiment", sorted(registry.EXPERIMENTS))
def test_the_source_reader_agrees_with_the_dataclass(experiment):
    cls = settings_class(experiment)
    read = knobs.knobs_of(experiment)
    assert knobs.settings_of(experiment).qualname == f"{cls.__module__}:{cls.__name__}"
    fields = dataclasses.fields(cls)
    assert list(read) == [f.name for f in fields]
    for f in fields:
        knob = read[f.name]
        if f.default is not dataclasses.MISSING:
            assert knob.default == f.default, f.name
        elif f.default_factory is not dataclasses.MISSING:
            assert not knob.required, f.name
        else:
            assert knob.required, f.name


@pytest.mark.parametrize("experiment", sorted(registry.EXPERIMENTS))
def test_every_knob_says_what_it_is_in_one_line(experiment):
    for knob in knobs.knobs_of(experiment).values():
        assert knob.doc, f"{knobs.settings_of(experiment).qualname}.{knob.name} has no docstring under it"
        source = knobs.settings_of(experiment).qualname
        assert len(knob.doc) <= 300, f"{source}.{knob.name}: a one-line docstring, not a paragraph"


def test_a_point_passes_the_block_through_and_refuses_an_unknown_field():
    block = {"warmup": 3, "iters": 7, "sizes_bytes": [1, 2], "gloo_world_sizes": [2]}
    assert knobs.point("allreduce", block, size_bytes=8) == {"warmup": 3, "iters": 7, "size_bytes": 8}
    assert knobs.point("allreduce", block, size_bytes=8, warmup=1)["warmup"] == 1  # the rule's value wins
    with pytest.raises(ValueError, match=r"\['iterations'\] not a field of .*AllReduceSettings.*known: size_bytes"):
        knobs.point("allreduce", block, size_bytes=8, iterations=3)


# --- the grids against the dataclasses --------------------------------------------------------------


@pytest.fixture(scope="module", params=["main", "next", "smoke"])
def parsed(request):
    """(experiment rules' problem and points, the grid blocks each experiment's knobs come from)."""
    with Workflow(REPO, {"grid": request.param}) as wf:
        rules = [(r.params.problem, r.params.points) for r in wf.snakemake.rules if hasattr(r.params, "points")]
        blocks = {e: set(paths) for e, paths in wf.snakemake.globals["KNOB_BLOCKS"].items()}
    return request.param, rules, blocks


def test_every_point_of_every_grid_is_a_valid_settings_value(parsed):
    grid, rules, _ = parsed
    assert rules, f"grid {grid}: no experiment rule"
    for problem, points in rules:
        cls = settings_class(problem)
        for p in json.loads(points):
            jobs.parse_settings(cls, p)  # raises naming the key


def _deref(node: dict) -> dict:
    while "$ref" in node:
        node = SCHEMA["$defs"][node["$ref"].rsplit("/", 1)[1]]
    return node


def _schema_node(path: tuple[str, ...]) -> dict:
    node = _deref(SCHEMA)
    for key in path:
        node = _deref(node["properties"][key])
    return node


def _samples(node: dict) -> list:
    """Values the schema node admits, one of each kind (an enum: all of them)."""
    node = _deref(node)
    if "enum" in node:
        return list(node["enum"])
    if "oneOf" in node or "anyOf" in node:
        return [v for sub in node.get("oneOf", node.get("anyOf")) for v in _samples(sub)]
    kinds = node.get("type", [])
    kinds = [kinds] if isinstance(kinds, str) else kinds
    sample = {"integer": 3, "number": 2.5, "boolean": True, "string": "x", "null": None}
    return [sample[k] for k in kinds if k in sample]


def test_the_grid_schema_agrees_with_the_knobs_it_sets(parsed):
    grid, _, blocks = parsed
    checked = 0
    for experiment, paths in blocks.items():
        hints = typing.get_type_hints(settings_class(experiment))
        for path in paths:
            for name, prop in _schema_node(path).get("properties", {}).items():
                if name not in hints:
                    continue  # a sweep (sizes, dtypes, ...) or a setting of the rule itself
                for value in _samples(prop):
                    assert jobs._type_ok(value, hints[name]), (
                        f"grid schema {'.'.join(path)}.{name} admits {value!r}, which "
                        f"{knobs.settings_of(experiment).qualname}.{name}: {hints[name]} does not")
                checked += 1
    assert checked >= 20, f"grid {grid}: only {checked} schema properties matched a knob"
