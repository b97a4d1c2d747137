"""The node's data service: the asyncio adapter of the data-plane machine.

The data path's logic -- client sessions, branches, the coordinator's
two-phase orchestration, request results, the reaction to membership
changes -- is the sans-I/O :class:`~nonstop.dataplane.machine.DataPlane`
(docs/design/dataplane-machine.md).  :class:`DataService` feeds it events and
carries out its actions on the real node:

* client ops (``on_client``) and closed connections → ``ClientOp`` /
  ``ClientGone``; ``ClientReply`` → the connection's ``rep`` frame;
* peers' ``data.*`` messages (``on_peer``) → ``Received``; ``Send`` →
  ``runtime.send``;
* ``Exec`` → :mod:`nonstop.dataplane.store_ops` on the branch's
  ``AsyncTransaction`` of the node's ``Database`` (this adapter owns them: one
  Exec at a time per branch, in the order emitted) → ``BranchDone``;
  ``EndBranch`` → rollback, after the branch's earlier Execs;
* ``Decide`` → the distributed-commit machine's ``{"op": "run"}`` through
  ``runtime.submit`` → ``DecisionDone``;
* ``SetTimer`` / ``CancelTimer`` → ``loop.call_later`` → ``TimerFired``;
* the cluster layer's ``node_state`` / ``view`` / ``quorum`` notifications and
  the peers' hellos → ``ClusterChanged``.

``bulk.*`` ops (Spark) and the ``nodes`` and ``types`` ops do not touch
sessions: this adapter answers them itself (bulk ops on a worker thread).
"""

from __future__ import annotations

import asyncio
import collections
import functools
import itertools
import logging
import os
import random
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgpack

from nonstop import errors
from nonstop.bulk import swap_apply
from nonstop.bulk.arrow_import import load_arrow, needs_arrow_import
from nonstop.dataplane.commit import RETRYABLE_REASONS, map_run_reply
from nonstop.dataplane.events import (
    BranchDone,
    ClientGone,
    ClientOp,
    ClientReply,
    ClusterChanged,
    Decide,
    DecisionDone,
    EndBranch,
    Exec,
    LocalWaits,
    PartitionView,
    ReadWaits,
)
from nonstop.dataplane.holdings import (
    HOLDINGS_OP,
    cannot_tell,
    last_copies,
    leave_refusal,
    partitions_leave_refusal,
)
from nonstop.dataplane.machine import DataPlane, DataPlaneConfig
from nonstop.dataplane.managed_types import check_type, types_reply
from nonstop.dataplane.routing import CLIENT_OPS, SESSION_OPS, is_data_message, is_data_op
from nonstop.dataplane.session_ops import merge_write
from nonstop.dataplane.store_ops import apply_writes, execute, run_branch_op, run_store_op
from nonstop.model.wire import error_out
from nonstop.net.frames import DEFAULT_MAX_FRAME, FrameTooLarge
from nonstop.runtime.interface import (
    CancelTimer,
    Log,
    Received,
    Send,
    SetTimer,
    Started,
    TimerFired,
)
from nonstop.tx.async_transaction import AsyncTransaction
from nonstop.tx.requests import DEFAULT_WINDOW
from nonstop.tx.transaction import Isolation, TxState

if TYPE_CHECKING:
    from nonstop.database import Database

log = logging.getLogger("nonstop.data")


CLUSTER_NOTES = ("node_state", "view", "quorum", "pt.changed", "pt.acting")
"""The cluster node's notifications after which the data plane takes the cluster's state
again: membership and quorum (an installed snapshot comes with ``view``); ``pt.changed``
(the partition table moved), ``pt.acting`` (what this node acts for)."""

_LOG_LEVELS = {"debug": logging.DEBUG, "info": logging.INFO, "warning": logging.WARNING}


