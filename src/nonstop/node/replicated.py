"""The real node's machine with sync replication of partitions (replication.md §10c, §10d).

:class:`ReplicatedClusterNode` is the node's :class:`~nonstop.dtx.clustered.DtxClusterNode`
(HA cluster node, distributed commit over the object store) hosting the
:class:`~nonstop.replication.host.ReplicationHost` -- the same glue the simulator's
``ReplicatedDataNode`` hosts, so the rules (holds, the unknown outcome, resent
proposals, resolution of prepared records) are written once.  What is this
node's own:

* **Events.**  ``rep.*`` peer messages (they arrive on the authenticated peer
  channel only: a client's request is a ``ClientRequest``, never a ``Received``)
  and ``rep.*`` timers go to the host; everything else to the DtxClusterNode.
  ``Persist`` tokens: ``2t`` the DtxClusterNode's, ``2t + 1`` the machine's, whose
  ``rep/`` keys go to the runtime's default persister (the node's cluster store,
  LMDB): a record counts as durable here only after that commit is on disk.
  After **every** event the host gets the applied table and this node's acting set;
  the tokens of one group commit come as one event (``handle_persisted``), so the
  settle runs once per group commit, not once per token.
* **The hold before the tombstone.**  The participant's phase two writes its
  ``dtx/t/`` tombstone to the object store, the hold (``rep/u/``) goes to the
  cluster store: two disks with no order between them.  A ``Persist`` carrying
  the tombstone of a gtid whose hold is not durable yet waits for it, so that a
  restart never finds the tombstone without the hold (replication.md §10d).
* **The store's calls** (:class:`StoreSide`) come from the data service's tasks,
  outside ``handle``: they are queued and the node wakes its machine with a
  ``rep.wake`` message to itself, so every action still leaves through
  ``handle``.  ``commit(records)`` (a one-node commit) answers None or the error
  reply of an unknown outcome; it raises ``NotActive`` (nothing made: retry) or the
  decided abort.  ``prepare(gtid, records)`` (a 2PC participant's prepare) raises
  on any refusal (the no vote), after recording the abort as this node's outcome.
  ``outcome(gtid, commit)`` is phase two, inside ``handle``.
* **Promotion**: when the machine starts a stream for P, the store takes the
  machine's copy of P (:func:`~nonstop.node.replica_store.load_copy`); prepared
  records of P are resolved and a committed one installed in the store.  Until
  both are done the data plane does not act for P (:meth:`ReplicatedClusterNode.
  ready`: ``NotActive``, retryable): nobody reads P's older copy, nor an object of
  a prepared record being resolved (the simulator answers that read
  ``Unavailable``; here the whole partition waits, §10b fix 5).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable, Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from nonstop import errors
from nonstop.dtx.clustered import ClusterFactory, DtxClusterNode
from nonstop.dtx.protocol import K_TOMB, DtxConfig, ResourceManager
from nonstop.ha.cluster_node import HaClusterNode
from nonstop.ha.partition_table import TABLE
from nonstop.model.wire import error_out
from nonstop.node.replica_store import WriteSets, partition_write_sets_sliced
from nonstop.replication import ReplicationConfig, ReplicationMachine
from nonstop.replication.applied_table import AppliedTable
from nonstop.replication.holds import K_HOLD
from nonstop.replication.host import Refusal, ReplicationHost
from nonstop.replication.machine import PREFIX
from nonstop.runtime.interface import (
    Action,
    ClientRequest,
    Event,
    Notify,
    Persist,
    Persisted,
    Received,
    Reply,
    TimerFired,
)

log = logging.getLogger("nonstop.node.replicated")

WAKE = "rep.wake"
"""The message a node sends itself when the store queued a call for the machine."""
REPROPOSE = 1.0
"""Seconds before an unanswered decision-log request of this composition is sent again
(the log drops requests without quorum or leader)."""
PREPARED_PARTITIONS = 4096
"""Prepares whose partitions are remembered for their phase two's hold (bounded: a gtid
forgotten here is still held on every partition whose copy holds it prepared)."""

StoreTask = Callable[[str, Mapping[str, Any]], Coroutine[Any, Any, Any]]


@dataclass(slots=True)
class _Load:
    """The store taking the machine's copy of a partition (promotion)."""

    stream: int
    loaded: bool = False
    unresolved: set[str] = field(default_factory=set)
    installing: int = 0


