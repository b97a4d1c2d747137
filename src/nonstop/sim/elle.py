"""Typed dependency graphs and the Elle-style cycle search behind :mod:`nonstop.sim.history`.

Nodes are small integers (a transaction's position in the history).  An edge
``a -> b`` carries a *bit set* of relations, because the same pair of
transactions is often related in several ways (``a`` wrote a value that ``b``
both overwrote and read).  Every search below takes a *mask*: it walks only
edges that carry at least one of the masked relations.  That single trick is
what classifies anomalies the way Adya and Elle do:

* **G0** -- a cycle of ``ww`` edges only;
* **G1c** -- a cycle of ``ww``/``wr`` edges with at least one ``wr``;
* **G-single** -- a cycle with exactly one ``rw`` edge;
* **G2-item** -- a cycle that needs two or more ``rw`` edges;
* the same four with ``-realtime`` / ``-process`` when the cycle needs an order
  edge (``rt``: one transaction completed before the other was invoked;
  ``po``: same process, one after the other).

The search never enumerates cycles (there can be exponentially many).  Per
strongly connected component it finds *one* short witness per class: Tarjan's
algorithm restricted to a mask splits a component into sub-components, and an
edge whose two ends share a sub-component closes a cycle; breadth-first search
inside that sub-component finds the shortest way back.  In particular an ``rw``
edge ``a -> b`` with ``a`` and ``b`` in one ``ww|wr`` sub-component is a
G-single witness, and an ``rw`` edge whose ends are in one component of the full
graph but *different* ``ww|wr`` sub-components lies only on cycles with at
least two ``rw`` edges (any cycle through it with one ``rw`` would put ``b``
and ``a`` in the same ``ww|wr`` sub-component), a G2-item witness.

Everything is iterative (no recursion limits) and linear in the size of the
graph per mask, so histories of many thousands of transactions are checked in
well under a second; the cycle searches only run inside non-trivial
components, which a valid history does not have.
"""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from itertools import pairwise

# Relation bits.  Data dependencies first, then order edges.
WW = 1
WR = 2
RW = 4
RT = 8
PO = 16

DATA = WW | WR | RW
ORDER = RT | PO
NAMES = {WW: "ww", WR: "wr", RW: "rw", RT: "rt", PO: "po"}


def rel_names(bits: int) -> list[str]:
    """The relation names in a bit set, strongest evidence first (for explanations)."""
    return [name for bit, name in NAMES.items() if bits & bit]


class Graph:
    """A directed graph on ``0..n-1`` whose edges carry relation bit sets.

    ``adj[a]`` maps each successor ``b`` to the bits of ``a -> b``.  Self-edges
    are dropped on insertion: a transaction depending on itself says nothing
    about isolation.
    """

    __slots__ = ("adj", "n")

    def __init__(self, n: int) -> None:
        self.n = n
        self.adj: list[dict[int, int]] = [{} for _ in range(n)]

    def add(self, a: int, b: int, rel: int) -> bool:
        """Add ``rel`` to ``a -> b``; True if that relation was new on the pair."""
        if a == b:
            return False
        succ = self.adj[a]
        old = succ.get(b, 0)
        if old & rel:
            return False
        succ[b] = old | rel
        return True

    def bits(self, a: int, b: int) -> int:
        return self.adj[a].get(b, 0)

    def edge_count(self) -> int:
        return sum(len(s) for s in self.adj)