@dataclass
class ServiceConfig:
    """Timeouts of the data path (seconds)."""

    branch_idle: float = 90.0
    """A participant's branch without an op for this long is rolled back (B8): the
    backstop for a coordinator that is up but silent (a lost ``branch.end``); above
    ``tx_idle``, so that an idle transaction is ended by its coordinator first."""
    tx_idle: float = 60.0
    """A transaction with no client op for this long is rolled back on every node."""
    lock_wait: float = 5.0
    """Lock-wait timeout of every branch: how distributed deadlocks end (B4, LockTimeout)."""
    rpc_timeout: float = 15.0
    """A peer that does not answer a data request this long is Unavailable (> lock_wait)."""
    commit_timeout: float = 30.0
    """A two-phase commit undecided this long: the client hears Unavailable (outcome unknown)."""
    sweep_every: float = 1.0
    deadlock_every: float = 0.025
    """How often wait-for edges are shared to find deadlocks across nodes (0: off)."""
    deadlock_wound: str = "blocked"
    """Wound-wait: ``"blocked"``, ``"any"`` or ``"off"`` (``DataPlaneConfig``)."""
    deadlock_age_max: float = 0.0
    """The most seniority a replay may claim on ``begin`` (``DataPlaneConfig``)."""
    result_window: int = DEFAULT_WINDOW

    def machine(self) -> DataPlaneConfig:
        """The machine's part of the configuration."""
        return DataPlaneConfig(
            branch_idle=self.branch_idle,
            tx_idle=self.tx_idle,
            rpc_timeout=self.rpc_timeout,
            commit_timeout=self.commit_timeout,
            sweep_every=self.sweep_every,
            deadlock_every=self.deadlock_every,
            deadlock_wound=self.deadlock_wound,
            deadlock_age_max=self.deadlock_age_max,
        )


class _Branch:
    """A branch's transaction and the Execs (and end) waiting to run on it."""

    __slots__ = ("queue", "running", "tx")

    def __init__(self) -> None:
        self.tx: AsyncTransaction | None = None
        self.queue: collections.deque[Exec | EndBranch] = collections.deque()
        self.running = False