class StoreSide:
    """What the store (data service, participant) calls; hands the calls to the machine."""

    def __init__(self) -> None:
        self.machine: ReplicatedClusterNode | None = None
        self.wake: Callable[[], None] = lambda: None
        """Set by the node: ``runtime.send(self, {"t": "rep.wake"})``."""
        self._tasks: set[asyncio.Task[Any]] = set()

    def run(self, coro: Coroutine[Any, Any, Any]) -> None:
        """Run a store coroutine as a task on the node's loop (called inside ``handle``)."""
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _machine(self) -> ReplicatedClusterNode:
        if self.machine is None:
            raise errors.Unavailable("the node's machine is not started yet")
        return self.machine

    async def commit(self, records: list[list[Any]]) -> dict[str, Any] | None:
        """A one-node commit's records (``write_set_records``): None once on every in-sync
        copy; the error reply of an unknown outcome (``branch.commit`` answers it as
        ``{"unknown": reply}``: nothing is recorded); raises a refusal (nothing made)."""
        refusal = await self._call(records, None)
        if refusal is None:
            return None
        if refusal.unknown:
            return error_out(refusal.error)
        raise refusal.error

    async def prepare(self, gtid: str, records: list[list[Any]]) -> None:
        """A participant's prepared write set: on every in-sync copy before the yes vote."""
        refusal = await self._call(records, gtid)
        if refusal is not None:
            raise refusal.error

    async def _call(self, records: list[list[Any]], gtid: str | None) -> Refusal | None:
        machine = self._machine()
        future: asyncio.Future[Refusal | None] = asyncio.get_running_loop().create_future()

        def done(refusal: Refusal | None) -> None:
            if not future.done():
                future.set_result(refusal)

        # Split by partition here, a slice per loop turn, not inside the machine's step.
        sets = await partition_write_sets_sliced(records, machine.table.partition_of)
        machine.request(lambda now: machine.replicate(now, sets, gtid, done))
        self.wake()
        return await future

    def outcome(self, gtid: str, commit: bool) -> None:
        """Phase two of ``gtid`` on this node's participant (called inside ``handle``)."""
        if self.machine is not None:
            self.machine.outcome(gtid, commit)


