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
from dataclasses import dataclass, field
from typing import Any

from nonstop import errors
from nonstop.dtx.decisions import DECIDED, LOOKUP, PROPOSE, UNKNOWN
from nonstop.ha.cluster_node import HaClusterNode
from nonstop.ha.partition_table import TABLE, partition_location
from nonstop.model.ref import Ref
from nonstop.model.wire import error_out
from nonstop.net import plain
from nonstop.replication import (
    Completed,
    Failed,
    PartitionView,
    ReplicationConfig,
    ReplicationMachine,
    Resolve,
    Submit,
)
from nonstop.replication.data import K_DATA, K_HEAD
from nonstop.replication.machine import PREFIX, RELEASED
from nonstop.replication.records import OUTCOME_ABORT, OUTCOME_COMMIT, PREPARE
from nonstop.replication.view import view_of
from nonstop.runtime.interface import (
    Action,
    Event,
    NodeId,
    Notify,
    Persist,
    Persisted,
    Received,
    TimerFired,
)
from nonstop.sim.core import Simulation
from nonstop.sim.scenarios.dataplane_node import TOKEN_OWNERS, SimDataNode

SIM_REPLICATION = ReplicationConfig(replica_timeout=0.3, resend=0.05, batch=4, resolve_after=1.0)
"""The machine's timings scaled to the simulator (replication.md §8)."""

LOCAL_COORDINATOR = "~rep"
"""Gtids ``<node>~rep.<n>`` name multi-partition one-node commits in the decision log: a
coordinator of its own that announces no floor, so the log never forgets them (a promoted
copy can always resolve one; the table grows by one decision per such commit)."""

RESULT_KEY = "r:"
"""Write-set key prefix of a request result ``r:<client>\\0<seq>``."""

Done = Callable[[dict[str, Any] | None], None]


@dataclass(slots=True)
class _Group:
    """The records of one commit or prepare, one per touched partition."""

    done: Done
    remaining: int
    failed: dict[str, Any] | None = None
    partitions: list[str] = field(default_factory=list)


def write_sets(
    after: list[list[Any]], partition_of: Callable[[bytes], str | None]
) -> dict[str, dict[str, Any]]:
    """After-images -> one write set per partition (module doc); objects outside every
    partition are not replicated."""
    sets: dict[str, dict[str, Any]] = {}
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


