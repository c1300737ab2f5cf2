"""The package's import graph: arrows point down, front-end modules form no circle.

The graph is read from the source with :mod:`ast` (nothing is imported): every ``import``
and ``from … import`` of a ``chatflow_cli`` module, at module level and inside functions,
is an edge, and so is a string that names a package module to import: a value of a
lazy-name map that a package's ``__getattr__`` reads (``_EXPORTS``, ``_LAZY``) and the
string given to ``import_module`` / ``__import__`` (other strings, docstrings and logger
names, are none); :func:`import_edges` marks those under ``if TYPE_CHECKING:``. The cycle checks of
the runtime graph leave them out (they never run); the rooms check and the type-only cycle
check count them (a type is a dependency too). ``from .pkg import name`` is an edge to
``pkg.name`` when that is a module, else to ``pkg``. Implicit
imports of parent packages are not edges (``chatflow_cli/__init__`` resolves its names
lazily: its map's strings are its edges).

Run as a script (``python tests/test_layering.py [ROOT]``) it prints the cycles it finds.
"""

from __future__ import annotations

import ast
import fnmatch
import functools
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = "chatflow_cli"
ROOT = Path(__file__).resolve().parents[1] / PACKAGE

#: The only modules allowed to import the command line module: it is the entry point.
ENTRY_POINTS = {f"{PACKAGE}.cli", f"{PACKAGE}.__main__"}


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the package by dotted name."""
    return {_module_name(p, root): p for p in sorted(root.rglob("*.py"))}


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    """The ids of the nodes of ``tree`` inside ``if TYPE_CHECKING:`` blocks (not their ``else``)."""
    found: set[int] = set()

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            found.update(id(n) for child in node.body for n in ast.walk(child))
            for child in node.orelse:
                visit(child)
            return
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def _all_imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """Every import statement of ``tree``, those under ``if TYPE_CHECKING:`` included."""
    return [node for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))]


def _is_import_call(node: ast.AST) -> bool:
    """``import_module(...)``, ``importlib.import_module(...)`` or ``__import__(...)``."""
    if not isinstance(node, ast.Call):
        return False
    func = node.func
    return (isinstance(func, ast.Name) and func.id in ("import_module", "__import__")) or (
        isinstance(func, ast.Attribute) and func.attr == "import_module")


def _lazy_maps(tree: ast.Module) -> list[ast.Dict]:
    """The module's lazy-name maps: a module-level dict of string keys and string values that
    the module's ``__getattr__`` reads (``_EXPORTS``, ``_LAZY``)."""
    getattr_names = {n.id for node in tree.body
                     if isinstance(node, ast.FunctionDef) and node.name == "__getattr__"
                     for n in ast.walk(node) if isinstance(n, ast.Name)}
    maps = []
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
            node, ast.AnnAssign) else []
        value = getattr(node, "value", None)
        if isinstance(value, ast.Dict) and any(isinstance(t, ast.Name) and t.id in getattr_names
                                               for t in targets) and all(
                isinstance(v, ast.Constant) and isinstance(v.value, str) for v in value.keys + value.values):
            maps.append(value)
    return maps


def _string_imports(tree: ast.Module, name: str, is_package: bool,
                    mods: dict[str, Path]) -> list[tuple[ast.AST, str, str]]:
    """The imports made through strings: ``(node, target module, imported name)`` for a value of
    a lazy-name map (``"chatflow_cli.core.runner"``, ``".sqlite"``, or ``"turns"`` for the
    package's own module) and for the string constant given to ``import_module`` /
    ``__import__``, when it is exactly the dotted path of a package module (absolute, or
    relative with leading dots). Other strings (docstrings, logger names) are no imports."""
    package = name if is_package else name.rpartition(".")[0]

    def resolve(text: str, bare_is_relative: bool) -> str | None:
        if text.startswith("."):
            level = len(text) - len(text.lstrip("."))
            base = package.split(".")
            base = base[: len(base) - (level - 1)]
            target = ".".join(base + ([text[level:]] if text[level:] else []))
        elif bare_is_relative and not _inside(text, PACKAGE):
            target = f"{package}.{text}"
        else:
            target = text
        return target if target in mods else None

    found: list[tuple[ast.AST, str, str]] = []
    for lazy in _lazy_maps(tree):
        for key, value in zip(lazy.keys, lazy.values):
            assert isinstance(key, ast.Constant) and isinstance(value, ast.Constant)
            if target := resolve(value.value, bare_is_relative=True):
                found.append((value, target, key.value))
    for node in ast.walk(tree):
        if _is_import_call(node) and isinstance(node, ast.Call) and node.args:
            arg = node.args[0]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and (
                    target := resolve(arg.value, bare_is_relative=False)):
                found.append((arg, target, target))
    return found


def _from_module(node: ast.ImportFrom, name: str, is_package: bool) -> str:
    """The absolute module a ``from ... import`` in module ``name`` reads from."""
    if not node.level:
        return node.module or ""
    base = name.split(".") if is_package else name.split(".")[:-1]
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def import_edges(root: Path = ROOT) -> list[tuple[str, int, str, str, bool]]:
    """Every import of a package module by a package module: ``(module, line, target, name,
    type_only)``, where ``name`` is the imported name (``from x import name``; else the
    target) and ``type_only`` says the import sits under ``if TYPE_CHECKING:``. The package's
    own graph is read once a test process (the tests write only to copies)."""
    return list(_cached_edges(root) if root == ROOT else _read_edges(root))


@functools.lru_cache(maxsize=1)
def _cached_edges(root: Path) -> tuple[tuple[str, int, str, str, bool], ...]:
    return tuple(_read_edges(root))


