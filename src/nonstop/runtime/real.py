"""The real runtime: drives one sans-I/O :class:`Machine` with asyncio, TCP and LMDB.

Everything happens on one event loop thread -- the machine is never entered
concurrently -- except the stores' commits, which run on writer threads so an
fsync never stalls keep-alives.  The actions of
:mod:`nonstop.runtime.interface` are carried out as follows:

* ``SetTimer``/``CancelTimer`` → ``loop.call_later`` handles, one per name;
* ``Send`` → the peer's link of the :class:`~nonstop.runtime.transport.Transport`
  (best effort); a message to the node itself is delivered on the next turn;
* ``Reconnect`` → drop every connection to that peer and dial again at once;
* ``Persist`` → the :class:`~nonstop.runtime.persist.PersistRouter`: all
  ``Persist`` actions of one loop turn go to their persister as one write set
  (by key prefix: the node's composition registers persisters for prefixes,
  every other key goes to the cluster store's
  :class:`~nonstop.runtime.storage.StoreWriter`, one LMDB transaction and
  fsync per write set, one write set in flight (``serial``): what arrives
  during an fsync, and what the machine emits on hearing of it, goes in the
  next one -- group commit); ``Persisted`` is fed for each token once it is
  durable, in order per persister -- all the tokens of one acknowledgement as
  one ``handle_persisted`` call when the machine has it
  (:class:`~nonstop.runtime.interface.DurableBatches`); a failed write stops
  the node;
* ``Reply`` → the client connection that sent the request (dropped if gone),
  or the future of :meth:`RealRuntime.submit`;
* ``Notify`` → a structured ``nonstop.notify`` log line plus the callbacks in
  :attr:`RealRuntime.notifiers`;
* ``Log`` → the ``nonstop.machine`` logger.

Client requests and peer messages are offered to the node's
:class:`~nonstop.runtime.routing.Router` (if any) before the machine sees
them (:mod:`nonstop.runtime.clients`); the runtime knows no service above the
network.  :meth:`RealRuntime.submit` lets such a service ask the machine for
things (a two-phase commit) without a client connection.

The runtime also tells the machine what only the transport sees, in the
conventions of :class:`nonstop.cluster.node.ClusterNode`:

* a node name learned at an address (from a dialed ``--join`` address's
  hello, a peer's hello, or a UDP announcement) is delivered as a discovery
  announcement ``Received(sender=name, payload={"k": "disc", "name", "address"})``;
* a connection refused by the transport handshake because of the peer's
  identity or protocol range (no common version, duplicate location code or
  store timestamp) is delivered as the peer's failure-detector hello
  (``{"k": "fd", "en": False, "b": {"t": "hello", "id": {...}, "ack": True}}``),
  so the detector itself classifies the peer (``UnsupportedProtocol``, ...),
  exactly as it would for a hello that reached it.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import os
import random
from collections.abc import Awaitable, Callable
from typing import Any

from nonstop.errors import Unavailable
from nonstop.net.connection import Connection, HandshakeRejected
from nonstop.net.handshake import Hello
from nonstop.runtime.clients import ClientServer
from nonstop.runtime.config import RuntimeConfig
from nonstop.runtime.interface import (
    ALIVE,
    ALIVE_EVERY,
    Action,
    CancelTimer,
    ClientRequest,
    Event,
    Log,
    Machine,
    Notify,
    Persist,
    Persisted,
    Received,
    Reconnect,
    Reply,
    Send,
    SetTimer,
    Started,
    TimerFired,
)
from nonstop.runtime.loop_lag import LoopLagMonitor
from nonstop.runtime.persist import PersistRouter
from nonstop.runtime.routing import Router
from nonstop.runtime.storage import ClusterStore, StoreWriter
from nonstop.runtime.transport import Transport

log = logging.getLogger("nonstop.runtime")
machine_log = logging.getLogger("nonstop.machine")
notify_log = logging.getLogger("nonstop.notify")

QUIET_NOTIFY = frozenset(
    {
        "applied",
        "proposed",
        "dtx.begin",
        "dtx.resolved",
        "dtx.finished",
        "dl.request",
        "dl.answer",
        "dl.decided",
        "pt.lease",
        "rep.acked",
        "rep.released",
    }
)
"""Per-entry and per-transaction notifications: logged at debug only (one line per log
entry or per distributed commit costs throughput: ~6 lines a commit; with sync replicas
one ``rep.acked`` per replicated record and one ``rep.released`` per participant's phase
two, ~5% of a node's CPU at 64 clients)."""

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}


