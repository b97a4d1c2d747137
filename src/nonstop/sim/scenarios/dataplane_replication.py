"""The data path's simulated node with sync replication of partitions (replication.md §10).

:class:`ReplicatedDataNode` is the data path's node (:class:`SimDataNode`: HA
cluster node, distributed commit, data plane, simulated store) plus the
:class:`~nonstop.replication.machine.ReplicationMachine`, wired as the data
path needs it:

* **One-node commits** (the store's local group commit) and **a participant's
  prepare** (the store as two-phase commit's resource manager) hand their
  after-images to :meth:`commit` / :meth:`prepare` (the store's
  :class:`~nonstop.sim.scenarios.dataplane_store.Replicator`).  They are split
  by partition (a reference's location code names its partition) into write
  sets -- ``<ref hex>`` -> ``[type, version, state]`` (None: deleted) -- and the
  request results of the commit (``r:<client>\\0<seq>`` -> ``[ok, value]``) go
  into every touched partition's write set (H2: a retry on the promoted node
  finds them).  The commit is answered, and the participant votes yes, only
  when the record of every touched partition completed (durable here and on
  every in-sync sync replica, I3).  A partition this node does not act for
  refuses at once, before anything is written anywhere (``NotActive``:
  retryable, rolled back); a record that failed after it was sent answers
  ``Unavailable`` (outcome unknown: it may be on the promoted replica; the
  client asks ``request.result``).
* **Outcomes**: the store's phase two (``finish``) calls :meth:`outcome`: the
  machine holds the gtid's acknowledgement (``hold``; the dtx machine's
  ``hold_ack`` is the machine's ``held``, ``rep.released`` acknowledges at
  once), then a record of each partition that holds the prepared record.
* **Promotion**: when this node starts acting for P (the machine starts a
  stream), the store's copy of P is replaced by the machine's (objects and
  request results, made durable in the store's own keys too) and P's prepared
  records are taken over with write locks on their objects
  (``rep:<gtid>``); the machine's ``Resolve`` becomes a decision-log lookup
  (abort proposed if nothing is decided), its answer an ``outcome`` record and,
  for a commit, the after-images installed in the store.
* **Restore copies**: the machine's copy records carry P's objects from its
  own copy (the store's objects of P are the same values: every write of P on
  the active node goes through both); the target's store takes them when it
  acts (as at promotion).  The restorer proposes ``restored`` only once the
  machine's copy is done (``copy_done``).
* ``Submit`` (a D12 ``drop``) becomes a partition-table entry.

The machine persists its own copy (``rep/``) besides the store's (``st/``): the
simulator keeps both, the real node will keep one (replication.md §10).

A one-node commit that writes **several partitions** is prepared in each and
decided in the decision log (gtid ``<node>~rep.<n>``), then given its outcome
records, so it is atomic on the replicas; its decision proposal is resent until
the log answers.  Root causes found and what is left: replication.md §10b.
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable, Mapping
from typing import Any

from nonstop import errors
from nonstop.ha.cluster_node import HaClusterNode
from nonstop.ha.partition_table import TABLE
from nonstop.model.wire import error_out
from nonstop.net import plain
from nonstop.replication import ReplicationConfig, ReplicationMachine
from nonstop.replication.applied_table import AppliedTable
from nonstop.replication.data import K_DATA, K_HEAD
from nonstop.replication.host import RESULT_KEY, Refusal, ReplicationHost, WriteSets
from nonstop.replication.machine import PREFIX
from nonstop.runtime.interface import (
    Action,
    Event,
    NodeId,
    Notify,
    Persist,
    Persisted,
    Received,
    SetTimer,
    TimerFired,
)
from nonstop.sim.core import Simulation
from nonstop.sim.scenarios.dataplane_node import TOKEN_OWNERS, SimDataNode
from nonstop.sim.scenarios.dataplane_store import taken_name, taken_parts

SIM_REPLICATION = ReplicationConfig(
    replica_timeout=0.3,
    resend=0.05,
    batch=4,
    resolve_after=1.0,
    # Small bounds, so that the seeds run prepared records in parts, large one-node commits
    # made prepared records, and messages cut short (replication.md §4a).
    record_writes=2,
    message_writes=4,
    # Two writes made per event: larger prepared records and outcomes go across events
    # (``rep.slice``), other records of the partition queued behind (§4a).
    step_writes=2,
)
"""The machine's timings scaled to the simulator (replication.md §8)."""