def scc(graph: Graph, mask: int, nodes: Iterable[int] | None = None) -> list[list[int]]:
    """Non-trivial strongly connected components of the ``mask`` subgraph (Tarjan, iterative).

    With ``nodes`` given, the walk stays inside that set (used to split one
    component further under a narrower mask).  Single nodes are never
    returned: the graph has no self-edges, so a single node is never a cycle.
    """
    adj = graph.adj
    allowed: set[int] | None = None
    if nodes is None:
        roots: Iterable[int] = range(graph.n)
    else:
        allowed = set(nodes)
        roots = sorted(allowed)
    index: dict[int, int] = {}
    low: dict[int, int] = {}
    on_stack: set[int] = set()
    stack: list[int] = []
    out: list[list[int]] = []
    counter = 0
    for root in roots:
        if root in index:
            continue
        # Each frame: (node, iterator over its masked successors).
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        work = [(root, iter(adj[root].items()))]
        while work:
            v, it = work[-1]
            advanced = False
            for w, bits in it:
                if not bits & mask or (allowed is not None and w not in allowed):
                    continue
                if w not in index:
                    index[w] = low[w] = counter
                    counter += 1
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(adj[w].items())))
                    advanced = True
                    break
                if w in on_stack and index[w] < low[v]:
                    low[v] = index[w]
            if advanced:
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                if low[v] < low[parent]:
                    low[parent] = low[v]
            if low[v] == index[v]:
                comp = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    comp.append(w)
                    if w == v:
                        break
                if len(comp) > 1:
                    comp.sort()
                    out.append(comp)
    return out


def component_ids(components: Sequence[Sequence[int]], start: int = 0) -> dict[int, int]:
    """Map each node of the given components to a component number (from ``start``)."""
    ids: dict[int, int] = {}
    for i, comp in enumerate(components, start):
        for v in comp:
            ids[v] = i
    return ids


def shortest_path(graph: Graph, mask: int, src: int, dst: int, within: set[int]) -> list[int]:
    """Shortest ``src -> ... -> dst`` path over ``mask`` edges inside ``within`` (BFS).

    Callers only ask when a path is known to exist (both ends are in one
    strongly connected component of that mask), so a miss is a bug.
    """
    if src == dst:
        return [src]
    adj = graph.adj
    parent = {src: src}
    queue = deque([src])
    while queue:
        v = queue.popleft()
        for w, bits in adj[v].items():
            if bits & mask and w in within and w not in parent:
                parent[w] = v
                if w == dst:
                    path = [w]
                    while w != src:
                        w = parent[w]
                        path.append(w)
                    path.reverse()
                    return path
                queue.append(w)
    raise AssertionError(f"no path {src} -> {dst} under mask {mask}")  # pragma: no cover


@dataclass(frozen=True, slots=True)
class Cycle:
    """A witness cycle ``nodes[0] -> nodes[1] -> ... -> nodes[0]`` and the relation used per step.

    ``rels[i]`` is the single relation chosen to explain ``nodes[i] ->
    nodes[i+1]`` (wrapping around): the one that made the step legal under the
    search's mask, preferring the weakest claim (``ww`` over ``wr`` over
    ``rw`` over order edges) so that the classification is not inflated.
    """

    nodes: tuple[int, ...]
    rels: tuple[int, ...]

    def count(self, rel: int) -> int:
        return sum(1 for r in self.rels if r & rel)

    def kind(self) -> str:
        """The anomaly class of this cycle (see the module docstring)."""
        rw = self.count(RW)
        if rw == 0:
            base = "G1c" if self.count(WR) else "G0"
        elif rw == 1:
            base = "G-single"
        else:
            base = "G2-item"
        if self.count(RT):
            return base + "-realtime"
        if self.count(PO):
            return base + "-process"
        return base


def _pick(bits: int, prefer: int) -> int:
    """The one relation to show for an edge: the lowest bit within ``prefer``."""
    chosen = bits & prefer
    return chosen & -chosen


def _close(graph: Graph, a: int, b: int, first: int, mask: int, within: set[int]) -> Cycle:
    """The cycle made of edge ``a -first-> b`` and the shortest ``mask`` path ``b -> a``."""
    path = shortest_path(graph, mask, b, a, within)
    nodes = (a, *path[:-1])
    rels = [first]
    for x, y in pairwise(path):
        rels.append(_pick(graph.bits(x, y), mask))
    return Cycle(nodes, tuple(rels))


def _same(ids: dict[int, int], a: int, b: int) -> bool:
    """True if ``a`` and ``b`` are in one component of ``ids`` (nodes outside none are alone)."""
    ia = ids.get(a)
    return ia is not None and ia == ids.get(b)


