"""Checking recorded transaction histories: does what the clients saw have a serial explanation?

The deterministic simulator and the real multi-process fault runs both end
with a *history*: every transaction a client attempted, what it did, and what
it got back.  This module decides whether that history is serializable and,
when it is not, says precisely why, in the vocabulary of Adya's thesis (G0,
G1a, G1b, G1c, G-single, G2-item) as used by Elle (Kingsbury & Alvaro, VLDB
2020).  The design is in ``docs/design/history-checker.md``.

**List-append model** (:func:`check_list_append`).  Each key holds a list;
transactions append unique values and read whole lists.  Because values are
unique and lists only grow, every read of a key reveals a prefix of that key's
*version order* and which transaction wrote each element.  From that the
checker infers write-write (``ww``), write-read (``wr``) and read-write
(``rw``, anti-dependency) edges between committed transactions, optionally
real-time (``rt``) and process-order (``po``) edges, and looks for cycles
(:mod:`nonstop.sim.elle`).  Non-cycle anomalies (aborted and intermediate
reads, reads of values nobody wrote, duplicated elements, reads that
disagree on the order, reads inside a transaction that contradict its own
earlier reads and appends) are found directly.

**Bank model** (:func:`check_bank`).  The simulator's bank workload moves
money between accounts; every transaction that reads all accounts must see
the constant total.  A read that sees half of a transfer is the visible form
of a G1/G2 bug in that workload.

**Input.**  A history is a list of :class:`Txn` (or of dicts of the same
shape, which is also the JSON-lines format: one transaction per line)::

    {"type": "ok", "process": 0, "invoke": 1.25, "complete": 1.31,
     "ops": [["append", "x", 3], ["r", "y", [1, 2]], ["r", "z", null]]}

``type`` is ``ok`` (committed), ``fail`` (known not to have committed) or
``info`` (indeterminate: the client timed out or its node died).  Times are
only needed for ``realtime=True``.  Write them with :func:`dump_jsonl`, record
them live with :class:`Recorder`, and check a file with
``python -m nonstop.sim.history FILE`` (exit status 1 on anomalies).
"""

from __future__ import annotations

import argparse
import bisect
import json
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from nonstop.sim.elle import NAMES, ORDER, PO, RT, RW, WR, WW, Cycle, Graph, find_cycles

OK, FAIL, INFO = "ok", "fail", "info"
TYPES = (OK, FAIL, INFO)
APPEND, READ, WRITE = "append", "r", "w"
_OP_ALIASES = {"append": APPEND, "a": APPEND, "r": READ, "read": READ, "w": WRITE, "write": WRITE}

# The non-cycle anomaly kinds, in the order a report lists them.
G1A = "G1a"
G1B = "G1b"
GARBAGE = "garbage-read"
DUPLICATE = "duplicate-elements"
INCOMPATIBLE = "incompatible-order"
INTERNAL = "internal"
WRONG_TOTAL = "wrong-total"
NEGATIVE = "negative-balance"

Vals = tuple[Any, ...]
"""The list a read saw (or a prefix of it), as a tuple."""


class HistoryError(ValueError):
    """The history itself is malformed (not an anomaly of the system under test)."""


@dataclass(slots=True)
class Txn:
    """One transaction as a client saw it.

    ``ops`` are micro-operations ``(f, key, value)``: ``("append", k, v)``,
    ``("r", k, [values] | None)`` (``None``: not known, e.g. for an ``info``
    transaction) and, for the bank model, ``("w", account, balance)``.
    ``id`` is only for display (defaults to the position in the history).
    """

    ops: list[tuple[str, Any, Any]]
    type: str = OK
    process: Any = None
    invoke: float | None = None
    complete: float | None = None
    id: Any = None

    def describe(self) -> str:
        """``T3 (ok, process 1): append x 4; r y [1, 2]`` with long reads shortened."""
        parts = []
        for f, k, v in self.ops:
            parts.append(f"{f} {k!r} {_short(v) if f == READ else repr(v)}")
        proc = "" if self.process is None else f", process {self.process!r}"
        return f"T{self.id} ({self.type}{proc}): {'; '.join(parts)}"


