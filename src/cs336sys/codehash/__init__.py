"""Hashes of the code an experiment runs, for the workflow's re-run decisions.

Snakemake never looks inside imported modules, and judges `script:` files by modification time.
So each experiment rule carries, as a parameter, a hash of what its experiment's function can run:

- **What is hashed** is each top-level statement's *tokens*, with comments, docstrings (and every
  other statement that is a bare string, such as a field's docstring), blank lines
  and line breaks inside brackets dropped, string and number literals written canonically (quotes,
  prefixes, `1_000`), f-strings as their source text, and a trailing comma that changes nothing
  dropped. Tokens, not `ast.dump`, whose text changes between Python versions: the same code hashes
  the same under 3.11 and 3.12. Editing documentation or layout therefore stales nothing.
- **Which statements** are those the entry points can reach. A module that is imported runs its
  top-level statements, so those that may act (calls, `if`, `try`, loops, imports of other packages)
  always count; a function, class, constant or package-internal import counts when something that
  counts names it (by a plain name, or `module.name` through an imported package module). A class
  counts whole; a package module used other than as `module.name` counts whole; the modules whose
  statements count are those imported by the statements that count (lazy imports inside a
  function only when that function counts), and a name such an import binds inside a function is
  followed into its module as a top-level import's is. Everything else, an unrelated function in the
  same file included, can change without staling anything.

An entry is a module (everything it holds counts, its `if __name__ == "__main__":` block too: it is
the program) or `module:function`. `code_hash(*entries)` is 16 hex digits; `manifest(*entries)`
lists each counted statement with its own hash, which cs336sys.why compares with an earlier commit's to
name what changed (`python -m cs336sys.codehash why`, the command line in __main__).

This module is what callers use; beneath it, each importing only those after it: `reachable` (the walk from
an entry through what counts), `statements` (a module's top-level statements: what each binds, names and does
at import) and `tokens` (what a statement's hash is made of). Hashes are kept within a process only: hashing
every rule of the workflow costs about 1.5 CPU seconds a parse (measured, notes/runs/2026-11-28-rerun-rules),
which a cache between processes saved only while no source had changed.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

from cs336sys.codehash.reachable import Tree
from cs336sys.codehash.statements import Module

__all__ = ["RUNNER", "SRC", "Manifest", "Module", "Tree", "changes", "clear_cache",
           "closure", "code_hash", "describe", "diff", "manifest", "tree"]

SRC = Path(__file__).resolve().parents[2]  # .../src
RUNNER = "cs336sys.run"  # every experiment job runs its function through it: an experiment's entries are both


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