def _neither_same(ids: dict[int, int], other: dict[int, int], a: int, b: int) -> bool:
    """``a`` and ``b`` in one component of neither ``ids`` nor ``other``."""
    return not _same(ids, a, b) and not _same(other, a, b)


def find_cycles(graph: Graph, order: bool = False) -> list[Cycle]:
    """One witness cycle per anomaly class per component (see the module docstring).

    Data-only classes (G0, G1c, G-single, G2-item) are searched on the
    ``ww|wr|rw`` graph.  With ``order`` true, the ``rt``/``po`` edges in the
    graph are searched too, and only cycles that *need* an order edge are
    added (so a history with one G-single is not reported twice).

    A closing edge must be *pure* for its class: a G1c witness starts with an
    edge that is ``wr`` but not also ``ww``, a G-single with one that is
    ``rw`` and neither ``ww`` nor ``wr``, and so on.  An edge that also
    carries a weaker relation is already explained by the weaker class.
    """
    cycles: list[Cycle] = []
    data_comps = scc(graph, DATA)
    data_id = component_ids(data_comps)
    wwwr_id: dict[int, int] = {}
    n_subs = 0
    for comp in data_comps:
        members = set(comp)
        # G0: any cycle of ww edges, one per ww sub-component.
        for sub in scc(graph, WW, comp):
            _add(cycles, _first_closing(graph, sub, WW, 0, WW))
        # G1c and G-single both close inside ww|wr sub-components.
        subs = scc(graph, WW | WR, comp)
        wwwr_id.update(component_ids(subs, n_subs))
        n_subs += len(subs)
        for sub in subs:
            _add(cycles, _first_closing(graph, sub, WR, WW, WW | WR))
            _add(cycles, _first_closing(graph, sub, RW, WW | WR, WW | WR))
        # G2-item: a pure rw edge that no single-rw cycle can close.
        _add(
            cycles,
            _first_closing(
                graph, comp, RW, WW | WR, DATA, members, lambda a, b: not _same(wwwr_id, a, b)
            ),
        )
    if not order:
        return cycles
    nonrw = WW | WR | ORDER
    for comp in scc(graph, DATA | ORDER):
        members = set(comp)
        subs = scc(graph, nonrw, comp)
        nonrw_id = component_ids(subs)
        for sub in subs:
            # G0/G1c-realtime: a pure order edge closes a cycle without rw.
            _add(cycles, _first_closing(graph, sub, ORDER, WW | WR, nonrw))
            # G-single-realtime: an rw edge whose way back needs an order edge.
            _add(
                cycles,
                _first_closing(
                    graph, sub, RW, WW | WR, nonrw, None, lambda a, b: not _same(wwwr_id, a, b)
                ),
            )
        # G2-item-realtime: an rw edge only on cycles with order edges and 2+ rw.
        _add(
            cycles,
            _first_closing(
                graph,
                comp,
                RW,
                WW | WR,
                DATA | ORDER,
                members,
                functools.partial(_neither_same, nonrw_id, data_id),
            ),
        )
    return cycles


def _add(cycles: list[Cycle], cycle: Cycle | None) -> None:
    if cycle is not None:
        cycles.append(cycle)


def _first_closing(
    graph: Graph,
    sub: list[int],
    first: int,
    forbid: int,
    path_mask: int,
    members: set[int] | None = None,
    accept: Callable[[int, int], bool] | None = None,
) -> Cycle | None:
    """A cycle in ``sub`` that starts with an edge carrying ``first`` but none of ``forbid``.

    ``sub`` must be strongly connected under ``path_mask``, so that any such
    edge inside it closes a cycle; ``accept`` narrows which edges qualify.
    """
    if members is None:
        members = set(sub)
    adj = graph.adj
    for a in sub:
        for b, bits in adj[a].items():
            if (
                bits & first
                and not bits & forbid
                and b in members
                and (accept is None or accept(a, b))
            ):
                return _close(graph, a, b, _pick(bits, first), path_mask, members)
    return None