def _short(v: Any) -> str:
    """A read's value for humans: long lists keep their ends, which is what explanations use."""
    if v is None:
        return "?"
    if not isinstance(v, tuple):
        return repr(v)
    if len(v) <= 8:
        return "[" + ", ".join(map(repr, v)) + "]"
    head = ", ".join(map(repr, v[:2]))
    tail = ", ".join(map(repr, v[-4:]))
    return f"[{head}, …({len(v) - 6} more)…, {tail}]"


def _freeze(x: Any) -> Any:
    """JSON gives lists; keys and values must be hashable, so lists become tuples."""
    if isinstance(x, list):
        t = tuple(x)
        if list in set(map(type, t)):  # nested lists are rare: keep the flat case in C
            return tuple(_freeze(e) for e in t)
        return t
    return x


def _txn(raw: Txn | Mapping[str, Any], pos: int) -> Txn:
    """Validate one transaction and bring it to the internal shape (tuples, canonical op names)."""
    if isinstance(raw, Txn):
        src: Mapping[str, Any] = {
            "ops": raw.ops,
            "type": raw.type,
            "process": raw.process,
            "invoke": raw.invoke,
            "complete": raw.complete,
            "id": raw.id,
        }
    elif isinstance(raw, Mapping):
        src = raw
    else:
        raise HistoryError(f"transaction {pos}: expected a Txn or a mapping, got {raw!r}")
    kind = src.get("type", OK)
    if kind not in TYPES:
        raise HistoryError(f"transaction {pos}: type must be one of {TYPES}, got {kind!r}")
    ops: list[tuple[str, Any, Any]] = []
    for op in src.get("ops") or ():
        if not isinstance(op, list | tuple) or len(op) not in (2, 3):
            raise HistoryError(f"transaction {pos}: bad micro-op {op!r} (want [f, key, value])")
        f = _OP_ALIASES.get(op[0])
        if f is None:
            raise HistoryError(f"transaction {pos}: unknown micro-op {op[0]!r}")
        value = op[2] if len(op) == 3 else None
        key = _freeze(op[1])
        if f == APPEND and value is None:
            raise HistoryError(f"transaction {pos}: append without a value: {op!r}")
        ops.append((f, key, _freeze(value)))
    ident = src.get("id")
    return Txn(
        ops=ops,
        type=kind,
        process=src.get("process"),
        invoke=src.get("invoke"),
        complete=src.get("complete"),
        id=pos if ident is None else ident,
    )


def normalise(history: Iterable[Txn | Mapping[str, Any]]) -> list[Txn]:
    """The history as fresh :class:`Txn` objects; :class:`HistoryError` if malformed."""
    return [_txn(raw, pos) for pos, raw in enumerate(history)]


# ------------------------------------------------------------------ results


@dataclass(frozen=True, slots=True)
class Anomaly:
    """One anomaly: its class, a human explanation, and the transactions (positions) involved.

    ``cycle`` lists the steps ``(from, relation, to)`` for cycle anomalies.
    ``str()`` is the explanation a person reads in a failing test or the CLI.
    """

    kind: str
    explanation: str
    txns: tuple[int, ...] = ()
    key: Any = None
    cycle: tuple[tuple[int, str, int], ...] = ()

    def __str__(self) -> str:
        return f"{self.kind}: {self.explanation}"


@dataclass(slots=True)
class Result:
    """The verdict: ``valid`` is true when no anomaly of any kind was found."""

    anomalies: dict[str, list[Anomaly]] = field(default_factory=dict)
    stats: dict[str, Any] = field(default_factory=dict)

    @property
    def valid(self) -> bool:
        return not self.anomalies

    def add(self, anomaly: Anomaly) -> None:
        self.anomalies.setdefault(anomaly.kind, []).append(anomaly)

    def report(self, limit: int = 3) -> str:
        """A readable verdict: counts per class and the first ``limit`` explanations of each."""
        s = self.stats
        head = f"{s.get('txns', 0)} transactions ({s.get('ok', 0)} ok, {s.get('fail', 0)} fail, "
        head += f"{s.get('info', 0)} info)"
        if self.valid:
            return f"valid: {head}, no anomalies"
        lines = [
            f"INVALID: {head}: "
            + ", ".join(f"{k} ×{len(v)}" for k, v in sorted(self.anomalies.items()))
        ]
        for kind in sorted(self.anomalies):
            found = self.anomalies[kind]
            for a in found[:limit]:
                lines.append(_indent(str(a)))
            if len(found) > limit:
                lines.append(f"  ... and {len(found) - limit} more {kind}")
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.report()


