"""The import graph of the project's packages has no cycle, and its layers hold: the protocol
core depends on neither the emulator nor the command line, the emulator is built on the
core's public names alone, and the command line sits above the client.

Every module's source is parsed with :mod:`ast` (nothing is imported); each ``import`` and
``from ... import`` statement, relative or absolute, anywhere in the module (inside
functions too) becomes an edge to the module of these packages it names (the packages
above that module, whose ``__init__`` Python runs first, are not edges: every submodule
would otherwise be in a cycle with its package).  Imports under ``if TYPE_CHECKING:`` are
annotations only: they do not count as edges of the runtime graph.  The emulator
(``nsq_emulator``) is held to more: no cycle even through those.
"""

from __future__ import annotations

import ast
import itertools
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: the packages pyproject.toml ships
PACKAGES = (
    "nsq_proto",
    "nsq_client",
    "nsq_anyio",
    "nsq_trio",
    "nsq_spark",
    "nsq_emulator",
    "nsq_cli",
)
EMULATOR = "nsq_emulator"
CLI = "nsq_cli"


@dataclass(frozen=True)
class Edge:
    """``source`` imports ``target`` at ``line``; ``type_only`` under ``if TYPE_CHECKING:``."""

    source: str
    target: str
    line: int
    type_only: bool


def module_files() -> dict[str, Path]:
    """Every module of :data:`PACKAGES`, by dotted name (a package by its own name)."""
    modules: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def _is_type_checking(test: ast.expr) -> bool:
    """``TYPE_CHECKING`` or ``typing.TYPE_CHECKING``."""
    if isinstance(test, ast.Name):
        return test.id == "TYPE_CHECKING"
    return isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"


def _imports(node: ast.AST, type_only: bool = False) -> Iterator[tuple[ast.stmt, bool]]:
    """Every import statement under ``node``, flagged when it is under ``if TYPE_CHECKING:``."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.Import | ast.ImportFrom):
            yield child, type_only
        elif isinstance(child, ast.If) and _is_type_checking(child.test):
            for stmt in child.body:
                yield from _imports_in(stmt, True)
            for stmt in child.orelse:
                yield from _imports_in(stmt, type_only)
        else:
            yield from _imports(child, type_only)


def _imports_in(stmt: ast.stmt, type_only: bool) -> Iterator[tuple[ast.stmt, bool]]:
    """The import statements of one statement, itself included."""
    if isinstance(stmt, ast.Import | ast.ImportFrom):
        yield stmt, type_only
    else:
        yield from _imports(stmt, type_only)


def _base_package(module: str, is_package: bool, level: int) -> str:
    """The package a ``from`` import with ``level`` leading dots is relative to."""
    parts = module.split(".")
    if not is_package:
        parts.pop()
    if level > 1:
        parts = parts[: len(parts) - (level - 1)]
    return ".".join(parts)


def _targets(stmt: ast.stmt, module: str, is_package: bool, known: set[str]) -> Iterator[str]:
    """The modules of ``known`` that one import statement of ``module`` loads by name."""
    if isinstance(stmt, ast.Import):
        for alias in stmt.names:
            name = alias.name
            while name and name not in known:
                name = name.rpartition(".")[0]
            if name:
                yield name
        return
    assert isinstance(stmt, ast.ImportFrom)
    base = stmt.module or ""
    if stmt.level:
        package = _base_package(module, is_package, stmt.level)
        base = f"{package}.{base}" if base else package
    for alias in stmt.names:
        submodule = f"{base}.{alias.name}"
        if submodule in known:
            yield submodule
        elif base in known:
            yield base


def import_edges() -> list[Edge]:
    """Every import between modules of :data:`PACKAGES`."""
    files = module_files()
    known = set(files)
    edges: list[Edge] = []
    for module, path in files.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        is_package = path.name == "__init__.py"
        for stmt, type_only in _imports(tree):
            for target in _targets(stmt, module, is_package, known):
                if target != module:
                    edges.append(Edge(module, target, stmt.lineno, type_only))
    return edges


Graph = dict[str, dict[str, str]]


def import_graph(*, type_only: bool = False) -> Graph:
    """module -> imported module -> where the first such import is; imports under
    ``if TYPE_CHECKING:`` count only with ``type_only``."""
    graph: Graph = {name: {} for name in module_files()}
    for edge in import_edges():
        if type_only or not edge.type_only:
            where = f"line {edge.line}" + (", under TYPE_CHECKING" if edge.type_only else "")
            graph[edge.source].setdefault(edge.target, where)
    return graph


def cycles_touching(graph: Graph, package: str) -> list[str]:
    """A description of each import cycle with a module of ``package`` in it."""
    return [
        describe(graph, c)
        for c in strongly_connected(graph)
        if any(m == package or m.startswith(package + ".") for m in c)
    ]


def strongly_connected(graph: Graph) -> list[list[str]]:
    """Tarjan's strongly connected components with more than one module, each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in graph[node]:
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(found)