def _read_edges(root: Path) -> list[tuple[str, int, str, str, bool]]:
    mods = modules(root)
    edges: list[tuple[str, int, str, str, bool]] = []
    for name, path in mods.items():
        is_package = path.name == "__init__.py"
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        type_checking = _type_checking_nodes(tree)
        for node in _all_imports(tree):
            if isinstance(node, ast.Import):
                targets = [(alias.name, alias.name) for alias in node.names]
            else:
                prefix = _from_module(node, name, is_package)
                targets = [(f"{prefix}.{alias.name}" if f"{prefix}.{alias.name}" in mods else prefix, alias.name)
                           for alias in node.names]
            for target, imported in targets:
                while target and target not in mods:  # `import a.b.c` of a package's attribute
                    target = target.rpartition(".")[0]
                if target and target != name and target.split(".")[0] == PACKAGE:
                    edges.append((name, node.lineno, target, imported, id(node) in type_checking))
        for string, target, imported in _string_imports(tree, name, is_package, mods):
            if target != name:
                edges.append((name, getattr(string, "lineno", 0), target, imported, id(string) in type_checking))
    return edges


def import_graph(root: Path = ROOT, *, type_only: bool = False) -> dict[str, set[str]]:
    """``{module: {modules it imports}}`` over the package's own modules (``type_only``: the
    imports under ``if TYPE_CHECKING:`` count too). Reading ``__version__`` from the root is
    no edge: it is a plain constant of ``chatflow_cli/__init__``, which Python imports before
    any module of the package, and reading it runs none of the root's lazy imports."""
    graph: dict[str, set[str]] = {name: set() for name in modules(root)}
    for name, _line, target, imported, under_type_checking in import_edges(root):
        if target == PACKAGE and imported == "__version__":
            continue  # a constant of the root, which every module's import runs first anyway
        if type_only or not under_type_checking:
            graph[name].add(target)
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (each holds a cycle),
    found with Tarjan's algorithm; each sorted, the list sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = [0]

    def strongconnect(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, ()):
            if w not in index:
                strongconnect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    for v in sorted(graph):
        if v not in index:
            strongconnect(v)
    return sorted(found)


def cycle_edges(graph: dict[str, set[str]]) -> list[tuple[str, str]]:
    """The edges inside a strongly connected component: each lies on some cycle."""
    member = {m: i for i, comp in enumerate(cycles(graph)) for m in comp}
    return sorted((a, b) for a, targets in graph.items() for b in targets
                  if a in member and member.get(b) == member[a])


def _front_end(module: str) -> bool:
    return not module.startswith(f"{PACKAGE}.core") and module != PACKAGE


# ---------------------------------------------------------------------------------------
def write_files(package: Path, files: dict[str, str]) -> None:
    """Write a scratch package: ``files`` maps a path under ``package`` to its text."""
    for relative, text in files.items():
        (package / relative).parent.mkdir(parents=True, exist_ok=True)
        (package / relative).write_text(text, encoding="utf-8")


def test_the_graph_sees_function_level_imports():
    """The reader is not blind: a function-level import becomes an edge."""
    graph = import_graph()
    assert f"{PACKAGE}.cli" in graph[f"{PACKAGE}.__main__"]
    # cli imports its commands inside the command functions only
    assert any(m.startswith(f"{PACKAGE}.commands") for m in graph[f"{PACKAGE}.cli"])


def test_the_graph_sees_imports_made_through_strings(tmp_path):
    """A lazy map's value (absolute, ``.relative`` or the package's bare module name) and the
    string given to ``import_module`` / ``__import__`` are runtime edges (the review's two:
    ``core.memory``'s map reaching a renderer, ``core/tokens.py`` importing ``cli``); a
    docstring, a logger name or a dict no ``__getattr__`` reads is none (a few small files)."""
    assert (PACKAGE, f"{PACKAGE}.core.runner", "Runner") in {(m, t, n) for m, _l, t, n, _k in import_edges()
                                                            if not _k}
    package = tmp_path / PACKAGE
    files = {
        "__init__.py": "",
        "cli.py": "",
        "render/__init__.py": '_EXPORTS = {"safe_text": "text"}\ndef __getattr__(name):\n    return _EXPORTS[name]\n',
        "render/text.py": "",
        "core/__init__.py": "",
        "core/tokens.py": ('"""Never `importlib.import_module("chatflow_cli.cli")`."""\nimport importlib\n'
                           'import logging\nlog = logging.getLogger("chatflow_cli.cli")\n'
                           'NAMES = {"x": "chatflow_cli.cli"}\n'
                           'def f():\n    return importlib.import_module("chatflow_cli.cli")\n'
                           'def g():\n    return __import__("chatflow_cli.render")\n'),
        "core/memory/__init__.py": ('from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n'
                                    '    from importlib import import_module\n    import_module(".store", __name__)\n'
                                    '_LAZY = {\n    "Store": ".store",\n    "safe_text": "chatflow_cli.render.text",\n}\n'
                                    'def __getattr__(name):\n    return _LAZY[name]\n'),
        "core/memory/store.py": "",
    }
    write_files(package, files)
    assert sorted(import_edges(package)) == [
        (f"{PACKAGE}.core.memory", 4, f"{PACKAGE}.core.memory.store", f"{PACKAGE}.core.memory.store", True),
        (f"{PACKAGE}.core.memory", 6, f"{PACKAGE}.core.memory.store", "Store", False),
        (f"{PACKAGE}.core.memory", 7, f"{PACKAGE}.render.text", "safe_text", False),
        (f"{PACKAGE}.core.tokens", 7, f"{PACKAGE}.cli", f"{PACKAGE}.cli", False),
        (f"{PACKAGE}.core.tokens", 9, f"{PACKAGE}.render", f"{PACKAGE}.render", False),
        (f"{PACKAGE}.render", 1, f"{PACKAGE}.render.text", "safe_text", False),
    ]