class ReplicatedClusterNode(DtxClusterNode):
    """DtxClusterNode hosting the replication host (module doc)."""

    def __init__(
        self,
        cluster_config: Any,
        rm: ResourceManager,
        rng: random.Random,
        recovered: Mapping[bytes, bytes],
        dtx_config: DtxConfig | None = None,
        *,
        cluster_factory: ClusterFactory,
        store: StoreSide,
        load: StoreTask,
        install: StoreTask,
        replication: ReplicationConfig | None = None,
    ) -> None:
        super().__init__(
            cluster_config, rm, rng, recovered, dtx_config, cluster_factory=cluster_factory
        )
        ha = self.cluster
        assert isinstance(ha, HaClusterNode), "replication needs the HA cluster node"
        self.ha = ha
        self.replication = ReplicationMachine(
            self.name, random.Random(rng.getrandbits(64)), recovered, replication
        )
        ha.restorer.copy_done = self.replication.copy_done
        # The participant acknowledges phase two only once the machine released its hold.
        self.dtx.hold_ack = self.replication.held
        self.host = ReplicationHost(
            self.replication,
            _RealHostRuntime(self),
            # Random start: a restart does not reuse a multi-partition commit's gtid.
            first_local_txid=random.Random(rng.getrandbits(64)).getrandbits(48),
            propose_again=lambda: REPROPOSE,
            lookup_again=REPROPOSE,
        )
        self.store = store
        store.machine = self
        self._load_task = load
        self._install_task = install
        self._requests: list[Callable[[float], None]] = []
        self._out: list[Action] = []
        self._now = 0.0
        self._prepared_parts: dict[str, list[str]] = {}
        """gtid -> the partitions this node's participant prepared it in (the hold's)."""
        self._holds_writing: dict[int, list[str]] = {}
        """The machine's token of a hold's write -> its gtids, until it is durable."""
        self._unheld: dict[str, int] = {}
        """gtid -> hold writes in flight: its tombstone waits for them."""
        self._waiting_tombs: list[tuple[list[str], Persist]] = []
        self.loads: dict[str, _Load] = {}
        self.table = AppliedTable(ha)

    # ------------------------------------------------------------ the data plane's answer
    def ready(self, partition: str) -> bool:
        """Has the store taken the copy of ``partition`` for the stream this node runs
        (and settled the prepared records it came with)?  The data plane acts only then."""
        stream = self.replication.streams.get(partition)
        load = self.loads.get(partition)
        return (
            stream is not None
            and load is not None
            and load.stream == stream.stream_id
            and load.loaded
            and not load.unresolved
            and load.installing == 0
        )

    def request(self, call: Callable[[float], None]) -> None:
        """Queue a store call; it runs at the next event (the store wakes the node)."""
        self._requests.append(call)

    # ------------------------------------------------------------ events
    def handle(self, event: Event) -> list[Action]:
        now = self._now = event.now
        self._out = []
        host = self.host
        host.dirty = True
        if isinstance(event, Received) and _rep_kind(event.payload):
            if event.payload.get("t") != WAKE:
                host.handle(event)
            elif event.sender != self.name:
                pass  # (only this node wakes itself)
        elif isinstance(event, TimerFired) and event.name.startswith(PREFIX):
            host.handle(event)
        elif isinstance(event, Persisted):
            self._persisted(now, event.token)
        else:
            self._inner(now, super().handle(event))
        out = self._after_event(now)
        if isinstance(event, ClientRequest) and _op(event.payload) == "status":
            out = [self._with_status(a, event.request_id) for a in out]
        return out

    def handle_persisted(self, now: float, tokens: Sequence[int]) -> list[Action]:
        """The tokens of one group commit (``runtime.interface.DurableBatches``): each goes
        to its component as its own ``Persisted``, in order; the store's queued calls and
        the settle run once for the batch, as after one event (module doc)."""
        self._now = now
        self._out = []
        self.host.dirty = True
        for token in tokens:
            self._persisted(now, token)
        return self._after_event(now)

    def _persisted(self, now: float, token: int) -> None:
        inner, owner = divmod(token, 2)
        if owner:
            self.host.handle(Persisted(now, inner))
            if inner in self._holds_writing:
                self._hold_durable(inner)
        else:
            self._inner(now, super().handle(Persisted(now, inner)))

    def _after_event(self, now: float) -> list[Action]:
        """The store's queued calls, then the host's settle; every action of the event."""
        host = self.host
        requests, self._requests = self._requests, []
        for call in requests:
            call(now)
        for _ in range(8):  # on_table after the event, again when it made records
            if not host.dirty:
                break
            self._settle(now)
        out, self._out = self._out, []
        return out

    def _with_status(self, action: Action, request_id: int) -> Action:
        """The status reply with this node's replication (streams, heads, ready partitions)."""
        if not isinstance(action, Reply) or action.request_id != request_id:
            return action
        if not isinstance(action.payload, dict):
            return action
        return Reply(request_id, {**action.payload, "replication": self.replication_status()})

    def _inner(self, now: float, actions: list[Action]) -> None:
        """The DtxClusterNode's actions as this node's (tokens ``2t``)."""
        for action in actions:
            if isinstance(action, Persist):
                persist = Persist(2 * action.token, action.writes)
                unheld = self._unheld and self._unheld_tombs(persist)
                if unheld:
                    self._waiting_tombs.append((unheld, persist))
                else:
                    self._out.append(persist)
            else:
                if isinstance(action, Notify) and action.kind == "dl.answer":
                    self.host.decision(now, action.data.get("payload"))
                self._out.append(action)

    def _cluster(self, now: float, actions: list[Action]) -> None:
        """Actions of the cluster node (a table entry, a log request) as the node's own."""
        self._inner(now, self._from_cluster(now, actions))

    def _settle(self, now: float) -> None:
        self.host.settle(now, self.table.views(), self.table.acting(now))
        for name, load in self.loads.items():
            if load.unresolved and name not in self.replication.streams:
                # P moved on before its prepared records were resolved here: the new active
                # node resolves them (§10b fix 6); a new stream here loads P again.
                for txid in sorted(load.unresolved):
                    if self.host.settled_elsewhere(name, txid):
                        load.unresolved.discard(txid)

    # ------------------------------------------------------------ the hold before the tombstone
    def _machine_persist(self, action: Persist) -> None:
        """The machine's write (token ``2t + 1``); a hold's is tracked until durable."""
        held = [k[len(K_HOLD) :].decode() for k, v in action.writes if k.startswith(K_HOLD) and v]
        if held:
            self._holds_writing[action.token] = held
            for gtid in held:
                self._unheld[gtid] = self._unheld.get(gtid, 0) + 1
        self._out.append(Persist(2 * action.token + 1, action.writes))

    def _unheld_tombs(self, persist: Persist) -> list[str]:
        """The gtids whose tombstone ``persist`` writes while their hold is not durable."""
        return [
            gtid
            for key, value in persist.writes
            if value is not None
            and key.startswith(K_TOMB)
            and (gtid := key[len(K_TOMB) :].decode()) in self._unheld
        ]

    def _hold_durable(self, token: int) -> None:
        for gtid in self._holds_writing.pop(token):
            left = self._unheld[gtid] - 1
            if left:
                self._unheld[gtid] = left
            else:
                del self._unheld[gtid]
        waiting, self._waiting_tombs = self._waiting_tombs, []
        for gtids, persist in waiting:
            if any(g in self._unheld for g in gtids):
                self._waiting_tombs.append((gtids, persist))
            else:
                self._out.append(persist)

    # ------------------------------------------------------------ the store's calls
    def replicate(
        self,
        now: float,
        sets: WriteSets,
        gtid: str | None,
        done: Callable[[Refusal | None], None],
    ) -> None:
        """A commit's (``gtid`` None) or a prepare's write sets by partition (module doc)."""
        answer = done
        if gtid is not None:
            txid = gtid
            self._prepared_parts[txid] = sorted(sets)
            if len(self._prepared_parts) > PREPARED_PARTITIONS:
                self._prepared_parts.pop(next(iter(self._prepared_parts)))

            def voted(refusal: Refusal | None) -> None:
                if refusal is not None and refusal.unknown:
                    # This participant votes no: the outcome is abort, known here -- a copy
                    # of the prepared record elsewhere resolves from it (held like any other).
                    # (Not ``unknown``: refused after waiting out a lapse, nothing was made.)
                    parts = self._prepared_parts.get(txid, [])
                    self.host.outcome(self.host.now, txid, False, parts)
                done(refusal)

            answer = voted
        refused = self.host.replicate(now, sets, gtid, answer)
        if refused is not None:
            done(refused)  # refused before anything was made

    def outcome(self, gtid: str, commit: bool) -> None:
        """The participant's phase two of ``gtid`` (inside ``handle``: the dtx machine's
        finish, before its tombstone is written): the hold, then the outcome records."""
        parts = self._prepared_parts.pop(gtid, [])
        self.host.outcome(self._now, gtid, commit, parts)

    # ------------------------------------------------------------ promotion
    def _load_copy(self, name: str, stream_id: int, values: Mapping[str, Any], txids: Any) -> None:
        load = self.loads[name] = _Load(stream_id, unresolved=set(txids))
        self.store.run(self._loading(name, load, dict(values)))

    async def _loading(self, name: str, load: _Load, values: dict[str, Any]) -> None:
        try:
            count = await self._load_task(name, values)
        except Exception:
            log.exception("%s: the store could not take the replicated copy", name)
            self.loads.pop(name, None)
            self.host.loaded.pop(name, None)  # tried again at the next event
            self.store.wake()
            return
        load.loaded = True
        log.info("%s: the store took the replicated copy (%d records)", name, count)

    def _resolved(
        self, name: str, txid: str, writes: Mapping[str, Any] | None, commit: bool
    ) -> None:
        load = self.loads.get(name)
        if load is None:
            return
        if writes is not None and commit:
            # Installed even if this node's own participant holds the branch in doubt: the
            # load waits for its locks and the values are the same (whole states).
            load.installing += 1
            self.store.run(self._installing(name, load, dict(writes)))
        load.unresolved.discard(txid)

    async def _installing(self, name: str, load: _Load, writes: dict[str, Any]) -> None:
        try:
            while not load.loaded:  # after the load: it deletes what its copy lacks
                await asyncio.sleep(0.01)
                if self.loads.get(name) is not load:
                    return
            await self._install_task(name, writes)
        except Exception:
            log.exception("%s: a resolved prepared record could not be installed", name)
            raise
        finally:
            load.installing -= 1
            self.store.wake()  # ready() may have changed: let the node settle

    def replication_status(self) -> dict[str, Any]:
        return {
            "replication": self.host.status(),
            "ready": sorted(n for n in self.replication.streams if self.ready(n)),
        }

    def replication_stats(self) -> dict[str, int]:
        """Counters for ``runtime_stats``: the machine's (drops, copies, ...) and the
        commits and prepares the host parked while this node's lease lapsed."""
        return {**self.replication.stats, "lapses_waited": self.host.lapses_waited}