Done = Callable[[dict[str, Any] | None], None]
"""The simulated store's callback: None, or an error reply (``"unknown": True``: the outcome
is not known here)."""


def write_sets(after: list[list[Any]], partition_of: Callable[[bytes], str | None]) -> WriteSets:
    """After-images -> one write set per partition (module doc); objects outside every
    partition are not replicated."""
    sets: WriteSets = {}
    results: dict[str, Any] = {}
    for image in after:
        if isinstance(image[0], bytes):
            ref, type_name, version, state = image
            partition = partition_of(ref)
            if partition is not None:
                value = None if state is None else [type_name, version, state]
                sets.setdefault(partition, {})[ref.hex()] = value
        else:
            client, seq, ok, value = image
            results[f"{RESULT_KEY}{client}\0{seq}"] = [ok, value]
    for writes in sets.values():
        writes.update(results)
    return sets


def after_images(writes: Mapping[str, Any]) -> list[list[Any]]:
    """A write set (or a partition's values) -> the store's after-images."""
    after: list[list[Any]] = []
    for key, value in sorted(writes.items()):
        if key.startswith(RESULT_KEY):
            client, _, seq = key[len(RESULT_KEY) :].rpartition("\0")
            if value is not None:
                after.append([client, int(seq), bool(value[0]), value[1]])
        elif value is None:
            after.append([bytes.fromhex(key), "", 0, None])
        else:
            type_name, version, state = value
            after.append([bytes.fromhex(key), type_name, version, dict(state)])
    return after


def _reply(refusal: Refusal | None) -> dict[str, Any] | None:
    """The host's answer as the simulated store's error reply."""
    if refusal is None:
        return None
    reply = error_out(refusal.error)
    if refusal.unknown:
        reply["unknown"] = True
    return reply


PREPARE_TIMER = "dpr.prepare:"
"""Timer of a delayed prepare (``prepare_delay``)."""


