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
"""

from __future__ import annotations

import ast
import hashlib
import io
import json
import os
import sys
import token
import tokenize
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

PACKAGE = "cs336sys"
SRC = Path(__file__).resolve().parents[2]  # .../src
RUNNER = "cs336sys.run"  # every experiment job runs its function through it: an experiment's entries are both

# Names whose use in counted code means "look anything up by name at run time": their module counts whole.
_DYNAMIC = {"globals", "vars", "locals", "eval", "exec", "__import__"}


# --- tokens ----------------------------------------------------------------------------------------


def _canonical_literal(text: str) -> str:
    try:
        return repr(ast.literal_eval(text))
    except (ValueError, SyntaxError):  # an f-string: its source text
        return text


def _tokens(source: str) -> list[tuple[int, int, str]]:
    """(line, column, canonical text) of each significant token, comments and line breaks inside
    brackets left out; an f-string is one token of its source text (Python 3.12 splits it)."""
    lines = source.splitlines(keepends=True)
    out: list[tuple[int, int, str]] = []
    fstring_start, depth = None, 0
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        kind = tok.type
        name = token.tok_name[kind]
        if name == "FSTRING_START":
            if depth == 0:
                fstring_start = tok.start
            depth += 1
            continue
        if name == "FSTRING_END":
            depth -= 1
            if depth == 0:
                (l0, c0), (l1, c1) = fstring_start, tok.end
                text = "".join(lines[l0 - 1:l1])[c0:len("".join(lines[l0 - 1:l1 - 1])) + c1]
                out.append((l0, c0, text))
            continue
        if depth:
            continue
        if kind in (tokenize.COMMENT, tokenize.NL, tokenize.ENCODING, tokenize.ENDMARKER):
            continue
        if kind == tokenize.NEWLINE:
            text = ";"
        elif kind == tokenize.INDENT:
            text = "<indent>"
        elif kind == tokenize.DEDENT:
            text = "<dedent>"
        elif kind in (tokenize.STRING, tokenize.NUMBER):
            text = _canonical_literal(tok.string)
        else:
            text = tok.string
        out.append((tok.start[0], tok.start[1], text))
    return _drop_inert_trailing_commas(out)


def _drop_inert_trailing_commas(toks: list[tuple[int, int, str]]) -> list[tuple[int, int, str]]:
    """A comma before a closing bracket changes nothing where the bracket holds another comma at its
    level, and before `}` always; `(a,)` and `x[a,]` (a one-element tuple) keep theirs."""
    drop: set[int] = set()
    stack: list[list[int]] = []  # per open bracket: its commas
    for i, (_, _, text) in enumerate(toks):
        if text in ("(", "[", "{"):
            stack.append([])
        elif text == ",":
            if stack:
                stack[-1].append(i)
        elif text in (")", "]", "}") and stack:
            commas = stack.pop()
            if commas and commas[-1] == i - 1 and (text == "}" or len(commas) > 1):
                drop.add(i - 1)
    return [t for i, t in enumerate(toks) if i not in drop]


# --- a module's statements -------------------------------------------------------------------------


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


# --- what an entry reaches -------------------------------------------------------------------------


class Tree:
    """The package sources under `root` (a checkout's src/, or an old commit's, for migrations)."""

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

    def reach(self, *entries: str) -> dict[str, dict[int, str]]:
        """module -> {index: digest} of its statements that count, for these entries (an import of a
        constant counts as the constant's value)."""
        counted: dict[str, set[int]] = {}
        inlined: dict[tuple[str, int], str] = {}
        whole: set[str] = set()
        todo: list[tuple[str, Statement]] = []

        def add(m: str, s: Statement) -> None:
            if s.index not in counted[m]:
                counted[m].add(s.index)
                todo.append((m, s))

        def load(name: str) -> None:
            """`name` is imported: its packages' and its own acting statements run."""
            parts = name.split(".")
            for i in range(1, len(parts) + 1):
                m = ".".join(parts[:i])
                if m in counted or not _ours(m) or self.path(m) is None:
                    continue  # done, not ours, or `from pkg import name` where name is no module
                counted[m] = set()
                for s in self.module(m).statements:
                    if s.always and not s.main_guard:
                        add(m, s)

        def everything(m: str, main: bool = False) -> None:
            load(m)
            if m in whole and not main:
                return
            whole.add(m)
            for s in self.module(m).statements:
                if main or not s.main_guard:
                    add(m, s)

        def use_module(m: str, chain: tuple[str, ...]) -> None:
            """Module `m` used as `m.chain...` (as a value, if the chain is empty: then all of it counts)."""
            load(m)
            if chain:
                resolve(m, chain[0], chain[1:])
            else:
                everything(m)

        def follow(target: str, attr: str | None, chain: tuple[str, ...]) -> None:
            """A name an import binds: module `target`, or `target.attr`, then `.chain`."""
            if attr is None:
                use_module(target, chain)
            elif self.path(f"{target}.{attr}") is not None:
                use_module(f"{target}.{attr}", chain)
            else:
                load(target)
                resolve(target, attr, chain)

        def resolve(m: str, name: str, chain: tuple[str, ...] = ()) -> None:
            """`name`, then `.chain`, as module `m` sees it."""
            bindings = self.module(m).binding(name)
            if not bindings:
                if self.path(f"{m}.{name}") is not None:  # a submodule, as an attribute of its package
                    use_module(f"{m}.{name}", chain)
                for s in self.module(m).statements:  # star imports may bind it
                    for target in s.star:
                        if counted.get(m) and s.index in counted[m]:
                            everything(target)
                return
            for s in bindings:
                add(m, s)
                if name not in s.imports:
                    continue  # a definition or a value: a chain on it is an attribute of an object
                target, attr = s.imports[name]
                value = (None if chain or attr is None or self.path(f"{target}.{attr}") is not None
                         else self._constant(target, attr))
                if value is not None:  # an imported constant counts as its value, here
                    load(target)
                    inlined[(m, s.index)] = value
                else:
                    follow(target, attr, chain)

        for entry in entries:
            module, _, function = entry.partition(":")
            if self.path(module) is None:
                raise ValueError(f"no source for module {module!r} under {self.root}")
            if not function:
                everything(module, main=True)
                continue
            load(module)
            if not self.module(module).binding(function):
                raise ValueError(f"module {module!r} defines no {function!r}")
            resolve(module, function)

        while todo:
            m, s = todo.pop()
            for name in s.lazy_imports:
                load(name)
            if s.dynamic:
                everything(m)
            for target in s.star:
                everything(target)
            for name, chain in [(name, ()) for name in s.names] + sorted(s.chains):
                for target, attr in sorted(s.local_imports.get(name, ()), key=str):
                    follow(target, attr, chain)
                resolve(m, name, chain)  # the name may be bound at the top of the module as well: both count
        return {m: {i: inlined.get((m, i)) or self._digest_of(m, i) for i in indices} for m, indices in counted.items()}

    def _digest_of(self, module: str, index: int) -> str:
        s = next(s for s in self.module(module).statements if s.index == index)
        return s.constant or s.digest

    def _constant(self, module: str, name: str, depth: int = 0) -> str | None:
        """The value digest of `module.name` if it is a constant (through imports of it), else None."""
        bindings = self.module(module).binding(name)
        if len(bindings) != 1 or depth > 20:
            return None
        s = bindings[0]
        if s.constant is not None:
            return s.constant
        if name in s.imports and s.imports[name][1] is not None:
            target, attr = s.imports[name]
            if self.path(f"{target}.{attr}") is None:
                return self._constant(target, attr, depth + 1)
        return None

    def modules(self, *entries: str) -> list[str]:
        """The package modules that running `entries` imports (whether or not anything in them counts)."""
        return sorted(self.reach(*entries))

    def manifest(self, *entries: str) -> dict[str, list[tuple[str, str]]]:
        """module -> [(statement label, its hash)] of what counts, in source order."""
        out = {}
        for m, digests in sorted(self.reach(*entries).items()):
            rows = [(s.label, digests[s.index]) for s in self.module(m).statements if s.index in digests]
            if rows:
                out[m] = rows
        return out

    def code_hash(self, *entries: str) -> str:
        """Per module: the statements that act at import in their order (it may matter), then the
        definitions, constants and imports that count, in any order (moving one within its file, or
        an import's place, changes nothing)."""
        h = hashlib.sha256()
        for m, digests in sorted(self.reach(*entries).items()):
            acting = [digests[s.index] for s in self.module(m).statements if s.index in digests and s.always]
            others = sorted(digests[s.index] for s in self.module(m).statements
                            if s.index in digests and not s.always)
            if acting or others:
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
    _sources_digest.cache_clear()
    _stored.cache_clear()


# Hashing parses every module a workflow names (a few seconds per `snakemake` run, and per Slurm job,
# which parses the workflow again). The hashes are kept on disk, keyed by a digest of what a hash can depend
# on: every source file's path and bytes, this module's, and the Python that tokenizes them (its version and
# implementation): a changed, added or removed file, or another Python, is another key. $CS336SYS_CODEHASH_CACHE
# names the folder (default ~/.cache/cs336sys/codehash, or under $XDG_CACHE_HOME); "off" turns it off.
CACHE_ENV = "CS336SYS_CODEHASH_CACHE"
CACHE_FILES = 100  # source states kept


def _cache_dir() -> Path | None:
    where = os.environ.get(CACHE_ENV)
    if where == "off":
        return None
    if where:
        return Path(where)
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "cs336sys" / "codehash"


@cache
def _sources_digest(root: Path) -> str:
    """Every source file under `root` (its relative path and bytes), this module and the Python running it:
    what a hash can depend on."""
    h = hashlib.sha256(Path(__file__).read_bytes() + f"\0{sys.implementation.name} {sys.version}\0".encode())
    for path in sorted(root.rglob("*.py")):
        h.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:32]