def test_cycles_are_found_in_a_graph_that_has_one():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c"]]
    assert cycle_edges(graph) == [("a", "b"), ("b", "c"), ("c", "a")]


def test_nothing_imports_the_command_line_module_but_the_entry_point():
    graph = import_graph()
    importers = sorted(m for m, targets in graph.items() if f"{PACKAGE}.cli" in targets)
    assert set(importers) <= ENTRY_POINTS, importers


def test_the_library_imports_no_front_end():
    graph = import_graph()
    upward = sorted((m, t) for m, targets in graph.items() if m.startswith(f"{PACKAGE}.core")
                    for t in targets if _front_end(t))
    assert upward == []


def test_no_import_cycle_between_front_end_modules():
    graph = import_graph()
    front = {m: {t for t in targets if _front_end(t)} for m, targets in graph.items() if _front_end(m)}
    assert cycles(front) == []


def test_no_import_cycle_anywhere_in_the_package():
    """The library too: the model client asks a low probe whether the local model is
    installed, and the local model's client builds on the model client, not the reverse."""
    graph = import_graph()
    assert cycles(graph) == []
    assert f"{PACKAGE}.core.local_probe" in graph[f"{PACKAGE}.core.model"]
    assert not any(t == f"{PACKAGE}.core.local" or t.startswith(f"{PACKAGE}.core.local.")
               for t in graph[f"{PACKAGE}.core.model"])


def test_no_import_cycle_even_through_type_only_imports():
    """Type annotations point down too: a part that needs another part's type gets it from a
    module below both (the REPL's parts from ``repl.host``), not from a module that imports
    it back. The package's root, which names every public type for type checkers, is left
    out: it sits above everything."""
    graph = {m: {t for t in targets if t != PACKAGE}
             for m, targets in import_graph(type_only=True).items() if m != PACKAGE}
    assert cycle_edges(graph) == []


def test_stores_reach_other_modules_through_named_seams_only():
    """No module of the store package imports another module's private (underscore) name,
    except from private modules (its own ``_port``, ``_core``, ``_checks`` and the mixins):
    the events module's event-type rules are public. A backend
    package (``sqlite/``, ``postgres/``) is one store split by role: its modules share their
    private names with each other, and reach the rest of the library by the same rule."""
    memory = ROOT / "core" / "memory"
    paths = sorted(memory.rglob("*.py"))
    assert len(paths) > 10 and any(len(p.relative_to(memory).parts) == 2 for p in paths)
    leaks = []
    for path in paths:
        depth = len(path.relative_to(memory).parts)  # the import level that reaches memory's modules
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level >= depth and not (
                    node.module or "").rpartition(".")[2].startswith("_"):
                leaks += [(path.name, node.module, a.name) for a in node.names if a.name.startswith("_")]
    assert leaks == []


