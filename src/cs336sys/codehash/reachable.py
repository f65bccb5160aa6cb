"""What an entry reaches: the walk from an entry point through the statements that count, module by module,
and the hash and manifest of what it counted (the rules are in the package's docstring)."""

from __future__ import annotations

import hashlib
from pathlib import Path

from cs336sys.codehash.statements import Module, Statement, _ours, _parse


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
        walk = _Walk(self)
        for entry in entries:
            walk.enter(entry)
        walk.drain()
        return {m: {i: walk.inlined.get((m, i)) or self._digest_of(m, i) for i in indices}
                for m, indices in walk.counted.items()}

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


class _Walk:
    """One `Tree.reach`: the statements counted so far, per module, and those whose names are still to follow."""

    def __init__(self, tree: Tree):
        self.tree = tree
        self.counted: dict[str, set[int]] = {}
        self.inlined: dict[tuple[str, int], str] = {}  # an import of a constant: the constant's digest
        self.whole: set[str] = set()
        self.todo: list[tuple[str, Statement]] = []

    def enter(self, entry: str) -> None:
        """An entry point: a module (all of it, its main block too) or `module:function`."""
        module, _, function = entry.partition(":")
        if self.tree.path(module) is None:
            raise ValueError(f"no source for module {module!r} under {self.tree.root}")
        if not function:
            self.everything(module, main=True)
            return
        self.load(module)
        if not self.tree.module(module).binding(function):
            raise ValueError(f"module {module!r} defines no {function!r}")
        self.resolve(module, function)

    def drain(self) -> None:
        """Follow what each counted statement names and imports until nothing new counts."""
        while self.todo:
            m, s = self.todo.pop()
            for name in s.lazy_imports:
                self.load(name)
            if s.dynamic:
                self.everything(m)
            for target in s.star:
                self.everything(target)
            for name, chain in [(name, ()) for name in s.names] + sorted(s.chains):
                for target, attr in sorted(s.local_imports.get(name, ()), key=str):
                    self.follow(target, attr, chain)
                self.resolve(m, name, chain)  # the name may be bound at the top of the module as well: both count

    def add(self, m: str, s: Statement) -> None:
        if s.index not in self.counted[m]:
            self.counted[m].add(s.index)
            self.todo.append((m, s))

    def load(self, name: str) -> None:
        """`name` is imported: its packages' and its own acting statements run."""
        parts = name.split(".")
        for i in range(1, len(parts) + 1):
            m = ".".join(parts[:i])
            if m in self.counted or not _ours(m) or self.tree.path(m) is None:
                continue  # done, not ours, or `from pkg import name` where name is no module
            self.counted[m] = set()
            for s in self.tree.module(m).statements:
                if s.always and not s.main_guard:
                    self.add(m, s)

    def everything(self, m: str, main: bool = False) -> None:
        self.load(m)
        if m in self.whole and not main:
            return
        self.whole.add(m)
        for s in self.tree.module(m).statements:
            if main or not s.main_guard:
                self.add(m, s)

    def use_module(self, m: str, chain: tuple[str, ...]) -> None:
        """Module `m` used as `m.chain...` (as a value, if the chain is empty: then all of it counts)."""
        self.load(m)
        if chain:
            self.resolve(m, chain[0], chain[1:])
        else:
            self.everything(m)

    def follow(self, target: str, attr: str | None, chain: tuple[str, ...]) -> None:
        """A name an import binds: module `target`, or `target.attr`, then `.chain`."""
        if attr is None:
            self.use_module(target, chain)
        elif self.tree.path(f"{target}.{attr}") is not None:
            self.use_module(f"{target}.{attr}", chain)
        else:
            self.load(target)
            self.resolve(target, attr, chain)

    def resolve(self, m: str, name: str, chain: tuple[str, ...] = ()) -> None:
        """`name`, then `.chain`, as module `m` sees it."""
        bindings = self.tree.module(m).binding(name)
        if not bindings:
            self.unbound(m, name, chain)
            return
        for s in bindings:
            self.add(m, s)
            if name not in s.imports:
                continue  # a definition or a value: a chain on it is an attribute of an object
            target, attr = s.imports[name]
            value = (None if chain or attr is None or self.tree.path(f"{target}.{attr}") is not None
                     else self.tree._constant(target, attr))
            if value is not None:  # an imported constant counts as its value, here
                self.load(target)
                self.inlined[(m, s.index)] = value
            else:
                self.follow(target, attr, chain)

    def unbound(self, m: str, name: str, chain: tuple[str, ...]) -> None:
        """A name no statement of `m` binds: a submodule of the package `m`, or bound by a star import."""
        if self.tree.path(f"{m}.{name}") is not None:  # a submodule, as an attribute of its package
            self.use_module(f"{m}.{name}", chain)
        for s in self.tree.module(m).statements:  # star imports may bind it
            for target in s.star:
                if self.counted.get(m) and s.index in self.counted[m]:
                    self.everything(target)