class _RealHostRuntime:
    """The real node's side of :class:`ReplicationHost` (``HostRuntime``)."""

    def __init__(self, node: ReplicatedClusterNode) -> None:
        self.node = node

    def persist(self, action: Persist) -> None:
        self.node._machine_persist(action)

    def emit(self, action: Any) -> None:
        self.node._out.append(action)

    def submit(self, now: float, entry: dict[str, Any]) -> None:
        node = self.node
        node._cluster(now, node.ha.submit(now, TABLE, entry))

    def ask_log(self, now: float, request: dict[str, Any]) -> None:
        node = self.node
        node._cluster(now, node.decisions.request(now, request))

    def release(self, now: float, gtid: str) -> None:
        node = self.node
        node._inner(now, node.released(now, gtid))

    def tomb(self, gtid: str) -> str | None:
        return self.node.dtx.tombs.get(gtid)

    def own_prepare(self, gtid: str) -> list[str]:
        return self.node._prepared_parts.get(gtid, [])

    def load_copy(
        self, name: str, stream_id: int, values: Mapping[str, Any], prepared: Mapping[str, Any]
    ) -> None:
        self.node._load_copy(name, stream_id, values, prepared)

    def resolved(
        self, name: str, txid: str, writes: Mapping[str, Any] | None, commit: bool
    ) -> None:
        self.node._resolved(name, txid, writes, commit)


def _op(payload: Any) -> Any:
    return payload.get("op") if isinstance(payload, dict) else None


def _rep_kind(payload: Any) -> bool:
    kind = payload.get("t") if isinstance(payload, dict) else None
    return isinstance(kind, str) and kind.startswith(PREFIX)


__all__ = ["WAKE", "ReplicatedClusterNode", "StoreSide"]
