"""The import layers of ``src/nonstop``, computed from the source (issue 9).

Units
-----
A *unit* is a subpackage (``nonstop.cluster``, ``nonstop.dtx``, ...), a module at
the root (``nonstop.errors``, ``nonstop.database``), or the root package itself
(``nonstop``: its ``__init__``, the public facade).

Edges: which imports are counted, and why
-----------------------------------------
Every ``import a.b`` and ``from a.b import c`` (relative ones resolved) anywhere
in a module's syntax tree counts, wherever it sits:

* **inside functions and methods** -- a deferred import is still a dependency;
  deferring only hides a cycle from the interpreter, not from the design;
* **under ``if TYPE_CHECKING:``** -- an annotation naming another package's type
  depends on that type's shape; typing-only imports are how a cycle hides behind
  ``Any`` and strings (the review found ``client.remote`` doing exactly that);
* in ``try``/``except`` and any other block alike.

``from a.b import c`` is an edge to ``a.b.c`` when that is a module or package of
the tree (``from nonstop import errors`` depends on ``nonstop.errors``, not on
the facade), else to ``a.b``.  Not counted: the implicit execution of
``nonstop/__init__`` when any ``nonstop.x`` is imported (that is Python loading
the facade, not a dependency of ``x``; counting it would put every unit in one
cycle), and names loaded by ``importlib`` from configuration strings (plug-ins,
``nonstop.node.machine.resolve``).  An edge of a unit to itself is not a cycle.

Layers (lowest first)
---------------------
::

    errors                      exceptions, imports nothing of nonstop
    model                       managed types, codecs, wire forms of objects
    net                         frames, handshake, TLS, discovery, addresses
    runtime                     the machine contract, the asyncio runtime, storage
    store                       LMDB and group commit
    database, tx                the embedded store and its transactions
    cluster                     failure detector, Raft, quorum, tables of the log
    dtx                         two-phase commit, the decision table
    ha                          partitions: table, policies, mappers, leases, failover
    configuration               versioned configuration (F1): types, files, the log table
    replication                 sync replication of partitions: streams, fencing, copies
    client                      sync/async clients
    nonstop (the facade)        the public surface
    bulk, dataplane             bulk operations, the data service
    security                    roles, the op matrix, the users table of the cluster log
    commands                    the administrative commands, defined once (G2)
    adminapi                    the node's admin HTTP API and web console
    node                        the node process and its composition
    spark, sim, admin, demos    integrations, the simulator, tools, examples

What is enforced
----------------
1. ``nonstop.runtime`` imports only ``nonstop.errors``, ``nonstop.net`` and itself:
   the runtime knows nothing above the network, so the real and the simulated
   runtimes drive the same machines through the same seam.
2. The unit graph has no cycle (no strongly connected component of more than
   one unit).  A failure prints the import lines that make each cycle.

The rest of the order above is documentation (it is what the graph allows
today); only these two rules are checked.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
ROOT = "nonstop"
RUNTIME = "nonstop.runtime"
RUNTIME_MAY_IMPORT = frozenset({"nonstop.errors", "nonstop.net", RUNTIME})


@dataclass(frozen=True, slots=True)
class Import:
    """A dependency of ``importer`` on ``target``, from the statement ``text`` at ``source``."""

    importer: str
    target: str
    source: str  # file:line
    text: str  # the statement's first line


def module_names() -> dict[str, Path]:
    """Every module of the tree by dotted name (a package by its own name)."""
    out = {}
    for path in sorted((SRC / ROOT).rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        out[".".join(parts)] = path
    return out


def unit_of(module: str) -> str:
    """``nonstop.cluster.node`` -> ``nonstop.cluster``; ``nonstop.errors``; ``nonstop``."""
    return ".".join(module.split(".")[:2])


def imports(modules: dict[str, Path]) -> Iterator[Import]:
    """Every import of a ``nonstop`` module in the tree (module docstring: what counts)."""
    for name, path in modules.items():
        is_package = path.name == "__init__.py"
        package = name if is_package else name.rpartition(".")[0]
        code = path.read_text(encoding="utf-8")
        lines = code.splitlines()
        tree = ast.parse(code, str(path))
        for node in ast.walk(tree):
            targets: list[str] = []
            if isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")
                    base = base[: len(base) - (node.level - 1)]
                    module = ".".join([*base, *([node.module] if node.module else [])])
                else:
                    module = node.module or ""
                for alias in node.names:
                    sub = f"{module}.{alias.name}"
                    targets.append(sub if sub in modules else module)
            else:
                continue
            where = f"{path.relative_to(SRC.parent)}:{node.lineno}"
            text = lines[node.lineno - 1].strip()
            for target in sorted(set(targets)):
                if target == ROOT or target.startswith(ROOT + "."):
                    yield Import(name, target, where, text)


def unit_graph() -> dict[str, dict[str, list[Import]]]:
    """importer unit -> imported unit -> the imports behind that edge (no self edges)."""
    modules = module_names()
    graph: dict[str, dict[str, list[Import]]] = {unit_of(m): {} for m in modules}
    for imp in imports(modules):
        src, dst = unit_of(imp.importer), unit_of(imp.target)
        edges = graph[src].setdefault(dst, []) if src != dst else []
        if src != dst and all(e.source != imp.source for e in edges):
            edges.append(imp)  # one line per statement, however many names it imports
    return graph


def strongly_connected(graph: dict[str, dict[str, list[Import]]]) -> list[list[str]]:
    """Tarjan's strongly connected components, each sorted, in a stable order."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, {})):
            if w not in index:
                visit(w)
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
            components.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(components)