def _indent(text: str) -> str:
    return "\n".join("  " + line for line in text.splitlines())


def _counts(txns: Sequence[Txn]) -> dict[str, Any]:
    stats: dict[str, Any] = {"txns": len(txns), OK: 0, FAIL: 0, INFO: 0}
    for t in txns:
        stats[t.type] += 1
    return stats


# ------------------------------------------------------------- list-append


def check_list_append(
    history: Iterable[Txn | Mapping[str, Any]], *, realtime: bool = False, process: bool = False
) -> Result:
    """Check a list-append history for serializability anomalies.

    With ``realtime`` the checker also demands *strict* serializability: a
    transaction that completed before another was invoked must precede it
    (cycles through such ``rt`` edges are reported as ``...-realtime``).
    With ``process`` each process's transactions must take effect in the order
    it ran them (``...-process``).  Both need ``invoke`` times (``realtime``
    also ``complete`` times); transactions without them get no such edges.

    Appended values must be unique per key (:class:`HistoryError` otherwise):
    that is what makes a read reveal who wrote each element.
    """
    started = time.perf_counter()
    txns = normalise(history)
    result = Result(stats=_counts(txns))
    writer, final = _writers(txns)
    reads = _reads(txns, result)
    graph = Graph(len(txns))
    evidence: dict[tuple[int, int, int], tuple[Any, ...]] = {}
    observed: set[int] = set()
    orders = {
        k: _order_key(txns, k, rs, writer.get(k, {}), final, observed, result)
        for k, rs in reads.items()
    }
    committed = [t.type == OK or (t.type == INFO and i in observed) for i, t in enumerate(txns)]
    for k, (order, compatible) in orders.items():
        _key_edges(txns, k, order, compatible, writer.get(k, {}), committed, graph, evidence)
    if realtime:
        _realtime_edges(txns, graph, evidence)
    if process:
        _process_edges(txns, graph, evidence)
    for cycle in find_cycles(graph, order=realtime or process):
        result.add(_cycle_anomaly(txns, cycle, evidence))
    result.stats.update(
        keys=len(reads),
        edges=graph.edge_count(),
        seconds=round(time.perf_counter() - started, 4),
    )
    return result


def _writers(txns: Sequence[Txn]) -> tuple[dict[Any, dict[Any, int]], dict[tuple[int, Any], Any]]:
    """Who appended each value (``writer[key][value]``) and each txn's last append per key."""
    writer: dict[Any, dict[Any, int]] = {}
    final: dict[tuple[int, Any], Any] = {}
    for pos, t in enumerate(txns):
        for f, k, v in t.ops:
            if f == APPEND:
                w = writer.setdefault(k, {})
                other = w.get(v)
                if other is not None:
                    raise HistoryError(
                        f"value {v!r} appended to key {k!r} by both T{txns[other].id} and "
                        f"T{t.id}: appended values must be unique per key"
                    )
                w[v] = pos
                final[(pos, k)] = v
            elif f != READ:
                raise HistoryError(f"T{t.id}: micro-op {f!r} is not part of the list-append model")
    return writer, final