def a_cycle(graph: Graph, component: list[str]) -> list[str]:
    """One concrete cycle through the first module of ``component`` (it closes on itself)."""
    members = set(component)
    start = component[0]
    parents: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for succ in sorted(graph[node]):
                if succ not in members:
                    continue
                if succ == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(parents[path[-1]])
                    return [*reversed(path), start]
                if succ not in parents:
                    parents[succ] = node
                    following.append(succ)
        frontier = following
    raise AssertionError(f"no cycle through {start}")  # pragma: no cover


def describe(graph: Graph, component: list[str]) -> str:
    """A component and one of its cycles, with the line of each import."""
    cycle = a_cycle(graph, component)
    steps = [f"{a} ({graph[a][b]}) -> {b}" for a, b in itertools.pairwise(cycle)]
    return (
        f"import cycle among {len(component)} modules: {', '.join(component)}\n"
        "  for example:\n    " + "\n    ".join(steps)
    )


def test_every_shipped_package_is_checked() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    include = project["tool"]["setuptools"]["packages"]["find"]["include"]
    assert sorted(pattern.rstrip("*") for pattern in include) == sorted(PACKAGES)


def test_every_package_is_parsed() -> None:
    files = module_files()
    for package in PACKAGES:
        assert package in files
    assert f"{EMULATOR}._nsqd" in files


def test_relative_imports_resolve() -> None:
    known = {"p", "p.a", "p.sub", "p.sub.b", "p.sub.c"}
    from_sub = ast.parse("from . import c\nfrom .. import a\nfrom ..a import x\nfrom .c import y")
    got = [
        t
        for stmt in from_sub.body
        for t in _targets(stmt, "p.sub.b", is_package=False, known=known)
    ]
    assert got == ["p.sub.c", "p.a", "p.a", "p.sub.c"]
    in_package = ast.parse("from . import b\nfrom .b import z\nimport p.sub.c.missing")
    got = [
        t for stmt in in_package.body for t in _targets(stmt, "p.sub", is_package=True, known=known)
    ]
    assert got == ["p.sub.b", "p.sub.b", "p.sub.c"]


def test_type_checking_imports_are_flagged() -> None:
    source = (
        "from typing import TYPE_CHECKING\n"
        "import typing\n"
        "if TYPE_CHECKING:\n    import p.a\nelse:\n    import p.sub\n"
        "if typing.TYPE_CHECKING:\n    from p import sub\n"
        "def f():\n    import p.sub.b\n"
    )
    found = [
        (stmt.lineno, type_only)
        for stmt, type_only in _imports(ast.parse(source))
        if isinstance(stmt, ast.Import | ast.ImportFrom) and stmt.lineno > 2
    ]
    assert found == [(4, True), (6, False), (8, True), (10, False)]


def test_cycle_detection_reports_a_cycle() -> None:
    graph = {"a": {"b": "1"}, "b": {"c": "2"}, "c": {"a": "3", "d": "4"}, "d": {}}
    assert strongly_connected(graph) == [["a", "b", "c"]]
    assert a_cycle(graph, ["a", "b", "c"]) == ["a", "b", "c", "a"]


@pytest.mark.parametrize("package", PACKAGES)
def test_no_import_cycle(package: str) -> None:
    """No import cycle touches ``package`` (imports inside functions count)."""
    found = cycles_touching(import_graph(), package)
    assert not found, "\n\n".join(found)


@pytest.mark.parametrize("package", [EMULATOR, "nsq_client"])
def test_no_cycle_even_through_annotations(package: str) -> None:
    """The emulator's parts, and the async client's, meet through small protocols, so even
    their imports under ``if TYPE_CHECKING:`` form no cycle."""
    found = cycles_touching(import_graph(type_only=True), package)
    assert not found, "\n\n".join(found)


def in_package(module: str, package: str) -> bool:
    """Whether ``module`` is ``package`` or one of its modules."""
    return module == package or module.startswith(package + ".")


def is_private(module: str) -> bool:
    """Whether a part of the dotted name starts with ``_`` (``nsq_proto._frames``); a
    ``__main__`` or ``__init__`` is not private."""
    return any(part.startswith("_") and not part.endswith("__") for part in module.split("."))


def test_private_names_are_told_apart() -> None:
    assert is_private("nsq_proto._frames") and is_private("nsq_proto.sub._x")
    assert not is_private("nsq_proto") and not is_private("nsq_proto.wire")
    assert not is_private("nsq_emulator.__main__")


