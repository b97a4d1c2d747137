"""Where a machine's ``Persist`` actions go: one router, shared by both runtimes.

A node's durable keys need not all live in one store.  The cluster layer's
keys (``raft/``, ``fd/``, ...) go to the node's cluster store; the
distributed-commit machine's keys (``dtx/``) must be written in the *object*
store's commits, together with the prepared write sets and phase-two effects
they stand for (``docs/design/data-path.md`` section 5).  Which store holds
which prefix is the node's composition's business (``nonstop.node``), not the
runtime's: the composition registers a :class:`Persister` per key prefix on
the runtime's :class:`PersistRouter`, and every other key goes to the
runtime's own store (the real runtime's LMDB writer, the simulator's disk).
The real runtime (:mod:`nonstop.runtime.real`) and the simulator
(:mod:`nonstop.sim.core`) run this same code, so a write takes the same path
in both.

The router keeps the :class:`~nonstop.runtime.interface.Persist` contract:

* **Routing.**  A ``Persist`` goes to the persister of the longest registered
  prefix its keys start with (the default persister when none matches).  A
  ``Persist`` whose keys belong to two persisters is **refused**: it could not
  be atomic (two stores, two commits), so the router fails as for a failed
  write -- nothing more is acknowledged and the runtime stops the node (the
  simulator raises).  No machine emits one: the cluster layer and the
  distributed-commit machine persist their keys in separate actions.
* **Group commit.**  ``Persist`` actions are queued; one :meth:`flush` hands
  each persister the queued actions of its prefix as **one write set** (the
  real runtime flushes once per event-loop turn; the simulator at once, its
  disk groups writes up to the next simulated fsync).  A persister registered
  with ``distinct_keys`` (one that may apply a write set's deletes before its
  puts, like the object store's group committer) gets a new write set wherever
  a key repeats, so no write set writes a key twice.  A persister registered
  with ``serial`` has at most one write set in flight: what is queued meanwhile
  waits for its acknowledgement and goes as the next write set, together with
  the Persists the machine emits on hearing ``Persisted`` (the real cluster
  store: one fsync then carries a Raft append and the reactions to the one
  before, which saves fsyncs per transaction under load).
* **Atomicity and order.**  A ``Persist`` lies inside one write set, which a
  persister writes atomically.  The write sets of one persister are written in
  the order handed over.
* **Acknowledgement.**  ``Persisted(token)`` is reported (``on_durable``) only
  once the write set holding it is durable, and per persister in emission
  order, even if a persister completes write sets out of order.  Across
  persisters there is no order: a later ``dtx/`` write may be acknowledged
  before an earlier ``raft/`` one, as the two stores fsync independently.  A
  machine that needs one durable before the other waits for the first
  ``Persisted`` before emitting the second.
* **Failure.**  A write set that fails (or a persister that raises) is never
  acknowledged, and neither is anything after it, on any persister:
  ``on_failed`` is called once and the runtime must stop (fail-stop:
  acknowledging anything more would be a lie).

Persisters may complete from another thread (the real stores do); the router
itself is single-threaded, so completions come back through ``post`` (the
real runtime: ``loop.call_soon_threadsafe``; the simulator: a direct call).
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Sequence
from typing import Protocol

from nonstop.runtime.interface import Persist

Write = tuple[bytes, bytes | None]
"""``(key, value)``; a ``None`` value deletes the key."""

Done = Callable[[BaseException | None], None]
"""Called once by a persister: ``None`` when the write set is durable, else the error."""


class Persister(Protocol):
    """A store that makes write sets durable (the cluster store, the object store, a disk)."""

    def persist(self, batch: Sequence[Persist], done: Done) -> None:
        """Write the writes of ``batch`` (one write set), after every earlier one; then ``done``.

        The write set is atomic as a whole (at least each ``Persist`` of it must
        be: after a crash a prefix of whole ``Persist`` actions may survive, as
        the contract allows) and applied in order.  Called on the router's
        thread, in order.  ``done`` may be called from any thread (the router
        hands it back through its ``post``), exactly once.  Raising counts as a
        failed write.
        """
        ...


def writes_of(batch: Sequence[Persist]) -> list[Write]:
    """The writes of ``batch`` in order, as one list (for stores that take plain writes)."""
    if len(batch) == 1:
        return list(batch[0].writes)
    return [w for p in batch for w in p.writes]


class PersistRouteError(Exception):
    """A ``Persist`` writes keys of two persisters: it cannot be made atomic."""


class _WriteSet:
    __slots__ = ("durable", "tokens")

    def __init__(self, tokens: list[int]) -> None:
        self.tokens = tokens
        self.durable = False


class _Route:
    __slots__ = (
        "commits_key",
        "distinct_keys",
        "in_flight",
        "label",
        "max_writes",
        "persister",
        "persists_key",
        "queue",
        "serial",
    )

    def __init__(
        self,
        persister: Persister,
        label: str,
        distinct_keys: bool,
        serial: bool,
        max_writes: int | None = None,
    ) -> None:
        self.persister = persister
        self.label = label
        self.serial = serial
        self.max_writes = max_writes
        prefix = f"{label}_" if label else ""
        self.persists_key = prefix + "persists"
        self.commits_key = prefix + "store_commits"
        self.distinct_keys = distinct_keys
        self.queue: list[Persist] = []
        self.in_flight: collections.deque[_WriteSet] = collections.deque()


def _take(route: _Route, everything: bool) -> tuple[list[Persist], list[Persist]]:
    """The Persists ``route`` hands over now, and those that stay queued."""
    queue = route.queue
    bound = route.max_writes
    if bound is None or everything:
        return queue, []
    size = 0
    for i, persist in enumerate(queue):
        size += len(persist.writes)
        if size > bound and i > 0:
            return queue[:i], queue[i:]
    return queue, []


class PersistRouter:
    """Routes ``Persist`` actions to persisters by key prefix (module doc).

    ``on_durable(tokens)``: tokens now durable, in order (feed ``Persisted`` for each);
    ``on_failed(exc)``: the first failure (stop the node);
    ``defer(fn)``: run ``fn`` once the current turn is over (None: flush at once);
    ``post(fn)``: run ``fn`` on the router's thread (None: call it directly);
    ``stats``: counters ``[<label>_]persists`` (Persists acknowledged) and
    ``[<label>_]store_commits`` (write sets acknowledged), per route;
    ``serial``: the default persister has one write set in flight at most.
    """

    def __init__(
        self,
        default: Persister,
        *,
        on_durable: Callable[[list[int]], None],
        on_failed: Callable[[BaseException], None],
        defer: Callable[[Callable[[], None]], object] | None = None,
        post: Callable[[Callable[[], None]], object] | None = None,
        stats: collections.Counter[str] | None = None,
        serial: bool = False,
    ) -> None:
        self._default = _Route(default, "", False, serial)
        self._routes: list[tuple[bytes, _Route]] = []
        """(prefix, route), longest prefix first."""
        self._on_durable = on_durable
        self._on_failed = on_failed
        self._defer = defer
        self._post = post
        self.stats = stats if stats is not None else collections.Counter[str]()
        self._dirty: list[_Route] = []
        """Routes whose queued Persists the next flush hands over."""
        self._scheduled = False
        """A deferred flush is pending."""
        self._epoch = 0
        self.failed: BaseException | None = None

    def route(
        self,
        prefix: bytes,
        persister: Persister,
        *,
        label: str,
        distinct_keys: bool = False,
        serial: bool = False,
        max_writes: int | None = None,
    ) -> None:
        """Send the ``Persist`` actions whose keys start with ``prefix`` to ``persister``.

        ``label`` names its counters in :attr:`stats`; ``distinct_keys``: never
        hand it a write set that writes a key twice; ``serial``: one write set in
        flight at most; ``max_writes`` (with ``serial``): a write set takes queued
        Persists while their writes fit (at least one), the rest wait for its
        acknowledgement -- a bound on one commit of that persister, whatever piled
        up while the one before was in flight.  Register before the machine emits
        its first ``Persist``.
        """
        if max_writes is not None and (max_writes < 1 or not serial):
            raise ValueError("max_writes needs a serial route and a positive bound")
        if not prefix:
            raise ValueError("a persister route needs a non-empty key prefix")
        if any(p == prefix for p, _ in self._routes):
            raise ValueError(f"prefix {prefix!r} already has a persister")
        route = _Route(persister, label, distinct_keys, serial, max_writes)
        self._routes.append((prefix, route))
        self._routes.sort(key=lambda item: len(item[0]), reverse=True)

    # ------------------------------------------------------------- queueing
    def add(self, persist: Persist) -> None:
        """Queue one ``Persist`` for its persister (flushed at the end of the turn)."""
        try:
            route = self._route_of(persist)
        except PersistRouteError as exc:
            self._fail(exc)
            return
        # A route with Persists queued is listed already, or held until its write
        # set in flight is durable.
        listed = bool(route.queue) or (route.serial and bool(route.in_flight))
        route.queue.append(persist)
        if not listed:
            self._dirty.append(route)
            self._schedule()

    def _schedule(self) -> None:
        if self._defer is None:
            self.flush()
        elif not self._scheduled:
            self._scheduled = True
            self._defer(self.flush)

    def _route_of(self, persist: Persist) -> _Route:
        routes = self._routes
        if not routes:
            return self._default
        found: _Route | None = None
        for key, _ in persist.writes:
            route = self._default
            for prefix, candidate in routes:
                if key.startswith(prefix):
                    route = candidate
                    break
            if found is None:
                found = route
            elif route is not found:
                raise PersistRouteError(
                    f"Persist {persist.token} writes keys of two stores "
                    f"({found.label or 'default'} and {route.label or 'default'}, "
                    f"e.g. {key!r:.60}): it cannot be atomic"
                )
        return found if found is not None else self._default

    def flush(self, *, everything: bool = False) -> None:
        """Hand every queued ``Persist`` to its persister, one write set per persister.

        A ``serial`` persister's queue waits while it has a write set in flight
        (its acknowledgement flushes it), unless ``everything`` (a stop: what was
        emitted is written even though nobody will hear of it).
        """
        self._scheduled = False
        if everything:
            for route in self._all_routes():
                if route.queue and route not in self._dirty:
                    self._dirty.append(route)
        while self._dirty:
            route = self._dirty.pop(0)
            if route.serial and route.in_flight and not everything:
                continue  # held: _complete hands it over
            batch, route.queue = _take(route, everything)
            if not batch:
                continue
            if route.distinct_keys:
                self._hand_distinct(route, batch)
            else:
                self._hand(route, batch)

    def _hand_distinct(self, route: _Route, batch: list[Persist]) -> None:
        """One write set per run of Persists that write no key twice, in order."""
        part: list[Persist] = []
        keys: set[bytes] = set()
        for persist in batch:
            if any(k in keys for k, _ in persist.writes):
                self._hand(route, part)
                part, keys = [], set()
            part.append(persist)
            keys.update(k for k, _ in persist.writes)
        if part:
            self._hand(route, part)

    def _hand(self, route: _Route, batch: list[Persist]) -> None:
        ws = _WriteSet([p.token for p in batch])
        route.in_flight.append(ws)
        epoch = self._epoch
        post = self._post

        def done(exc: BaseException | None) -> None:  # any thread
            if post is None:
                self._complete(epoch, route, ws, exc)
            else:
                post(lambda: self._complete(epoch, route, ws, exc))

        try:
            route.persister.persist(batch, done)
        except Exception as exc:
            self._complete(epoch, route, ws, exc)

    # ----------------------------------------------------------- completion
    def _complete(
        self, epoch: int, route: _Route, ws: _WriteSet, exc: BaseException | None
    ) -> None:
        if epoch != self._epoch or self.failed is not None:
            return  # a previous incarnation's write, or durability is already broken
        if exc is not None:
            self._fail(exc)
            return
        ws.durable = True
        in_flight = route.in_flight
        if in_flight[0] is not ws:
            return  # an earlier write set of this persister is not durable yet
        tokens: list[int] = []
        sets = 0
        while in_flight and in_flight[0].durable:
            tokens.extend(in_flight.popleft().tokens)
            sets += 1
        self.stats[route.persists_key] += len(tokens)
        self.stats[route.commits_key] += sets
        self._on_durable(tokens)
        if route.serial and route.queue and not route.in_flight and route not in self._dirty:
            # What waited for this write set, and what the machine just emitted.
            self._dirty.append(route)
            self._schedule()

    def _fail(self, exc: BaseException) -> None:
        if self.failed is not None:
            return
        self.failed = exc
        self._on_failed(exc)

    # ------------------------------------------------------------ lifecycle
    def reset(self) -> None:
        """Forget everything queued or in flight (a crash): later completions are ignored."""
        self._epoch += 1
        self._dirty.clear()
        for route in self._all_routes():
            route.queue.clear()
            route.in_flight.clear()
        self.failed = None

    def idle(self) -> bool:
        """Nothing is queued and every write set handed over was acknowledged."""
        return not any(r.in_flight or r.queue for r in self._all_routes())

    def _all_routes(self) -> list[_Route]:
        return [self._default, *(route for _, route in self._routes)]


__all__ = ["Done", "PersistRouteError", "PersistRouter", "Persister", "Write", "writes_of"]
