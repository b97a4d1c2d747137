"""The real runtime: drives one sans-I/O :class:`Machine` with asyncio, TCP and LMDB.

Everything happens on one event loop thread — the machine is never entered
concurrently — except the LMDB commit, which runs on a one-thread executor so
an fsync never stalls keep-alives.  The actions of
:mod:`nonstop.runtime.interface` are carried out as follows:

* ``SetTimer``/``CancelTimer`` → ``loop.call_later`` handles, one per name;
* ``Send`` → one persistent outbound TCP (or TLS) connection per peer, dialed
  on demand and re-dialed with a short back-off; messages sent while it is
  (re)connecting wait in a small bounded backlog, beyond it they are dropped
  (``Send`` is best effort by contract);
* ``Reconnect`` → drop every connection to that peer and dial again at once;
* ``Persist`` → queued; all ``Persist`` actions of one loop turn (and those
  that arrive while a commit is in flight) go into **one** LMDB write
  transaction with one fsync, after which ``Persisted`` is fed for each token
  in order (group commit).  A ``Persist`` of the distributed-commit machine
  (keys ``dtx/...``) goes instead to :attr:`RealRuntime.dtx_persister`, which
  writes it in the object store's group commit (data-path.md section 5);
* ``Reply`` → the client connection that sent the request (dropped if gone);
* ``Notify`` → a structured ``nonstop.notify`` log line plus the callbacks in
  :attr:`RealRuntime.notifiers`;
* ``Log`` → the ``nonstop.machine`` logger.

Peer messages whose ``t`` starts with ``data.`` and the client ops of the data
path (``tx.*``, ``bulk.*``, ``nodes``, ``types``, ``request.result``) go to
:attr:`RealRuntime.data_service` (``nonstop.dataplane.service``), not to the
machine; :meth:`RealRuntime.submit` lets it ask the machine for things (a
two-phase commit) without a client connection.

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
import ssl
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from nonstop.dataplane.service import is_data_message, is_data_op
from nonstop.errors import ProtocolError, Unavailable
from nonstop.net import handshake
from nonstop.net.address import split_address
from nonstop.net.connection import Connection, HandshakeRejected, accept, dial
from nonstop.net.discovery import Discovery, DiscoveryConfig
from nonstop.net.frames import DEFAULT_MAX_FRAME, FrameError
from nonstop.net.handshake import Hello
from nonstop.net.tls import TLSConfig, client_context, server_context
from nonstop.runtime.interface import (
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
from nonstop.runtime.storage import ClusterStore

log = logging.getLogger("nonstop.runtime")
machine_log = logging.getLogger("nonstop.machine")
notify_log = logging.getLogger("nonstop.notify")

SOURCE_STATIC = 3
SOURCE_HELLO = 2
SOURCE_DISCOVERY = 1
"""Where an address came from; a higher source wins (C2: static beats dynamic)."""

IDENTITY_CODES = frozenset(
    {handshake.UNSUPPORTED_PROTOCOL, handshake.DUPLICATE_LOCATION, handshake.DUPLICATE_TIMESTAMP}
)
"""Refusals the failure detector turns into C3 node states."""

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
    }
)
"""Per-entry and per-transaction notifications: logged at debug only (one line per log
entry or per distributed commit costs throughput: ~6 lines a commit)."""

BACKLOG = 1024

DTX_KEYS = b"dtx/"
"""Durable keys of the distributed-commit machine: written by the dtx persister."""
"""Messages kept for a peer while its connection is being (re)established."""

_LEVELS = {
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warning": logging.WARNING,
    "error": logging.ERROR,
}


@dataclass
class RuntimeConfig:
    """What the runtime needs to know beyond the node's identity."""

    listen: str = "127.0.0.1:7101"
    join: list[str] = field(default_factory=list)
    static_peers: dict[str, str] = field(default_factory=dict)
    """name → address from the configuration (C2 static discovery; the machine knows them too)."""
    max_frame: int = DEFAULT_MAX_FRAME
    tls: TLSConfig = field(default_factory=TLSConfig)
    discovery: DiscoveryConfig = field(default_factory=DiscoveryConfig)
    connect_timeout: float = 2.0
    handshake_timeout: float = 5.0
    redial_min: float = 0.05
    redial_max: float = 1.0
    startup_grace: float = 10.0
    """A DuplicateName/WrongCluster refusal this soon after start stops the node."""