class DataService:
    """The data path of one node (module doc); one per node process, on the runtime's loop."""

    def __init__(
        self,
        runtime: Any,
        db: Database,
        config: ServiceConfig | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.runtime = runtime
        self.db = db
        swap_apply.resume(db)  # overwrites a restart interrupted land, or wait for their outcome
        self.name: str = runtime.name
        self.config = config or ServiceConfig()
        # A fresh random start per incarnation for session and call ids (the machine says why).
        rng = rng or random.Random(int.from_bytes(os.urandom(8), "big"))
        # The frame limit of this node's connections (max_frame_bytes): writes to a
        # peer and replies to clients are sized against it.
        runtime_config = getattr(runtime, "config", None)
        self.max_frame: int = int(getattr(runtime_config, "max_frame", DEFAULT_MAX_FRAME))
        machine_config = self.config.machine()
        machine_config.max_message = self.max_frame
        self.machine = DataPlane(self.name, rng, machine_config)
        self._pages: dict[int, dict[int, collections.deque[list[Any]]]] = {}
        """Client connection → cursor → the pages of a query reply not fetched yet."""
        self._cursors = itertools.count(1)
        self._txs: dict[str, _Branch] = {}
        self._conns: dict[int, Any] = {}
        self._timers: dict[str, asyncio.TimerHandle] = {}
        self._tasks: set[asyncio.Task[Any]] = set()
        self._coros: set[Coroutine[Any, Any, None]] = set()
        """Store ops running without a task (``_eager``)."""
        self._feeding = False
        self._backlog: collections.deque[Any] = collections.deque()
        self._arrow_wait: collections.deque[tuple[int, Any, Any]] | None = None
        """Client ops waiting for pyarrow's import (``bulk/arrow_import.py``), in order."""
        self._peers_seen = -1
        self._refresh_due = False
        self._partitions_key: tuple[Any, ...] | None = None
        self._partitions: Mapping[str, PartitionView] = {}
        self._stopping = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self.commit: Callable[[AsyncTransaction], Awaitable[dict[str, Any] | None]] | None = None
        """How a branch commits (``store_ops.run_branch_op``); the node sets it when its
        partitions replicate (``nonstop.node.replica_store.replicated_commit``)."""
        self.observer: Any = None
        """The node's metrics (``nonstop.node.metrics.DataObserver``): told of each session
        op and its reply; None when the node serves no metrics."""
        self._do: dict[type, Callable[[Any], None]] = {
            Exec: self._do_exec,
            Send: self._do_send,
            ClientReply: self._do_reply,
            SetTimer: self._do_set_timer,
            CancelTimer: self._do_cancel_timer,
            EndBranch: self._do_end_branch,
            Decide: self._do_decide,
            Log: self._do_log,
            ReadWaits: self._do_read_waits,
        }

    @property
    def stats(self) -> collections.Counter[str]:
        """Counters of the data path (``runtime_stats``' ``data``)."""
        return self.machine.stats

    @property
    def branches(self) -> dict[str, Any]:
        """The branches the machine holds now (branch id → its record)."""
        return self.machine.branches

    # ================================================================ life
    def start(self) -> None:
        """Start the machine's timers and listen for membership changes."""
        add = getattr(self.runtime, "add_notifier", None)
        if add is not None:
            for kind in CLUSTER_NOTES:
                add(kind, self._cluster_noted)
        # A large ended transaction's locks and entries are released a slice per turn
        # of this loop, also when the store's writer thread ends it (data-path.md §6.8).
        self.db.engine.slices.home(self._get_loop())
        self._feed(Started(now=self._now()))
        self._refresh()

    async def stop(self) -> None:
        """Roll every open branch back (the store is about to close)."""
        self._stopping = True
        for handle in self._timers.values():
            handle.cancel()
        self._timers.clear()
        for task in list(self._tasks):
            task.cancel()
        for coro in list(self._coros):
            coro.close()
        self._coros.clear()
        for slot in list(self._txs.values()):
            if slot.tx is not None and slot.tx.state is TxState.ACTIVE:
                await slot.tx.rollback()
        self._txs.clear()
        self.db.engine.slices.home(None)  # (what is left of them now: the store closes next)

    def _spawn(self, coro: Any) -> None:
        task = self._get_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _get_loop(self) -> asyncio.AbstractEventLoop:
        loop = self._loop
        if loop is None:
            loop = self._loop = asyncio.get_running_loop()
        return loop

    def _now(self) -> float:
        return self._get_loop().time()

    # ============================================================ events in
    def on_client(self, conn: Any, client_id: Any, payload: dict[str, Any]) -> None:
        """A client request for the data service (called by the runtime on its loop)."""
        op = payload.get("op")
        if op == "nodes" or op == "types":
            self.stats["client_ops"] += 1
            _send_reply(conn, client_id, self._directory(op))
            return
        if op == "partition.objects":
            _send_reply(conn, client_id, self.partition_objects())
            return
        if op == "tx.more":
            self.stats["client_ops"] += 1
            _send_reply(conn, client_id, self._next_page(id(conn), payload.get("c")))
            return
        if isinstance(op, str) and op.startswith("bulk."):
            self.stats["client_ops"] += 1
            self._spawn(self._answer_bulk(conn, client_id, op, payload))
            return
        if op == "leave":
            self._spawn(self._answer_leave(conn, client_id, payload))
            return
        key = id(conn)
        if key not in self._conns:
            self._conns[key] = conn
        if self.observer is not None:
            self.observer.op(key, client_id, op)
        if self._arrow_wait is not None or needs_arrow_import(payload):
            self._wait_for_arrow(key, client_id, payload)
            return
        self._client_op(key, client_id, payload)

    def _client_op(self, key: int, client_id: Any, payload: Any) -> None:
        if len(self.runtime.peers) != self._peers_seen:
            self._refresh()  # a new peer's hello: where its objects live
        self._feed(ClientOp(now=self._now(), conn=key, corr=client_id, payload=payload))

    def _wait_for_arrow(self, key: int, client_id: Any, payload: Any) -> None:
        """Hold this client op, and every one after it, until pyarrow is imported on a
        thread: imported by the op itself it held the loop for up to half a second."""
        if self._arrow_wait is None:
            self._arrow_wait = collections.deque()
            loaded = asyncio.get_running_loop().run_in_executor(None, load_arrow)
            loaded.add_done_callback(lambda _: self._arrow_loaded())
        self._arrow_wait.append((key, client_id, payload))

    def _arrow_loaded(self) -> None:
        held, self._arrow_wait = self._arrow_wait or collections.deque(), None
        for key, client_id, payload in held:
            if key in self._conns:  # (its connection may have closed meanwhile)
                self._client_op(key, client_id, payload)

    def connection_closed(self, conn: Any) -> None:
        """The client connection is gone: its sessions roll back, except committing ones (B8)."""
        key = id(conn)
        self._pages.pop(key, None)
        if self._conns.pop(key, None) is not None:
            self._feed(ClientGone(now=self._now(), conn=key))

    def on_peer(self, sender: str, payload: dict[str, Any]) -> None:
        """A ``data.*`` message from a peer (called by the runtime on its loop)."""
        if len(self.runtime.peers) != self._peers_seen:
            self._refresh()
        self._feed(Received(now=self._now(), sender=sender, payload=payload))

    def lookup_branch(self, branch_id: str) -> AsyncTransaction | None:
        """The commit participant takes a branch over for two-phase commit (data-path.md §5).

        From then on the branch is the participant's: the machine forgets it
        (no idle timeout, ``branch.end`` or session end touches it) and its
        transaction leaves this adapter.
        """
        if not self.machine.take_branch(branch_id, self._now()):
            return None
        slot = self._txs.pop(branch_id, None)
        if slot is None or slot.tx is None or slot.tx.state is not TxState.ACTIVE:
            return None
        return slot.tx

    def branch_lapsed(self, branch_id: str) -> bool:
        """Whether :meth:`lookup_branch` refuses the branch only because this node's lease
        lapsed (``DataPlane.vote_lapsed``): the participant asks again (its vote wait)."""
        return self.machine.vote_lapsed(branch_id, self._now())

    def _cluster_noted(self, _action: Any) -> None:
        # Called from inside the cluster machine's dispatch: the machine hears of
        # it on the next loop turn (never a Decide from inside that dispatch).
        if not self._refresh_due:
            self._refresh_due = True
            self._get_loop().call_soon(self._refresh)

    def _refresh(self) -> None:
        self._refresh_due = False
        self._feed(self._cluster_changed())

    def _cluster_changed(self) -> ClusterChanged:
        """What the cluster layer and the transport know now."""
        peers = self.runtime.peers
        self._peers_seen = len(peers)
        cluster = self._cluster()
        view = list(getattr(cluster, "view_members", None) or [])
        candidates = set(view) | set(peers)
        detector = getattr(cluster, "detector", None)
        if detector is not None:
            up = {n for n in candidates if str(detector.state_of(n)) == "Up"}
        else:
            up = {n for n in candidates if self.runtime.connected(n)}
        up.add(self.name)
        locations = {int(hello.location): name for name, hello in peers.items()}
        locations[int(self.runtime.hello.location)] = self.name
        locations[int(self.db.location)] = self.name
        quorum = getattr(cluster, "quorum_state", None) or "Active"
        return ClusterChanged(
            now=self._now(),
            members=tuple(view or self.known_nodes()),
            up=frozenset(up),
            quorum=str(quorum),
            locations=locations,
            partitions=self._partition_views(cluster),
        )

    def _partition_views(self, cluster: Any) -> Mapping[str, PartitionView]:
        """The table and this node's acting set; rebuilt only when either changed."""
        table = getattr(cluster, "partition_table", None)
        if table is None:
            return {}
        key = (cluster.table_version, cluster.acting_set)
        if key != self._partitions_key:
            self._partitions_key = key
            self._partitions = partition_views(table, cluster.acting_set)
        return self._partitions

    # ============================================================ the machine
    def _feed(self, event: Any) -> None:
        """Hand ``event`` to the machine and carry out its actions.

        An event arising while actions are carried out (a store op done at
        once) waits its turn: the machine never sees an event inside another.
        """
        if self._feeding:
            self._backlog.append(event)
            return
        if self._stopping:  # the store is closing: nothing more is done
            return
        self._feeding = True
        try:
            while True:
                try:
                    actions = self.machine.handle(event)
                except Exception:  # a bug: never let it stop the service
                    log.exception("data plane: %s failed", type(event).__name__)
                    actions = []
                for action in actions:
                    try:
                        self._do[type(action)](action)
                    except Exception:
                        log.exception("data plane: %s failed", type(action).__name__)
                if not self._backlog:
                    return
                event = self._backlog.popleft()
        finally:
            self._feeding = False

    def _do_send(self, action: Send) -> None:
        payload = action.payload
        if (
            payload.get("t") == "data.rep"
            and _objects_bytes(payload.get("p")) > self.max_frame // 2
        ):
            size = _frame_size(payload)  # worth measuring exactly: big objects aboard
            if size > self.max_frame:
                # A branch op's answer too large for a frame (a query of big objects):
                # the coordinator hears TooLarge now, not a timeout.
                refusal = _too_large("the answer of a branch op", size, self.max_frame)
                payload = {**payload, "p": error_out(refusal)}
        self.runtime.send(action.to, payload)

    def _do_reply(self, action: ClientReply) -> None:
        if self.observer is not None:
            self.observer.reply(action.conn, action.corr, action.payload)
        conn = self._conns.get(action.conn)
        if conn is None or conn.closed:
            return
        try:
            conn.send({"t": "rep", "id": action.corr, "p": action.payload})
        except FrameTooLarge as exc:  # encoded once; measured only when too large
            payload = self._first_page(action.conn, action.payload, exc.size)
            _send_reply(conn, action.corr, payload)
        except Exception:  # not encodable: _send_reply answers ProtocolError
            _send_reply(conn, action.corr, action.payload)

    # ============================================================ reply pages
    def _first_page(self, conn_key: int, reply: Any, size: int) -> Any:
        """A reply over the frame limit: a query's objects in pages, else TooLarge.

        The first page goes now with ``more: cursor``; the client fetches the
        others with ``tx.more`` (held until then, or until the connection closes).
        """
        objects = reply.get("os") if isinstance(reply, dict) else None
        if not isinstance(objects, list):
            return error_out(_too_large("the reply", size, self.max_frame))
        budget = self.max_frame - PAGE_MARGIN
        pages: list[list[Any]] = [[]]
        used = 0
        for obj in objects:
            obj_size = _frame_size(obj)
            if obj_size > budget:
                return error_out(_too_large("one object of the reply", obj_size, self.max_frame))
            if pages[-1] and used + obj_size > budget:
                pages.append([])
                used = 0
            pages[-1].append(obj)
            used += obj_size
        first = {**reply, "os": pages[0]}
        if len(pages) > 1:
            cursor = next(self._cursors)
            self._pages.setdefault(conn_key, {})[cursor] = collections.deque(pages[1:])
            first["more"] = cursor
            self.stats["paged_replies"] += 1
        return first

    def _next_page(self, conn_key: int, cursor: Any) -> dict[str, Any]:
        pages = self._pages.get(conn_key, {}).get(cursor) if isinstance(cursor, int) else None
        if not pages:
            return error_out(errors.BadArgument(f"no reply pages left for cursor {cursor!r:.40}"))
        page: dict[str, Any] = {"os": pages.popleft()}
        if pages:
            page["more"] = cursor
        else:
            del self._pages[conn_key][cursor]
        return page

    def _do_set_timer(self, action: SetTimer) -> None:
        old = self._timers.pop(action.name, None)
        if old is not None:
            old.cancel()
        if self._stopping:
            return
        self._timers[action.name] = self._get_loop().call_later(
            action.delay, self._fire, action.name
        )

    def _do_cancel_timer(self, action: CancelTimer) -> None:
        handle = self._timers.pop(action.name, None)
        if handle is not None:
            handle.cancel()

    def _fire(self, name: str) -> None:
        self._timers.pop(name, None)
        self._feed(TimerFired(now=self._now(), name=name))

    def _do_log(self, action: Log) -> None:
        if action.level == "error":
            log.error("%s", action.message)
        else:
            log.log(_LOG_LEVELS.get(action.level, logging.INFO), "%s", action.message)

    def _do_read_waits(self, _action: ReadWaits) -> None:
        """The store's wait-for edges between branches (the lock table knows transactions)."""
        graph = self.db.engine.locks.wait_for()
        edges: tuple[tuple[str, str], ...] = ()
        if graph:
            bids = {slot.tx.id: bid for bid, slot in self._txs.items() if slot.tx is not None}
            edges = tuple(
                (bids[waiter], bids[holder])
                for waiter, holders in graph.items()
                if waiter in bids
                for holder in holders
                if holder in bids
            )
        self._feed(LocalWaits(now=self._now(), edges=edges))

    def _do_decide(self, action: Decide) -> None:
        try:
            future = self.runtime.submit({"op": "run", "branches": action.branches})
        except Exception as exc:
            self._feed(DecisionDone(now=self._now(), corr=action.corr, reply=_failed(exc)))
            return
        future.add_done_callback(functools.partial(self._decided, action.corr))

    def _decided(self, corr: int, future: asyncio.Future[Any]) -> None:
        if future.cancelled():
            reply: Any = {"error": "Unavailable", "why": "the commit request was cancelled"}
        elif future.exception() is not None:
            reply = _failed(future.exception())
        else:
            reply = future.result()
        self._feed(DecisionDone(now=self._now(), corr=corr, reply=reply))

    # ============================================================ the store
    def _do_exec(self, action: Exec) -> None:
        if action.bid is None:
            self._eager(self._store_op(action))
            return
        slot = self._txs.get(action.bid)
        if slot is None:
            slot = self._txs[action.bid] = _Branch()
        slot.queue.append(action)
        if not slot.running:
            slot.running = True
            self._start_drain(action.bid, slot)

    def _do_end_branch(self, action: EndBranch) -> None:
        slot = self._txs.get(action.bid)
        if slot is None:
            return
        slot.queue.append(action)
        if slot.running and slot.tx is not None:
            # An op of the branch may be waiting for a lock: end the wait now, or the
            # rollback queued behind it (and the locks it frees) waits for lock_wait.
            closed = errors.TransactionClosed(f"branch {action.bid} is being rolled back")
            self.db.engine.locks.interrupt(slot.tx.id, closed)
        if not slot.running:
            slot.running = True
            self._start_drain(action.bid, slot)

    def _start_drain(self, bid: str, slot: _Branch) -> None:
        head = slot.queue[0]
        if type(head) is Exec and head.op in _USER_CODE_OPS:
            self._spawn(self._drain(bid, slot, in_task=True))
        else:
            self._eager(self._drain(bid, slot, in_task=False))

    def _eager(self, coro: Coroutine[Any, Any, None]) -> None:
        """Run ``coro`` at once, without a task, until it waits; on as what it awaits settles.

        Most store ops finish without waiting (no lock to wait for, nothing to
        make durable): they cost no task and no loop turn.  Only the adapter's
        own coroutines run this way; they await only futures of the store.
        """
        self._coros.add(coro)
        self._step(coro)

    def _step(self, coro: Coroutine[Any, Any, None], _settled: Any = None) -> None:
        if coro not in self._coros:  # closed by stop() while it waited
            return
        try:
            waited = coro.send(None)
        except StopIteration:
            self._coros.discard(coro)
            return
        except BaseException:
            self._coros.discard(coro)
            log.exception("data plane: a store op failed")
            return
        if waited is None:  # a bare yield (sleep(0)): the next loop turn
            self._get_loop().call_soon(self._step, coro)
        elif asyncio.isfuture(waited):
            waited._asyncio_future_blocking = False
            waited.add_done_callback(functools.partial(self._step, coro))
        else:
            self._coros.discard(coro)
            coro.close()
            log.error("data plane: a store op awaited %r, not a future", waited)

    async def _drain(self, bid: str, slot: _Branch, in_task: bool) -> None:
        """Run the branch's Execs one after the other, in the order they came.

        ``in_task``: in a task of its own (else run by ``_eager``).
        """
        try:
            while slot.queue:
                item = slot.queue.popleft()
                if not in_task and type(item) is Exec and item.op in _USER_CODE_OPS:
                    # Application code runs in a task of its own (it may use
                    # anything asyncio offers): the rest of the queue goes there.
                    slot.queue.appendleft(item)
                    self._spawn(self._drain(bid, slot, in_task=True))
                    return
                if type(item) is EndBranch:
                    tx, slot.tx = slot.tx, None
                    if tx is not None and tx.state is TxState.ACTIVE:
                        await tx.rollback()
                    continue
                assert isinstance(item, Exec)
                reply = await self._exec(bid, slot, item)
                self._feed(BranchDone(now=self._now(), corr=item.corr, reply=reply))
            slot.running = False
            if slot.tx is None and self._txs.get(bid) is slot:
                del self._txs[bid]
        except BaseException:
            slot.running = False
            raise

    async def _exec(self, bid: str, slot: _Branch, ex: Exec) -> dict[str, Any]:
        try:
            if ex.iso is not None:
                if slot.tx is not None:
                    raise errors.ProtocolError(f"branch {bid} opened twice")
                self.db.engine.check_open()
                slot.tx = AsyncTransaction(self.db, Isolation(ex.iso), self.config.lock_wait)
            tx = slot.tx
            if tx is None:
                raise errors.BranchRolledBack(f"branch {bid} is over on {self.name}")
            reply = await run_branch_op(
                tx, ex.op, ex.fields, ex.writes, self.config.result_window, self.commit
            )
            if tx.state is not TxState.ACTIVE:
                slot.tx = None  # committed (or failed and rolled back): nothing left to end
            return reply
        except errors.Error as exc:
            return error_out(exc)
        except Exception as exc:
            log.exception("branch op %r failed", ex.op)
            return error_out(exc)

    async def _store_op(self, ex: Exec) -> None:
        try:
            reply = await run_store_op(
                self.db, ex.op, ex.fields, self.config.lock_wait, self.config.result_window
            )
        except errors.Error as exc:
            reply = error_out(exc)
        except Exception as exc:
            log.exception("store op %r failed", ex.op)
            reply = error_out(exc)
        self._feed(BranchDone(now=self._now(), corr=ex.corr, reply=reply))

    # ============================================================ own ops
    def _directory(self, op: str) -> dict[str, Any]:
        """The ``nodes`` or ``types`` reply."""
        try:
            if op == "nodes":
                return {"nodes": self.nodes()}
            return {"types": types_reply()}
        except Exception as exc:
            log.exception("data op %r failed", op)
            return error_out(exc)

    async def _answer_bulk(
        self, conn: Any, client_id: Any, op: str, payload: dict[str, Any]
    ) -> None:
        await _answer(conn, client_id, op, self._bulk(op, payload))

    async def _answer_leave(self, conn: Any, client_id: Any, payload: dict[str, Any]) -> None:
        await _answer(conn, client_id, "leave", self._leave(payload))

    async def _leave(self, payload: dict[str, Any]) -> Any:
        """``leave``: refused while the node leaving holds the last in-sync copy of a
        partition (routing by partition) or any object (routing by node) -- holdings.py --
        else the cluster's membership change as before."""
        name = payload.get("name")
        table = getattr(self._cluster(), "partition_table", None)
        if isinstance(name, str) and name in self.members() and self.machine.config.placement:
            live = getattr(self._cluster(), "view_live", None) or []
            parts = table.partitions.values() if table is not None else []
            why = partitions_leave_refusal(name, last_copies(parts, name, live))
            if why is not None:
                raise errors.ClusterError(why)
        elif isinstance(name, str) and name in self.members():
            holdings = await self._internal_op({"op": HOLDINGS_OP, "name": name})
            if "error" in holdings:
                raise errors.ClusterError(cannot_tell(name, holdings))
            why = leave_refusal(holdings)
            if why is not None:
                raise errors.ClusterError(why)
        return await self.runtime.submit(payload)

    def _internal_op(self, payload: dict[str, Any]) -> asyncio.Future[Any]:
        """Run a client op of the machine for the node itself; the future of its reply."""
        inner = _InternalConn(self._get_loop().create_future())
        key = id(inner)
        self._conns[key] = inner
        inner.future.add_done_callback(lambda _: self._conns.pop(key, None))
        self._feed(ClientOp(now=self._now(), conn=key, corr=0, payload=payload))
        return inner.future

    async def _bulk(self, op: str, p: dict[str, Any]) -> dict[str, Any]:
        try:
            from nonstop.bulk.handlers import HANDLERS, BulkContext
        except ImportError as exc:
            raise errors.BadArgument(f"bulk operations are not available: {exc}") from None
        handler = HANDLERS.get(op)
        if handler is None:
            raise errors.BadArgument(f"unknown bulk op {op!r}")
        loop = asyncio.get_running_loop()
        context = BulkContext(self.db, self.name, self.machine.config.placement)
        result = await loop.run_in_executor(None, handler, context, p)
        return result if isinstance(result, dict) else {"r": result}

    # ============================================================ cluster view
    def _cluster(self) -> Any:
        machine = self.runtime.machine
        return getattr(machine, "cluster", machine)

    def partition_objects(self) -> dict[str, Any]:
        """``partition.objects``: the committed number of objects of each partition this
        node acts for (``nonstop partition list``), and how the data path routes."""
        from nonstop.ha.partition_table import partition_location
        from nonstop.model.managed import registered_types
        from nonstop.model.ref import location_prefix

        routing = "partitions" if self.machine.config.placement is not None else "nodes"
        counts: dict[str, int] = {}
        cluster = self._cluster()
        acting: frozenset[str] = getattr(cluster, "acting_set", frozenset())
        table = getattr(cluster, "partition_table", None)
        names = sorted(registered_types())
        for name in sorted(acting):
            part = table.get(name) if table is not None else None
            if part is None:
                continue
            loc = [location_prefix(partition_location(name))]
            counts[name] = sum(self.db.engine.store.count(t, loc) for t in names)
        return {"routing": routing, "counts": counts}

    def acting(self, now: float, partition: str) -> bool:
        """Whether this node acts for ``partition`` at ``now`` (the cluster node's answer,
        ha.md §8: the data plane asks it at the moment it acknowledges)."""
        acting = getattr(self._cluster(), "acting", None)
        return bool(acting is not None and acting(now, partition))

    def applied_epoch(self, partition: str) -> int | None:
        """``partition``'s epoch in the table the cluster node applied, now (the data
        plane's fence, replication.md §10b fix 8); None if it has no such partition."""
        table = getattr(self._cluster(), "partition_table", None)
        part = None if table is None else table.partitions.get(partition)
        return None if part is None else int(part.epoch)

    def is_up(self, name: str) -> bool:
        """Up per the failure detector (or, without one, connected)."""
        if name == self.name:
            return True
        detector = getattr(self._cluster(), "detector", None)
        if detector is not None:
            return str(detector.state_of(name)) == "Up"
        return bool(self.runtime.connected(name))

    def members(self) -> list[str]:
        """The cluster's nodes: the committed view's members (or every known node)."""
        members = list(getattr(self._cluster(), "view_members", None) or [])
        if not members:
            members = self.known_nodes()
        return [self.name, *sorted(n for n in members if n != self.name)]

    def known_nodes(self) -> list[str]:
        view = set(getattr(self._cluster(), "view_members", None) or [])
        return sorted(view | set(self.runtime.peers) | {self.name})

    def nodes(self) -> list[dict[str, Any]]:
        """The ``nodes`` reply: name, address, location and up for every known node."""
        out = [
            {
                "name": self.name,
                "address": self.runtime.hello.address,
                "location": int(self.runtime.hello.location),
                "up": True,
            }
        ]
        for name in self.known_nodes():
            if name == self.name:
                continue
            hello = self.runtime.peers.get(name)
            address = self.runtime.addresses.get(name, (hello.address if hello else "", 0))[0]
            out.append(
                {
                    "name": name,
                    "address": address,
                    "location": None if hello is None else int(hello.location),
                    "up": self.is_up(name),
                }
            )
        return out


_USER_CODE_OPS = frozenset({"branch.call", "branch.overwrite", "branch.upsert"})
"""Branch ops that run application code or long bulk work (a called method, a bulk
swap, a bulk batch): in a task."""


PAGE_MARGIN = 64 * 1024
"""Room left in a reply frame for everything but its objects."""


def partition_views(table: Any, acting: frozenset[str]) -> dict[str, PartitionView]:
    """The data plane's view of a :class:`~nonstop.ha.partition_table.PartitionTable`."""
    from nonstop.ha.partition_table import partition_location

    return {
        name: PartitionView(
            name=name,
            location=partition_location(name),
            active=part.active,
            epoch=part.epoch,
            current=tuple((n, part.style(n)) for n in part.current),
            acting=name in acting,
        )
        for name, part in table.partitions.items()
    }


def _objects_bytes(reply: Any) -> int:
    """A quick lower bound of the bytes of a reply's objects (``o``, ``os``): their states."""
    if not isinstance(reply, dict):
        return 0
    objects = reply.get("os")
    objects = objects if isinstance(objects, list) else [reply.get("o")]
    return sum(
        len(o[3]) for o in objects if isinstance(o, list) and len(o) > 3 and isinstance(o[3], bytes)
    )


def _frame_size(value: Any) -> int:
    """The bytes ``value`` takes in a frame body (msgpack), for the size limits."""
    try:
        return len(msgpack.packb(value, use_bin_type=True))
    except (TypeError, ValueError, OverflowError):
        return 0  # not encodable at all: the send reports it


def _too_large(what: str, size: int, limit: int) -> errors.TooLarge:
    return errors.TooLarge(
        f"{what} takes {size:,} bytes, over the frame limit of {limit:,} bytes (max_frame_bytes)",
        size,
        limit,
    )


class _InternalConn:
    """A connection for ops the node runs for itself: the reply resolves ``future``."""

    closed = False

    def __init__(self, future: asyncio.Future[Any]) -> None:
        self.future = future

    def send(self, frame: dict[str, Any]) -> None:
        if not self.future.done():
            self.future.set_result(frame.get("p"))


async def _answer(conn: Any, client_id: Any, op: str, work: Coroutine[Any, Any, Any]) -> None:
    """Send ``work``'s result as the reply, or its error (a bug logged too)."""
    try:
        reply = await work
    except errors.Error as exc:
        reply = error_out(exc)
    except Exception as exc:
        log.exception("data op %r failed", op)
        reply = error_out(exc)
    _send_reply(conn, client_id, reply)


def _send_reply(conn: Any, client_id: Any, reply: Any) -> None:
    if conn.closed:
        return
    try:
        conn.send({"t": "rep", "id": client_id, "p": reply})
    except FrameTooLarge as exc:  # a reply too large for a frame
        log.warning("data reply refused: %s", exc)
        refusal = _too_large("the reply", exc.size, exc.limit)
        conn.send({"t": "rep", "id": client_id, "p": error_out(refusal)})
    except Exception as exc:
        log.error("cannot send a data reply: %s", exc)
        conn.send({"t": "rep", "id": client_id, "p": error_out(errors.ProtocolError(str(exc)))})


def _failed(exc: BaseException | None) -> dict[str, Any]:
    """A commit request that failed in the runtime (the node stopping) → a ``run`` reply."""
    name = "Unavailable" if isinstance(exc, errors.Unavailable) else "Error"
    return {"error": name, "why": str(exc)}


__all__ = [
    "CLIENT_OPS",
    "RETRYABLE_REASONS",
    "SESSION_OPS",
    "DataService",
    "ServiceConfig",
    "apply_writes",
    "check_type",
    "execute",
    "is_data_message",
    "is_data_op",
    "map_run_reply",
    "merge_write",
    "types_reply",
]
