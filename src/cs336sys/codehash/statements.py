"""A module's top-level statements as the reachability walk sees them: what each binds, what it names,
whether it acts when the module is imported, and the hash of its tokens."""

from __future__ import annotations

import ast
import hashlib
import sys
from dataclasses import dataclass, field
from pathlib import Path

from cs336sys.codehash.tokens import _tokens

PACKAGE = "cs336sys"

# Names whose use in counted code means "look anything up by name at run time": their module counts whole.
_DYNAMIC = {"globals", "vars", "locals", "eval", "exec", "__import__"}


@dataclass
class Statement:
    """One top-level statement: what it binds, what it names, and its tokens' hash."""

    index: int
    label: str  # "def name", "class name", "x = …", "import …", "if …" (for `why`)
    digest: str
    binds: set[str] = field(default_factory=set)
    names: set[str] = field(default_factory=set)  # names it uses other than as `name.attr`
    chains: set[tuple[str, tuple[str, ...]]] = field(default_factory=set)  # name.attr.attr... it uses
    star: set[str] = field(default_factory=set)  # modules it imports `*` from
    imports: dict[str, tuple[str, str | None]] = field(default_factory=dict)  # bound name -> (module, attr)
    lazy_imports: set[str] = field(default_factory=set)  # package modules imported anywhere inside it
    local_imports: dict[str, set[tuple[str, str | None]]] = field(default_factory=dict)  # bound inside it: each
    always: bool = False  # runs and may act when the module is imported
    dynamic: bool = False  # looks names up at run time (globals(), eval, ...)
    main_guard: bool = False
    constant: str | None = None  # a name bound to a value of literals alone: the value's digest

    def bind(self, top: bool, name: str, module: str, attr: str | None) -> None:
        """An import of ours binds `name` to `module` (or `module.attr`): at the top of the module, or
        inside this statement's body (a function may import one name in several branches)."""
        if top:
            self.imports[name] = (module, attr)
        else:
            self.local_imports.setdefault(name, set()).add((module, attr))


@dataclass
class Module:
    name: str
    statements: list[Statement]

    def binding(self, name: str) -> list[Statement]:
        return [s for s in self.statements if name in s.binds and not s.main_guard]


def _is_main_guard(node: ast.AST) -> bool:
    t = node.test if isinstance(node, ast.If) else None
    return (isinstance(t, ast.Compare) and isinstance(t.left, ast.Name) and t.left.id == "__name__"
            and len(t.comparators) == 1 and isinstance(t.comparators[0], ast.Constant)
            and t.comparators[0].value == "__main__")


def _docstring_spans(tree: ast.Module) -> list[tuple[tuple[int, int], tuple[int, int]]]:
    """Every statement that is a bare string: the docstrings of modules, classes and functions, and
    the attribute docstrings after a field or a constant. Such a statement evaluates a literal and
    discards it (the first of a body also becomes `__doc__`), so dropping it changes nothing that runs."""
    return [((n.lineno, n.col_offset), (n.end_lineno, n.end_col_offset)) for n in ast.walk(tree)
            if isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant) and isinstance(n.value.value, str)]


def _absolute(module: str, is_package: bool, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    parts = module.split(".") if is_package else module.split(".")[:-1]
    base = ".".join(parts[: len(parts) - node.level + 1])
    return f"{base}.{node.module}" if node.module else base


def _ours(module: str) -> bool:
    return module == PACKAGE or module.startswith(PACKAGE + ".")


def _bound_names(node: ast.AST) -> set[str]:
    """Names a statement binds at its own level (not inside the functions or classes it defines)."""
    found: set[str] = set()

    def visit(n: ast.AST) -> None:
        if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            found.add(n.name)  # what it holds binds its own names, not the module's
            return
        if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del)):
            found.add(n.id)
        elif isinstance(n, (ast.Import, ast.ImportFrom)):
            found.update(a.asname or a.name.split(".")[0] for a in n.names if a.name != "*")
        elif isinstance(n, ast.ExceptHandler) and n.name:
            found.add(n.name)
        for child in ast.iter_child_nodes(n):
            visit(child)

    visit(node)
    return found


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


_PURE = (ast.Constant, ast.BinOp, ast.UnaryOp, ast.Tuple, ast.operator, ast.unaryop, ast.Load)


def _constant_digest(node: ast.stmt) -> str | None:
    """`NAME = <literals and arithmetic>` (`MIB = 2**20`, `LOG2E = 1.44…`): the digest of its value, so
    that where it is written, and how (`2**20` or `1 << 20`), is not what counts; None otherwise."""
    if isinstance(node, ast.Assign) and len(node.targets) == 1:
        target, value = node.targets[0], node.value
    elif isinstance(node, ast.AnnAssign) and node.value is not None:
        target, value = node.target, node.value
    else:
        return None
    if not isinstance(target, ast.Name) or not all(isinstance(n, _PURE) for n in ast.walk(value)):
        return None
    try:
        result = eval(compile(ast.Expression(value), "<constant>", "eval"), {"__builtins__": {}})  # literals only
    except Exception:  # noqa: BLE001 - an expression that raises is left to the tokens
        return None
    return _digest([f"constant {type(result).__name__} {result!r}"])


