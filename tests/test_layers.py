"""splitlab's modules import down their layers only, and no two import each other, directly or round a circle.

The layers are written once, here (``LAYERS``, bottom first): a module may import its own layer or any below it,
never one above. The module graph is read from the sources' syntax trees, nothing is imported: every ``import`` and
``from ... import`` anywhere in a module (inside functions and ``if TYPE_CHECKING:`` blocks too, relative ones
resolved), every string that names a splitlab module exactly (what ``importlib.import_module`` is handed, a table
of module names), and, for ``import a.b.c``, the packages ``a.b`` and ``a`` whose ``__init__`` runs
first (not where the importer lives inside that package: Python runs a package's ``__init__`` before its modules,
so that edge is no dependence). A module the table does not place fails too: a new module gets its layer here.
An import path ``"package.module:attribute"`` (``splitlab.families``' records, the cards' ``[impl]``) names no module
exactly and is no edge: it is data, and the code that resolves it (``bench.impls.resolve``) is the importer.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "splitlab"

#: The layers, bottom first: (name, modules). ``pkg.*`` places every module under ``pkg``.
LAYERS: list[tuple[str, list[str]]] = [
    ("base", ["splitlab", "splitlab.errors", "splitlab.resources", "splitlab.intmath", "splitlab.families"]),
    ("vocabulary", ["splitlab.serving", "splitlab.devices", "splitlab.workloads", "splitlab.args", "splitlab.plugins"]),
    ("result data", ["splitlab.catalog", "splitlab.results", "splitlab.datasets", "splitlab.sweep_timelines"]),
    ("wave model", ["splitlab.waves"]),
    ("planners", ["splitlab.planners", "splitlab.planners.*"]),
    ("kernels", ["splitlab.kernels", "splitlab.kernels.*"]),
    ("bench", ["splitlab.bench", "splitlab.bench.*"]),
    ("analysis", ["splitlab.analysis", "splitlab.plots", "splitlab.peer_table", "splitlab.ledger"]),
    ("scoring", ["splitlab.scoring"]),
    ("fit and headline", ["splitlab.fit", "splitlab.headline"]),
    ("notebook helpers", ["splitlab.notebook"]),
    ("report", ["splitlab.report", "splitlab.report_parameters"]),
    ("regress", ["splitlab.regress"]),
    ("command line", ["splitlab.cli", "splitlab.__main__"]),
]

MODULE_NAME = re.compile(r"splitlab(\.[A-Za-z_]\w*)+")
Graph = Mapping[str, Mapping[str, int]]  # module -> {imported module: the line of the first such import}


def modules(package: Path = PACKAGE) -> dict[str, Path]:
    """Every module under ``package`` (a package by its own name), by dotted name."""
    out = {}
    for path in sorted(package.rglob("*.py")):
        parts = list(path.relative_to(package.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def _owner(name: str, known: Iterable[str]) -> str | None:
    """The longest known module ``name`` is or lies in (``splitlab.planners.Plan`` -> ``splitlab.planners``)."""
    known = set(known)
    while name and name not in known:
        name = name.rpartition(".")[0]
    return name or None


def _with_packages(name: str, importer: str) -> list[str]:
    """``name`` and the packages above it whose ``__init__`` runs when it is imported, less those ``importer`` lies
    in (running already)."""
    parts = name.split(".")
    chain = [".".join(parts[:i]) for i in range(1, len(parts) + 1)]
    return [m for m in chain if not (importer == m or importer.startswith(m + "."))]


def imports_of(source: str, module: str, known: Iterable[str], *, is_package: bool = False) -> dict[str, int]:
    """The splitlab modules ``module`` (its text ``source``) imports, each with the line of its first import:
    statements anywhere in the tree, strings naming a module exactly, and the packages those run first."""
    known = set(known)
    found: dict[str, int] = {}

    def add(name: str, line: int) -> None:
        owner = _owner(name, known)
        if owner is None:
            return
        for m in _with_packages(owner, module):
            if m != module:
                found.setdefault(m, line)

    here = module.split(".") if is_package else module.split(".")[:-1]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name, node.lineno)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the importer's package up
                up = here[: len(here) - (node.level - 1)]
                base = ".".join([*up, base] if base else up)
            for alias in node.names:  # a module imported by name, else the attribute's module
                add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base, node.lineno)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and MODULE_NAME.fullmatch(node.value):
            if node.value in known:  # importlib.import_module("splitlab.x"), a table of module names
                add(node.value, node.lineno)
    return found


def module_graph(package: Path = PACKAGE) -> dict[str, dict[str, int]]:
    """Every module under ``package`` and the splitlab modules it imports (``imports_of``)."""
    mods = modules(package)
    return {m: imports_of(p.read_text(encoding="utf-8"), m, mods, is_package=p.name == "__init__.py")
            for m, p in mods.items()}


def layer_of(module: str, layers: list[tuple[str, list[str]]] = LAYERS) -> int | None:
    """The index of ``module``'s layer (an exact entry first, then the nearest ``pkg.*``); None if none places it."""
    for i, (_, names) in enumerate(layers):
        if module in names:
            return i
    best = None
    for i, (_, names) in enumerate(layers):
        for n in names:
            if n.endswith(".*") and module.startswith(n[:-1]) and (best is None or len(n) > best[1]):
                best = (i, len(n))
    return best[0] if best else None