def _reads(txns: Sequence[Txn], result: Result) -> dict[Any, list[tuple[int, Vals, bool]]]:
    """Every known read of a committed txn, per key: ``(txn, values, external)``.

    A read is *external* if the transaction had not appended to that key
    before it: only those say something about other transactions.  Reads
    after the transaction's own reads and appends must agree with them (the
    ``internal`` anomaly: a transaction does not see its own writes, or its
    view of a key changed under it).
    """
    reads: dict[Any, list[tuple[int, Vals, bool]]] = {}
    for pos, t in enumerate(txns):
        if t.type != OK:
            continue  # an info txn's reads are unknown; a failed one's do not matter
        known: dict[Any, Vals] = {}  # key -> what the txn must see now (after a read)
        own: dict[Any, list[Any]] = {}  # key -> own appends not yet covered by a read
        later: dict[Any, set[Any]] = {}  # key -> every value the txn appends
        for f, k, v in t.ops:
            if f == APPEND:
                later.setdefault(k, set()).add(v)
        for f, k, v in t.ops:
            if f == APPEND:
                if k in known:
                    known[k] = (*known[k], v)
                else:
                    own.setdefault(k, []).append(v)
                continue
            if v is None:
                continue
            if not isinstance(v, tuple):
                raise HistoryError(f"T{t.id}: read of {k!r} returned {v!r}, not a list")
            mine = own.get(k)
            if k in known and v != known[k]:
                result.add(
                    Anomaly(
                        INTERNAL,
                        f"T{t.id} read {k!r} = {_short(v)} but its own earlier reads and "
                        f"appends imply {_short(known[k])}\n  {t.describe()}",
                        (pos,),
                        k,
                    )
                )
            elif mine and v[-len(mine) :] != tuple(mine):
                result.add(
                    Anomaly(
                        INTERNAL,
                        f"T{t.id} read {k!r} = {_short(v)}, which does not end with its own "
                        f"appends {_short(tuple(mine))}\n  {t.describe()}",
                        (pos,),
                        k,
                    )
                )
            external = k not in known and not mine
            if external and k in later and not later[k].isdisjoint(v):
                result.add(
                    Anomaly(
                        INTERNAL,
                        f"T{t.id} read {k!r} = {_short(v)}, which contains "
                        f"{', '.join(repr(x) for x in v if x in later[k])} that it appends "
                        f"only later\n  {t.describe()}",
                        (pos,),
                        k,
                    )
                )
                external = False  # a read from the future says nothing about the others
            reads.setdefault(k, []).append((pos, v, external))
            known[k] = v
            own.pop(k, None)
    return reads


def _order_key(
    txns: Sequence[Txn],
    k: Any,
    rs: list[tuple[int, Vals, bool]],
    writer: dict[Any, int],
    final: dict[tuple[int, Any], Any],
    observed: set[int],
    result: Result,
) -> tuple[Vals, list[tuple[int, Vals, bool]]]:
    """Version order of ``k`` and the reads consistent with it; flags the non-cycle anomalies.

    Adds to ``observed`` every transaction whose append some read shows: an
    ``info`` transaction in that set did commit (atomically, or the missing
    half shows up as an anomaly of its own).
    """
    # The version order is the longest read without duplicates; every other
    # read must be a prefix of it.
    order: Vals = ()
    order_reader = -1
    clean: list[tuple[int, Vals, bool]] = []
    for pos, vals, ext in rs:
        if len(set(vals)) != len(vals):
            dups = sorted({v for v in vals if vals.count(v) > 1}, key=repr)
            result.add(
                Anomaly(
                    DUPLICATE,
                    f"T{txns[pos].id} read {k!r} = {_short(vals)}, in which "
                    f"{', '.join(map(repr, dups))} appear more than once",
                    (pos,),
                    k,
                )
            )
            _check_values(txns, k, pos, vals, writer, observed, result)
            continue
        clean.append((pos, vals, ext))
        if len(vals) > len(order):
            order, order_reader = vals, pos
    compatible: list[tuple[int, Vals, bool]] = []
    for pos, vals, ext in clean:
        if order[: len(vals)] == vals:
            compatible.append((pos, vals, ext))
            continue
        i = next(i for i, (a, b) in enumerate(zip(vals, order, strict=False)) if a != b)
        result.add(
            Anomaly(
                INCOMPATIBLE,
                f"T{txns[pos].id} read {k!r} = {_short(vals)} and T{txns[order_reader].id} read "
                f"{_short(order)}: neither is a prefix of the other (element {i}: "
                f"{vals[i]!r} vs {order[i]!r}), so no single order of appends explains both",
                (pos, order_reader),
                k,
            )
        )
        _check_values(txns, k, pos, vals, writer, observed, result)

    # Each element of the order is judged once: who wrote it, and was that committed?
    bad: list[int] = []  # indexes in ``order`` whose writer failed or does not exist
    for i, v in enumerate(order):
        w = writer.get(v)
        if w is None or txns[w].type == FAIL:
            bad.append(i)
        else:
            observed.add(w)
    for pos, vals, _ in compatible:
        n_bad = bisect.bisect_left(bad, len(vals))
        if n_bad:
            _report_bad(txns, k, pos, vals, [order[i] for i in bad[:n_bad]], writer, result)
        _check_intermediate(txns, k, pos, vals, writer, final, result)
    return order, compatible