def _statement(module: str, is_package: bool, index: int, node: ast.stmt, digest: str) -> Statement:
    s = Statement(index, _label(node), digest, binds=_bound_names(node), always=_may_act(node),
                  main_guard=_is_main_guard(node), constant=_constant_digest(node))
    attribute_bases = {id(n.value) for n in ast.walk(node) if isinstance(n, ast.Attribute)}
    for n in ast.walk(node):
        if isinstance(n, ast.Name):
            if n.id in _DYNAMIC:
                s.dynamic = True
            if id(n) not in attribute_bases:
                s.names.add(n.id)
        elif isinstance(n, ast.Attribute) and id(n) not in attribute_bases:  # the outermost of a chain
            chain, base = [], n
            while isinstance(base, ast.Attribute):
                chain.append(base.attr)
                base = base.value
            if isinstance(base, ast.Name):
                s.chains.add((base.id, tuple(reversed(chain))))
            # any other base (a call's result, a subscript) holds its own names, walked on their own
        elif isinstance(n, ast.Import):
            for a in n.names:
                if _ours(a.name):  # `import a.b` binds `a` (the chain walks down); `as c`: a.b
                    s.lazy_imports.add(a.name)
                    s.bind(n is node, a.asname or a.name.split(".")[0],
                           a.name if a.asname else a.name.split(".")[0], None)
        elif isinstance(n, ast.ImportFrom):
            target = _absolute(module, is_package, n)
            if not _ours(target):
                continue
            s.lazy_imports.add(target)
            for a in n.names:
                if a.name == "*":
                    s.dynamic = True
                    s.star.add(target)
                    continue
                s.lazy_imports.add(f"{target}.{a.name}")
                s.bind(n is node, a.asname or a.name, target, a.name)
    return s


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


def _parse(path: Path, module: str, text: str) -> Module:
    tree = ast.parse(text, filename=str(path))
    drop = _docstring_spans(tree)
    toks = _tokens(text)

    def in_docstring(line: int, col: int) -> bool:
        return any(a <= (line, col) < b for a, b in drop)

    # a docstring and the line end after it go together
    kept: list[tuple[int, int, str]] = []
    skipping = False
    for line, col, text_ in toks:
        if in_docstring(line, col):
            skipping = True
            continue
        if skipping and text_ == ";":
            skipping = False
            continue
        skipping = False
        kept.append((line, col, text_))
    is_package = path.name == "__init__.py"
    statements = []
    starts = []
    for node in tree.body:
        first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
        starts.append((first, 0))
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
        if isinstance(node, ast.Expr) and index == 0 and isinstance(node.value, ast.Constant) \
                and isinstance(node.value.value, str):
            continue  # the module docstring
        if isinstance(node, (ast.Import, ast.ImportFrom)) and not _is_future(node):
            statements.extend(_import_statements(module, is_package, len(statements), node))
            continue
        digest = _digest(parts)
        statements.append(_statement(module, is_package, len(statements), node, digest))
    seen: dict[str, int] = {}
    for s in statements:  # labels name statements in `why`: the second `def _` is `def _ (2)`
        seen[s.label] = seen.get(s.label, 0) + 1
        if seen[s.label] > 1:
            s.label = f"{s.label} ({seen[s.label]})"
    return Module(module, statements)


def _digest(parts: list[str]) -> str:
    return hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[:16]


def _is_future(node: ast.stmt) -> bool:
    return isinstance(node, ast.ImportFrom) and node.module == "__future__"


def _import_statements(module: str, is_package: bool, start: int, node: ast.Import | ast.ImportFrom):
    """A top-level import as one statement per name it binds, each written absolutely, so that an
    import of a name nothing uses, or the order or grouping of names, changes nothing. Importing a
    module of the standard library only binds a name; any other package's import may act (it runs
    that package's code), so it always counts."""
    if isinstance(node, ast.Import):
        pieces = [(f"import {a.name}" + (f" as {a.asname}" if a.asname else ""), a.name, ast.Import(names=[a]))
                  for a in node.names]
    else:
        target = _absolute(module, is_package, node)
        pieces = [(f"from {target} import {a.name}" + (f" as {a.asname}" if a.asname else ""), target,
                   ast.ImportFrom(module=target, names=[a], level=0)) for a in node.names]
    out = []
    for i, (text, target, piece) in enumerate(pieces):
        s = _statement(module, is_package, start + i, piece, _digest([text]))
        s.label = text
        top = target.split(".")[0]
        s.always = not _ours(target) and top not in sys.stdlib_module_names
        out.append(s)
    return out