def _cache_file(root: Path) -> Path | None:
    folder = _cache_dir()
    return None if folder is None else folder / f"{_sources_digest(root)}.json"


def _read_cache(path: Path | None) -> dict[str, str]:
    try:
        found = json.loads(path.read_text()) if path is not None else {}
    except (OSError, ValueError):
        return {}
    return found if isinstance(found, dict) else {}


@cache
def _stored(root: Path) -> dict[str, str]:
    """The hashes stored for these sources (read once per process)."""
    return _read_cache(_cache_file(root))


def _store(root: Path, key: str, value: str) -> None:
    """Add one hash to the file (merged with what another process may have added; best effort)."""
    _stored(root)[key] = value
    path = _cache_file(root)
    if path is None:
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        merged = {**_read_cache(path), **_stored(root)}
        tmp = path.with_name(f".{path.name}.{os.getpid()}")
        tmp.write_text(json.dumps(merged, sort_keys=True))
        os.replace(tmp, path)
        kept = sorted(path.parent.glob("*.json"), key=lambda p: p.stat().st_mtime, reverse=True)
        for old in kept[CACHE_FILES:]:  # each edit of the sources makes a file: keep the newest
            old.unlink(missing_ok=True)
    except OSError:
        pass  # a read-only home, or another process pruning: hashes are computed each time


@cache
def _hash(root: Path, entries: tuple[str, ...]) -> str:
    key = "\0".join(entries)
    stored = _stored(root).get(key)
    if stored is not None:
        return stored
    value = _tree(root).code_hash(*entries)
    _store(root, key, value)
    return value


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
