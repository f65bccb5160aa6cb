"""A module's top-level statements (each one's label, the hash of its tokens, whether it acts at import) and
the package modules it imports, anywhere in it."""

from __future__ import annotations

import ast
import hashlib
import sys
from dataclasses import dataclass, field
from pathlib import Path

from cs336sys.codehash.tokens import _tokens

PACKAGE = "cs336sys"

@dataclass
class Statement:
    """One top-level statement: its label (for `why`), its tokens' hash, whether it may act at import."""

    label: str  # "def name", "class name", "x = …", "from m import x", "if …"
    digest: str
    always: bool = False  # may do more at import than bind names: its place in the module counts


@dataclass
class Module:
    """A module's top-level statements, and the package modules it imports anywhere (functions included)."""

    name: str
    statements: list[Statement]
    imports: set[str] = field(default_factory=set)


def _is_docstring(n: ast.AST) -> bool:
    """A statement that is a bare string: the docstrings of modules, classes and functions, and the
    attribute docstrings after a field or a constant. Such a statement evaluates a literal and discards it
    (the first of a body also becomes `__doc__`), so dropping it changes nothing that runs."""
    return isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)


def _absolute(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    parts = module.split(".") if is_package else module.split(".")[:-1]
    base = ".".join(parts[: len(parts) - node.level + 1])
    return f"{base}.{node.module}" if node.module else base


def _ours(module: str) -> bool:
    return module == PACKAGE or module.startswith(PACKAGE + ".")


# Decorators that only wrap or describe what they decorate: a definition under only these acts at
# import by binding its name, nothing else (any other decorator may register it somewhere).
_INERT_DECORATORS = {"dataclass", "dataclasses.dataclass", "property", "staticmethod", "classmethod",
                     "cache", "functools.cache", "lru_cache", "functools.lru_cache", "cached_property",
                     "functools.cached_property", "contextmanager", "contextlib.contextmanager",
                     "triton.jit", "torch.no_grad", "final", "typing.final"}


def _dotted(node: ast.AST) -> str | None:
    if isinstance(node, ast.Call):
        node = node.func
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([node.id, *reversed(parts)])


def _may_act(node: ast.stmt) -> bool:
    """Does the statement do more, when the module is imported, than bind names (a definition, a
    constant, an import of ours)?"""
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
        return any(_dotted(d) not in _INERT_DECORATORS for d in node.decorator_list)
    if isinstance(node, ast.ImportFrom):
        return node.level == 0 and not _ours(node.module or "")
    if isinstance(node, ast.Import):
        return not all(_ours(a.name) for a in node.names)
    if isinstance(node, (ast.Assign, ast.AnnAssign)):
        return node.value is not None and any(
            isinstance(n, (ast.Call, ast.Await, ast.Yield, ast.YieldFrom, ast.NamedExpr, ast.Lambda))
            for n in ast.walk(node.value))
    return True


def _label(node: ast.stmt) -> str:
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return f"def {node.name}"
    if isinstance(node, ast.ClassDef):
        return f"class {node.name}"
    if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        return " = ".join(ast.unparse(t) for t in targets) + " = …"
    text = ast.unparse(node).splitlines()[0]
    return text if len(text) <= 60 else text[:57] + "..."


Span = tuple[tuple[int, int], tuple[int, int]]  # (line, column) of a node's start and of its end


def _scan(module: str, is_package: bool, tree: ast.AST) -> tuple[list[Span], set[str]]:
    """One walk of `tree`: the spans of its docstrings (`_is_docstring`), in source order, and the package
    modules an import anywhere in it names: `from m import x` names m, and m.x (kept only where m.x is a
    module: the caller checks)."""
    spans, found = [], set()
    for n in ast.walk(tree):
        if _is_docstring(n):
            spans.append(((n.lineno, n.col_offset), (n.end_lineno, n.end_col_offset)))
        elif isinstance(n, ast.Import):
            found.update(a.name for a in n.names if _ours(a.name))
        elif isinstance(n, ast.ImportFrom):
            target = _absolute(module, is_package, n)
            if _ours(target):
                found.add(target)
                found.update(f"{target}.{a.name}" for a in n.names if a.name != "*")
    return sorted(spans), found


def _parse(path: Path, module: str, text: str) -> Module:
    tree = ast.parse(text, filename=str(path))
    is_package = path.name == "__init__.py"
    drop, imports = _scan(module, is_package, tree)  # docstrings never overlap: one pass over both lists
    drop.append(((10**9, 0), (10**9, 0)))

    # a docstring and the line end after it go together
    kept: list[tuple[int, int, str]] = []
    skipping = False
    d = 0
    for line, col, text_ in _tokens(text):
        while drop[d][1] <= (line, col):
            d += 1
        if drop[d][0] <= (line, col):
            skipping = True
            continue
        if skipping and text_ == ";":
            skipping = False
            continue
        skipping = False
        kept.append((line, col, text_))
    statements = []
    starts = [(min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])]), 0) for node in tree.body]
    bounds = starts[1:] + [(10**9, 0)]
    i = 0
    for index, node in enumerate(tree.body):
        lo, hi = starts[index], bounds[index]
        parts = []
        while i < len(kept) and (kept[i][0], kept[i][1]) < hi:
            if (kept[i][0], kept[i][1]) >= lo:
                parts.append(kept[i][2])
            i += 1
        while parts and parts[0] == "<dedent>":  # the ends of the statement before (where tokenize puts them)
            parts.pop(0)
        while parts and parts[-1] == "<dedent>":  # implied by the indents it opened
            parts.pop()
        if index == 0 and _is_docstring(node):
            continue  # the module docstring
        if isinstance(node, (ast.Import, ast.ImportFrom)) and not _is_future(node):
            statements.extend(_import_statements(module, is_package, node))
            continue
        statements.append(Statement(_label(node), _digest(parts), always=_may_act(node)))
    seen: dict[str, int] = {}
    for s in statements:  # labels name statements in `why`: the second `def _` is `def _ (2)`
        seen[s.label] = seen.get(s.label, 0) + 1
        if seen[s.label] > 1:
            s.label = f"{s.label} ({seen[s.label]})"
    return Module(module, statements, imports)


def _digest(parts: list[str]) -> str:
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[:16]


def _is_future(node: ast.stmt) -> bool:
    return isinstance(node, ast.ImportFrom) and node.module == "__future__"


def _import_statements(module: str, is_package: bool, node: ast.Import | ast.ImportFrom) -> list[Statement]:
    """A top-level import as one statement per name it binds, each written absolutely, so that the order or
    grouping of names changes nothing. Importing a module of the standard library or of this package only
    binds a name; any other package's import may act (it runs that package's code), so its place counts."""
    if isinstance(node, ast.Import):
        pieces = [(f"import {a.name}" + (f" as {a.asname}" if a.asname else ""), a.name) for a in node.names]
    else:
        target = _absolute(module, is_package, node)
        pieces = [(f"from {target} import {a.name}" + (f" as {a.asname}" if a.asname else ""), target)
                  for a in node.names]
    return [Statement(text, _digest([text]), always=not _ours(target) and target.split(".")[0]
                      not in sys.stdlib_module_names) for text, target in pieces]