def _inside(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def private_imports(root: Path = ROOT) -> list[str]:
    """Imports of a private-in-name module or name from outside the package that holds it, as
    ``module:line imports path``. A ``_part`` of a module's path (``core._run``, ``memory._port``)
    belongs to the package above it; a ``_name`` imported from a module belongs to that module's
    package (from a package's ``__init__``: to the package). So ``core/runner.py`` may import
    ``core/_run/turn.py``, and the memory backends ``memory._port._Tx``, but ``cli.py`` may not
    import ``core/_run/…`` nor ``sdk_session.py`` a name of ``memory/_checks.py``. Imports
    inside functions and under ``if TYPE_CHECKING:`` count too, and so does a private name
    reached as an imported module's attribute (``from .core import dsn`` then ``dsn._x``)."""
    mods = modules(root)
    bad = []
    for module, line, target, name, _type_only in import_edges(root):
        parts = target.split(".")
        homes = [".".join(parts[:i]) for i, part in enumerate(parts)
                 if part.startswith("_") and not part.startswith("__")]
        if name != target and not target.endswith("." + name) and name.startswith("_") \
                and not name.startswith("__"):
            homes.append(target if mods[target].name == "__init__.py" else target.rpartition(".")[0])
        if any(not _inside(module, home) for home in homes):
            path = target if name == target or target.endswith("." + name) else f"{target}.{name}"
            bad.append(f"{mods[module].relative_to(root.parent).as_posix()}:{line} imports {path}")
    return bad + _private_attributes(root)


def _private_attributes(root: Path) -> list[str]:
    """``module._name`` where ``module`` is bound by an import of a package module (``from
    .core import dsn``, ``import chatflow_cli.core.dsn as dsn``, ``import chatflow_cli.core.dsn``
    then ``chatflow_cli.core.dsn._x``) and the using module is outside the package that holds
    ``_name``, as ``module:line uses path``. A name bound by an import anywhere in the file
    counts (no scopes: cheap, and the package shadows no such name)."""
    mods = modules(root)
    bad = []
    for name, path in mods.items():
        is_package = path.name == "__init__.py"
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        bound: dict[str, str] = {}
        for node in _all_imports(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        bound[alias.asname] = alias.name
                    else:
                        bound[alias.name.split(".")[0]] = alias.name.split(".")[0]
            else:
                prefix = _from_module(node, name, is_package)
                bound.update({alias.asname or alias.name: f"{prefix}.{alias.name}" for alias in node.names})

        def dotted(node: ast.expr) -> str | None:
            if isinstance(node, ast.Name):
                return bound.get(node.id)
            if isinstance(node, ast.Attribute):
                head = dotted(node.value)
                return f"{head}.{node.attr}" if head else None
            return None

        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and node.attr.startswith("_")
                    and not node.attr.startswith("__")):
                continue
            target = dotted(node.value)
            if target not in mods:
                continue
            home = target if mods[target].name == "__init__.py" else target.rpartition(".")[0]
            if not _inside(name, home):
                bad.append(f"{path.relative_to(root.parent).as_posix()}:{node.lineno} uses {target}.{node.attr}")
    return bad


def test_nothing_private_in_name_is_imported_from_outside_its_package(tmp_path):
    """A ``_private`` module or name is used inside its own package only; what another package
    needs gets a public home (``core/cancel.py``, ``core.memory.json_sha256``). The check sees
    a private module and a private name imported from outside, or reached as an imported
    module's attribute, and lets the same from inside pass (a package of a few small files:
    milliseconds)."""
    assert private_imports() == []
    package = tmp_path / PACKAGE
    files = {
        "__init__.py": "",
        "cli.py": "def f():\n    from .core._run.cancel import stop\n",
        "core/__init__.py": "",
        "core/runner.py": "from ._run.cancel import stop\nfrom .memory import _checks\n",
        "core/_run/__init__.py": "",
        "core/_run/cancel.py": "def stop(): pass\n",
        "core/memory/__init__.py": "",
        "core/memory/_checks.py": "def _sha(): pass\n",
        "core/memory/_port.py": "class _Tx: pass\n",
        "core/memory/store.py": "from ._checks import _sha\nfrom ._port import _Tx\n",
        "core/memory/sqlite/__init__.py": "from .._port import _Tx\n",
        "core/sdk_session.py": "from .memory._checks import _sha\nfrom .memory.store import _Tx\n",
        # a private name reached as a module's attribute (the review's `dsn._URL_PASSWORD`)
        "core/dsn.py": "_URL_PASSWORD = 1\n",
        "context.py": ("from .core import dsn\nimport chatflow_cli.core.dsn as d2\nimport chatflow_cli.core.dsn\n"
                       "def f():\n    return dsn._URL_PASSWORD, d2._URL_PASSWORD, chatflow_cli.core.dsn._URL_PASSWORD\n"
                       "def g(x):\n    return dsn.__name__, x._private\n"),
        "core/tokens.py": "from . import dsn\nfrom .memory import store\nX = dsn._URL_PASSWORD, store._Tx\n",
    }
    write_files(package, files)
    assert private_imports(package) == [
        f"{PACKAGE}/cli.py:2 imports {PACKAGE}.core._run.cancel.stop",
        f"{PACKAGE}/core/runner.py:2 imports {PACKAGE}.core.memory._checks",
        f"{PACKAGE}/core/sdk_session.py:1 imports {PACKAGE}.core.memory._checks._sha",
        f"{PACKAGE}/core/sdk_session.py:2 imports {PACKAGE}.core.memory.store._Tx",
        f"{PACKAGE}/context.py:5 uses {PACKAGE}.core.dsn._URL_PASSWORD",
        f"{PACKAGE}/context.py:5 uses {PACKAGE}.core.dsn._URL_PASSWORD",
        f"{PACKAGE}/context.py:5 uses {PACKAGE}.core.dsn._URL_PASSWORD",
        f"{PACKAGE}/core/tokens.py:3 uses {PACKAGE}.core.memory.store._Tx",
    ]


#: The page that draws the house; its table of rooms is the rule the tests below enforce.
DESIGN = ROOT.parent / "docs" / "design.md"
_ROW = re.compile(r"^\|\s*([a-z][a-z-]*)\s*\|(.*)\|(.*)\|\s*$")
_PATH = re.compile(r"`([^`]+)`(\s*\*\(on its way\)\*)?")


@dataclass(frozen=True)
class Room:
    name: str
    paths: tuple[str, ...]          # relative to the package: a file, or a folder ending in "/"
    may_import: frozenset[str]
    on_its_way: frozenset[str]      # paths allowed to be missing (another branch adds them)

    def holds(self, relative: str) -> bool:
        return any(relative == p or (p.endswith("/") and relative.startswith(p)) for p in self.paths)


def rooms(design: Path = DESIGN) -> dict[str, Room]:
    """The rooms of the table ``| room | its modules | may import |`` in docs/design.md."""
    text = design.read_text(encoding="utf-8")
    start = text.index("| room | its modules | may import |")
    found: dict[str, Room] = {}
    for line in text[start:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        match = _ROW.match(line)
        assert match, f"docs/design.md: a row of the rooms table I cannot read: {line!r}"
        name, cell, targets = match.groups()
        paths = _PATH.findall(cell)
        assert paths, f"docs/design.md: room {name} lists no module"
        allowed = frozenset(t.strip() for t in targets.split(",") if t.strip() not in ("", "—", "-"))
        found[name] = Room(name, tuple(p for p, _ in paths), allowed, frozenset(p for p, way in paths if way))
    unknown = sorted((r.name, t) for r in found.values() for t in r.may_import if t not in found)
    assert not unknown, f"docs/design.md: arrows to rooms the table does not have: {unknown}"
    return found


def room_of(root: Path = ROOT, house: dict[str, Room] | None = None) -> dict[str, str]:
    """``{module: its room}``; fails naming a module in no room or in two."""
    house = rooms() if house is None else house
    placed: dict[str, str] = {}
    homeless, twice = [], []
    for module, path in modules(root).items():
        relative = path.relative_to(root).as_posix()
        homes = [r.name for r in house.values() if r.holds(relative)]
        if not homes:
            homeless.append(relative)
        elif len(homes) > 1:
            twice.append((relative, homes))
        else:
            placed[module] = homes[0]
    assert not homeless, f"modules in no room of docs/design.md (add them to its table): {homeless}"
    assert not twice, f"modules in two rooms of docs/design.md: {twice}"
    return placed


def crossings(root: Path = ROOT, house: dict[str, Room] | None = None) -> list[str]:
    """Every import from one room into another that the table draws no arrow for, as
    ``module:line imports target (room -> room)``; imports inside functions and under ``if
    TYPE_CHECKING:`` count too. ``__version__`` read from the package root is no arrow."""
    house = rooms() if house is None else house
    where = room_of(root, house)
    bad = []
    for module, line, target, name, type_only in import_edges(root):
        if target == PACKAGE and name == "__version__":
            continue
        a, b = where[module], where[target]
        if a != b and b not in house[a].may_import:
            bad.append(f"{modules(root)[module].relative_to(root.parent).as_posix()}:{line} imports {target}"
                       f"{' (type only)' if type_only else ''} ({a} -> {b})")
    return bad


def test_the_drawing_has_every_module_in_one_room_and_every_listed_path_exists():
    house = rooms()
    assert {"entry", "commands", "repl", "render", "assembly", "plumbing", "runner", "model", "memory",
            "leaves"} <= set(house)
    room_of()
    missing = sorted(p for r in house.values() for p in r.paths
                     if p not in r.on_its_way and not (ROOT / p).exists())
    assert missing == [], f"docs/design.md names paths that do not exist: {missing}"


def test_imports_cross_rooms_only_along_the_arrows_of_the_drawing():
    assert crossings() == []


def test_an_import_against_the_arrows_is_named(tmp_path):
    """The check can fail: a copy of the package where a leaf imports the Runner (an upward
    arrow, under ``if TYPE_CHECKING:``) and a store imports a renderer (a front-end) is refused
    with module, line and rooms, and a module the drawing does not place is named."""
    copy = tmp_path / PACKAGE
    shutil.copytree(ROOT, copy, ignore=shutil.ignore_patterns("__pycache__"))
    leaf = copy / "core" / "tokens.py"
    leaf.write_text(leaf.read_text(encoding="utf-8") + "\nif TYPE_CHECKING:\n    from .runner import Runner\n",
                    encoding="utf-8")
    store = copy / "core" / "memory" / "sqlite" / "store.py"
    lines = store.read_text(encoding="utf-8").splitlines(keepends=True)
    store.write_text("".join(lines + ["def _f() -> None:\n", "    from ....render import safe_text\n"]),
                     encoding="utf-8")
    bad = crossings(copy)
    assert f"{PACKAGE}/core/tokens.py:{len(leaf.read_text().splitlines())} imports {PACKAGE}.core.runner" \
           " (type only) (leaves -> runner)" in bad, bad
    assert f"{PACKAGE}/core/memory/sqlite/store.py:{len(lines) + 2} imports {PACKAGE}.render (memory -> render)" \
        in bad, bad
    assert len(bad) == 2, bad
    (copy / "stray.py").write_text("", encoding="utf-8")
    with pytest.raises(AssertionError, match="in no room.*stray.py"):
        room_of(copy)


def module_listing(design: Path = DESIGN) -> tuple[str, str]:
    """The two listings of "The rooms in more detail" in docs/design.md: the front-ends'
    modules (``chatflow_cli/``) and the library's (``chatflow_cli/core/``)."""
    text = design.read_text(encoding="utf-8")
    section = text.split("\n## The rooms in more detail\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```\n(.*?)```", section, re.S)
    assert len(blocks) == 2, "docs/design.md: 'The rooms in more detail' has not its two listings"
    return blocks[0], blocks[1]


def _entries(listing: str) -> list[str]:
    """A listing's entries: a line at the listing's least indent and the lines indented under it."""
    lines = [ln for ln in listing.splitlines() if ln.strip()]
    indent = min(len(ln) - len(ln.lstrip()) for ln in lines)
    entries: list[str] = []
    for ln in lines:
        if len(ln) - len(ln.lstrip()) == indent or not entries:
            entries.append(ln)
        else:
            entries[-1] += "\n" + ln
    return entries


def _names(text: str, word: str) -> bool:
    return re.search(rf"(?<![\w./]){re.escape(word)}(?![\w/])", text) is not None


def unlisted(root: Path = ROOT, design: Path = DESIGN) -> list[str]:
    """The package's modules that design.md's listings do not name, exactly: a module by its
    file name (``cli.py``, ``store.py``), written in the entry of its folder. An entry is
    headed by a folder relative to its listing (``commands/``, ``memory/sqlite/``) or by
    modules of the listing's own folder (``model.py``, ``memory_app.py,``); a module of the
    listing's folder is named in an entry of the second kind, a module in a folder in the
    entry headed by that folder, and a package's ``__init__.py`` by that entry's being
    there. So ``leases.py`` in ``memory/postgres/``'s entry does not list
    ``memory/sqlite/leases.py``, nor the word ``window`` a ``memory/window.py``."""
    front, library = (_entries(listing) for listing in module_listing(design))
    missing = []
    for path in modules(root).values():
        relative = path.relative_to(root).as_posix()
        inside = relative.removeprefix("core/")
        entries = library if inside != relative else front
        folder, _, file = inside.rpartition("/")
        if folder:
            holders = [e for e in entries if e.split()[0] == folder + "/"]
            named = bool(holders) and (file == "__init__.py" or any(_names(e, file) for e in holders))
        else:
            named = any(_names(e, file) for e in entries if not e.split()[0].endswith("/"))
        if not named:
            missing.append(relative)
    return missing


_LISTED_FILE = re.compile(r"(?<![\w./-])(\w+(?:/\w+)*\.py)(?!\w)")


def listed_but_missing(root: Path = ROOT, design: Path = DESIGN) -> list[str]:
    """What design.md's listings name that does not exist, as a path relative to the package: an
    entry's folder (``repl/``, ``memory/sqlite/``) and each ``name.py`` an entry names, in that
    folder (``ghost.py`` in the ``repl/`` entry is ``repl/ghost.py``) or, in an entry of modules,
    in the listing's own folder (``stream.py`` in ``model.py``'s entry is ``core/stream.py``)."""
    missing = []
    for listing, base in zip(module_listing(design), ("", "core/")):
        for entry in _entries(listing):
            head = entry.split()[0]
            folder = base + head if head.endswith("/") else base
            if head.endswith("/") and not (root / folder).is_dir():
                missing.append(folder)
            missing += [folder + f for f in _LISTED_FILE.findall(entry) if not (root / folder / f).is_file()]
    return sorted(set(missing))


def test_the_module_listing_names_every_module(tmp_path):
    """"The rooms in more detail" names each module of the package (a module added or renamed
    without it fails here), and the check sees the modules it does not name, a common word
    or a neighbour folder's module of the same name being no listing (a few empty files)."""
    assert unlisted() == []
    assert listed_but_missing() == []
    package = tmp_path / PACKAGE
    for relative in ("__init__.py", "cli.py", "stray.py", "commands/chat.py", "commands/stray.py",
                     "core/dsn.py", "core/cli.py", "core/mcp/_keeper.py", "core/nowhere/__init__.py",
                     "core/memory/__init__.py", "core/memory/sqlite/store.py", "core/memory/postgres/leases.py",
                     # the five modules of the review: a word of the entry, or a module of a neighbour
                     "core/memory/sqlite/leases.py", "core/memory/rows.py", "core/memory/window.py",
                     "commands/ls.py", "core/local/model.py",
                     # named in the listing, outside its folder's entry
                     "core/search.py", "core/_run/cancel.py"):
        (package / relative).parent.mkdir(parents=True, exist_ok=True)
        (package / relative).write_text("", encoding="utf-8")
    assert sorted(unlisted(package)) == [
        "commands/ls.py", "commands/stray.py", "core/_run/cancel.py", "core/cli.py", "core/local/model.py",
        "core/memory/rows.py", "core/memory/sqlite/leases.py", "core/memory/window.py", "core/nowhere/__init__.py",
        "core/search.py", "stray.py"]


def test_the_module_listing_names_no_module_that_is_not_there(tmp_path):
    """The other way round: a copy of design.md whose listings name a module or folder the
    package has not (``ghost.py`` in the ``repl/`` entry, a ``ghosts/`` entry, ``spectre.py``
    beside ``stream.py`` in an entry of the library's modules) is refused, path by path."""
    text = DESIGN.read_text(encoding="utf-8")
    changed = tmp_path / "design.md"
    edits = [("  repl/             app.py (run_repl,", "  repl/             app.py, ghost.py (run_repl,"),
             ("  lookup.py         stored", "  ghosts/           a.py\n  lookup.py         stored"),
             ("ModelStream, ChatClient (what the Runner needs); stream.py",
              "ModelStream, ChatClient (what the Runner needs); stream.py, spectre.py")]
    for old, new in edits:
        assert text.count(old) == 1, old
        text = text.replace(old, new)
    changed.write_text(text, encoding="utf-8")
    assert listed_but_missing(design=changed) == ["core/spectre.py", "ghosts/", "ghosts/a.py", "repl/ghost.py"]


def code_arrows(root: Path = ROOT, house: dict[str, Room] | None = None) -> dict[str, set[str]]:
    """``{room: {rooms it imports}}`` as the code has them, a room marked ``*`` when every
    import of it is under ``if TYPE_CHECKING:``."""
    house = rooms() if house is None else house
    where = room_of(root, house)
    kinds: dict[str, dict[str, set[bool]]] = {name: {} for name in house}
    for module, _line, target, name, type_only in import_edges(root):
        if not (target == PACKAGE and name == "__version__") and where[module] != where[target]:
            kinds[where[module]].setdefault(where[target], set()).add(type_only)
    return {a: {b + "*" * all(k) for b, k in targets.items()} for a, targets in kinds.items()}


_MERMAID_NODE = re.compile(r'^(\w+)\["([^"]*)"\]$')
_MERMAID_EDGE = re.compile(r"^(\w+) (-->|-\.->) (\w+)$")
_MERMAID_SUBGRAPH = re.compile(r'^subgraph (\w+)( \["[^"]*"\])?$')


@dataclass(frozen=True)
class Drawing:
    rooms: frozenset[str]
    arrows: frozenset[tuple[str, str, bool]]   # (room, room, dotted: type-only)
    subgraphs: tuple[tuple[str, str | None], ...] = ()  # (room, the subgraph it is drawn in)
    labels: tuple[tuple[str, str], ...] = ()            # (room, its label)


def drawing(design: Path = DESIGN) -> Drawing:
    """The Mermaid flowchart of "The house: rooms and arrows": its nodes (a room each, ``_``
    for ``-`` in the id) with their labels and subgraphs, and its arrows, read line by line; a
    line that is no ``graph TD``, ``%%`` comment, ``subgraph``/``end``, node ``id["label"]`` or
    arrow ``a --> b`` / ``a -.-> b`` fails, so an arrow written another way cannot slip past."""
    text = design.read_text(encoding="utf-8")
    section = text.split("\n## The house: rooms and arrows\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```mermaid\n(.*?)```", section, re.S)
    assert len(blocks) == 1, "docs/design.md: the house is not one ```mermaid block"
    lines = [ln.strip() for ln in blocks[0].splitlines() if ln.strip()]
    assert lines and lines[0] == "graph TD", "docs/design.md: the drawing does not begin with `graph TD`"
    nodes: set[str] = set()
    arrows: set[tuple[str, str, bool]] = set()
    subgraphs: list[tuple[str, str | None]] = []
    labels: list[tuple[str, str]] = []
    inside: list[str] = []
    for line in lines[1:]:
        if line.startswith("%%"):
            continue
        if line == "end":
            assert inside, "docs/design.md: an `end` with no subgraph open"
            inside.pop()
        elif subgraph := _MERMAID_SUBGRAPH.match(line):
            inside.append(subgraph.group(1))
        elif node := _MERMAID_NODE.match(line):
            room = node.group(1).replace("_", "-")
            nodes.add(room)
            subgraphs.append((room, inside[-1] if inside else None))
            labels.append((room, node.group(2)))
        elif edge := _MERMAID_EDGE.match(line):
            a, style, b = edge.groups()
            arrows.add((a.replace("_", "-"), b.replace("_", "-"), style == "-.->"))
        else:
            raise AssertionError(f"docs/design.md: a line of the drawing I cannot read: {line!r}")
    strays = sorted({r for a, b, _ in arrows for r in (a, b)} - nodes)
    assert not strays, f"docs/design.md: arrows to rooms the drawing does not declare: {strays}"
    return Drawing(frozenset(nodes), frozenset(arrows), tuple(subgraphs), tuple(labels))


#: The drawing's two subgraphs: the front-ends (``chatflow_cli/``) and the library (``core/``).
FRONT, LIBRARY = "front", "library"
_LABEL_PATH = re.compile(r"(?<![\w./*-])([\w*]+\.py|\w+/)(?![\w/])")


def drawing_against_rooms(design: Path = DESIGN, root: Path = ROOT) -> list[str]:
    """How the drawing's subgraphs and labels differ from the table's rooms: a room whose
    modules are all under ``core/`` sits in the ``library`` subgraph, one with none there in
    ``front`` (the package root, ``__init__.py`` alone, above both, in neither), and each
    ``name.py`` (``*_app.py``) or ``folder/`` a label writes is a module or folder of that room."""
    house = rooms(design)
    drawn = drawing(design)
    where = room_of(root, house)
    paths: dict[str, list[str]] = {}
    for module, path in modules(root).items():
        paths.setdefault(where[module], []).append(path.relative_to(root).as_posix())
    bad = []
    for room, subgraph in drawn.subgraphs:
        if room not in house:
            continue
        in_core = {p.startswith("core/") for p in house[room].paths}
        expected = None if house[room].paths == ("__init__.py",) else (
            LIBRARY if in_core == {True} else FRONT if in_core == {False} else "?")
        if subgraph != expected:
            bad.append(f"{room} is drawn in {subgraph or 'no'} subgraph, its modules belong in {expected or 'no'}")
    for room, label in drawn.labels:
        for token in _LABEL_PATH.findall(label):
            ours = paths.get(room, [])
            if token.endswith("/"):
                found = any(f"/{token}" in f"/{p}" for p in ours)
            else:
                found = any(fnmatch.fnmatchcase(p.rpartition("/")[2], token) for p in ours)
            if not found:
                bad.append(f"the label of {room} names {token}, no module of that room")
    return bad


def drawn_arrows(design: Path = DESIGN) -> set[tuple[str, str, bool]]:
    """The drawing's arrows with its one rule applied: a room with no arrow drawn to ``leaves``
    imports them at runtime."""
    drawn = drawing(design)
    arrows = set(drawn.arrows)
    to_leaves = {a for a, b, _ in arrows if b == "leaves"}
    arrows |= {(r, "leaves", False) for r in drawn.rooms - to_leaves - {"leaves"}}
    return arrows


def _mermaid(arrow: tuple[str, str, bool]) -> str:
    a, b, dotted = arrow
    return f"{a.replace('-', '_')} {'-.->' if dotted else '-->'} {b.replace('-', '_')}"


def drawing_against_code(design: Path = DESIGN, root: Path = ROOT) -> list[str]:
    """How the drawing differs from the rooms' imports in the code (a dotted arrow: every import
    of that room is under ``if TYPE_CHECKING:``), one line an arrow."""
    house = rooms(design)
    real = {(a, b.rstrip("*"), b.endswith("*")) for a, targets in code_arrows(root, house).items() for b in targets}
    drawn = drawn_arrows(design)
    return ([f"the code has, the drawing not: {_mermaid(x)}" for x in sorted(real - drawn)]
            + [f"the drawing has, the code not: {_mermaid(x)}" for x in sorted(drawn - real)])


def drawing_against_table(design: Path = DESIGN) -> list[str]:
    """How the drawing differs from the table's rooms and its ``may import`` column."""
    house = rooms(design)
    drawn = drawing(design)
    table = {(a, b) for a, room in house.items() for b in room.may_import}
    arrows = {(a, b) for a, b, _ in drawn_arrows(design)}
    return ([f"a room of the table not drawn: {r}" for r in sorted(set(house) - drawn.rooms)]
            + [f"a room drawn not in the table: {r}" for r in sorted(drawn.rooms - set(house))]
            + [f"the table has, the drawing not: {a} -> {b}" for a, b in sorted(table - arrows)]
            + [f"the drawing has, the table not: {a} -> {b}" for a, b in sorted(arrows - table)])


def test_the_drawing_is_the_code_and_the_table():
    """The Mermaid drawing of the house has every room of the table and, with its rule for
    ``leaves``, exactly the code's arrows room by room and the table's (about a second: the
    import graph, read once per process)."""
    assert drawing_against_table() == []
    assert drawing_against_code() == [], "docs/design.md: the drawing is not the code's arrows"


def test_the_drawing_checks_see_a_missing_or_false_arrow_and_a_missing_room(tmp_path):
    """A copy of design.md with ``local --> model`` removed, a false ``leaves --> runner``, a
    solid arrow where the code's is type-only, the table's runner row without mcp, a room left
    out, or a line in another syntax is refused (reads the cached import graph: milliseconds)."""
    text = DESIGN.read_text(encoding="utf-8")
    changed = tmp_path / "design.md"

    def check(old: str, new: str) -> tuple[list[str], list[str]]:
        assert old in text, old
        changed.write_text(text.replace(old, new, 1), encoding="utf-8")
        return drawing_against_code(changed), drawing_against_table(changed)

    assert check("  local --> model\n", "") == (["the code has, the drawing not: local --> model"],
                                                ["the table has, the drawing not: local -> model"])
    assert check("  mcp --> resources\n", "  mcp --> resources\n  leaves --> runner\n") == (
        ["the drawing has, the code not: leaves --> runner"], ["the drawing has, the table not: leaves -> runner"])
    assert check("  render -.-> runner\n", "  render --> runner\n") == (
        ["the code has, the drawing not: render -.-> runner", "the drawing has, the code not: render --> runner"], [])
    row = next(ln for ln in text.splitlines() if ln.startswith("| runner |"))
    assert check(row, row.replace("mcp, ", "")) == ([], ["the drawing has, the table not: runner -> mcp"])
    with pytest.raises(AssertionError, match="arrows to rooms the drawing does not declare"):
        check('    mcp["mcp: mcp/ (MCP servers\' tools)"]\n', "")
    leaves = next(ln for ln in text.splitlines() if ln.startswith("    leaves["))
    changed.write_text(text.replace(leaves + "\n", ""), encoding="utf-8")
    assert "a room of the table not drawn: leaves" in drawing_against_table(changed)
    with pytest.raises(AssertionError, match="a line of the drawing I cannot read: 'runner --> mcp & model'"):
        check("  runner --> mcp\n", "  runner --> mcp & model\n")


def test_the_drawing_puts_each_room_in_its_subgraph_and_labels_it_with_its_own_modules(tmp_path):
    """The subgraphs and labels are checked too: a copy of design.md with ``memory`` moved into
    the front-ends' subgraph, the root moved into the library's, ``cli.py`` written into the
    leaves' label and ``render/`` into the runner's is refused, each (milliseconds)."""
    assert drawing_against_rooms() == []
    text = DESIGN.read_text(encoding="utf-8")
    changed = tmp_path / "design.md"
    memory = next(ln for ln in text.splitlines() if ln.startswith("    memory["))
    root = next(ln for ln in text.splitlines() if ln.startswith("  root["))
    leaves = next(ln for ln in text.splitlines() if ln.startswith("    leaves["))
    runner = next(ln for ln in text.splitlines() if ln.startswith("    runner["))
    front = next(ln for ln in text.splitlines() if ln.startswith("  subgraph front"))
    library = next(ln for ln in text.splitlines() if ln.startswith("  subgraph library"))
    moved = (text.replace(memory + "\n", "").replace(root + "\n", "")
             .replace(front, f"{front}\n{memory}", 1)
             .replace(library, f"{library}\n  {root}", 1)
             .replace(leaves, leaves.replace("dsn.py,", "dsn.py, cli.py,"))
             .replace(runner, runner.replace("_run/", "_run/, render/")))
    changed.write_text(moved, encoding="utf-8")
    assert sorted(drawing_against_rooms(changed)) == [
        "memory is drawn in front subgraph, its modules belong in library",
        "root is drawn in library subgraph, its modules belong in no",
        "the label of leaves names cli.py, no module of that room",
        "the label of runner names render/, no module of that room"]


#: Issue 29: no module of the package is over this many lines.
MAX_LINES = 800


def long_modules(root: Path = ROOT) -> dict[str, int]:
    """``{path: lines}`` of the package's modules over :data:`MAX_LINES` lines."""
    counts = {p.relative_to(root.parent).as_posix(): len(p.read_text(encoding="utf-8").splitlines())
              for p in sorted(root.rglob("*.py"))}
    return {p: n for p, n in counts.items() if n > MAX_LINES}


def test_no_module_is_over_800_lines(tmp_path):
    assert long_modules() == {}
    (tmp_path / PACKAGE).mkdir()
    (tmp_path / PACKAGE / "big.py").write_text("x = 1\n" * (MAX_LINES + 1), encoding="utf-8")
    assert long_modules(tmp_path / PACKAGE) == {f"{PACKAGE}/big.py": MAX_LINES + 1}


#: The one module that may import typer's private modules (``typer._click``, ``typer._coercion``...).
TYPER_ADAPTER = f"{PACKAGE}._typer_adapter"


def private_typer_imports(root: Path = ROOT) -> dict[str, list[str]]:
    """``{module: [private typer modules it imports]}``: ``import typer._x``, ``from typer._x
    import …`` and ``from typer import _x``, anywhere in the module (functions and ``if
    TYPE_CHECKING:`` blocks too)."""
    found: dict[str, list[str]] = {}
    for name, path in modules(root).items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in _all_imports(tree):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif node.level == 0 and node.module == "typer":
                targets = [f"typer.{alias.name}" for alias in node.names]
            else:
                targets = [node.module or ""] if node.level == 0 else []
            found.setdefault(name, []).extend(
                t for t in targets if t.split(".")[0] == "typer" and any(p.startswith("_") for p in t.split(".")[1:]))
    return {m: sorted(set(ts)) for m, ts in found.items() if ts}


def test_only_the_typer_adapter_imports_typers_private_modules():
    found = private_typer_imports()
    assert set(found) == {TYPER_ADAPTER}, found
    # the reader sees each form of import
    assert {"typer._click", "typer._coercion", "typer._completion_shared"} <= set(found[TYPER_ADAPTER])


if __name__ == "__main__":  # pragma: no cover - a measuring aid
    target = Path(sys.argv[1]).resolve() if len(sys.argv) > 1 else ROOT
    g = import_graph(target)
    comps = cycles(g)
    front_g = {m: {t for t in ts if _front_end(t)} for m, ts in g.items() if _front_end(m)}
    print(f"modules {len(g)}, edges {sum(map(len, g.values()))}")
    print(f"cycles (strongly connected components > 1 module): {len(comps)}, "
          f"edges on a cycle: {len(cycle_edges(g))}")
    for comp in comps:
        print("  ", " ".join(comp))
    print(f"front-end cycles: {len(cycles(front_g))}, edges on a cycle: {len(cycle_edges(front_g))}")