def describe(edges: list[Import]) -> str:
    return "\n".join(f"    {i.source}: {i.text}" for i in edges)


# ------------------------------------------------------------------ the rules
def test_the_runtime_imports_nothing_above_the_network() -> None:
    above = {
        dst: edges
        for dst, edges in unit_graph().get(RUNTIME, {}).items()
        if dst not in RUNTIME_MAY_IMPORT
    }
    report = "\n".join(f"  {RUNTIME} -> {dst}:\n{describe(e)}" for dst, e in sorted(above.items()))
    assert not above, f"the runtime imports above nonstop.net:\n{report}"


def test_no_package_imports_another_that_imports_it_back() -> None:
    graph = unit_graph()
    cycles = [c for c in strongly_connected(graph) if len(c) > 1]
    lines = []
    for component in cycles:
        lines.append(f"cycle between {', '.join(component)}:")
        members = set(component)
        for src in component:
            for dst, edges in sorted(graph[src].items()):
                if dst in members:
                    lines.append(f"  {src} -> {dst}:\n{describe(edges)}")
    assert not cycles, "package import cycles:\n" + "\n".join(lines)


# ------------------------------------------------------------ the tool itself
def test_the_graph_counts_deferred_typing_and_relative_imports(tmp_path: Path) -> None:
    """The analysis sees the import forms the docstring says it counts."""
    pkg = tmp_path / "nonstop"
    for sub in ("a", "b", "c", "d"):
        (pkg / sub).mkdir(parents=True)
        (pkg / sub / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text("")
    (pkg / "errors.py").write_text("")
    (pkg / "a" / "m.py").write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from nonstop.b import thing\n"
        "def f():\n    import nonstop.c.x\n"
        "from .. import errors\n"
        "from . import m2\n"
    )
    (pkg / "a" / "m2.py").write_text("")
    (pkg / "c" / "x.py").write_text("from nonstop import d\nimport nonstop\n")
    global SRC
    saved, SRC = SRC, tmp_path
    try:
        graph = unit_graph()
    finally:
        SRC = saved
    assert set(graph["nonstop.a"]) == {"nonstop.b", "nonstop.c", "nonstop.errors"}
    assert set(graph["nonstop.c"]) == {"nonstop.d", "nonstop"}
    assert graph["nonstop.a"]["nonstop.b"][0].source.endswith("a/m.py:3")
    looped: dict[str, dict[str, list[Import]]] = {**graph, "nonstop.b": {"nonstop.a": []}}
    assert ["nonstop.a", "nonstop.b"] in strongly_connected(looped)