def upward(graph: Graph, layers: list[tuple[str, list[str]]] = LAYERS) -> list[str]:
    """One line per import that runs up the layers, and per module no layer places."""
    out = []
    for m in sorted(graph):
        lm = layer_of(m, layers)
        if lm is None:
            out.append(f"{m}: in no layer; give it one in tests/test_layers.py's LAYERS")
            continue
        for dep, line in sorted(graph[m].items()):
            ld = layer_of(dep, layers)
            if ld is not None and ld > lm:
                out.append(f"{m} (layer {layers[lm][0]!r}) imports {dep} (layer {layers[ld][0]!r}) at line {line}")
    return out


def components(graph: Graph) -> list[list[str]]:
    """The strongly connected components of ``graph`` of more than one module (Tarjan): each a set of modules that
    all reach one another through imports, sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def connect(v: str) -> None:  # iterative Tarjan: an import chain may be deeper than the recursion limit
        work = [(v, iter(sorted(graph.get(v, ()))))]
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        while work:
            node, edges = work[-1]
            for w in edges:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                    break
                if w in on_stack:
                    low[node] = min(low[node], index[w])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        w = stack.pop()
                        on_stack.discard(w)
                        comp.append(w)
                        if w == node:
                            break
                    if len(comp) > 1:
                        components.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return components


def cycles(graph: Graph) -> list[list[str]]:
    """The import circles of ``graph``: per component (``components``) one shortest circle through its first module,
    the modules in import order with the first repeated at the end."""
    return [_circle(graph, comp) for comp in components(graph)]


def _circle(graph: Graph, comp: list[str]) -> list[str]:
    """A shortest circle from the component's first module back to it, inside the component (breadth first)."""
    inside, start = set(comp), comp[0]
    came: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph.get(v, ())):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(came[path[-1]])
                    return [*reversed(path), start]
                if w in inside and w not in came:
                    came[w] = v
                    nxt.append(w)
        frontier = nxt
    return comp  # not reached for a strongly connected component


GRAPH = module_graph()


def test_no_import_circles():
    found = components(GRAPH)
    assert not found, "import circles:\n" + "\n".join(
        f"{' -> '.join(_circle(GRAPH, comp))} (all of {', '.join(comp)} reach one another)" for comp in found)


def test_imports_run_down_the_layers_only():
    bad = upward(GRAPH)
    assert not bad, "imports against the layers (tests/test_layers.py):\n" + "\n".join(bad)


def test_the_table_names_only_modules_that_exist():
    mods = set(GRAPH)
    for _, names in LAYERS:
        for n in names:
            assert (n[:-2] in mods) if n.endswith(".*") else (n in mods), f"LAYERS names {n}, which is no module"


# --- the checks themselves, on graphs small enough to read -------------------------------------------------

def test_a_circle_is_found_and_named():
    graph = {"a": {"b": 1}, "b": {"c": 3}, "c": {"a": 7}, "d": {"a": 2}, "e": {"f": 1}, "f": {"e": 1}}
    assert sorted(cycles(graph)) == [["a", "b", "c", "a"], ["e", "f", "e"]]
    assert sorted(components(graph)) == [["a", "b", "c"], ["e", "f"]]
    assert cycles({"a": {"b": 1}, "b": {}, "c": {"a": 1, "b": 2}}) == []


def test_an_upward_import_and_an_unplaced_module_are_found():
    layers = [("low", ["p.low", "p.pkg.*"]), ("high", ["p.high"])]
    graph = {"p.low": {"p.high": 4}, "p.high": {"p.low": 1, "p.pkg.x": 2}, "p.pkg.x": {}, "p.new": {}}
    assert upward(graph, layers) == ["p.low (layer 'low') imports p.high (layer 'high') at line 4",
                                     "p.new: in no layer; give it one in tests/test_layers.py's LAYERS"]


def test_the_parser_sees_every_kind_of_import():
    known = {"splitlab", "splitlab.a", "splitlab.b", "splitlab.c", "splitlab.d", "splitlab.g", "splitlab.pkg",
             "splitlab.pkg.e", "splitlab.pkg.f", "splitlab.pkg.mod"}
    source = '''
"""A docstring naming splitlab.a is prose, not an import."""
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from splitlab.a import Thing

def f():
    from splitlab import b
    import splitlab.pkg.e

MODS = {"x": ("splitlab.c", "fn")}
importlib.import_module("splitlab.d")
from .f import y
from .. import g as _g
'''
    found = imports_of(source, "splitlab.pkg.mod", known)
    assert set(found) == {"splitlab.a", "splitlab.b", "splitlab.c", "splitlab.d", "splitlab.g", "splitlab.pkg.e",
                          "splitlab.pkg.f"}
    assert found["splitlab.b"] == 9  # the line of the (first) import
    # the packages whose __init__ runs first count, except those the importer lies in (``splitlab`` here)
    assert imports_of("import splitlab.pkg.e", "splitlab.a", known) == {"splitlab.pkg": 1, "splitlab.pkg.e": 1}
    assert imports_of("from splitlab.pkg import Name", "splitlab.a", known) == {"splitlab.pkg": 1}
    assert imports_of("from . import e", "splitlab.pkg", known, is_package=True) == {"splitlab.pkg.e": 1}


@pytest.mark.parametrize(("module", "layer"), [("splitlab.planners.flex", "planners"), ("splitlab.cli", "command line"),
                                               ("splitlab.kernels", "kernels"), ("splitlab.intmath", "base")])
def test_layer_of_reads_the_table(module, layer):
    assert LAYERS[layer_of(module)][0] == layer