def _key_edges(
    txns: Sequence[Txn],
    k: Any,
    order: Vals,
    compatible: list[tuple[int, Vals, bool]],
    writer: dict[Any, int],
    committed: list[bool],
    graph: Graph,
    evidence: dict[tuple[int, int, int], tuple[Any, ...]],
) -> None:
    """The ww, wr and rw edges that the version order of ``k`` and its reads imply.

    Edges only join committed transactions, so elements written by failed
    transactions or by nobody (already flagged) are skipped, and each
    committed element is linked to the next committed one.
    """
    committed_idx = [i for i, v in enumerate(order) if v in writer and committed[writer[v]]]
    # Committed appends that no read shows are, in the true order, after everything
    # any read shows (each read is a prefix of it).  Their order among themselves is
    # unknown.  An ``info`` transaction none of whose appends was seen anywhere may
    # never have committed, so it is left out.
    seen = set(order)
    unseen_value = {w: v for v, w in writer.items() if v not in seen and committed[w]}
    unseen = sorted(unseen_value)
    # ww: consecutive committed elements of the order, then the last one to the unseen.
    wr_of = [writer[order[i]] for i in committed_idx]
    for j in range(1, len(committed_idx)):
        a, b = wr_of[j - 1], wr_of[j]
        if graph.add(a, b, WW):
            evidence[(a, b, WW)] = (k, order[committed_idx[j - 1]], order[committed_idx[j]])
    if committed_idx:
        a = wr_of[-1]
        for b in unseen:
            if graph.add(a, b, WW):
                evidence[(a, b, WW)] = (k, order[committed_idx[-1]], unseen_value[b], True)
    # wr and rw from external reads: the last committed element seen, and the next one
    # unseen (or, for a read of everything observed, every unobserved committed append).
    for pos, vals, ext in compatible:
        if not ext:
            continue
        n = len(vals)
        j = bisect.bisect_left(committed_idx, n)  # first committed element not seen
        if j > 0:
            w = wr_of[j - 1]
            if graph.add(w, pos, WR):
                evidence[(w, pos, WR)] = (k, order[committed_idx[j - 1]])
        last = vals[-1] if vals else None
        # A read that ends inside another transaction's appends is G1b, reported as
        # such; the rw edge back to that same transaction would only repeat it.
        partial = writer.get(last) if vals else None
        if j < len(committed_idx):
            w = wr_of[j]
            if w != partial and graph.add(pos, w, RW):
                evidence[(pos, w, RW)] = (k, last, order[committed_idx[j]], False)
        else:
            for w in unseen:
                if w != partial and graph.add(pos, w, RW):
                    evidence[(pos, w, RW)] = (k, last, unseen_value[w], True)


def _check_values(
    txns: Sequence[Txn],
    k: Any,
    pos: int,
    vals: Vals,
    writer: dict[Any, int],
    observed: set[int],
    result: Result,
) -> None:
    """Aborted and garbage values in a read that is not part of the version order."""
    observed.update(writer[v] for v in vals if v in writer)
    bad = [v for v in vals if writer.get(v) is None or txns[writer[v]].type == FAIL]
    if bad:
        _report_bad(txns, k, pos, vals, bad, writer, result)


def _report_bad(
    txns: Sequence[Txn],
    k: Any,
    pos: int,
    vals: Vals,
    bad: list[Any],
    writer: dict[Any, int],
    result: Result,
) -> None:
    """G1a for values written by failed transactions; garbage-read for values nobody wrote."""
    reader = txns[pos]
    aborted = [v for v in bad if v in writer]
    garbage = [v for v in bad if v not in writer]
    if aborted:
        writers = sorted({writer[v] for v in aborted})
        result.add(
            Anomaly(
                G1A,
                f"T{reader.id} read {k!r} = {_short(vals)}, which contains "
                f"{', '.join(map(repr, aborted))} appended by aborted "
                + ", ".join(f"T{txns[w].id}" for w in writers)
                + "\n  "
                + "\n  ".join(txns[w].describe() for w in (pos, *writers)),
                (pos, *writers),
                k,
            )
        )
    if garbage:
        result.add(
            Anomaly(
                GARBAGE,
                f"T{reader.id} read {k!r} = {_short(vals)}, which contains "
                f"{', '.join(map(repr, garbage))} that no transaction appended to {k!r}",
                (pos,),
                k,
            )
        )


