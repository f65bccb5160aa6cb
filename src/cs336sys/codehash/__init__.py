"""Hashes of the code an experiment runs, for the workflow's re-run decisions.

Snakemake never looks inside imported modules, and judges `script:` files by modification time.
So each experiment rule carries, as a parameter, a hash of what its experiment's function can run:

- **What is hashed** is each top-level statement's *tokens*, with comments, docstrings (and every
  other statement that is a bare string, such as a field's docstring), blank lines
  and line breaks inside brackets dropped, string and number literals written canonically (quotes,
  prefixes, `1_000`), f-strings as their source text, and a trailing comma that changes nothing
  dropped. Tokens, not `ast.dump`, whose text changes between Python versions: the same code hashes
  the same under 3.11 and 3.12. Editing documentation or layout therefore stales nothing.
- **Which modules** are those an entry's module imports, anywhere in it (inside functions too), and
  what those import, and so on, with the packages above each (importing `a.b` runs `a/__init__.py`).
  A module counts whole: editing any definition in it stales every experiment that imports it.
- **Order:** per module, the statements that may act at import (calls, `if`, imports of other packages,
  decorated definitions) in their order, the others (definitions, constants, imports of the standard
  library or of ours) in any order: moving a definition within its file changes nothing.

An entry is a module or `module:function` (its module, checked to define the function).
`code_hash(*entries)` is 16 hex digits; `manifest(*entries)` lists each statement with its own hash,
which cs336sys.why compares with an earlier commit's to name what changed (`python -m cs336sys.codehash
why`, the command line in __main__).

This module is what callers use; beneath it `statements` (a module's top-level statements and its imports)
and `tokens` (what a statement's hash is made of). Hashes are kept within a process only: hashing every rule
of the workflow costs about a CPU second a parse (measured, notes/runs/2026-11-28-rerun-rules).
"""

from __future__ import annotations

import hashlib
from functools import cache
from pathlib import Path

from cs336sys.codehash.statements import Module, _ours, _parse

__all__ = ["RUNNER", "SRC", "Manifest", "Module", "Tree", "changes", "clear_cache",
           "closure", "code_hash", "describe", "diff", "manifest", "tree"]

SRC = Path(__file__).resolve().parents[2]  # .../src
RUNNER = "cs336sys.run"  # every experiment job runs its function through it: an experiment's entries are both


class Tree:
    """The package sources under `root` (a checkout's src/, or an old commit's, for `why`)."""

    def __init__(self, root: Path | str):
        self.root = Path(root)
        self._modules: dict[str, Module] = {}
        self._paths: dict[str, Path | None] = {}

    def path(self, module: str) -> Path | None:
        if module not in self._paths:
            base = self.root.joinpath(*module.split("."))
            found = [c for c in (base.with_suffix(".py"), base / "__init__.py") if c.is_file()]
            self._paths[module] = found[0] if found else None
        return self._paths[module]

    def module(self, name: str) -> Module:
        if name not in self._modules:
            path = self.path(name)
            if path is None:
                raise ValueError(f"no source for module {name!r} under {self.root}")
            self._modules[name] = _parse(path, name, path.read_text())
        return self._modules[name]

    def modules(self, *entries: str) -> list[str]:
        """The package modules that running `entries` imports, with the packages above each."""
        todo = []
        for entry in entries:
            module, _, function = entry.partition(":")
            labels = {s.label for s in self.module(module).statements}
            if function and not {f"def {function}", f"class {function}", f"{function} = …"} & labels:
                raise ValueError(f"module {module!r} defines no {function!r}")
            todo.append(module)
        found: set[str] = set()
        while todo:
            name = todo.pop()
            parts = name.split(".")
            for m in (".".join(parts[:i]) for i in range(1, len(parts) + 1)):
                if m not in found and _ours(m) and self.path(m) is not None:
                    found.add(m)
                    todo += sorted(self.module(m).imports)
        return sorted(found)

    def manifest(self, *entries: str) -> dict[str, list[tuple[str, str]]]:
        """module -> [(statement label, its hash)], in source order."""
        return {m: [(s.label, s.digest) for s in self.module(m).statements] for m in self.modules(*entries)}

    def code_hash(self, *entries: str) -> str:
        h = hashlib.sha256()
        for m in self.modules(*entries):
            statements = self.module(m).statements
            acting = [s.digest for s in statements if s.always]
            others = sorted(s.digest for s in statements if not s.always)
            h.update(m.encode() + b"\0" + "\0".join(acting).encode() + b"\1" + "\0".join(others).encode())
        return h.hexdigest()[:16]


@cache
def _tree(root: Path) -> Tree:
    return Tree(root)


def tree() -> Tree:
    """This checkout's sources (read once per process; `clear_cache` after editing them)."""
    return _tree(SRC)


def clear_cache() -> None:
    _tree.cache_clear()
    _hash.cache_clear()


@cache
def _hash(root: Path, entries: tuple[str, ...]) -> str:
    return _tree(root).code_hash(*entries)


def code_hash(*entries: str) -> str:
    """16 hex digits over what `entries` (modules, or `module:function`) can run, in this checkout."""
    return _hash(SRC, entries)


Manifest = dict[str, list[tuple[str, str]]]  # module -> [(statement label, its hash)]


def manifest(*entries: str) -> Manifest:
    return tree().manifest(*entries)


def closure(*entries: str) -> list[str]:
    """The package modules that running `entries` imports, in this checkout."""
    return tree().modules(*entries)


def diff(before: Manifest, after: Manifest) -> list[tuple[str, str, str]]:
    """(module, how, statement) for each statement changed, newly counted or no longer counted between two
    manifests, in module and source order; a module whose statements only moved is (module, "reordered", "")."""
    found = []
    for m in sorted(set(before) | set(after)):
        old, new = before.get(m, []), after.get(m, [])
        if old == new:
            continue
        old_by, new_by = dict(old), dict(new)
        rows = ([(m, "changed", label) for label, d in new if label in old_by and old_by[label] != d]
                + [(m, "now counts", label) for label, _ in new if label not in old_by]
                + [(m, "no longer counts", label) for label, _ in old if label not in new_by])
        found += rows or [(m, "reordered", "")]
    return found


def changes(before: Manifest, after: Manifest) -> list[str]:
    """What differs between two manifests, a line per module: `module: changed: a, b; now counts: c`."""
    return describe(diff(before, after))


def describe(rows: list[tuple[str, str, str]]) -> list[str]:
    """`diff`'s rows as a line per module."""
    by: dict[str, dict[str, list[str]]] = {}
    for m, how, label in rows:
        by.setdefault(m, {}).setdefault(how, []).append(label)
    return [f"{m}: " + ("; ".join(f"{how}: {', '.join(labels)}" for how, labels in hows.items() if how != "reordered")
                        or "statements reordered") for m, hows in by.items()]