class ReplicatedDataNode(SimDataNode):
    """The data path's node with sync replication of partitions (module doc)."""

    def __init__(
        self,
        cluster_config: Any,
        rng: random.Random,
        recovered: Mapping[bytes, bytes],
        *,
        replication: ReplicationConfig = SIM_REPLICATION,
        prepare_delay: float = 0.0,
        late_renewals: float = 0.0,
        **kwargs: Any,
    ) -> None:
        super().__init__(cluster_config, rng, recovered, **kwargs)
        self.prepare_delay = prepare_delay
        """Up to this many seconds between a prepare and the host's ``replicate`` (the
        scenario's ``prepare_delay``); its own RNG, so the delay moves nothing else."""
        self._delay_rng = random.Random(rng.getrandbits(64)) if prepare_delay > 0 else None
        self._delayed: dict[int, tuple[str, WriteSets, Done]] = {}
        self._delay_seq = 0
        self.prepared_parts: dict[str, list[str]] = {}
        """gtid -> the partitions this node's participant prepared it in, until its outcome
        (``own_prepare``: the host leaves their resolution to the distributed commit)."""
        ha = self.node.cluster
        assert isinstance(ha, HaClusterNode), "replication needs the HA cluster node"
        self.ha = ha
        if late_renewals > 0:
            _skip_renewals(ha, random.Random(rng.getrandbits(64)), late_renewals)
        self.replication = ReplicationMachine(
            self.name, random.Random(rng.getrandbits(64)), recovered, replication
        )
        ha.restorer.copy_done = self.replication.copy_done
        self.store.replicator = self
        # The participant acknowledges phase two only once the machine released its hold.
        self.node.dtx.hold_ack = self.replication.held
        self.host = ReplicationHost(
            self.replication,
            _SimHostRuntime(self),
            # Random start: a restart does not reuse a multi-partition commit's gtid.
            first_local_txid=random.Random(rng.getrandbits(64)).getrandbits(48),
            propose_again=lambda: self.node.dtx.config.retry,
            # Re-asked like the real node's (REPROPOSE): a lookup's answer is lost when the
            # node installs a snapshot past its entry (seed 3100449 waited resolve_after).
            lookup_again=self.node.dtx.config.retry,
        )
        self.table = AppliedTable(ha)
        # The data plane acts for P only once the store took the machine's copy of P for the
        # stream this node runs (seed 1917), as the real node's ``ready`` (node/replicated.py).
        cluster_acting = self.dataplane.config.acting
        assert cluster_acting is not None, "replication routes by partition"
        self.dataplane.config.acting = functools.partial(_acting_when_ready, cluster_acting, self)

    @property
    def loaded(self) -> dict[str, int]:
        """Partition -> the stream id the store's copy was loaded for (promotion)."""
        return self.host.loaded

    def ready(self, partition: str) -> bool:
        """Has the store taken the machine's copy of ``partition`` for the stream this node
        runs?  Until then the store holds an older copy (the one it had when this node last
        acted, or a participant's late phase two): seed 1917 answered a read from it in the
        step the lease began, before the host loaded the new stream's copy at the step's end."""
        stream = self.replication.streams.get(partition)
        if stream is None or self.loaded.get(partition) != stream.stream_id:
            return False
        # (nor while part of the copy waits for a branch in doubt here: the real node's
        # load waits for its lock, and the partition is not served until the load is done)
        waiting = self.store.load_waiting
        return not waiting or all(self.table.partition_of(r) != partition for r in waiting)

    # ------------------------------------------------------------ the machine's events
    def handle(self, event: Event) -> list[Action]:
        self.host.dirty = True  # on_table after every event (replication.md §3)
        return super().handle(event)

    def _side_event(self, event: Event) -> bool:
        if isinstance(event, TimerFired) and event.name.startswith(PREPARE_TIMER):
            self._delayed_prepare(int(event.name[len(PREPARE_TIMER) :]))
            return True
        if isinstance(event, TimerFired):
            taken = event.name.startswith(PREFIX)
        elif isinstance(event, Received) and isinstance(event.payload, dict):
            kind = event.payload.get("t")
            taken = isinstance(kind, str) and kind.startswith(PREFIX)
        else:
            taken = False
        if taken:
            self.host.handle(event)
        return taken

    def _side_persisted(self, event: Persisted) -> None:
        self.host.handle(event)

    def _settle(self, now: float) -> bool:
        host = self.host
        if not host.dirty:
            return False
        host.settle(now, self.table.views(), self.table.acting(now))
        if self.store.replicated_prepared:
            self._drop_settled_taken_over()
        return bool(self._queue) or not self.store.idle() or host.dirty

    def _cluster(self, now: float, actions: list[Action]) -> None:
        """Actions of the cluster node (a table entry, a log request) as the node's own."""
        self._from_node(now, self.node._from_cluster(now, actions))

    def _from_node(self, now: float, actions: list[Action]) -> None:
        for action in actions:
            if isinstance(action, Notify) and action.kind == "dl.answer":
                self.host.decision(now, action.data.get("payload"))
        super()._from_node(now, actions)

    # ------------------------------------------------------------ the store's replicator
    def commit(self, after: list[list[Any]], done: Done) -> dict[str, Any] | None:
        return self._replicate(after, done, None)

    def prepare(self, gtid: str, after: list[list[Any]], done: Done) -> dict[str, Any] | None:
        sets = write_sets(after, self.table.partition_of)
        self.prepared_parts[gtid] = sorted(sets)
        if len(self.prepared_parts) > 4096:
            self.prepared_parts.pop(next(iter(self.prepared_parts)))
        if self._delay_rng is None:
            return self._to_host(sets, gtid, done)
        self._delay_seq += 1
        key = self._delay_seq
        self._delayed[key] = (gtid, sets, done)
        delay = self._delay_rng.uniform(0.0, self.prepare_delay)
        self._out.append(SetTimer(f"{PREPARE_TIMER}{key}", delay))
        return None

    def _delayed_prepare(self, key: int) -> None:
        """A delayed prepare reaches the host -- unless its branch ended meanwhile (its
        coordinator gave up): then nothing is made, as a real participant's cancelled
        prepare task makes nothing."""
        entry = self._delayed.pop(key, None)
        if entry is None:
            return
        gtid, sets, done = entry
        if gtid not in self.store.rm_branches:
            done(_reply(Refusal(errors.NotActive(f"{gtid} ended before its prepare"))))
            return
        self.host.dirty = True
        refused = self._to_host(sets, gtid, done)
        if refused is not None:
            done(refused)

    def _replicate(
        self, after: list[list[Any]], done: Done, gtid: str | None
    ) -> dict[str, Any] | None:
        return self._to_host(write_sets(after, self.table.partition_of), gtid, done)

    def _to_host(self, sets: WriteSets, gtid: str | None, done: Done) -> dict[str, Any] | None:
        """``sets`` to the host's ``replicate``; a refusal made at once is returned (as the
        store's error reply), a later answer goes to ``done``."""
        return _reply(self.host.replicate(self.now, sets, gtid, lambda r: done(_reply(r))))

    def outcome(self, gtid: str, commit: bool, after: list[list[Any]]) -> None:
        # The hold is persisted before the participant's tombstone (same disk, in order).
        parts = write_sets(after, self.table.partition_of)
        self.prepared_parts.pop(gtid, None)
        self.host.outcome(self.now, gtid, commit, sorted(parts))

    def lookup(self, client: str, seq: int) -> tuple[tuple[bool, Any] | None, bool]:
        return self.host.lookup(client, seq)

    # ------------------------------------------------------------ promotion
    def _drop_settled_taken_over(self) -> None:
        """A prepared record taken over at promotion that the new active node resolved
        (``ReplicationHost.settled_elsewhere``): its locks go (seed 1294).  The store's
        objects of P are not served here now, and are replaced by the machine's copy when
        this node acts for P again."""
        for taken in list(self.store.replicated_prepared):
            name, gtid = taken_parts(taken)
            if self.host.settled_elsewhere(name, gtid):
                self.store.end_prepared(taken, False)

    def status(self) -> dict[str, Any]:
        status = super().status()
        status["replication"] = self.host.status()
        return status