class PeerLink:
    """The outbound connection to one address, re-dialed until the runtime stops."""

    def __init__(self, runtime: RealRuntime, address: str, source: int) -> None:
        self.runtime = runtime
        self.address = address
        self.source = source
        self.name: str | None = None
        self.conn: Connection | None = None
        self.backlog: collections.deque[Any] = collections.deque(maxlen=BACKLOG)
        self.refused: str | None = None
        self.first_attempt = asyncio.Event()
        """Set once the first dial finished, whatever its outcome."""
        self._wake = asyncio.Event()
        self._task = asyncio.ensure_future(self._run())

    def send(self, payload: Any) -> None:
        frame = {"t": "m", "p": payload}
        if self.conn is not None and not self.conn.closed:
            try:
                self.conn.send(frame)
            except FrameError as exc:
                log.error("cannot send to %s: %s", self.name or self.address, exc)
        else:
            self.backlog.append(frame)

    def reconnect(self) -> None:
        """Drop the connection (if any) and dial again without waiting for the back-off."""
        self.backlog.clear()
        if self.conn is not None:
            self.conn.close()
        self._wake.set()

    def stop(self) -> None:
        self._task.cancel()
        if self.conn is not None:
            self.conn.close()

    async def _sleep(self, delay: float) -> None:
        self._wake.clear()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), delay)

    async def _run(self) -> None:
        rt = self.runtime
        delay = rt.config.redial_min
        host, port = split_address(self.address)
        while True:
            try:
                conn = await dial(
                    host,
                    port,
                    rt.hello,
                    ssl_context=rt.client_ssl,
                    timeout=rt.config.connect_timeout,
                    max_frame=rt.config.max_frame,
                )
            except HandshakeRejected as exc:
                rt.on_rejected(self, exc)
                self.first_attempt.set()
                await self._sleep(max(delay, 1.0))
                delay = min(delay * 2, rt.config.redial_max)
                continue
            except (OSError, TimeoutError, EOFError, ProtocolError) as exc:
                log.debug("dial %s failed: %r", self.address, exc)
                self.first_attempt.set()
                await self._sleep(delay)
                delay = min(delay * 2, rt.config.redial_max)
                continue
            assert conn.peer is not None
            self.first_attempt.set()
            if not rt.on_link_up(self, conn):
                conn.close()
                return
            delay = rt.config.redial_min
            self.refused = None
            self.conn = conn
            while self.backlog:
                try:
                    conn.send(self.backlog.popleft())
                except FrameError as exc:
                    log.error("cannot send to %s: %s", self.name, exc)
            # Nothing is expected on an outbound link; reading detects its end.
            try:
                while True:
                    value = await conn.recv()
                    log.debug("unexpected frame on link to %s: %r", self.name, value)
            except (OSError, EOFError, FrameError, asyncio.IncompleteReadError) as exc:
                log.debug("link to %s closed: %r", self.name, exc)
            finally:
                conn.close()
                self.conn = None
                rt.on_link_down(self)
            if not self._wake.is_set():
                await self._sleep(delay)