class ReplicatedDataNode(SimDataNode):
    """The data path's node with sync replication of partitions (module doc)."""

    def __init__(
        self,
        cluster_config: Any,
        rng: random.Random,
        recovered: Mapping[bytes, bytes],
        *,
        replication: ReplicationConfig = SIM_REPLICATION,
        **kwargs: Any,
    ) -> None:
        super().__init__(cluster_config, rng, recovered, **kwargs)
        ha = self.node.cluster
        assert isinstance(ha, HaClusterNode), "replication needs the HA cluster node"
        self.ha = ha
        self.replication = ReplicationMachine(
            self.name, random.Random(rng.getrandbits(64)), recovered, replication
        )
        ha.restorer.copy_done = self.replication.copy_done
        self.store.replicator = self
        self._groups: dict[int, _Group] = {}
        self._next_group = 0
        self._resolving: dict[str, set[str]] = {}
        """gtid -> the partitions whose prepared record of it waits for its outcome."""
        # The participant acknowledges phase two only once the machine released its hold.
        self.node.dtx.hold_ack = self.replication.held
        self._local_txid = random.Random(rng.getrandbits(64)).getrandbits(48)
        """Sequence of this node's multi-partition one-node commits (random start: a restart
        does not reuse one)."""
        self._deciding: dict[str, tuple[list[str], Done, dict[str, Any] | None]] = {}
        self._proposed: dict[str, tuple[float, dict[str, Any]]] = {}
        """txid of ``_deciding`` -> (when, the proposal): resent every dtx ``retry`` until
        decided (the log drops a request without quorum or leader)."""
        self._outcomes: dict[str, str] = {}
        """gtid -> outcome this node's participant applied (bounded; a restart forgets)."""
        self.loaded: dict[str, int] = {}
        """Partition -> the stream id the store's copy was loaded for (promotion)."""
        self._locations: dict[int, str] = {}
        self._views: tuple[tuple[int, bytes], dict[str, PartitionView]] = ((-1, b""), {})
        self._rep_dirty = True
        # The data plane acts for P only once the store took the machine's copy of P for the
        # stream this node runs (seed 1917), as the real node's ``ready`` (node/replicated.py).
        cluster_acting = self.dataplane.config.acting
        assert cluster_acting is not None, "replication routes by partition"
        self.dataplane.config.acting = functools.partial(_acting_when_ready, cluster_acting, self)

    # ------------------------------------------------------------ the machine's events
    def handle(self, event: Event) -> list[Action]:
        self._rep_dirty = True  # on_table after every event (replication.md §3)
        return super().handle(event)

    def _side_event(self, event: Event) -> bool:
        if isinstance(event, TimerFired):
            taken = event.name.startswith(PREFIX)
        elif isinstance(event, Received) and isinstance(event.payload, dict):
            kind = event.payload.get("t")
            taken = isinstance(kind, str) and kind.startswith(PREFIX)
        else:
            taken = False
        if taken:
            self._rep_actions(event.now, self.replication.handle(event))
        return taken

    def _side_persisted(self, event: Persisted) -> None:
        self._rep_actions(event.now, self.replication.handle(event))

    def _settle(self, now: float) -> bool:
        if not self._rep_dirty:
            return False
        self._rep_dirty = False
        ha = self.ha
        acting = [n for n in ha.partition_table.partitions if ha.acting(now, n)]
        self._rep_actions(now, self.replication.on_table(now, self._rep_views(), acting))
        self._load_new_streams(now)
        if self.store.replicated_prepared:
            self._drop_settled_taken_over()
        if self._proposed:
            self._propose_again(now)
        return bool(self._queue) or not self.store.idle() or self._rep_dirty

    def _rep_views(self) -> dict[str, PartitionView]:
        ha = self.ha
        at, views = self._views
        if at != (ha.applied_index, ha.applied_digest):
            views = {n: view_of(p) for n, p in ha.partition_table.partitions.items()}
            self._views = ((ha.applied_index, ha.applied_digest), views)
        return views

    def _rep_actions(self, now: float, actions: list[Any]) -> None:
        for action in actions:
            if isinstance(action, Persist):
                self._out.append(Persist(TOKEN_OWNERS * action.token + 3, action.writes))
            elif isinstance(action, Completed | Failed):
                self._finished(action)
            elif isinstance(action, Notify) and action.kind == RELEASED:
                self._out.append(action)
                self._from_node(now, self.node.released(now, str(action.data["g"])))
            elif isinstance(action, Submit):
                self._cluster(now, self.ha.submit(now, TABLE, dict(action.entry)))
            elif isinstance(action, Resolve):
                self._resolving.setdefault(action.txid, set()).add(action.partition)
                known = self._known_outcome(action.txid)
                if known is not None:
                    # This node was the participant and applied the outcome while it did not
                    # act for the partition (a restart): the log may have forgotten it since.
                    self._decision(now, {"t": DECIDED, "g": action.txid, "o": known})
                    continue
                lookup = {"t": LOOKUP, "g": action.txid}
                self._cluster(now, self.node.decisions.request(now, lookup))
            else:
                self._out.append(action)

    def _cluster(self, now: float, actions: list[Action]) -> None:
        """Actions of the cluster node (a table entry, a log request) as the node's own."""
        self._from_node(now, self.node._from_cluster(now, actions))

    def _from_node(self, now: float, actions: list[Action]) -> None:
        for action in actions:
            if isinstance(action, Notify) and action.kind == "dl.answer":
                self._decision(now, action.data.get("payload"))
        super()._from_node(now, actions)

    # ------------------------------------------------------------ the store's replicator
    def commit(self, after: list[list[Any]], done: Done) -> dict[str, Any] | None:
        return self._replicate(after, done, None)

    def prepare(self, gtid: str, after: list[list[Any]], done: Done) -> dict[str, Any] | None:
        return self._replicate(after, done, gtid)

    def outcome(self, gtid: str, commit: bool, after: list[list[Any]]) -> None:
        rep, now = self.replication, self.now
        decision = OUTCOME_COMMIT if commit else OUTCOME_ABORT
        self._outcomes[gtid] = decision
        if len(self._outcomes) > 4096:
            self._outcomes.pop(next(iter(self._outcomes)))
        # The participant acknowledges phase two only once every copy of the partitions it
        # prepared in that may be promoted holds the outcome (replication/holds.py): else the
        # log may forget the gtid while a copy still needs it.  The hold is persisted before
        # the participant's tombstone (same disk, in order), so it survives a restart.
        # The partitions its after-images name, and every partition whose copy here holds
        # the gtid prepared: right after a restart the table is not applied yet and names
        # nothing (seed 2440), while the copies are recovered from the disk.
        parts = set(write_sets(after, self._partition_of))
        parts |= {name for name, held in rep.data.prepared.items() if gtid in held}
        self._rep_actions(now, rep.hold(gtid, sorted(parts)))
        self._rep_dirty = True
        for name in [n for n in sorted(rep.streams) if gtid in rep.data.prepared_of(n)]:
            self._rep_actions(now, rep.outcome(now, None, name, gtid, decision))

    def lookup(self, client: str, seq: int) -> tuple[tuple[bool, Any] | None, bool]:
        data = self.replication.data
        key = f"{RESULT_KEY}{client}\0{seq}"
        # A copy whose last record is this node's own, without a stream of it that completed
        # a record, may hold records its replicas never got -- or lack some a replica holds
        # (lost in a crash): what it says about a request is in doubt until the active node's
        # stream reaches it.
        unsure = {name for name in data.heads if data.last_is_own(name) and not self._sure(name)}
        for name, values in data.objects.items():
            value = values.get(key)
            if value is not None and name not in unsure:
                return (bool(value[0]), value[1]), False
        pending = bool(unsure or self._groups or self._deciding) or any(data.prepared.values())
        return None, pending

    def _sure(self, name: str) -> bool:
        stream = self.replication.streams.get(name)
        return stream is not None and stream.completed >= 1

    def _known_outcome(self, gtid: str) -> str | None:
        """The outcome this node's own participant applied for ``gtid``, if it knows it."""
        known = self._outcomes.get(gtid) or self.node.dtx.tombs.get(gtid)
        return known if known in (OUTCOME_COMMIT, OUTCOME_ABORT) else None

    def _replicate(
        self, after: list[list[Any]], done: Done, gtid: str | None
    ) -> dict[str, Any] | None:
        rep, now = self.replication, self.now
        sets = write_sets(after, self._partition_of)
        if not sets:
            done(None)  # nothing of a partition: nothing to replicate
            return None
        for name in sorted(sets):
            # Checked for every partition before any record is made: all or nothing.
            view = rep.views.get(name)
            if name not in rep.acting or name not in rep.streams or view is None:
                active = None if view is None else view.active
                return error_out(
                    errors.NotActive(f"{self.name} does not act for {name} (active: {active})")
                )
        if gtid is None and len(sets) > 1:
            # A one-node commit over several partitions: one record per partition would not
            # be atomic on the replicas (one can arrive, not the other, when this node dies).
            # So: a prepared record in each, the decision in the log, then the outcomes.
            self._local_txid += 1
            gtid = f"{self.name}{LOCAL_COORDINATOR}.{self._local_txid}"
            txid = gtid
            done = functools.partial(self._local_prepared, txid, sorted(sets), done)
        self._next_group += 1
        ref = self._next_group
        group = self._groups[ref] = _Group(done, len(sets), partitions=sorted(sets))
        self._rep_dirty = True
        for name in group.partitions:
            epoch = rep.views[name].epoch
            if gtid is None:
                actions = rep.replicate(now, ref, name, epoch, sets[name])
            else:
                actions = rep.replicate(now, ref, name, epoch, sets[name], PREPARE, gtid)
            self._rep_actions(now, actions)
        return None

    def _local_prepared(
        self, txid: str, names: list[str], done: Done, error: dict[str, Any] | None
    ) -> None:
        """Every partition's prepared record of a one-node commit completed (or one failed):
        decide it in the log, first writer wins (a promoted copy proposes abort)."""
        outcome = OUTCOME_ABORT if error is not None else OUTCOME_COMMIT
        self._deciding[txid] = (names, done, error)
        proposal = {"t": PROPOSE, "g": txid, "o": outcome, "n": []}
        self._proposed[txid] = (self.now, proposal)
        self._cluster(self.now, self.node.decisions.request(self.now, proposal))

    def _propose_again(self, now: float) -> None:
        """Resend the proposals of one-node commits still undecided (seed 738: one was lost
        and the commit waited for ever, its locks held)."""
        retry = self.node.dtx.config.retry
        for txid, (at, proposal) in list(self._proposed.items()):
            if now - at >= retry:
                self._proposed[txid] = (now, proposal)
                self._cluster(now, self.node.decisions.request(now, proposal))

    def _local_decided(self, now: float, txid: str, decision: str) -> None:
        names, done, error = self._deciding.pop(txid)
        self._proposed.pop(txid, None)
        self._outcomes[txid] = decision
        rep = self.replication
        for name in names:
            if txid in rep.data.prepared_of(name):
                self._rep_dirty = True
                self._rep_actions(now, rep.outcome(now, None, name, txid, decision))
        if decision == OUTCOME_COMMIT:
            done(None)
        elif error is not None:
            done({k: v for k, v in error.items() if k != "unknown"})  # decided: an abort
        else:
            done(error_out(errors.Aborted(f"{txid}: a promoted copy decided abort first")))

    def _finished(self, action: Completed | Failed) -> None:
        group = self._groups.get(action.ref) if isinstance(action.ref, int) else None
        if group is None:
            return
        if isinstance(action, Failed) and group.failed is None:
            group.failed = error_out(
                errors.Unavailable(
                    f"{action.partition}: {action.error} (active {action.active}) before every "
                    "sync replica held the commit: outcome unknown, ask request.result"
                )
            )
            group.failed["unknown"] = True
        group.remaining -= 1
        if group.remaining == 0:
            del self._groups[action.ref]
            group.done(group.failed)

    def _partition_of(self, ref: bytes) -> str | None:
        names = self.ha.partition_table.partitions
        if len(self._locations) != len(names):
            self._locations = {partition_location(n): n for n in names}
        return self._locations.get(Ref(ref).location)

    # ------------------------------------------------------------ promotion
    def ready(self, partition: str) -> bool:
        """Has the store taken the machine's copy of ``partition`` for the stream this node
        runs?  Until then the store holds an older copy (the one it had when this node last
        acted, or a participant's late phase two): seed 1917 answered a read from it in the
        step the lease began, before ``_load_new_streams`` ran at the step's end."""
        stream = self.replication.streams.get(partition)
        return stream is not None and self.loaded.get(partition) == stream.stream_id

    def _load_new_streams(self, now: float) -> None:
        """A partition this node just started acting for: the store takes the machine's copy."""
        rep, store = self.replication, self.store
        for name, stream in sorted(rep.streams.items()):
            if self.loaded.get(name) == stream.stream_id:
                continue
            self.loaded[name] = stream.stream_id
            values = rep.data.values(name)
            after = after_images(values)
            present = {bytes.fromhex(k) for k in values if not k.startswith(RESULT_KEY)}
            gone = [r for r in store.objects if r not in present and self._partition_of(r) == name]
            after += [[r, "", 0, None] for r in sorted(gone)]
            store.load(after)
            for txid, writes in sorted(rep.data.prepared_of(name).items()):
                if txid not in store.rm_branches:
                    store.take_prepared(_taken(name, txid), after_images(writes))

    def _drop_settled_taken_over(self) -> None:
        """A prepared record taken over at promotion, of a partition this node no longer has
        a stream for, that its copy here no longer holds (the new active node resolved it):
        its locks go (seed 1294: the lookup's answer never came, the locks stayed for ever).
        The store's objects of P are not served here now, and are replaced by the machine's
        copy when this node acts for P again."""
        rep = self.replication
        for taken in list(self.store.replicated_prepared):
            name, _, gtid = taken.partition("/")
            if name in rep.streams or gtid in rep.data.prepared_of(name):
                continue
            self.store.end_prepared(taken, False)
            waiting = self._resolving.get(gtid)
            if waiting is not None:
                waiting.discard(name)
                if not waiting:
                    del self._resolving[gtid]

    def _decision(self, now: float, answer: Any) -> None:
        if not isinstance(answer, dict):
            return
        txid, kind = answer.get("g"), answer.get("t")
        if isinstance(txid, str) and txid in self._deciding and kind == DECIDED:
            self._local_decided(now, txid, str(answer.get("o")))
        if not isinstance(txid, str) or txid not in self._resolving:
            return
        if kind == DECIDED:
            decision = str(answer.get("o"))
            for name in sorted(self._resolving.pop(txid)):
                self._resolved(now, name, txid, decision)
        elif kind == UNKNOWN:
            if answer.get("forgotten"):
                # Finished everywhere and forgotten.  A commit is forgotten only after every
                # participant acknowledged it, and a participant acknowledges only once every
                # copy that may be promoted holds the outcome (the machine's durable holds):
                # so a copy still prepared here missed an abort (the prepare never got its
                # yes vote, the participant restarted without it).
                self._out.append(
                    Notify("rep.forgotten", {"g": txid, "p": sorted(self._resolving[txid])})
                )
                for name in sorted(self._resolving.pop(txid)):
                    self._resolved(now, name, txid, OUTCOME_ABORT)
                return
            # Nothing decided: propose abort; whatever the log holds first is the outcome.
            proposal = {"t": PROPOSE, "g": txid, "o": OUTCOME_ABORT, "n": []}
            self._cluster(now, self.node.decisions.request(now, proposal))

    def _resolved(self, now: float, name: str, txid: str, decision: str) -> None:
        """P's prepared record of ``txid`` gets its outcome: a record, and the store's copy."""
        writes = self.replication.data.prepared_of(name).get(txid)
        self._rep_dirty = True
        self._rep_actions(now, self.replication.outcome(now, None, name, txid, decision))
        if txid in self.store.rm_branches:
            return  # the store's own phase two installs it
        committed = decision == OUTCOME_COMMIT
        taken_over = self.store.end_prepared(_taken(name, txid), committed)
        if not taken_over and writes is not None and committed and name in self.loaded:
            self.store.load(after_images(writes))

    def status(self) -> dict[str, Any]:
        status = super().status()
        status["replication"] = self.replication.status()
        return status


def _acting_when_ready(
    cluster_acting: Callable[[float, str], bool], node: ReplicatedDataNode, now: float, name: str
) -> bool:
    """The data plane's ``acting``: the cluster node's answer, and the store holds the copy."""
    return cluster_acting(now, name) and node.ready(name)


def _taken(partition: str, gtid: str) -> str:
    """The store's name of P's prepared record of ``gtid`` taken over at promotion."""
    return f"{partition}/{gtid}"


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