class _SimHostRuntime:
    """The simulated node's side of :class:`ReplicationHost` (``HostRuntime``)."""

    def __init__(self, node: ReplicatedDataNode) -> None:
        self.node = node

    def persist(self, action: Persist) -> None:
        self.node._out.append(Persist(TOKEN_OWNERS * action.token + 3, action.writes))

    def emit(self, action: Any) -> None:
        self.node._out.append(action)

    def submit(self, now: float, entry: dict[str, Any]) -> None:
        node = self.node
        node._cluster(now, node.ha.submit(now, TABLE, entry))

    def ask_log(self, now: float, request: dict[str, Any]) -> None:
        node = self.node
        node._cluster(now, node.node.decisions.request(now, request))

    def release(self, now: float, gtid: str) -> None:
        node = self.node
        node._from_node(now, node.node.released(now, gtid))

    def tomb(self, gtid: str) -> str | None:
        return self.node.node.dtx.tombs.get(gtid)

    def own_prepare(self, gtid: str) -> list[str]:
        return self.node.prepared_parts.get(gtid, [])

    def load_copy(
        self, name: str, stream_id: int, values: Mapping[str, Any], prepared: Mapping[str, Any]
    ) -> None:
        """The store's copy of ``name`` becomes the machine's (objects of ``name`` it lacks
        deleted); its prepared records are taken over with write locks on their objects."""
        node, store = self.node, self.node.store
        after = after_images(values)
        present = {bytes.fromhex(k) for k in values if not k.startswith(RESULT_KEY)}
        gone = [r for r in store.objects if r not in present and node.table.partition_of(r) == name]
        after += [[r, "", 0, None] for r in sorted(gone)]
        store.load(after)
        for txid, writes in sorted(prepared.items()):
            images = after_images(writes)
            own = store.rm_branches.get(txid)
            if own is not None:
                # This node's own branch of the same gtid installs its writes at its phase
                # two; the rest of the record is another participant's (seed 3100502).
                mine = {image[0] for image in own.after or []}
                images = [image for image in images if image[0] not in mine]
            if images:
                store.take_prepared(taken_name(name, txid), images)

    def resolved(
        self, name: str, txid: str, writes: Mapping[str, Any] | None, commit: bool
    ) -> None:
        store = self.node.store
        taken_over = store.end_prepared(taken_name(name, txid), commit)
        if txid in store.rm_branches:
            return  # the store's own phase two installs the rest
        if not taken_over and writes is not None and commit and name in self.node.host.loaded:
            store.load(after_images(writes))