class RealRuntime:
    """Drive ``machine`` on the running asyncio loop until :meth:`stop`."""

    def __init__(
        self,
        *,
        hello: Hello,
        store: ClusterStore,
        machine_factory: Callable[[dict[bytes, bytes]], Machine],
        config: RuntimeConfig,
    ) -> None:
        self.hello = hello
        self.name = hello.name
        self.store = store
        self.machine_factory = machine_factory
        self.config = config
        self.machine: Machine | None = None
        self.loop: asyncio.AbstractEventLoop | None = None
        self.server: asyncio.AbstractServer | None = None
        self.server_ssl: ssl.SSLContext | None = None
        self.client_ssl: ssl.SSLContext | None = None
        if config.tls.enabled:
            self.server_ssl = server_context(config.tls)
            self.client_ssl = client_context(config.tls)
        self.notifiers: dict[str, list[Callable[[Notify], None]]] = collections.defaultdict(list)
        self.peers: dict[str, Hello] = {}
        """The last hello seen from each peer name (address, pid, ...)."""
        self.addresses: dict[str, tuple[str, int]] = {}
        """name → (address, source)."""
        self._links: dict[str, PeerLink] = {}
        """address → outbound link."""
        self._by_name: dict[str, PeerLink] = {}
        self._inbound: dict[str, set[Connection]] = collections.defaultdict(set)
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._requests: dict[int, tuple[Connection, Any, Any]] = {}
        self._next_request = 1
        self._persist_queue: list[Persist] = []
        self._flush_scheduled = False
        self._dtx_queue: list[Persist] = []
        """Distributed-commit Persists of this loop turn, handed to the store together."""
        self._committing = False
        self._committed_idle = asyncio.Event()
        self._committed_idle.set()
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lmdb-commit")
        self._tasks: set[asyncio.Task[Any]] = set()
        self._stopping = False
        self.fatal: BaseException | None = None
        self.stopped = asyncio.Event()
        self.stats = collections.Counter[str]()
        self.discovery: Discovery | None = None
        self._handlers: dict[type, Callable[[Any], None]] = {
            Send: self._do_send,
            SetTimer: self._do_set_timer,
            CancelTimer: self._do_cancel_timer,
            Persist: self._do_persist,
            Reply: self._do_reply,
            Notify: self._notify,
            Log: self._do_log,
            Reconnect: self._do_reconnect,
        }
        self.started_at = 0.0
        self.data_service: Any = None
        """The node's data service (``nonstop.dataplane.service.DataService``), if any."""
        self.dtx_persister: Any = None
        """Writes the ``dtx/`` keys of ``Persist`` actions (``dataplane.participant``), if any."""
        self._internal: dict[int, asyncio.Future[Any]] = {}
        """Requests of :meth:`submit`: request id → the future of the machine's reply."""
        self.identity_error: HandshakeRejected | None = None
        self.on_identity_error: Callable[[HandshakeRejected], None] | None = None

    # ================================================================ life
    async def start(self) -> None:
        """Bind the listener, build the machine from ``DATA/cluster``, feed ``Started``.

        Binding first means a port conflict fails the start before anything is
        dialed or persisted.
        """
        self.loop = asyncio.get_running_loop()
        host, port = split_address(self.config.listen)
        self.server = await asyncio.start_server(
            self._on_accept,
            host,
            port,
            ssl=self.server_ssl,
            limit=256 * 1024,
            reuse_address=True,
        )
        self.started_at = self.now()
        self.machine = self.machine_factory(self.store.recovered())
        if self.data_service is not None:
            self.data_service.start()
        self._dispatch(Started(now=self.now()))
        for name, address in self.config.static_peers.items():
            self.learn(name, address, SOURCE_STATIC, feed=False)
        for address in self.config.join:
            if address != self.config.listen and address not in self._links:
                self._link_for(address, SOURCE_STATIC)
        if self.config.discovery.enabled:
            self.discovery = Discovery(
                self.config.discovery,
                cluster=self.hello.cluster,
                name=self.name,
                address=self.config.listen,
                protocol=(self.hello.proto_min, self.hello.proto_max),
                on_found=lambda name, address: self.learn(name, address, SOURCE_DISCOVERY),
            )
            await self.discovery.start()

    async def first_contacts(self, timeout: float) -> None:
        """Wait until every configured peer address was dialed once (or ``timeout``).

        The node process waits for this before it declares itself started, so
        that "this name is already used" or "wrong cluster" refusals from the
        peers it was told to join are reported as a start-up failure.
        """
        waits = [link.first_attempt.wait() for link in self._links.values()]
        if waits:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.gather(*waits), timeout)

    def now(self) -> float:
        assert self.loop is not None
        return self.loop.time()

    async def stop(self) -> None:
        """Graceful stop: no new connections, durable writes finished, store closed."""
        if self._stopping:
            return
        self._stopping = True
        if self.server is not None:
            self.server.close()
        if self.discovery is not None:
            self.discovery.stop()
        for handle in self._timers.values():
            handle.cancel()
        self._timers.clear()
        for link in list(self._links.values()):
            link.stop()
        for conns in self._inbound.values():
            for conn in conns:
                conn.close()
        for task in list(self._tasks):
            task.cancel()
        for fut in self._internal.values():
            if not fut.done():
                fut.set_exception(Unavailable(f"node {self.name} is stopping"))
        self._internal.clear()
        if self._dtx_queue:
            # Emitted before the stop: handed to the store while it is still open
            # (like the cluster state below, worth keeping even if nobody hears of it).
            self._flush_dtx()
        if self.data_service is not None:
            await self.data_service.stop()
        # Let an in-flight commit finish and write what is still queued: a
        # Persist already emitted is worth keeping even if nobody hears of it.
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._committed_idle.wait(), 10)
        if self._persist_queue:
            writes = [w for p in self._persist_queue for w in p.writes]
            self._persist_queue.clear()
            await asyncio.get_running_loop().run_in_executor(
                self._executor, self.store.commit, writes
            )
        self._executor.shutdown(wait=True)
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
        for action in actions:
            self._execute(action)

    def _execute(self, action: Action) -> None:
        # One dict lookup instead of a chain of isinstance checks: this runs
        # for every action of every event (several per cluster-log entry).
        handler = self._handlers.get(type(action))
        if handler is None:
            log.error("unknown action %r", action)
        else:
            handler(action)

    def _do_send(self, action: Send) -> None:
        self._send(action.to, action.payload)

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

    def _do_persist(self, action: Persist) -> None:
        if self.dtx_persister is not None and any(k.startswith(DTX_KEYS) for k, _ in action.writes):
            # The machine's distributed-commit keys live in the object store, committed
            # with the store's own writes (a Persist never mixes them with raft/ keys).
            self._persist_dtx(action)
            return
        self._persist_queue.append(action)
        self._schedule_flush()

    def _persist_dtx(self, action: Persist) -> None:
        """Queue ``action`` for the store; the queue goes at the end of this loop turn.

        Under load one turn handles many messages, each often persisting (prepared
        records, outcomes, coordinator records): one store write set and one
        completion callback for all of them instead of one each saves a thread
        hand-off (lock, wake-up) each way per Persist.  Each Persist stays atomic (it
        is inside one write set) and is acknowledged after it is durable, in order.
        """
        if not self._dtx_queue:
            assert self.loop is not None
            self.loop.call_soon(self._flush_dtx)
        self._dtx_queue.append(action)

    def _flush_dtx(self) -> None:
        queue, self._dtx_queue = self._dtx_queue, []
        batch: list[Persist] = []
        keys: set[bytes] = set()
        for action in queue:
            # The store's group commit applies one write set's deletes before its
            # puts: a key written twice must go in separate write sets, in order.
            if any(k in keys for k, _ in action.writes):
                self._persist_dtx_batch(batch)
                batch, keys = [], set()
            batch.append(action)
            keys.update(k for k, _ in action.writes)
        if batch:
            self._persist_dtx_batch(batch)

    def _persist_dtx_batch(self, batch: list[Persist]) -> None:
        loop = self.loop
        assert loop is not None and self.dtx_persister is not None
        tokens = [p.token for p in batch]

        def done(exc: BaseException | None) -> None:  # on the store's writer thread
            # After a stop the loop may be closed: the write is durable anyway, and
            # nobody is left to tell.
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self._dtx_persisted, tokens, exc)

        try:
            self.dtx_persister.persist([w for p in batch for w in p.writes], done)
        except Exception as exc:
            self._dtx_persisted(tokens, exc)

    def _dtx_persisted(self, tokens: list[int], exc: BaseException | None) -> None:
        if exc is not None:
            log.critical("distributed-commit state commit failed, stopping the node: %r", exc)
            if self.fatal is None:
                self.fatal = exc
            self._spawn(self.stop())
            return
        self.stats["dtx_persists"] += len(tokens)
        self.stats["dtx_store_commits"] += 1
        for token in tokens:
            self._dispatch(Persisted(now=self.now(), token=token))

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
        rid = self._next_request
        self._next_request += 1
        self._internal[rid] = fut
        self._dispatch(ClientRequest(now=self.now(), request_id=rid, payload=payload))
        return fut

    def _do_reply(self, action: Reply) -> None:
        self._reply(action.request_id, action.payload)

    def _do_log(self, action: Log) -> None:
        machine_log.log(_LEVELS.get(action.level, logging.INFO), "%s", action.message)

    def _do_reconnect(self, action: Reconnect) -> None:
        self._reconnect(action.peer)

    def _fire(self, name: str) -> None:
        self._timers.pop(name, None)
        self._dispatch(TimerFired(now=self.now(), name=name))

    def _feed_discovered(self, name: str, address: str) -> None:
        payload = {"k": "disc", "name": name, "address": address}
        self._dispatch(Received(now=self.now(), sender=name, payload=payload))

    def _feed_refused_hello(self, peer: Hello) -> None:
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

    # ======================================================= group commit
    def _schedule_flush(self) -> None:
        if not self._flush_scheduled and not self._committing:
            self._flush_scheduled = True
            assert self.loop is not None
            self.loop.call_soon(self._start_commit)

    def _start_commit(self) -> None:
        self._flush_scheduled = False
        if self._committing or not self._persist_queue or self._stopping:
            return
        batch = self._persist_queue
        self._persist_queue = []
        writes = [w for p in batch for w in p.writes]
        self._committing = True
        self._committed_idle.clear()
        assert self.loop is not None
        started = time.perf_counter()
        fut = self.loop.run_in_executor(self._executor, self.store.commit, writes)
        fut.add_done_callback(lambda f: self._commit_done(f, batch, started))

    def _commit_done(self, fut: asyncio.Future[int], batch: list[Persist], started: float) -> None:
        self._committing = False
        self._committed_idle.set()
        exc = fut.exception()
        if exc is not None:
            # Durability is broken: acknowledging anything more would be a lie.
            log.critical("cluster state commit failed, stopping the node: %r", exc)
            self.fatal = exc
            self._spawn(self.stop())
            return
        self.stats["commits"] += 1
        self.stats["persists"] += len(batch)
        self.stats["commit_us"] += int((time.perf_counter() - started) * 1e6)
        for p in batch:
            self._dispatch(Persisted(now=self.now(), token=p.token))
        if self._persist_queue:
            self._schedule_flush()

    # ============================================================ peers
    def _link_for(self, address: str, source: int) -> PeerLink:
        link = self._links.get(address)
        if link is None:
            link = PeerLink(self, address, source)
            self._links[address] = link
        elif source > link.source:
            link.source = source
        return link

    def learn(self, name: str, address: str, source: int, *, feed: bool = True) -> None:
        """Record that ``name`` listens at ``address`` (static > hello > discovery)."""
        if name == self.name or not address:
            return
        known = self.addresses.get(name)
        if known is not None and (known[0] == address or known[1] > source):
            return
        self.addresses[name] = (address, source)
        link = self._by_name.get(name)
        if link is not None and link.address != address:
            log.info("node %s moves from %s to %s", name, link.address, address)
            del self._by_name[name]
            link.stop()
            self._links.pop(link.address, None)
        if name not in self._by_name:
            new = self._link_for(address, source)
            new.name = name
            self._by_name[name] = new
        if feed:
            self._feed_discovered(name, address)
        if known is None:
            self._share_addresses()

    def on_link_up(self, link: PeerLink, conn: Connection) -> bool:
        """An outbound link finished its handshake; False to give the link up."""
        assert conn.peer is not None
        name = conn.peer.name
        if link.name is not None and link.name != name:
            # Configured as ``B@addr`` but another node answers there.
            log.error("expected node %s at %s, found node %s", link.name, link.address, name)
            if self._by_name.get(link.name) is link:
                del self._by_name[link.name]
                self.addresses.pop(link.name, None)
        self.peers[name] = conn.peer
        owner = self._by_name.get(name)
        if owner is not None and owner is not link:
            if owner.source >= link.source:
                # Two addresses lead to one node (e.g. a static alias): keep one link.
                self._links.pop(link.address, None)
                return False
            owner.stop()
            self._links.pop(owner.address, None)
        link.name = name
        self._by_name[name] = link
        known = self.addresses.get(name)
        if known is None or known[0] != link.address:
            self.addresses[name] = (link.address, link.source)
            self._feed_discovered(name, link.address)
        log.info("connected to %s at %s (protocol %s)", name, link.address, conn.version)
        conn.send(self._address_book_frame(exclude=name))
        return True

    def _address_book_frame(self, exclude: str | None = None) -> dict[str, Any]:
        book = {n: a for n, (a, _) in self.addresses.items() if n != exclude}
        return {"t": "addr", "book": book}

    def _share_addresses(self) -> None:
        """Tell every connected peer the addresses we know (peer-assisted discovery, C2).

        A node that joined through one address learns the others this way, and
        they learn it from its hello when it dials them.
        """
        for name, link in self._by_name.items():
            if link.conn is not None and not link.conn.closed:
                link.conn.send(self._address_book_frame(exclude=name))

    def _on_address_book(self, sender: str, book: Any) -> None:
        if not isinstance(book, dict):
            return
        for name, address in book.items():
            if not isinstance(name, str) or not isinstance(address, str):
                continue
            if name == self.name or name in self.addresses:
                continue
            try:
                split_address(address)
            except ValueError:
                continue
            log.info("learned %s at %s from %s", name, address, sender)
            self.learn(name, address, SOURCE_DISCOVERY)

    def on_link_down(self, link: PeerLink) -> None:
        if link.name is not None and not self._stopping:
            log.info("connection to %s at %s lost", link.name, link.address)

    def on_rejected(self, link: PeerLink, exc: HandshakeRejected) -> None:
        """A dial was refused by identity/protocol checks: log once, tell the machine."""
        peer_name = exc.peer.name if exc.peer is not None else link.name
        if link.refused != exc.code:
            log.error("peer at %s refused: %s", link.address, exc)
        link.refused = exc.code
        fatal_codes = (handshake.DUPLICATE_NAME, handshake.WRONG_CLUSTER)
        if exc.code in fatal_codes and self.now() - self.started_at < self.config.startup_grace:
            # Right after start this means *we* are the misconfigured node.
            self.identity_error = exc
            if self.on_identity_error is not None:
                self.on_identity_error(exc)
        if exc.code in IDENTITY_CODES and exc.peer is not None and peer_name:
            self._feed_refused_hello(exc.peer)

    def send(self, to: str, payload: Any) -> None:
        """Send ``payload`` to node ``to`` (best effort, like the machine's ``Send``)."""
        self._send(to, payload)

    def _send(self, to: str, payload: Any) -> None:
        if to == self.name:
            assert self.loop is not None
            self.loop.call_soon(
                lambda: self._dispatch(Received(now=self.now(), sender=to, payload=payload))
            )
            return
        link = self._by_name.get(to)
        if link is None:
            self.stats["send_unknown"] += 1
            log.debug("no address known for %s; message dropped", to)
            return
        link.send(payload)

    def _reconnect(self, peer: str) -> None:
        link = self._by_name.get(peer)
        if link is not None:
            link.reconnect()
        for conn in list(self._inbound.get(peer, ())):
            conn.close()

    def connected(self, name: str) -> bool:
        link = self._by_name.get(name)
        return link is not None and link.conn is not None and not link.conn.closed

    # ============================================================ inbound
    async def _on_accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = Connection(reader, writer, self.config.max_frame)
        try:
            try:
                peer = await accept(
                    conn, self.hello, self.config.handshake_timeout, self._check_identity
                )
            except HandshakeRejected as exc:
                log.warning("rejected connection from %s: %s", conn.remote, exc)
                peer = exc.peer
                if (
                    peer is not None
                    and peer.role == handshake.ROLE_NODE
                    and exc.code in IDENTITY_CODES
                ):
                    self._feed_refused_hello(peer)
                return
            except FrameError as exc:
                log.warning("closing connection from %s: %s", conn.remote, exc)
                return
            except (OSError, EOFError, TimeoutError, asyncio.IncompleteReadError) as exc:
                log.debug("handshake with %s failed: %r", conn.remote, exc)
                return
            if peer.role == handshake.ROLE_CLIENT:
                await self._serve_client(conn)
            else:
                await self._serve_peer(conn, peer)
        except asyncio.CancelledError:
            pass
        except Exception:
            log.exception("connection from %s failed", conn.remote)
        finally:
            conn.close()

    def _check_identity(self, peer: Hello) -> handshake.Rejection | None:
        """Refuse a second live process claiming a name we already talk to.

        Without this a node started by mistake with a used name would take
        over the real node's address in every peer's address book.
        """
        if peer.role != handshake.ROLE_NODE:
            return None
        known = self.peers.get(peer.name)
        if known is not None and known.timestamp != peer.timestamp and self.connected(peer.name):
            return handshake.Rejection(
                handshake.DUPLICATE_NAME,
                f"node name {peer.name!r} is already used by a running node at "
                f"{self.addresses.get(peer.name, ('?',))[0]}",
            )
        return None

    async def _serve_peer(self, conn: Connection, peer: Hello) -> None:
        self.peers[peer.name] = peer
        self._inbound[peer.name].add(conn)
        if peer.address:
            self.learn(peer.name, peer.address, SOURCE_HELLO)
        try:
            while True:
                try:
                    values = await conn.recv_many()
                except FrameError as exc:
                    log.warning("closing connection from %s: %s", peer.name, exc)
                    return
                except (OSError, EOFError, asyncio.IncompleteReadError):
                    return
                for value in values:
                    if isinstance(value, dict) and value.get("t") == "m":
                        self.stats["received"] += 1
                        payload = value.get("p")
                        if self.data_service is not None and is_data_message(payload):
                            self.data_service.on_peer(peer.name, payload)
                            continue
                        event = Received(now=self.now(), sender=peer.name, payload=payload)
                        self._dispatch(event)
                    elif isinstance(value, dict) and value.get("t") == "addr":
                        self._on_address_book(peer.name, value.get("book"))
                    else:
                        log.warning(
                            "closing connection from %s: unknown message type %r",
                            peer.name,
                            value.get("t") if isinstance(value, dict) else type(value).__name__,
                        )
                        return
        finally:
            self._inbound[peer.name].discard(conn)

    async def _serve_client(self, conn: Connection) -> None:
        mine: set[int] = set()
        served = False
        try:
            while True:
                try:
                    values = await conn.recv_many()
                except FrameError as exc:
                    log.warning("closing client connection from %s: %s", conn.remote, exc)
                    return
                except (OSError, EOFError, asyncio.IncompleteReadError):
                    return
                for value in values:
                    if not (isinstance(value, dict) and value.get("t") == "req"):
                        log.warning(
                            "closing client connection from %s: unknown message", conn.remote
                        )
                        return
                    client_id = value.get("id")
                    payload = value.get("p")
                    local = self._local_request(payload)
                    if local is not None:
                        conn.send({"t": "rep", "id": client_id, "p": local})
                        continue
                    op = payload.get("op") if isinstance(payload, dict) else None
                    if self.data_service is not None and is_data_op(op):
                        served = True
                        self.data_service.on_client(conn, client_id, payload)
                        continue
                    rid = self._next_request
                    self._next_request += 1
                    self._requests[rid] = (conn, client_id, op)
                    mine.add(rid)
                    self._dispatch(ClientRequest(now=self.now(), request_id=rid, payload=payload))
        finally:
            for rid in mine:
                self._requests.pop(rid, None)
            if served and self.data_service is not None:
                # Its open transactions are rolled back (B8).
                self.data_service.connection_closed(conn)

    def _local_request(self, payload: Any) -> Any:
        """Requests the runtime answers itself (they must work even if the machine is stuck)."""
        if not isinstance(payload, dict):
            return None
        op = payload.get("op")
        if op == "ping":
            return {
                "name": self.name,
                "cluster": self.hello.cluster,
                "address": self.hello.address,
                "pid": os.getpid(),
                "protocol": [self.hello.proto_min, self.hello.proto_max],
            }
        if op == "runtime_stats":
            return {
                "stats": dict(self.stats),
                "connected": sorted(n for n in self._by_name if self.connected(n)),
                "addresses": {n: a for n, (a, _) in self.addresses.items()},
                "data": {} if self.data_service is None else dict(self.data_service.stats),
                # The object store's group commit: store commits per fsync (commits/groups).
                "store": {} if self.data_service is None else self.data_service.db.stats(),
            }
        return None

    def _reply(self, request_id: int, payload: Any) -> None:
        internal = self._internal.pop(request_id, None)
        if internal is not None:
            if not internal.done():
                internal.set_result(payload)
            return
        entry = self._requests.pop(request_id, None)
        if entry is None:
            return
        conn, client_id, op = entry
        if op == "status" and isinstance(payload, dict):
            payload = self._enrich_status(payload)
        try:
            conn.send({"t": "rep", "id": client_id, "p": payload})
        except FrameError as exc:
            log.error("reply too large: %s", exc)
            conn.send({"t": "rep", "id": client_id, "p": {"error": "ProtocolError"}})

    def _enrich_status(self, status: dict[str, Any]) -> dict[str, Any]:
        """Add what only the runtime knows (pids, addresses) to the machine's status."""
        nodes = status.get("nodes")
        if isinstance(nodes, list):
            for node in nodes:
                if not isinstance(node, dict):
                    continue
                name = node.get("name")
                if name == self.name:
                    node.setdefault("pid", os.getpid())
                    if not node.get("address"):
                        node["address"] = self.hello.address
                elif name in self.peers:
                    node.setdefault("pid", self.peers[name].pid)
                    if not node.get("address") and name in self.addresses:
                        node["address"] = self.addresses[name][0]
                else:
                    node.setdefault("pid", None)
        return status

    # =========================================================== notifiers
    def _notify(self, action: Notify) -> None:
        kind = action.kind
        level = logging.DEBUG if kind in QUIET_NOTIFY else logging.INFO
        if notify_log.isEnabledFor(level):
            record = {"kind": kind, "node": self.name, **action.data}
            notify_log.log(level, "%s", json.dumps(record, default=str, sort_keys=True))
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
        import uvloop  # type: ignore[import-not-found]
    except ImportError:
        return False
    asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    return True