def _check_intermediate(
    txns: Sequence[Txn],
    k: Any,
    pos: int,
    vals: Vals,
    writer: dict[Any, int],
    final: dict[tuple[int, Any], Any],
    result: Result,
) -> None:
    """G1b: the read ends in the middle of another committed transaction's appends to ``k``."""
    if not vals:
        return
    w = writer.get(vals[-1])
    if w is None or w == pos or txns[w].type == FAIL:
        return
    last = final[(w, k)]
    if last != vals[-1]:
        result.add(
            Anomaly(
                G1B,
                f"T{txns[pos].id} read {k!r} = {_short(vals)}, ending with {vals[-1]!r}, an "
                f"intermediate append of T{txns[w].id}, whose final append to {k!r} is "
                f"{last!r}\n  {txns[pos].describe()}\n  {txns[w].describe()}",
                (pos, w),
                k,
            )
        )


def _realtime_edges(
    txns: Sequence[Txn], graph: Graph, evidence: dict[tuple[int, int, int], tuple[Any, ...]]
) -> None:
    """``a -rt-> b`` when ``a`` completed before ``b`` was invoked, transitively reduced.

    Sweeping the events in time order, the *frontier* holds the completed
    transactions not yet known to precede a later completed one.  A
    transaction invoked now follows everything in the frontier; when it
    completes it replaces its own predecessors there.  The edge count stays
    proportional to concurrency, not to the square of the history.
    """
    events: list[tuple[float, int, int]] = []
    for pos, t in enumerate(txns):
        if t.type == FAIL or t.invoke is None:
            continue
        events.append((t.invoke, 0, pos))  # at equal times an invoke is not "after"
        if t.type == OK and t.complete is not None:
            events.append((t.complete, 1, pos))
    events.sort()
    frontier: set[int] = set()
    preds: dict[int, list[int]] = {}
    for _, is_completion, pos in events:
        if is_completion:
            frontier.difference_update(preds.get(pos, ()))
            frontier.add(pos)
        else:
            preds[pos] = list(frontier)
            for a in preds[pos]:
                if graph.add(a, pos, RT):
                    evidence[(a, pos, RT)] = (txns[a].complete, txns[pos].invoke)


def _process_edges(
    txns: Sequence[Txn], graph: Graph, evidence: dict[tuple[int, int, int], tuple[Any, ...]]
) -> None:
    """``a -po-> b`` from each committed txn to every later one of the same process.

    Only edges from ``ok`` transactions: after an ``info`` the process cannot
    know whether that transaction is still in flight.  Order within a process
    is by invoke time when all have one, else the order in the history.
    """
    by_process: dict[Any, list[int]] = {}
    for pos, t in enumerate(txns):
        if t.type != FAIL and t.process is not None:
            by_process.setdefault(t.process, []).append(pos)
    for proc, positions in by_process.items():
        if all(txns[p].invoke is not None for p in positions):
            positions.sort(key=lambda p: (txns[p].invoke, p))
        last_ok: int | None = None
        for pos in positions:
            if last_ok is not None and graph.add(last_ok, pos, PO):
                evidence[(last_ok, pos, PO)] = (proc,)
            if txns[pos].type == OK:
                last_ok = pos


def _explain_edge(txns: Sequence[Txn], a: int, b: int, rel: int, ev: tuple[Any, ...]) -> str:
    """One step of a cycle in words, from the evidence recorded when the edge was added."""
    ta, tb = f"T{txns[a].id}", f"T{txns[b].id}"
    if rel == WW:
        k, va, vb, *unread = ev
        if unread:
            return (
                f"{ta} appended {va!r} to {k!r}, the last element any read shows, and {tb}'s "
                f"committed append {vb!r} was never read, so it came later"
            )
        return f"{ta} appended {va!r} to {k!r}, and {tb} appended {vb!r} right after it"
    if rel == WR:
        k, v = ev
        return f"{tb} read {k!r} up to {v!r}, which {ta} appended"
    if rel == RW:
        k, seen, nxt, unread = ev
        what = "as empty" if seen is None else f"up to {seen!r}"
        if unread:
            return (
                f"{ta} read {k!r} {what}, everything any read shows, missing {tb}'s committed "
                f"append {nxt!r} (never read, so after all of it)"
            )
        return f"{ta} read {k!r} {what}, missing {nxt!r}, the next append, by {tb}"
    if rel == RT:
        done, started = ev
        return f"{ta} completed (t={done}) before {tb} was invoked (t={started})"
    (proc,) = ev
    return f"{ta} ran before {tb} on process {proc!r}"


