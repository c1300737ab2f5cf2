"""The package's import graph: arrows point down, front-end modules form no circle.

The graph is read from the source with :mod:`ast` (nothing is imported): every ``import``
and ``from … import`` of a ``chatflow_cli`` module, at module level and inside functions,
is an edge. Imports under ``if TYPE_CHECKING:`` are left out (they never run). ``from .pkg
import name`` is an edge to ``pkg.name`` when that is a module, else to ``pkg``. Implicit
imports of parent packages are not edges (``chatflow_cli/__init__`` resolves its names
lazily).

Run as a script (``python tests/test_layering.py [ROOT]``) it prints the cycles it finds.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

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


def _runtime_imports(tree: ast.AST) -> list[ast.Import | ast.ImportFrom]:
    """The import statements of ``tree`` outside ``if TYPE_CHECKING:`` blocks."""
    found: list[ast.Import | ast.ImportFrom] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return found


def import_graph(root: Path = ROOT) -> dict[str, set[str]]:
    """``{module: {modules it imports}}`` over the package's own modules."""
    mods = modules(root)
    graph: dict[str, set[str]] = {name: set() for name in mods}
    for name, path in mods.items():
        is_package = path.name == "__init__.py"
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for node in _runtime_imports(tree):
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            else:
                if node.level:
                    base = name.split(".") if is_package else name.split(".")[:-1]
                    base = base[: len(base) - (node.level - 1)]
                    prefix = ".".join(base + ([node.module] if node.module else []))
                else:
                    prefix = node.module or ""
                targets = [f"{prefix}.{alias.name}" if f"{prefix}.{alias.name}" in mods else prefix
                           for alias in node.names]
            for target in targets:
                while target and target not in mods:  # `import a.b.c` of a package's attribute
                    target = target.rpartition(".")[0]
                if target and target != name and target.split(".")[0] == PACKAGE:
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
def test_the_graph_sees_function_level_imports():
    """The reader is not blind: a function-level import becomes an edge."""
    graph = import_graph()
    assert f"{PACKAGE}.cli" in graph[f"{PACKAGE}.__main__"]
    # cli imports its commands inside the command functions only
    assert any(m.startswith(f"{PACKAGE}.commands") for m in graph[f"{PACKAGE}.cli"])


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
    assert f"{PACKAGE}.core._local_probe" in graph[f"{PACKAGE}.core.model"]
    assert not any(t.startswith(f"{PACKAGE}.core.local") for t in graph[f"{PACKAGE}.core.model"])


def test_stores_reach_other_modules_through_named_seams_only():
    """No module of the store package imports another module's private (underscore) name,
    except from its own private modules (``_port``, ``_core``, ``_checks`` and the mixins)
    and the events module's event-type rules. A backend package (``sqlite/``, ``postgres/``)
    is one store split by role: its modules share their private names with each other, and
    reach the rest of the store package by the same rule."""
    memory = ROOT / "core" / "memory"
    paths = sorted(memory.rglob("*.py"))
    assert len(paths) > 10 and any(len(p.relative_to(memory).parts) == 2 for p in paths)
    leaks = []
    for path in paths:
        depth = len(path.relative_to(memory).parts)  # the import level that reaches memory's modules
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == depth and not (node.module or "").startswith("_"):
                leaks += [(path.name, node.module, a.name) for a in node.names if a.name.startswith("_")]
    assert leaks == []


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