class RealRuntime:
    """One node's machine on the real network and disk (module doc).

    What services above the runtime may use: :attr:`name`, :attr:`hello`,
    :attr:`peers` (name → last hello), :attr:`addresses` (name → (address,
    source)), :attr:`machine`, :meth:`send`, :meth:`submit`,
    :meth:`add_notifier`, :meth:`connected`, :attr:`persists` (register a
    persister for a key prefix) and :attr:`router`.
    """

    def __init__(
        self,
        hello: Hello,
        store: ClusterStore,
        machine_factory: Callable[[dict[bytes, bytes]], Machine],
        config: RuntimeConfig,
        router: Router | None = None,
    ) -> None:
        self.hello = hello
        self.name = hello.name
        self.store = store
        self.machine_factory = machine_factory
        self.config = config
        self.machine: Machine | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.stats = collections.Counter[str]()
        self.transport = Transport(hello, config, self, self.stats)
        self.bounds = self.transport.bounds
        """Connection caps, deadlines, buffer budget; ``bounds.refusals`` counts each refusal."""
        self.peers: dict[str, Hello] = self.transport.peers
        """The last hello seen from each peer name (address, pid, ...)."""
        self.addresses: dict[str, tuple[str, int]] = self.transport.addresses
        """name → (address, source)."""
        self.router: Router | None = router
        """Client ops and peer messages of the node's services (``nonstop.node.router``)."""
        self.clients = ClientServer(self)
        self.writer = StoreWriter(store, self.stats)
        self.persists = PersistRouter(
            self.writer,
            on_durable=self._persisted,
            on_failed=self._persist_failed,
            defer=self._call_soon,
            post=self._call_threadsafe,
            stats=self.stats,
            serial=True,
        )
        """Where ``Persist`` actions go: the cluster store unless a prefix is routed elsewhere."""
        self.notifiers: dict[str, list[Callable[[Notify], None]]] = collections.defaultdict(list)
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._next_request = 1
        self._internal: dict[int, asyncio.Future[Any]] = {}
        """Requests of :meth:`submit`: request id → the future of the machine's reply."""
        self._tasks: set[asyncio.Task[Any]] = set()
        self._stopping = False
        self.fatal: BaseException | None = None
        self.stopped = asyncio.Event()
        self._handlers: dict[type, Callable[[Any], None]] = {
            Send: self._do_send,
            SetTimer: self._do_set_timer,
            CancelTimer: self._do_cancel_timer,
            Persist: self.persists.add,
            Reply: self._do_reply,
            Notify: self._notify,
            Log: self._do_log,
            Reconnect: self._do_reconnect,
        }
        self.permissions: Callable[[Connection, Any], Any] | None = None
        """Who may send which client request (the node's composition sets it,
        ``nonstop.node.router``): returns None or the error reply; None: everyone may."""
        self.loop_lag = LoopLagMonitor(warn_after=config.loop_lag_warn)
        """How late the event loop wakes (``nonstop_event_loop_lag_seconds``, a warning line)."""
        self.identity_error: HandshakeRejected | None = None
        self.on_identity_error: Callable[[HandshakeRejected], None] | None = None
        self._bare_noted: dict[str, float] = {}
        """When each peer's bare message was last noted to the machine (``_heard_bare``)."""

    # ================================================================ life
    async def start(self) -> None:
        """Bind the listener, build the machine from ``DATA/cluster``, feed ``Started``.

        Binding first means a port conflict fails the start before anything is
        dialed or persisted.
        """
        self.loop = asyncio.get_running_loop()
        self.loop_lag.start()
        stacks_after = os.environ.get("NONSTOP_LOOP_STACKS")
        if stacks_after:  # diagnosis: where the loop blocks (docs/operations.md)
            self.loop_lag.watch_stacks(float(stacks_after))
        await self.transport.listen()
        self.machine = self.machine_factory(self.store.recovered())
        if self.router is not None:
            self.router.start()
        self._dispatch(Started(now=self.now()))
        await self.transport.start()

    async def first_contacts(self, timeout: float) -> None:
        """Wait until every configured peer address was dialed once (or ``timeout``).

        The node process waits for this before it declares itself started, so
        that "this name is already used" or "wrong cluster" refusals from the
        peers it was told to join are reported as a start-up failure.
        """
        await self.transport.first_contacts(timeout)

    def now(self) -> float:
        assert self.loop is not None
        return self.loop.time()

    async def stop(self) -> None:
        """Graceful stop: no new connections, durable writes finished, store closed."""
        if self._stopping:
            return
        self._stopping = True
        self.loop_lag.stop()
        self.transport.stop()
        for handle in self._timers.values():
            handle.cancel()
        self._timers.clear()
        current = asyncio.current_task()
        for task in list(self._tasks):
            if task is not current:  # a stop after a failed write runs as one of them
                task.cancel()
        for fut in self._internal.values():
            if not fut.done():
                fut.set_exception(Unavailable(f"node {self.name} is stopping"))
        self._internal.clear()
        # Persists emitted before the stop are handed to their stores while they
        # are open: worth keeping even if nobody hears of them.
        self.persists.flush(everything=True)
        if self.router is not None:
            await self.router.stop()
        # The cluster store's writer finishes what it was handed.
        await asyncio.get_running_loop().run_in_executor(None, self.writer.close)
        self.stopped.set()

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ============================================================ machine
    def _dispatch(self, event: Event) -> None:
        """Feed one event and carry out the actions; never called re-entrantly."""
        if self._stopping or self.machine is None:
            return
        try:
            actions = self.machine.handle(event)
        except Exception:
            # A bug in a machine.  Keep serving (other peers, admin status) but
            # make it loud; the machine's own state decides what happens next.
            log.exception("machine raised on %r", type(event).__name__)
            self.stats["machine_errors"] += 1
            return
        self._carry_out(actions)

    def _carry_out(self, actions: list[Action]) -> None:
        handlers = self._handlers
        for action in actions:
            # One dict lookup instead of a chain of isinstance checks: this runs
            # for every action of every event (several per cluster-log entry).
            handler = handlers.get(type(action))
            if handler is None:
                log.error("unknown action %r", action)
            else:
                handler(action)

    def _do_send(self, action: Send) -> None:
        self.send(action.to, action.payload)

    def _do_set_timer(self, action: SetTimer) -> None:
        old = self._timers.pop(action.name, None)
        if old is not None:
            old.cancel()
        assert self.loop is not None
        self._timers[action.name] = self.loop.call_later(
            max(0.0, action.delay), self._fire, action.name
        )

    def _do_cancel_timer(self, action: CancelTimer) -> None:
        old = self._timers.pop(action.name, None)
        if old is not None:
            old.cancel()

    def _fire(self, name: str) -> None:
        self._timers.pop(name, None)
        self._dispatch(TimerFired(now=self.now(), name=name))

    def _do_reply(self, action: Reply) -> None:
        internal = self._internal.pop(action.request_id, None)
        if internal is not None:
            if not internal.done():
                internal.set_result(action.payload)
            return
        self.clients.reply(action.request_id, action.payload)

    def _do_log(self, action: Log) -> None:
        machine_log.log(_LEVELS.get(action.level, logging.INFO), "%s", action.message)

    def _do_reconnect(self, action: Reconnect) -> None:
        self.transport.reconnect(action.peer)

    # ======================================================== durability
    def _call_soon(self, fn: Callable[[], None]) -> None:
        assert self.loop is not None
        self.loop.call_soon(fn)

    def _call_threadsafe(self, fn: Callable[[], None]) -> None:
        # After a stop the loop may be closed: the write is durable anyway, and
        # nobody is left to tell.
        assert self.loop is not None
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(fn)

    def _persisted(self, tokens: list[int]) -> None:
        machine = self.machine
        batch = getattr(machine, "handle_persisted", None)
        if batch is None or len(tokens) == 1:
            for token in tokens:
                self._dispatch(Persisted(now=self.now(), token=token))
            return
        # One event for the whole group commit (interface.DurableBatches): the
        # machine's after-event bookkeeping runs once, not once per token.
        if self._stopping:
            return
        try:
            actions = batch(self.now(), tokens)
        except Exception:
            log.exception("machine raised on a batch of %d Persisted", len(tokens))
            self.stats["machine_errors"] += 1
            return
        self.stats["persisted_batches"] += 1
        self._carry_out(actions)

    def _persist_failed(self, exc: BaseException) -> None:
        # Durability is broken: acknowledging anything more would be a lie.
        log.critical("durable state commit failed, stopping the node: %r", exc)
        if self.fatal is None:
            self.fatal = exc
        self._spawn(self.stop())

    # ========================================================== requests
    def submit(self, payload: Any) -> asyncio.Future[Any]:
        """Hand the machine a client request from inside the node; the future of its reply.

        The data service asks for two-phase commits this way (``{"op": "run"}``):
        the request is a ``ClientRequest`` like any other, only its ``Reply``
        resolves the future instead of going to a connection.
        """
        assert self.loop is not None
        fut: asyncio.Future[Any] = self.loop.create_future()
        if self._stopping:
            fut.set_exception(Unavailable(f"node {self.name} is stopping"))
            return fut
        rid = self.new_request_id()
        self._internal[rid] = fut
        self.request_machine(rid, payload)
        return fut

    def new_request_id(self) -> int:
        rid = self._next_request
        self._next_request += 1
        return rid

    def request_machine(self, request_id: int, payload: Any) -> None:
        self._dispatch(ClientRequest(now=self.now(), request_id=request_id, payload=payload))

    def authorize(self, conn: Connection, payload: Any) -> Any:
        """None when the connection may send ``payload``; else the error reply to send."""
        check = self.permissions
        return None if check is None else check(conn, payload)

    def runtime_stats(self) -> dict[str, Any]:
        """The ``runtime_stats`` reply: counters, connections, and the router's extras."""
        reply: dict[str, Any] = {
            "stats": dict(self.stats),
            "connected": self.transport.connected_names(),
            "addresses": {n: a for n, (a, _) in self.addresses.items()},
            "limits": self.bounds.snapshot(),
            "loop_lag": self.loop_lag.snapshot(),
        }
        if self.router is not None:
            reply.update(self.router.stats())
        replication = getattr(self.machine, "replication_stats", None)
        if replication is not None:
            reply["replication"] = replication()
        return reply

    # ======================================================= the network
    def send(self, to: str, payload: Any) -> None:
        """Send ``payload`` to node ``to`` (best effort, like the machine's ``Send``).

        A message to this node itself arrives on the next loop turn, through the
        router like any peer's.
        """
        if to == self.name:
            assert self.loop is not None
            self.loop.call_soon(self.on_message, to, payload)
            return
        self.transport.send(to, payload)

    def connected(self, name: str) -> bool:
        """Is the outbound link to ``name`` up?"""
        return self.transport.connected(name)

    def learn(self, name: str, address: str, source: int) -> None:
        """Record that ``name`` listens at ``address`` (``transport.SOURCE_*``: static wins)."""
        self.transport.learn(name, address, source)

    def on_message(self, sender: str, payload: Any) -> None:
        """A message of node ``sender``: the router's if it takes it, else the machine's."""
        router = self.router
        if router is not None and router.on_peer(sender, payload):
            self._heard_bare(sender)
            return
        if not (isinstance(payload, dict) and "k" in payload):
            self._heard_bare(sender)  # a replication record: no envelope either
        self._dispatch(Received(now=self.now(), sender=sender, payload=payload))

    def _heard_bare(self, sender: str) -> None:
        """Tell the machine, at most every :data:`ALIVE_EVERY`, that ``sender`` spoke.

        A peer's messages share one connection, in order: under a large swap its
        keep-alives queue behind megabytes of replication frames, and a node reading
        those frames must not take their sender for silent (reconnect, Down, a dropped
        replica).  Those frames carry no envelope, so the cluster machine would not
        count them; this note does (``ClusterNode``: ``{"k": "alive"}``).
        """
        machine = self.machine
        if machine is None or not getattr(machine, "hears_bare_messages", False):
            return
        now = self.now()
        if now - self._bare_noted.get(sender, -ALIVE_EVERY) < ALIVE_EVERY:
            return
        self._bare_noted[sender] = now
        self._dispatch(Received(now=now, sender=sender, payload={"k": ALIVE}))

    def serve_client(self, conn: Connection) -> Awaitable[None]:
        """Serve a handshake'd client connection until it ends (``runtime/clients.py``)."""
        return self.clients.serve(conn)

    def on_discovered(self, name: str, address: str) -> None:
        payload = {"k": "disc", "name": name, "address": address}
        self._dispatch(Received(now=self.now(), sender=name, payload=payload))

    def on_refused_identity(self, peer: Hello) -> None:
        """Let the failure detector see the identity the transport refused (C3 states)."""
        ident = {
            "name": peer.name,
            "address": peer.address,
            "location": peer.location,
            "timestamp": peer.timestamp,
            "proto": [peer.proto_min, peer.proto_max],
        }
        body = {"t": "hello", "id": ident, "en": False, "ack": True}
        payload = {"k": "fd", "en": False, "b": body}
        self._dispatch(Received(now=self.now(), sender=peer.name, payload=payload))

    def on_startup_refusal(self, exc: HandshakeRejected) -> None:
        """Right after start a peer refused this node's identity: tell the node process."""
        self.identity_error = exc
        if self.on_identity_error is not None:
            self.on_identity_error(exc)

    # =========================================================== notifiers
    def _notify(self, action: Notify) -> None:
        kind = action.kind
        level = logging.DEBUG if kind in QUIET_NOTIFY else logging.INFO
        if notify_log.isEnabledFor(level):
            record = {"kind": kind, "node": self.name, **action.data}
            notify_log.log(
                level,
                "%s",
                json.dumps(record, default=str, sort_keys=True),
                extra={"notify": record},  # a structured field of JSON log lines
            )
        for key in (kind, "*"):
            callbacks = self.notifiers.get(key)
            if not callbacks:
                continue
            for callback in tuple(callbacks):
                try:
                    callback(action)
                except Exception:
                    log.exception("notifier for %s failed", kind)

    def add_notifier(self, kind: str, callback: Callable[[Notify], None]) -> None:
        """Call ``callback`` for every ``Notify`` of ``kind`` (``"*"``: every kind)."""
        self.notifiers[kind].append(callback)


def new_rng() -> random.Random:
    """The machine's RNG: seeded from the OS in production (the simulator seeds its own)."""
    return random.Random(int.from_bytes(os.urandom(8), "big"))


def install_event_loop_policy() -> bool:
    """Use uvloop when it is importable; True when it is."""
    try:
        import uvloop  # type: ignore[import-not-found,unused-ignore]
    except ImportError:
        return False
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return True


__all__ = ["RealRuntime", "RuntimeConfig", "install_event_loop_policy", "new_rng"]