def _cycle_anomaly(
    txns: Sequence[Txn], cycle: Cycle, evidence: dict[tuple[int, int, int], tuple[Any, ...]]
) -> Anomaly:
    nodes = cycle.nodes
    steps = []
    lines = []
    for i, a in enumerate(nodes):
        b = nodes[(i + 1) % len(nodes)]
        rel = cycle.rels[i]
        steps.append((a, NAMES[rel], b))
        lines.append(
            f"T{txns[a].id} -{NAMES[rel]}-> T{txns[b].id}: "
            + _explain_edge(txns, a, b, rel, evidence[(a, b, rel)])
        )
    path = " ".join(f"T{txns[a].id} -{r}->" for a, r, _ in steps) + f" T{txns[nodes[0]].id}"
    rw = cycle.count(RW)
    why = {
        0: "a cycle without anti-dependencies",
        1: "a cycle with exactly one anti-dependency (rw)",
    }.get(rw, f"a cycle with {rw} anti-dependencies (rw)")
    if cycle.count(ORDER):
        why += ", which needs the real-time/process order"
    text = (
        f"{why} among {len(nodes)} transactions: {path}\n"
        + "\n".join("  " + line for line in lines)
        + "\n"
        + "\n".join("  " + txns[a].describe() for a in nodes)
    )
    return Anomaly(cycle.kind(), text, tuple(nodes), None, tuple(steps))


# -------------------------------------------------------------------- bank


def check_bank(
    history: Iterable[Txn | Mapping[str, Any]],
    *,
    total: int,
    accounts: Iterable[Any] | None = None,
    allow_negative: bool = True,
) -> Result:
    """Every committed read of all accounts must sum to ``total`` (the bank invariant).

    A transaction's *snapshot* is its first read of each account made before
    it wrote anything (``("r", account, balance)`` ops; ``("w", account,
    balance)`` marks a write).  Snapshots that cover ``accounts`` (default:
    every account named anywhere in the history) are checked; partial reads
    are not.  A wrong sum means the reader saw part of a transfer (or money
    was created or lost).  With ``allow_negative=False`` a negative balance in
    any committed read is flagged too.
    """
    started = time.perf_counter()
    txns = normalise(history)
    result = Result(stats=_counts(txns))
    names = set(accounts) if accounts is not None else {k for t in txns for _, k, _ in t.ops}
    checked = 0
    for pos, t in enumerate(txns):
        if t.type != OK:
            continue
        snapshot: dict[Any, Any] = {}
        for f, k, v in t.ops:
            if f == APPEND:
                raise HistoryError(f"T{t.id}: append is not part of the bank model")
            if f == WRITE:
                break
            if v is not None and k not in snapshot:
                snapshot[k] = v
        if not allow_negative:
            negative = {k: v for f, k, v in t.ops if f == READ and v is not None and v < 0}
            if negative:
                result.add(Anomaly(NEGATIVE, f"T{t.id} read negative balances {negative}", (pos,)))
        if not names or not names <= snapshot.keys():
            continue
        checked += 1
        seen = {k: snapshot[k] for k in sorted(names, key=repr)}
        got = sum(seen.values())
        if got != total:
            result.add(
                Anomaly(
                    WRONG_TOTAL,
                    f"T{t.id} read balances {seen} summing to {got}, not the constant total "
                    f"{total} (off by {got - total:+}): it saw part of a transfer, or money "
                    f"was created or lost",
                    (pos,),
                )
            )
    result.stats.update(
        full_reads=checked, accounts=len(names), seconds=round(time.perf_counter() - started, 4)
    )
    return result


# --------------------------------------------------------------- recording