def _skip_renewals(ha: HaClusterNode, rng: random.Random, share: float) -> None:
    """Drop ``share`` of the node's lease renewals (the scenario's ``late_renewals``): a
    real node's renewal comes late when its event loop is held up (a large op, a swap), so
    its lease lapses while the table stays as it was -- the lapses that the data plane's
    ops and votes wait out (``dataplane/lapse_waits.py``).  Safe by construction: a lease
    that is not renewed only lapses."""
    keeper = ha.leases
    plain = keeper.renewal

    def renewal(now: float) -> dict[str, Any] | None:
        entry = plain(now)
        return None if entry is not None and rng.random() < share else entry

    keeper.renewal = renewal  # type: ignore[method-assign]


def _acting_when_ready(
    cluster_acting: Callable[[float, str], bool], node: ReplicatedDataNode, now: float, name: str
) -> bool:
    """The data plane's ``acting``: the cluster node's answer, and the store holds the copy."""
    return cluster_acting(now, name) and node.ready(name)


def replicas_durable_observer(
    fail: Callable[[str, str], None],
) -> Callable[[Simulation, NodeId, Event, list[Action]], None]:
    """**durable** (I3): when a node completes record ``seq`` of P (``rep.acked``: a commit
    or a prepare may be acknowledged), every in-sync sync replica of P in that node's view
    holds the stream up to ``seq`` on its simulated *disk* (synced state, not memory)."""

    def observe(sim: Simulation, node: NodeId, event: Event, actions: list[Action]) -> None:
        for action in actions:
            if not isinstance(action, Notify) or action.kind != "rep.acked":
                continue
            data = action.data
            machine = sim.machine(node)
            if not isinstance(machine, ReplicatedDataNode):
                continue
            view = machine.replication.views.get(data["p"])
            for replica in () if view is None else view.in_sync_replicas():
                raw = sim.nodes[replica].disk.durable.get(K_HEAD + str(data["p"]).encode())
                head = (0, 0) if raw is None else tuple(plain.unpack(raw))
                if head[0] != data["s"] or head[1] < data["seq"]:
                    fail(
                        "durable-replica",
                        f"{node} completed {data['p']} e{data['e']} seq {data['seq']}; "
                        f"in-sync replica {replica}'s disk is at {head}",
                    )

    return observe


def replicated_class(node_class: type[SimDataNode]) -> type[SimDataNode]:
    """``node_class`` (the plain node or a broken variant of it) with replication composed."""
    if issubclass(node_class, ReplicatedDataNode):
        return node_class
    if node_class is SimDataNode:
        return ReplicatedDataNode
    return type(f"Replicated{node_class.__name__}", (ReplicatedDataNode, node_class), {})


def replicated_key(partition: str, key: str) -> bytes:
    """The durable key of an object of ``partition`` in the machine's copy (initial loads)."""
    return K_DATA + partition.encode() + b"\0" + key.encode()


__all__ = [
    "SIM_REPLICATION",
    "ReplicatedDataNode",
    "after_images",
    "replicas_durable_observer",
    "replicated_class",
    "replicated_key",
    "write_sets",
]
