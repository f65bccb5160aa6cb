"""Content hashes of the code an experiment runs, for the workflow's re-run decisions.

Snakemake never looks inside imported modules, and judges `script:` files by modification time.
So each experiment rule carries, as a parameter, the hash of the source text of the modules its
problem imports (the closure over `cs336sys` imports, found statically). Snakemake re-runs a job
when a parameter changes; touching a file or checking it out anew changes nothing.
"""

from __future__ import annotations

import ast
import hashlib
from functools import cache
from pathlib import Path

PACKAGE = "cs336sys"
SRC = Path(__file__).resolve().parent.parent  # .../src


def module_path(module: str) -> Path | None:
    base = SRC.joinpath(*module.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _is_main_guard(node: ast.AST) -> bool:
    """`if __name__ == "__main__":`: its body runs only when the module is the program, never when an
    experiment imports it, so what it imports is not part of what a point runs (a command line)."""
    t = node.test if isinstance(node, ast.If) else None
    return (isinstance(t, ast.Compare) and isinstance(t.left, ast.Name) and t.left.id == "__name__"
            and len(t.comparators) == 1 and isinstance(t.comparators[0], ast.Constant)
            and t.comparators[0].value == "__main__")


def _nodes(tree: ast.Module):
    """Every node of the module except those inside a top-level main guard."""
    for top in tree.body:
        if not _is_main_guard(top):
            yield from ast.walk(top)


def _imports(module: str, path: Path) -> set[str]:
    """Package-internal modules that `module` imports, anywhere in its body (lazy imports too), except
    under a top-level `if __name__ == "__main__":`."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: set[str] = set()
    for node in _nodes(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1])
                prefix = f"{base}.{node.module}" if node.module else base
            else:
                prefix = node.module or ""
            found.add(prefix)
            found.update(f"{prefix}.{a.name}" for a in node.names)
    return {m for m in found if (m == PACKAGE or m.startswith(PACKAGE + ".")) and module_path(m)}


@cache
def closure(module: str) -> tuple[str, ...]:
    """`module` and every package module it imports, transitively, plus their parent packages."""
    seen: set[str] = set()
    todo = [module]
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        path = module_path(m)
        if path is None:
            raise ValueError(f"no source for module {m!r} under {SRC}")
        seen.add(m)
        parts = m.split(".")
        todo.extend(".".join(parts[:i]) for i in range(1, len(parts)))  # importing a.b runs a/__init__
        todo.extend(_imports(m, path))
    return tuple(sorted(seen))


def code_hash(*modules: str) -> str:
    """sha256 over the sorted (module name, source bytes) of the closure of `modules`."""
    h = hashlib.sha256()
    for m in sorted(set().union(*(closure(x) for x in modules))):
        h.update(m.encode() + b"\0" + module_path(m).read_bytes() + b"\0")
    return h.hexdigest()[:16]