class Recorder:
    """Thread-safe recorder of a live history (real runs, or the simulator with its clock).

    ``h = rec.invoke(process, ops)`` before the client sends a transaction
    (reads may be ``None``), ``rec.complete(h, "ok", ops_with_results)``
    after.  Anything never completed stays ``info``, which is exactly what a
    client that timed out knows.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self.clock = clock
        self._lock = threading.Lock()
        self._txns: list[Txn] = []

    def invoke(self, process: Any, ops: Iterable[Sequence[Any]] = ()) -> int:
        now = self.clock()
        with self._lock:
            self._txns.append(
                Txn(ops=[tuple(o) for o in ops], type=INFO, process=process, invoke=now)
            )
            return len(self._txns) - 1

    def complete(self, handle: int, type: str, ops: Iterable[Sequence[Any]] | None = None) -> None:
        if type not in TYPES:
            raise ValueError(f"type must be one of {TYPES}, got {type!r}")
        now = self.clock()
        with self._lock:
            t = self._txns[handle]
            t.type = type
            if ops is not None:
                t.ops = [tuple(o) for o in ops]
            t.complete = None if type == INFO else now

    def history(self) -> list[Txn]:
        with self._lock:
            return normalise(self._txns)


# ------------------------------------------------------------- JSON lines


def to_json(t: Txn) -> dict[str, Any]:
    """One transaction as a JSON-able dict (the JSON-lines format, one per line)."""
    d: dict[str, Any] = {"type": t.type, "ops": [[f, k, v] for f, k, v in t.ops]}
    for name in ("process", "invoke", "complete", "id"):
        value = getattr(t, name)
        if value is not None:
            d[name] = value
    return d


def dump_jsonl(history: Iterable[Txn | Mapping[str, Any]], out: str | Path | IO[str]) -> None:
    """Write a history as JSON lines (tuples become lists)."""
    txns = normalise(history)
    if isinstance(out, str | Path):
        with open(out, "w", encoding="utf-8") as fh:
            dump_jsonl(txns, fh)
        return
    for t in txns:
        out.write(json.dumps(to_json(t), separators=(",", ":")) + "\n")


def load_jsonl(src: str | Path | IO[str]) -> list[Txn]:
    """Read a JSON-lines history (blank lines are skipped); :class:`HistoryError` if malformed."""
    if isinstance(src, str | Path):
        with open(src, encoding="utf-8") as fh:
            return load_jsonl(fh)
    raw = []
    for n, line in enumerate(src, 1):
        if not line.strip():
            continue
        try:
            raw.append(json.loads(line))
        except json.JSONDecodeError as exc:
            raise HistoryError(f"line {n}: not JSON: {exc}") from None
    return normalise(raw)


def main(argv: Sequence[str] | None = None) -> int:
    """The CLI: print the verdict; exit status 0 if valid, 1 on anomalies, 2 on bad input."""
    p = argparse.ArgumentParser(
        prog="python -m nonstop.sim.history",
        description="Check a JSON-lines transaction history for serializability anomalies.",
    )
    p.add_argument("file", help="history, one transaction per line ('-' for stdin)")
    p.add_argument("--model", choices=("list-append", "bank"), default="list-append")
    p.add_argument("--realtime", action="store_true", help="strict serializability (rt edges)")
    p.add_argument("--process", action="store_true", help="per-process order (po edges)")
    p.add_argument("--total", type=int, help="bank: the constant total of all balances")
    p.add_argument("--accounts", help="bank: comma-separated account names (default: all seen)")
    p.add_argument("--no-negative", action="store_true", help="bank: flag negative balances")
    p.add_argument("--show", type=int, default=5, help="explanations shown per anomaly class")
    args = p.parse_args(argv)
    try:
        txns = load_jsonl(sys.stdin if args.file == "-" else args.file)
        if args.model == "bank":
            if args.total is None:
                p.error("--model bank needs --total")
            accounts = args.accounts.split(",") if args.accounts else None
            result = check_bank(
                txns, total=args.total, accounts=accounts, allow_negative=not args.no_negative
            )
        else:
            result = check_list_append(txns, realtime=args.realtime, process=args.process)
    except (HistoryError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(result.report(limit=args.show))
    return 0 if result.valid else 1


if __name__ == "__main__":
    sys.exit(main())
