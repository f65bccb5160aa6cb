"""No import circles among cs336sys's modules: every import, at the top of a module, inside a function or
under `if TYPE_CHECKING:`, points down a tree a newcomer can walk (issue 62).

The graph is read from the source (ast), not by importing: `from cs336sys.a import b` is an edge to
`cs336sys.a.b` when that is a module, else to `cs336sys.a`; relative imports are resolved against the
importing module's package. A cycle is a strongly connected component of more than one module (or a
module importing itself)."""

from __future__ import annotations

import ast
from fnmatch import fnmatch
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"

# Circles that other issues remove, as patterns (fnmatch) that every module of an allowed circle matches:
# a circle that reaches a module outside its pattern, or a new one, fails. Remove an entry with its circle
# (the second test says when). None is left.
ALLOWED: list[tuple[str, ...]] = []


def module_name(path: Path, src: Path = SRC) -> str:
    parts = list(path.relative_to(src).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports_of(path: Path, modules: set[str], src: Path = SRC) -> set[str]:
    """The package modules that the file at `path` imports anywhere in its body."""
    name = module_name(path, src)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        for target in targets:
            while target and target not in modules:  # `import a.b.c` of a name inside a module
                target = target.rpartition(".")[0]
            if target and target != name:
                found.add(target)
    return found


def import_graph(src: Path = SRC, top: str = "cs336sys") -> dict[str, set[str]]:
    files = {module_name(p, src): p for p in (src / top).rglob("*.py")}
    modules = set(files)
    return {name: imports_of(path, modules, src) for name, path in files.items()}


def cycles(graph: dict[str, set[str]]) -> list[set[str]]:
    """The strongly connected components with more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[set[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            nxt = next((e for e in edges if e in graph), None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(component)
    return found


def allowed_by(circle: set[str]) -> tuple[str, ...] | None:
    return next((a for a in ALLOWED if all(any(fnmatch(m, p) for p in a) for m in circle)), None)


def test_cs336sys_has_no_import_circle_outside_the_allow_list():
    found = cycles(import_graph())
    unexpected = [sorted(c) for c in found if allowed_by(c) is None]
    assert unexpected == [], f"import circles: {unexpected}"


def test_every_allowed_circle_still_exists():
    """An allow-list entry whose circle is gone must leave the list (it would hide a new one)."""
    used = {allowed_by(c) for c in cycles(import_graph())}
    assert [a for a in ALLOWED if a not in used] == []


@pytest.mark.parametrize("style", ["top", "function", "type_checking", "relative"])
def test_the_checker_finds_a_circle_however_it_is_imported(tmp_path, style):
    pkg = tmp_path / "pkg"
    (pkg / "sub").mkdir(parents=True)
    for f in (pkg / "__init__.py", pkg / "sub" / "__init__.py", pkg / "c.py"):
        f.write_text("")
    (pkg / "sub" / "a.py").write_text("from pkg.sub import b\nfrom pkg import c\n")
    back = {"top": "from pkg.sub.a import X\n",
            "function": "def f():\n    import pkg.sub.a\n",
            "type_checking": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.sub.a import X\n",
            "relative": "from .a import X\n"}[style]
    (pkg / "sub" / "b.py").write_text(back)
    graph = import_graph(tmp_path, "pkg")
    assert graph["pkg.sub.a"] == {"pkg.sub.b", "pkg.c"}
    assert cycles(graph) == [{"pkg.sub.a", "pkg.sub.b"}]
    (pkg / "sub" / "b.py").write_text("from pkg import c\n")  # pointing down only: no circle
    assert cycles(import_graph(tmp_path, "pkg")) == []