def test_core_imports_neither_the_emulator_nor_the_cli() -> None:
    """``nsq_proto`` and ``nsq_client`` never import the emulator or the command line (not
    even for types)."""
    wrong = [
        f"{e.source} (line {e.line}) imports {e.target}"
        for e in import_edges()
        if (in_package(e.source, "nsq_proto") or in_package(e.source, "nsq_client"))
        and (in_package(e.target, EMULATOR) or in_package(e.target, CLI))
    ]
    assert not wrong, "the core imports the emulator or the CLI:\n  " + "\n  ".join(wrong)


def test_the_emulator_imports_only_public_names_of_the_core() -> None:
    """``nsq_emulator`` imports no private module of ``nsq_proto`` (``nsq_proto._frames``...)
    and nothing above it: not the client, not the command line (not even for types; its
    program ``python -m nsq_emulator`` is its own, which the command line's ``serve`` runs)."""
    wrong = []
    for e in import_edges():
        if not in_package(e.source, EMULATOR) or in_package(e.target, EMULATOR):
            continue
        if not in_package(e.target, "nsq_proto") or is_private(e.target):
            wrong.append(f"{e.source} (line {e.line}) imports {e.target}")
    assert not wrong, "the emulator imports beyond the core's public names:\n  " + "\n  ".join(
        wrong
    )
    targets = {e.target for e in import_edges() if in_package(e.source, EMULATOR)}
    assert {"nsq_proto", "nsq_proto.wire"} <= targets  # the check saw the emulator's imports


def test_only_the_core_imports_its_private_modules() -> None:
    """Every package above ``nsq_proto`` (the client, its adapters, Spark, the emulator, the
    command line) uses its public names: a private module of the core (``nsq_proto._config``)
    can change without them noticing."""
    wrong = [
        f"{e.source} (line {e.line}) imports {e.target}"
        for e in import_edges()
        if in_package(e.target, "nsq_proto")
        and is_private(e.target)
        and not in_package(e.source, "nsq_proto")
    ]
    assert not wrong, "a private module of the core is imported from above:\n  " + "\n  ".join(
        wrong
    )
    targets = {e.target for e in import_edges() if not in_package(e.source, "nsq_proto")}
    assert "nsq_proto" in targets  # the check saw the imports of the packages above


def test_the_cli_sits_above_the_client() -> None:
    """Nothing outside ``nsq_cli`` imports it; it runs on ``nsq_anyio``."""
    wrong = [
        f"{e.source} (line {e.line}) imports {e.target}"
        for e in import_edges()
        if in_package(e.target, CLI) and not in_package(e.source, CLI)
    ]
    assert not wrong, "the command line is imported from below:\n  " + "\n  ".join(wrong)
    graph = import_graph()
    assert any("nsq_anyio" in graph[m] for m in graph if in_package(m, CLI))


#: modules that stay importable without the Spark extra: the source's planning (and what it
#: imports) is plain Python over plain values, tested on its own
PURE_SPARK_MODULES = ("nsq_spark._planning",)
#: what those modules may not import, even through the modules they import
SPARK_EXTRA = ("pyspark", "pyarrow", "pandas")


def outside_imports(module: str) -> dict[str, int]:
    """The top-level names of the packages outside the project that ``module`` imports
    (inside functions and under ``if TYPE_CHECKING:`` too), with the first line of each."""
    path = module_files()[module]
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: dict[str, int] = {}
    for stmt, _ in _imports(tree):
        if isinstance(stmt, ast.Import):
            names = [alias.name for alias in stmt.names]
        else:
            assert isinstance(stmt, ast.ImportFrom)
            names = [stmt.module or ""] if stmt.level == 0 else []
        for name in names:
            found.setdefault(name.split(".")[0], stmt.lineno)
    return found


def reachable(graph: Graph, start: str) -> list[str]:
    """``start`` and every module it imports, directly or not."""
    seen = [start]
    for module in seen:
        seen.extend(m for m in sorted(graph[module]) if m not in seen)
    return seen


def test_outside_imports_are_found() -> None:
    found = outside_imports("nsq_spark._source")
    assert {"pyspark", "pyarrow", "atexit"} <= set(found)
    assert "nsq_spark" not in found and "nsq_anyio" in found


@pytest.mark.parametrize("module", PURE_SPARK_MODULES)
def test_the_spark_sources_planning_needs_no_spark(module: str) -> None:
    """The planning module, and every module of the project it imports, import neither
    pyspark nor pyarrow (nor pandas)."""
    modules = reachable(import_graph(type_only=True), module)
    assert "nsq_spark._options" in modules  # the check followed its imports
    wrong = [
        f"{m} (line {line}) imports {name}"
        for m in modules
        for name, line in outside_imports(m).items()
        if name in SPARK_EXTRA
    ]
    assert not wrong, f"{module} needs the Spark extra:\n  " + "\n  ".join(wrong)
