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
from cs336sys.workflow_helpers import grid_of, load_config, parsed_workflow

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


def test_a_job_is_given_its_points_less_their_defaults():
    allreduce = knobs.knobs_of("allreduce")
    assert allreduce["warmup"].default == 5  # the default the cases below lean on
    full = knobs.point("allreduce", {"warmup": 5, "iters": 7}, size_bytes=8)
    assert knobs.without_defaults("allreduce", full) == {"iters": 7, "size_bytes": 8}
    # compared as JSON writes them: an int is not its float, a bool not its int, a tuple is its list
    assert not knobs.at_default(allreduce["warmup"], 5.0) and not knobs.at_default(allreduce["warmup"], True)
    series = knobs.knobs_of("optimized_step")["techniques"]
    assert series.default == () and knobs.at_default(series, []) and not knobs.at_default(series, ["flash"])
    # a required knob, or a default that is not a literal, is never left out
    assert knobs.without_defaults("allreduce", {"size_bytes": 8}) == {"size_bytes": 8}
    assert not knobs.at_default(knobs.Knob("k", "list", knobs.SourceText("list()")), "list()")
    # what a rule reads of a knob: the block's value, else the default
    assert knobs.value("allreduce", {"warmup": 1}, "warmup") == 1 and knobs.value("allreduce", {}, "warmup") == 5
    with pytest.raises(ValueError, match="no literal default"):
        knobs.value("allreduce", {}, "size_bytes")


# --- the grids against the dataclasses --------------------------------------------------------------


@pytest.fixture(scope="module", params=["main", "next", "smoke"])
def parsed(request):
    """(experiment rules' problem and points, the grid blocks each experiment's knobs come from)."""
    with parsed_workflow(REPO, {"grid": request.param}) as workflow:
        rules = [(r.params.problem, r.params.points) for r in workflow.rules if hasattr(r.params, "points")]
        blocks = {e: set(paths) for e, paths in workflow.globals["KNOB_BLOCKS"].items()}
        values = workflow.globals["GRID"]
        registered = list(workflow.globals["EXPERIMENT_JOBS"])
    return request.param, rules, blocks, values, registered


def test_every_point_of_every_grid_is_a_valid_settings_value(parsed):
    grid, rules, _, _, _ = parsed
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
    grid, _, blocks, _, _ = parsed
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


def _at_default_everywhere(key: str, value, experiments: set[str]) -> bool:
    """Is `key: value` a knob at its default for every experiment that reads the block?"""
    found = [knobs.knobs_of(e).get(key) for e in experiments]
    return all(k is not None and knobs.at_default(k, value) for k in found)


def _readers(blocks: dict[str, set[tuple[str, ...]]]) -> dict[tuple[str, ...], set[str]]:
    readers: dict[tuple[str, ...], set[str]] = {}
    for experiment, paths in blocks.items():
        for path in paths:
            readers.setdefault(path, set()).add(experiment)
    return readers


def test_no_grid_repeats_a_default(parsed):
    """A value the grid gives a knob that equals its dataclass default is written twice: leave it out."""
    grid, _, blocks, values, _ = parsed
    main = grid_of(load_config(REPO, {"grid": "main"}))  # a default that overrides main's value is needed
    repeated = []
    for path, experiments in _readers(blocks).items():
        block, base = values, main
        for key in path:
            block, base = block[key], (base or {}).get(key)
        repeated += [f"{'.'.join(path)}.{k}: {v!r} ({', '.join(sorted(experiments))})"
                     for k, v in block.items() if _at_default_everywhere(k, v, experiments)
                     and (grid == "main" or (base or {}).get(k, v) == v)]
    assert not repeated, f"grid {grid} repeats defaults of the settings dataclasses:\n" + "\n".join(repeated)


def test_the_schema_requires_no_knob_that_has_a_default(parsed):
    """The schema's `required` lists follow from the dataclasses: a knob with a default is optional."""
    _, _, blocks, _, _ = parsed
    wrong = []
    for path, experiments in _readers(blocks).items():
        for key in _schema_node(path).get("required", []):
            found = [knobs.knobs_of(e).get(key) for e in experiments]
            if all(k is not None and not k.required for k in found):
                wrong.append(f"{'.'.join(path)}.{key} ({', '.join(sorted(experiments))})")
    assert not wrong, "required in the grid schema, though every experiment reading it has a default:\n" + \
        "\n".join(wrong)


def _names(node) -> set[str]:
    """Every key and string value anywhere in a grid block or a list of points."""
    if isinstance(node, dict):
        return set(node) | {n for v in node.values() for n in _names(v)}
    if isinstance(node, list | tuple):
        return {n for v in node for n in _names(v)}
    return {node} if isinstance(node, str) else set()


def test_job_names_have_one_separator_and_results_sit_under_their_experiment_and_job(parsed):
    """A job's name joins its parts with `-` only: `_` appears only inside one part that is itself a name
    from the grid or the job's points (an implementation, a job named in the config), never between
    parts. Its results lie under results/<experiment>/, and a named job's under results/<experiment>/<job>
    (a folder or a file stem), so a path says which experiment and job made it."""
    grid, _, _, values, registered = parsed
    given = _names(values)
    for j in registered:
        for part in j.job.split("-") if j.job else []:
            assert part and all(c.isalnum() or c in "._" for c in part), (grid, j.job)
            assert "_" not in part or part in given | _names(j.points), (
                f"grid {grid}: job {j.job!r} of {j.experiment} joins parts with '_' ({part!r})")
        for path in j.results:
            assert path.startswith(f"results/{j.experiment}/"), (grid, j.rule, path)
            if j.job:
                assert path.startswith((f"results/{j.experiment}/{j.job}/", f"results/{j.experiment}/{j.job}.json")), (
                    grid, j.rule, path)
