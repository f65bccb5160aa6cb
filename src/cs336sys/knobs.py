"""Each experiment's knobs: the fields of its settings dataclass, read from the source.

An experiment function is `run_point(settings: SomeSettings, run: Run) -> dict`; the dataclass on its
first parameter declares every field a point can set, with its type, its default and a one-line
docstring (the string after the field). That dataclass is the one declaration of a knob:

- the grid (`config/*.yaml`) gives a value to the knobs it sets, in the experiment's block;
- the rule files build each point with `point(experiment, block, **swept)` (workflow/rules/common.smk),
  which passes every field the block sets through by name, so a rule names only what it sweeps;
- the job runner checks each point against the dataclass (`cs336sys.jobs.parse_settings`), and a test
  checks the grids' schema against the dataclasses (tests/test_knobs.py).

The workflow reads this at parse time, so it parses the source (no import, no torch).
"""

from __future__ import annotations

import ast
import json
from dataclasses import dataclass
from functools import cache
from pathlib import Path

from cs336sys import registry
from cs336sys.codehash.statements import _absolute  # the module a relative import names

SRC = Path(__file__).resolve().parent.parent  # .../src
NO_DEFAULT = object()


class SourceText(str):
    """A default that is not a literal (a call, an expression), as its source text: no value to compare."""


@dataclass(frozen=True)
class Knob:
    name: str
    annotation: str  # the type as written
    default: object = NO_DEFAULT  # NO_DEFAULT: every point sets it; SourceText: a default not a literal
    doc: str | None = None  # the docstring under the field

    @property
    def required(self) -> bool:
        return self.default is NO_DEFAULT

    @property
    def has_literal_default(self) -> bool:
        """A default with a value to compare (not required, not an expression's source text)."""
        return not self.required and not isinstance(self.default, SourceText)


@dataclass(frozen=True)
class Settings:
    qualname: str  # module:Class
    knobs: dict[str, Knob]


def _module_path(module: str) -> Path:
    base = SRC.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    raise ValueError(f"module {module!r} is not in {SRC}")


@cache
def _tree(module: str) -> ast.Module:
    path = _module_path(module)
    return ast.parse(path.read_text(), filename=str(path))


def _find_class(module: str, name: str) -> tuple[str, ast.ClassDef]:
    """The class `name` as `module` sees it: defined there, or imported from another of ours."""
    for node in _tree(module).body:
        if isinstance(node, ast.ClassDef) and node.name == name:
            return module, node
    for node in _tree(module).body:
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if (alias.asname or alias.name) == name:
                    is_package = _module_path(module).name == "__init__.py"
                    return _find_class(_absolute(module, is_package, node), alias.name)
    raise ValueError(f"{module}: no class {name!r} (defined or imported)")


def _constant(module: str, name: str) -> ast.expr | None:
    """The value a module-level `NAME = literal` (or `NAME: type = literal`) assigns."""
    for node in _tree(module).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets):
            return node.value
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.target.id == name:
            return node.value
    return None


def _default(module: str, node: ast.expr | None) -> object:
    if node is None:
        return NO_DEFAULT
    if isinstance(node, ast.Call) and ast.unparse(node.func) in ("field", "dataclasses.field"):
        for kw in node.keywords:
            if kw.arg == "default":
                return _default(module, kw.value)
            if kw.arg == "default_factory":
                return SourceText(ast.unparse(kw.value) + "()")
        return NO_DEFAULT
    if isinstance(node, ast.Name) and (value := _constant(module, node.id)) is not None:
        return _default(module, value)
    try:
        return ast.literal_eval(node)
    except ValueError:
        return SourceText(ast.unparse(node))


def _knobs(module: str, cls: ast.ClassDef) -> dict[str, Knob]:
    """The fields of a settings dataclass, those of the classes it derives from first (a dataclass's
    field order); a base that is not one of our classes (none is) adds nothing."""
    knobs: dict[str, Knob] = {}
    for base in cls.bases:
        try:
            knobs.update(_knobs(*_find_class(module, ast.unparse(base))))
        except ValueError:
            continue
    body = cls.body
    for i, node in enumerate(body):
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        if ast.unparse(node.annotation).startswith(("ClassVar", "typing.ClassVar")):
            continue
        nxt = body[i + 1] if i + 1 < len(body) else None
        doc = None
        if isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant) and isinstance(nxt.value.value, str):
            doc = " ".join(nxt.value.value.split())
        name = node.target.id
        knobs[name] = Knob(name, ast.unparse(node.annotation), _default(module, node.value), doc)
    return knobs


@cache
def settings_of(experiment: str) -> Settings:
    """The settings dataclass of a registered experiment (its function's first parameter)."""
    module, _, function = registry.experiment(experiment).function.partition(":")
    for node in _tree(module).body:
        if isinstance(node, ast.FunctionDef) and node.name == function:
            args = node.args.posonlyargs + node.args.args
            if not args or args[0].annotation is None:
                raise ValueError(f"{module}:{function}: its first parameter has no settings annotation")
            where, cls = _find_class(module, ast.unparse(args[0].annotation))
            return Settings(f"{where}:{cls.name}", _knobs(where, cls))
    raise ValueError(f"{module}: no function {function!r}")


def knobs_of(experiment: str) -> dict[str, Knob]:
    return settings_of(experiment).knobs


def point(experiment: str, block: dict, **values) -> dict:
    """A point of `experiment`: `values` (what the rule sweeps or fixes), and every knob of the
    experiment that `block` (its grid block) sets, passed through by name. A value for a knob the
    experiment does not have is an error naming the known ones; knobs neither sets take their default."""
    knobs = knobs_of(experiment)
    unknown = sorted(set(values) - set(knobs))
    if unknown:
        raise ValueError(f"{experiment}: {unknown} not a field of {settings_of(experiment).qualname} "
                         f"(known: {', '.join(knobs)})")
    return {**{k: block[k] for k in knobs if k in block and k not in values}, **values}


def value(experiment: str, block: dict, name: str) -> object:
    """The value the knob `name` of `experiment` takes with this grid block: the block's, else the default
    (for a rule that hands one experiment's setting to another, or to a section)."""
    knob = knobs_of(experiment).get(name)
    if knob is None:
        raise ValueError(f"{experiment}: {name!r} is not a field of {settings_of(experiment).qualname}")
    if name in block:
        return block[name]
    if not knob.has_literal_default:
        raise ValueError(f"{experiment}: the grid sets no {name!r}, and {settings_of(experiment).qualname} "
                         "has no literal default for it")
    return knob.default


def at_default(knob: Knob, value: object) -> bool:
    """Is `value` (from a grid or a rule) the knob's literal default, as JSON writes both?"""
    if not knob.has_literal_default:
        return False
    return json.dumps(value) == json.dumps(knob.default)  # a tuple is a list; 25 is not 25.0, 1 not true


def without_defaults(experiment: str, point: dict) -> dict:
    """`point` less the knobs it sets to their default: what the job is given and its parameters record.

    Writing a default in the grid or leaving it out then makes the same job parameters, hence no re-run:
    the settings dataclass is where a default lives, and the job runner fills in what a point leaves out.
    """
    knobs = knobs_of(experiment)
    return {k: v for k, v in point.items() if k not in knobs or not at_default(knobs[k], v)}


def with_defaults(experiment: str, point: dict) -> dict:
    """`point` with every knob it leaves out at its literal default: the settings the job runs, as JSON."""
    defaults = {name: knob.default for name, knob in knobs_of(experiment).items() if knob.has_literal_default}
    return json.loads(json.dumps({**defaults, **point}))
