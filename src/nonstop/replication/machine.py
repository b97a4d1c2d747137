"""The replication machine of one node: :class:`ReplicationMachine` (replication.md).

Sans-I/O (``nonstop.runtime.interface``): the runtime's events go to
:meth:`~ReplicationMachine.handle`; the layer above calls
:meth:`~ReplicationMachine.replicate`, :meth:`~ReplicationMachine.outcome` and
:meth:`~ReplicationMachine.noop` and, **after every event**,
:meth:`~ReplicationMachine.on_table` with the applied partition table (as
:class:`~nonstop.replication.view.PartitionView`) and the partitions this node
acts for.  ``on_table`` ends the event: it completes what can be completed and
flushes -- one ``rep`` message per replica node carrying every record queued
for it, of every partition (batching per group commit).

Active side, per partition P this node acts for (a :class:`Stream`):

* a caller's record gets the next seq, is applied and persisted here, and
  queued for every replica (in-sync sync members of ``current`` and copying
  sync members);
* it completes (:class:`Completed`) once it is durable here *and* every
  in-sync sync replica of the current epoch acknowledged it durably (I3), in
  seq order, and only while this node acts for P;
* a replica silent for ``replica_timeout`` with records outstanding (or one
  whose history diverged) is dropped: a D12 ``drop(P, e, B)`` is
  :class:`Submit`-ted and nothing after the silent replica's place completes
  until the entry is applied here and B is gone from the epoch's list;
* the epoch moving with this node no longer active fails every waiting record
  with ``NotActive`` (:class:`Failed`): the caller retries on the active node;
* on starting to act (promotion, restart) it asks the layer above to resolve
  every prepared record of P from the decision log (:class:`Resolve`), and
  again for a prepared record still there after ``resolve_after``;
* a copying node gets a ``reset`` record, then the partition's objects in
  batches of ``batch`` (each acknowledged before the next is made), while new
  records flow to it too; :meth:`copy_done` tells the restorer when to
  propose ``restored``.

Holds (:mod:`nonstop.replication.holds`): a two-phase-commit participant
calls :meth:`~ReplicationMachine.hold` before it applies a txid's outcome and
acknowledges phase two only while :meth:`~ReplicationMachine.held` is false;
the machine releases a hold once every copy that may be promoted holds the
outcome, and says so with ``Notify("rep.released", {"g": txid})``.

Replica side: :mod:`nonstop.replication.replica` (fencing, order, buffering);
the answer to a ``rep`` goes out after ``Persisted``.

Messages (``t``):

* ``rep.rep`` active -> replica ``{"parts": [[P, e, stream, base, [record, ...],
  completed], ...]}`` -- ``completed``: the stream's highest seq durable on every copy
  that may be promoted (a replica's holds wait for it, §6); a part with no record
  only tells it (sent at the resend tick when it moved)
* ``rep.ack`` replica -> active ``{"parts": [[P, e, stream, durable seq, status,
  completed known], ...]}`` (the last: so a lost "completed" is told again)
"""

from __future__ import annotations

import collections
import random
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from nonstop.ha.partition_table import drop_entry
from nonstop.replication.actions import (
    BAD_REQUEST,
    NOT_ACTIVE,
    STALE_EPOCH,
    Completed,
    Failed,
    Resolve,
    Submit,
)
from nonstop.replication.data import PartitionData, Write
from nonstop.replication.holds import Holds
from nonstop.replication.records import (
    COMMIT,
    COPY,
    EMPTY,
    MORE,
    NOOP,
    OUTCOME,
    OUTCOME_ABORT,
    OUTCOME_COMMIT,
    OUTCOME_PART,
    PREPARE,
    RESET,
    Head,
    Record,
    head_from_wire,
    record_from_wire,
)
from nonstop.replication.replica import DIVERGED, OK, STATUSES, ReplicaSide
from nonstop.replication.stream import Deferred, Peer, Stream
from nonstop.replication.view import PartitionView
from nonstop.runtime.interface import (
    Event,
    Log,
    NodeId,
    Notify,
    Persist,
    Persisted,
    Received,
    Send,
    SetTimer,
    TimerFired,
)

REP = "rep.rep"
ACK = "rep.ack"
TICK = "rep.tick"
SLICE = "rep.slice"
"""Timer (zero delay) of the next step of records made across events (replication.md §4a)."""
PREFIX = "rep."
RELEASED = "rep.released"
"""``Notify`` kind: a held txid may be acknowledged now (``{"g": txid}``)."""
"""Message types and timer names of the machine all start with this."""

MUTANTS = ("ack_before_replica", "stale_epoch", "ignore_prepared")
"""Broken variants the simulator must catch (replication.md, section 8)."""


@dataclass(frozen=True, slots=True)
class ReplicationConfig:
    replica_timeout: float = 1.0
    """A sync replica silent this long with records outstanding is dropped (D12)."""
    busy_grace: float = 5.0
    """A replica that still answers -- it acknowledges each message it receives at once,
    with the durable seq it has, while its disk has not made the new records durable yet --
    is busy, not silent: it is dropped only after ``busy_grace * replica_timeout`` without
    progress (replication.md §4a, "A busy replica")."""
    resend: float = 0.1
    """Unacknowledged records are sent again this often."""
    batch: int = 1000
    """Objects per restore-copy record (the policy's ``batch``)."""
    resolve_after: float = 2.0
    """A prepared record on the acting node without outcome this long is resolved again."""
    max_records: int = 256
    """Records of one partition per message (a long backlog goes over several flushes)."""
    record_writes: int = 1000
    """A prepared write set larger than this goes as several ``prepare`` records (parts) of
    at most this many writes each: no record, and so no step that applies or decodes one,
    scales with a transaction's size (replication.md §4a)."""
    step_writes: int = 2000
    """The writes of records the active node makes (applies, packs, persists) per event,
    over all its partitions; records beyond wait, in order, for the next events, on a
    zero-delay timer (``rep.slice``): no step scales with a transaction's size -- nor with
    how many partitions it writes -- on the active node either (replication.md §4a, "Steps
    across events").  The record that exhausts it is made whole (a part: at most
    ``record_writes``)."""
    message_writes: int = 4000
    """The writes one ``rep`` message carries at most (but always one record): the rest of
    a backlog goes in the next flushes, so a replica decodes and applies a bounded amount
    per message (§4a)."""
    silence_from_write: bool = False
    """D12 measures a replica's silence from the first record it has not acknowledged, not
    from its last acknowledgement: without it, a partition idle for ``replica_timeout``
    drops its caught-up replicas at its next write (found on real nodes, which set it;
    replication.md §10c).  Off by default until the simulator's seeds are checked with it."""
    handover_drain: float = 1.0
    """Before a handover by priority (D9) the active node takes no new commit or prepare
    (``NotActive``, retryable: nothing made) until its records completed and every replica
    holds them, so none fails in flight when ``restored`` applies (replication.md §10e);
    past this long without the entry applied it takes them again (the handover may then
    cost in-flight records an unknown outcome, as before)."""
    sweep: float = 0.05
    """Every stream is looked at again at least this often (the time-driven duties: D12
    silence, re-resolving, the handover drain); between sweeps ``on_table`` looks only at
    the streams an event changed (replication.md, "Cost per event")."""
    mutant: str | None = None
    """Simulator only: one of :data:`MUTANTS`."""


_LOCAL = 0
_REPLICA = 1


class ReplicationMachine:
    """Active and replica sides of synchronous replication on one node (module doc)."""

    def __init__(
        self,
        me: NodeId,
        rng: random.Random,
        recovered: Mapping[bytes, bytes],
        config: ReplicationConfig | None = None,
    ) -> None:
        self.me = me
        self.rng = rng
        self.config = config or ReplicationConfig()
        self.data = PartitionData.recover(recovered)
        self.replica = ReplicaSide(me, self.data, fence=self.config.mutant != "stale_epoch")
        self.streams: dict[str, Stream] = {}
        self.views: dict[str, PartitionView] = {}
        self._views_from: Mapping[str, PartitionView] | None = None
        """The mapping ``views`` was copied from (on_table: unchanged if it is the same)."""
        self.acting: frozenset[str] = frozenset()
        self.durable: dict[str, Head] = dict(self.data.heads)
        """Per partition, the place durable on this node's disk."""
        self.holds = Holds.recover(recovered)
        self._covers: dict[tuple[str, str], tuple[int, int]] = {}
        """(txid, P) -> (stream, seq): the hold on P is released once that record completed."""
        self._told: dict[str, tuple[int, int]] = {}
        """P -> (stream, completed) as P's active node last told this replica: a hold on a
        partition this node has no stream for waits until its outcome is completed there."""
        self._unpersisted: collections.Counter[str] = collections.Counter()
        """Partition -> this replica's persists of its records not durable yet."""
        self._heard_sent: dict[tuple[NodeId, str], float] = {}
        """(active node, partition) -> when this replica last answered it at once (busy)."""
        self._telling = False
        """True while a resend tick flushes: parts that only tell ``completed`` go too."""
        self._waiting_told: set[str] = set()
        """Partitions a hold here waits on for the active node's ``completed`` (recomputed
        at every sweep)."""
        self._asked_at: dict[str, float] = {}
        """P -> when this replica last asked P's active node for its ``completed``."""
        self._token = 0
        self._tokens: dict[int, tuple[int, Any]] = {}
        self._drops: dict[tuple[str, int, NodeId], float] = {}
        self._prepared_seen: dict[str, dict[str, float]] = {}
        """P -> {txid: when a prepared record of P was last resolved or first seen}, per
        partition so that the sweep after every event costs what P holds, not every P's."""
        self._tick_armed = False
        self._slice_armed = False
        self._sliced_last = ""
        """The partition whose deferred records were made last (the next ``rep.slice``
        starts with the partition after it: every stream gets its turn)."""
        self._budget = self.config.step_writes
        """The writes this event may still make (``step_writes``; renewed by each event)."""
        self._touched: set[str] = set()
        """Partitions whose stream or copy an event changed since the last ``on_table``:
        between sweeps only they are looked at (completion, flush, holds, pruning)."""
        self._unflushed: set[str] = set()
        """Partitions with records left unsent by the last flush for want of room in the
        message (``message_writes``): the next flush, at the next event, goes on with them."""
        self.streams_started = 0
        """Streams started so far (a host compares it to hand a new stream's copy over)."""
        self._swept_at = float("-inf")
        """When ``on_table`` last looked at every stream (``config.sweep``)."""
        self.now = 0.0
        """The time of the event being handled (``copy_done`` is asked without one)."""
        self.stats = {
            "completed": 0,
            "drops": 0,
            "copies": 0,
            "resolves": 0,
            "diverged": 0,
            "drain_refused": 0,
        }

    # ------------------------------------------------------------ the layer above
    def replicate(
        self,
        now: float,
        ref: Any,
        partition: str,
        epoch: int,
        writes: Mapping[str, Any],
        kind: str = COMMIT,
        txid: str | None = None,
    ) -> list[Any]:
        """Replicate a one-phase commit or a prepared record of ``partition`` at ``epoch``."""
        if kind not in (COMMIT, PREPARE) or not isinstance(writes, Mapping):
            return [Failed(ref, partition, BAD_REQUEST)]
        # (the keys' types, not each key: one C pass over a write set of 100,000s)
        if not all(issubclass(t, str) for t in set(map(type, writes))) or (
            kind == PREPARE and not txid
        ):
            return [Failed(ref, partition, BAD_REQUEST)]
        size = max(1, self.config.record_writes)
        if kind == PREPARE and len(writes) > size:
            # Parts in order, the caller waiting on the last: it completes only once every
            # part is durable on every in-sync replica (I3), so a yes vote still means the
            # whole prepared record is on every copy that may be promoted.
            items = list(writes.items())
            spans = [(i, min(i + size, len(items))) for i in range(0, len(items), size)]
            steps = [Deferred(PREPARE, txid, {}, MORE, items=items, span=s) for s in spans]
            steps[-1] = Deferred(PREPARE, txid, {}, None, ref, True, items, spans[-1])
            return self._record(now, partition, epoch, steps)
        step = Deferred(kind, txid, dict(writes), None, ref, last=True)
        return self._record(now, partition, epoch, [step])

    def outcome(self, now: float, ref: Any, partition: str, txid: str, outcome: str) -> list[Any]:
        """Replicate ``txid``'s outcome: its prepared record is applied or dropped everywhere."""
        if outcome not in (OUTCOME_COMMIT, OUTCOME_ABORT) or not isinstance(txid, str):
            return [Failed(ref, partition, BAD_REQUEST)]
        # An outcome goes into the stream even while the lease is not held for a moment: the
        # prepared record's locks end with it, and a later record writing the same objects
        # must come after it (I4).  Only completion needs the node to act.
        final = Deferred(OUTCOME, txid, {}, outcome, ref, last=True)
        steps = self._outcome_steps(partition, final)
        return self._record(now, partition, None, steps, acting=False)

    def _outcome_steps(self, partition: str, final: Deferred) -> list[Deferred]:
        """The records of an outcome: the commit of a prepared record larger than
        ``record_writes`` goes as ``part`` records of that many of its writes (named by
        key), then the outcome applying the rest (replication.md §4a)."""
        stream = self.streams.get(partition)
        txid = final.txid
        writes = self.data.prepared_of(partition).get(txid or "")
        size = max(1, self.config.record_writes)
        if final.extra != OUTCOME_COMMIT or writes is None or len(writes) <= size:
            return [final]
        if stream is not None and any(d.txid == txid for d in stream.deferred):
            # Its prepared record not all made yet (or its outcome already on the way): the
            # outcome follows it whole, as before.
            return [final]
        keys = list(writes)
        cut = (len(keys) - 1) // size * size
        parts = [
            Deferred(OUTCOME, txid, dict.fromkeys(keys[i : i + size]), OUTCOME_PART)
            for i in range(0, cut, size)
        ]
        return [*parts, final]

    def noop(self, now: float, ref: Any, partition: str) -> list[Any]:
        """Complete once every in-sync replica holds everything this node holds of P."""
        step = Deferred(NOOP, None, {}, None, ref, last=True)
        return self._record(now, partition, None, [step])

    def making(self, partition: str) -> bool:
        """Has ``partition`` records asked for and not made yet (``step_writes``)?  Until
        they are, :attr:`data` does not show them: a caller that computes a write from it
        (the simulator's store) must wait."""
        stream = self.streams.get(partition)
        return stream is not None and bool(stream.deferred)

    def prepared_here(self, partition: str, txid: str) -> bool:
        """Is ``txid`` prepared in ``partition`` here, made or still to make?"""
        if txid in self.data.prepared_of(partition):
            return True
        stream = self.streams.get(partition)
        return stream is not None and any(
            d.txid == txid and d.kind == PREPARE for d in stream.deferred
        )

    def hold(self, txid: str, partitions: Iterable[str]) -> list[Any]:
        """Hold ``txid``'s acknowledgement until every copy of ``partitions`` that may be
        promoted holds its outcome (module doc); call it before the outcome is applied."""
        partitions = list(partitions)
        self._touched.update(partitions)
        writes = self.holds.add(txid, partitions)
        return [self._persist(writes, (_LOCAL, None))] if writes else []

    def held(self, txid: str) -> bool:
        """May ``txid``'s phase two not be acknowledged yet?"""
        return self.holds.is_held(txid)

    def copy_done(self, partition: str, node: NodeId) -> bool:
        """Has the restore copy of ``partition`` to ``node`` finished (for ``restored``)?"""
        view = self.views.get(partition)
        if view is None or partition not in self.acting or node not in view.copying:
            return False
        if node not in view.sync:
            return True  # asynchronous replicas hold nothing yet (D11 is a later issue)
        stream = self.streams.get(partition)
        peer = stream.peers.get(node) if stream is not None else None
        # Caught up with everything, not only the copy: from the moment the copy is finished
        # completions wait for this node too (see _complete), so when ``restored`` is applied
        # it holds every record acknowledged before -- it may become the active node at once.
        if not (
            peer is not None
            and peer.copy_finished()
            and stream is not None
            and (peer.acked >= stream.last)
        ):
            return False
        if node in view.outranking and not self._drain_over(stream):
            # A handover: only once nothing of this node's is in flight (§10e).
            return stream.drained()
        return True

    def handing_over(self, partition: str) -> NodeId | None:
        """The node ``partition`` is about to be handed over to, while this node drains for
        it and takes no new commit or prepare (§10e); None otherwise."""
        stream = self.streams.get(partition)
        view = self.views.get(partition)
        if stream is None or view is None or stream.drain_since is None:
            return None
        if self._drain_over(stream):
            return None
        finished = [n for n in view.outranking if (p := stream.peers.get(n)) and p.copy_finished()]
        return finished[0] if finished else None

    def _drain_over(self, stream: Stream) -> bool:
        since = stream.drain_since
        return since is not None and self.now - since > self.config.handover_drain

    def _watch_handover(self, now: float, stream: Stream, view: PartitionView) -> None:
        """Start (or end) the drain before a handover: a node that outranks this one has
        finished its copy, so ``restored`` will make it active (§10e)."""
        ahead = any(
            (p := stream.peers.get(n)) is not None and p.copy_finished() for n in view.outranking
        )
        if not ahead:
            stream.drain_since = None
        elif stream.drain_since is None:
            stream.drain_since = now

    def on_table(
        self, now: float, views: Mapping[str, PartitionView], acting: Iterable[str]
    ) -> list[Any]:
        """The applied table and this node's acting set after an event; ends the event.

        ``views`` may be the same mapping as at the previous call (the hosts' applied table
        caches it per applied index): the streams' replicas then need no new look."""
        fresh = views is not self._views_from
        if fresh:
            self.views = dict(views)
            self._views_from = views
        acting = frozenset(acting)
        # A new table, a new acting set or the sweep's period: every stream (the time-driven
        # duties); else only those the event changed (an ack, a record, a durable write).
        full = fresh or acting != self.acting or now - self._swept_at >= self.config.sweep
        if full:
            self._swept_at = now
        self.acting = acting
        self.now = max(self.now, now)
        actions: list[Any] = []
        for name, stream in list(self.streams.items()):
            view = self.views.get(name)
            # Another node's record applied here (a restore copy from another active node, in
            # events this one did not see as a gap) ends this stream too: its waiting records
            # may have been overwritten, so they must not complete.
            moved = self.data.head(name)[0] != stream.stream_id
            if view is None or view.active != self.me or moved:
                actions += self._end_stream(name, view)
                self._touched.add(name)
        for name in sorted(self.acting):
            view = self.views.get(name)
            if view is not None and view.active == self.me and name not in self.streams:
                actions += self._start_stream(now, view)
        if fresh:  # (a stream started above synced its replicas as it started)
            for name, stream in self.streams.items():
                actions += self._sync_peers(now, stream, self.views[name])
        names = set(self.streams) if full else self._touched & self.streams.keys()
        for name in names:
            # A copy finishes with an acknowledgement (a touch), not with a new table.
            self._watch_handover(now, self.streams[name], self.views[name])
        actions += self._progress(now, complete=True, full=full)
        if full:
            self._waiting_told = set()
        if self.holds.held and (full or self._touched):
            actions += self._settle_holds(None if full else self._touched)
        if self._waiting_told or self._asked_at:
            actions += self._ask_completed(now)
        self._touched = set()
        self._budget = self.config.step_writes  # (the event ends here)
        return actions

    # ------------------------------------------------------------ runtime events
    def handle(self, event: Event) -> list[Any]:
        now = event.now
        self._budget = self.config.step_writes
        self.now = max(self.now, now)
        actions: list[Any] = []
        if isinstance(event, Received):
            payload = event.payload
            kind = payload.get("t") if isinstance(payload, dict) else None
            if kind == REP:
                actions = self._on_rep(event.sender, payload)
            elif kind == ACK:
                self._on_ack(now, event.sender, payload)
            else:
                return [Log("warning", f"replication: unknown message from {event.sender}")]
        elif isinstance(event, TimerFired) and event.name == SLICE:
            self._slice_armed = False
            actions = self._slice()
        elif isinstance(event, TimerFired) and event.name == TICK:
            self._tick_armed = False
            self._telling = True
            self._touched.update(self.streams)
            for stream in self.streams.values():
                for peer in stream.peers.values():
                    peer.sent = peer.acked  # resend what is not acknowledged
                    peer.told = peer.told_known  # ... and completion not acknowledged
        elif isinstance(event, Persisted):
            actions = self._on_persisted(event.token)
        # No completion here: whether this node acts is only known once the composition has
        # handed the table over (on_table, at the end of this event).  A node resuming from
        # a pause must not acknowledge from the answer it had before the pause.
        actions += self._progress(now, complete=False, full=False)
        self._telling = False
        return actions

    # ------------------------------------------------------------ active side
    def _record(
        self,
        now: float,
        partition: str,
        epoch: int | None,
        steps: list[Deferred],
        *,
        acting: bool = True,
    ) -> list[Any]:
        """Make the records ``steps`` of a caller (its ``ref`` on the last), or refuse them."""
        ref, kind = steps[-1].ref, steps[-1].kind
        view = self.views.get(partition)
        if view is None:
            return [Failed(ref, partition, BAD_REQUEST)]
        if epoch is not None and epoch != view.epoch:
            return [Failed(ref, partition, STALE_EPOCH, view.active)]
        stream = self.streams.get(partition)
        if (acting and partition not in self.acting) or stream is None:
            return [Failed(ref, partition, NOT_ACTIVE, view.active)]
        if kind in (COMMIT, PREPARE):
            self.now = max(self.now, now)
            taker = self.handing_over(partition)
            if taker is not None:
                # Nothing made: the caller retries (on ``taker`` once ``restored`` applied).
                self.stats["drain_refused"] += 1
                return [Failed(ref, partition, NOT_ACTIVE, taker)]
        if self.config.silence_from_write:
            for peer in stream.peers.values():
                if peer.acked >= stream.last:
                    # Caught up until now: its silence (D12) starts with this record, not with
                    # its last acknowledgement.
                    peer.progress_at = now
        # Behind the records still to make, if any (I4: the stream's order is the callers'),
        # then as many as this event may still make; the rest at the next ``rep.slice``.
        stream.deferred.extend(steps)
        return self._make(stream)

    def _make(self, stream: Stream) -> list[Any]:
        """Make the stream's deferred records, in order, while this event's budget of
        writes (``step_writes``) lasts; the record that exhausts it is made whole."""
        actions: list[Any] = []
        deferred = stream.deferred
        if deferred and self._budget > 0:
            self._sliced_last = stream.partition  # (the next slice starts after it)
        while deferred and self._budget > 0:
            step = deferred.popleft()
            weight = step.weight()
            if step.kind == OUTCOME and step.extra == OUTCOME_COMMIT:
                weight = len(self.data.prepared_of(stream.partition).get(step.txid or "", ()))
            self._budget -= max(1, weight)
            writes = step.made_writes()
            actions += self._append(
                stream, step.kind, txid=step.txid, writes=writes, extra=step.extra
            )
            if step.last:
                stream.pending.append((stream.last, step.ref))
        return actions

    def _slice(self) -> list[Any]:
        """``rep.slice``: deferred records, one event's worth, a partition after the other
        from where the last slice stopped (every stream gets its turn)."""
        actions: list[Any] = []
        while self._budget > 0:
            names = sorted(n for n, s in self.streams.items() if s.deferred)
            if not names:
                break
            name = next((n for n in names if n > self._sliced_last), names[0])
            actions += self._make(self.streams[name])
        return actions

    def _append(
        self, stream: Stream, kind: str, also: tuple[Write, ...] = (), **fields: Any
    ) -> list[Any]:
        """Add a record to the stream, apply and persist it here (with ``also``)."""
        record = stream.add(kind, **fields)
        self._touched.add(stream.partition)
        writes = [*also, *self.data.apply(stream.partition, stream.stream_id, record, self.me)]
        return [self._persist(writes, (_LOCAL, (stream.partition, stream.stream_id, record.seq)))]

    def _persist(self, writes: list[Write], what: tuple[int, Any]) -> Persist:
        self._token += 1
        self._tokens[self._token] = what
        return Persist(self._token, tuple(writes))

    def _start_stream(self, now: float, view: PartitionView) -> list[Any]:
        name = view.name
        self.replica.forget_incoming(name)
        stream = Stream(name, self.rng.getrandbits(62) + 1, self.data.head(name), view.epoch)
        self.streams[name] = stream
        self.streams_started += 1
        self._touched.add(name)
        actions: list[Any] = []
        if self.config.mutant == "ignore_prepared":
            gone = self.data.discard_prepared(name)
            if gone:
                actions.append(self._persist(gone, (_LOCAL, None)))
        else:
            seen = self._prepared_seen.setdefault(name, {})
            for txid in sorted(self.data.prepared_of(name)):
                seen[txid] = now
                self.stats["resolves"] += 1
                actions.append(Resolve(name, txid))
        actions += self._sync_peers(now, stream, view)
        # A first record at once: replicas confirm the base, so divergence is found now.
        # It marks the stream as this node's own, durably (holds.py).
        own = self.data.start_own(name, stream.stream_id)
        return actions + self._append(stream, NOOP, also=(own,))

    def _end_stream(self, name: str, view: PartitionView | None) -> list[Any]:
        stream = self.streams.pop(name)
        active = view.active if view is not None else None
        refs = [ref for _, ref in stream.pending] + [d.ref for d in stream.deferred if d.last]
        return [Failed(ref, name, NOT_ACTIVE, active) for ref in refs]

    def _sync_peers(self, now: float, stream: Stream, view: PartitionView) -> list[Any]:
        """Make the stream's peers the epoch's replicas; start copies to copying nodes."""
        stream.epoch = view.epoch
        targets = view.targets()
        for node in [n for n in stream.peers if n not in targets]:
            del stream.peers[node]
        actions: list[Any] = []
        for node in targets:
            peer = stream.peers.get(node)
            if node in view.copying and (peer is None or not peer.copying):
                actions += self._start_copy(now, stream, node)
            elif peer is None:
                peer = stream.peers[node] = Peer(node, acked=0, progress_at=now)
                peer.diverged = not stream.can_serve(0)
        return actions

    def _start_copy(self, now: float, stream: Stream, node: NodeId) -> list[Any]:
        name = stream.partition
        # Only the prepared records held whole: one without its last part was never voted on
        # and is resolved as abort here; the target does not need it (nor its locks).
        prepared = {t: dict(w) for t, w in self.data.whole_prepared(name).items()}
        actions = self._append(stream, RESET, writes=prepared, extra=node)
        reset = stream.last
        stream.peers[node] = Peer(
            node,
            acked=reset - 1,
            progress_at=now,
            copy_reset=reset,
            copy_keys=sorted(self.data.values(name)),
            copy_last=reset,
        )
        self.stats["copies"] += 1
        return actions

    def _progress(self, now: float, *, complete: bool, full: bool) -> list[Any]:
        """Copy batches, completions, D12 drops, re-resolves, pruning; then flush.  Of every
        stream if ``full``, else of those touched since the last ``on_table``."""
        actions: list[Any] = []
        streams = self.streams
        names = (
            list(streams) if full else sorted((self._touched | self._unflushed) & streams.keys())
        )
        for name in names:
            stream, view = streams[name], self.views[name]
            for peer in stream.peers.values():
                if peer.copying and peer.copy_keys and peer.acked >= peer.copy_last:
                    keys = peer.copy_keys[: self.config.batch]
                    del peer.copy_keys[: self.config.batch]
                    values = self.data.values(name)
                    batch = {k: values.get(k) for k in keys}
                    actions += self._append(stream, COPY, writes=batch, extra=peer.node)
                    peer.copy_last = stream.last
            if complete and name in self.acting:
                actions += self._complete(stream, view)
                actions += self._re_resolve(now, name)
            actions += self._drop_silent(now, stream, view)
            stream.prune()
        return actions + self._flush(names)

    def _complete(self, stream: Stream, view: PartitionView) -> list[Any]:
        needed = [stream.peers.get(n) for n in view.in_sync_replicas()]
        # A copying node whose copy is finished is about to be proposed in sync (``restored``):
        # from then on it must hold every record acknowledged, like an in-sync replica.
        needed += [p for p in stream.peers.values() if p.copy_finished()]
        if self.config.mutant == "ack_before_replica":
            needed = []
        through = min([stream.local_durable] + [0 if p is None else p.acked for p in needed])
        if through > stream.completed:
            stream.completed = through
            self._touched.add(stream.partition)  # (the holds it covers: _settle_holds)
        out: list[Any] = []
        while stream.pending and stream.pending[0][0] <= through:
            seq, ref = stream.pending.popleft()
            self.stats["completed"] += 1
            out.append(Completed(ref, stream.partition, view.epoch, seq))
            out.append(
                Notify(
                    "rep.acked",
                    {"p": stream.partition, "e": view.epoch, "seq": seq, "s": stream.stream_id},
                )
            )
        return out

    def _settle_holds(self, touched: set[str] | None) -> list[Any]:
        """Release the holds whose partitions' promotable copies all hold the outcome; of
        the ``touched`` partitions only (None: all): nothing else changed since."""
        writes: list[Write] = []
        out: list[Any] = []
        for txid, parts in list(self.holds.held.items()):
            for name in sorted(parts if touched is None else parts & touched):
                if self._hold_settled(txid, name):
                    writes += self.holds.release(txid, name)
            if txid not in self.holds.held:
                out.append(Notify(RELEASED, {"g": txid}))
        if writes:
            out.insert(0, self._persist(writes, (_LOCAL, None)))
        return out

    def _hold_settled(self, txid: str, name: str) -> bool:
        key = (txid, name)
        if txid in self.data.prepared_of(name):
            self._covers.pop(key, None)
            return False  # this copy still waits for the outcome
        stream = self.streams.get(name)
        if stream is None:
            if self.data.last_is_own(name):
                # This node's own last record may not be on the replicas: wait for the
                # active's.
                self._covers.pop(key, None)
                return False
            # Another node's record came last: that node is active and resolved txid too --
            # but holding it here is not holding it there.  Its record may not be durable
            # on the active node yet (a crash loses it, and the restarted active node
            # resolves the prepared record again: from a log that forgot the commit once
            # this hold let the participant acknowledge -- as abort; seed 3300015).  So
            # wait until the active node says its copies completed this copy's place.
            head = self.data.head(name)
            cover = self._covers.get(key)
            if cover is None or cover[0] != head[0]:
                cover = self._covers[key] = head
            told = self._told.get(name)
            if told is None or told[0] != cover[0] or told[1] < cover[1]:
                self._waiting_told.add(name)
                return False
            del self._covers[key]
            return True
        cover = self._covers.get(key)
        if cover is None or cover[0] != stream.stream_id:
            # The outcome is at or before this stream's last record (or in its base, which
            # every replica it counts holds): once that record completes, so does the outcome.
            cover = self._covers[key] = (stream.stream_id, stream.last)
        if stream.completed < cover[1]:
            return False
        del self._covers[key]
        return True

    def _ask_completed(self, now: float) -> list[Any]:
        """A hold here waits for P's active node to say it completed this copy's place, and
        that word may never come on its own (this node restarted and forgot it; the active
        node, idle, thinks it knows): an ack of this copy's place, unasked, every ``resend``
        -- it echoes what this node knows, so the active node tells it again."""
        for name in [n for n in self._asked_at if n not in self._waiting_told]:
            del self._asked_at[name]
        out: list[Any] = []
        for name in sorted(self._waiting_told):
            view = self.views.get(name)
            head = self.data.head(name)
            if view is None or view.active in (None, self.me) or name in self.streams:
                continue
            if now - self._asked_at.get(name, float("-inf")) < self.config.resend:
                continue
            self._asked_at[name] = now
            seq = self._durable_seq(name, head[0])
            part = [name, view.epoch, head[0], seq, OK, self._known(name, head[0])]
            out.append(Send(view.active, {"t": ACK, "parts": [part]}))
        return out

    def _re_resolve(self, now: float, name: str) -> list[Any]:
        if self.config.mutant == "ignore_prepared":
            return []
        out: list[Any] = []
        prepared = self.data.prepared_of(name)
        seen = self._prepared_seen.get(name)
        if seen is None:
            if not prepared:
                return out
            seen = self._prepared_seen[name] = {}
        for txid in [t for t in seen if t not in prepared]:
            del seen[txid]  # resolved since
        stream = self.streams.get(name)
        coming = {d.txid for d in stream.deferred if d.kind == OUTCOME} if stream else set()
        for txid in sorted(prepared):
            if txid in coming:
                seen[txid] = now  # its outcome is being made
                continue
            at = seen.setdefault(txid, now)
            if now - at >= self.config.resolve_after:
                seen[txid] = now
                self.stats["resolves"] += 1
                out.append(Resolve(name, txid))
        return out

    def _drop_silent(self, now: float, stream: Stream, view: PartitionView) -> list[Any]:
        out: list[Any] = []
        timeout = self.config.replica_timeout
        for peer in stream.peers.values():
            quiet_for = now - peer.progress_at
            # Busy: it answered since its last progress, within the timeout (its disk is
            # behind, the node is not gone): dropped only after the longer grace.
            busy = peer.heard_at >= peer.progress_at and now - peer.heard_at <= timeout
            limit = timeout * self.config.busy_grace if busy else timeout
            silent = peer.acked < stream.last and quiet_for > limit
            if not (silent or (peer.diverged and not peer.copying)):
                continue
            key = (stream.partition, view.epoch, peer.node)
            last = self._drops.get(key)
            if last is not None and now - last < self.config.replica_timeout:
                continue
            self._drops[key] = now
            if len(self._drops) > 4096:
                self._drops = {k: t for k, t in self._drops.items() if now - t < 60.0}
            self.stats["drops"] += 1
            why = "diverged" if peer.diverged else f"silent for {quiet_for:.3f}s"
            out.append(Log("warning", f"{stream.partition}: dropping replica {peer.node} ({why})"))
            out.append(Submit(drop_entry(stream.partition, view.epoch, peer.node)))
        return out

    def _flush(self, names: Iterable[str]) -> list[Any]:
        """One ``rep`` per replica node with what it was not sent of the streams ``names``
        (every record is appended, and every resend asked, by an event that touches it)."""
        parts: dict[NodeId, list[Any]] = {}
        room: dict[NodeId, int] = {}
        """Per replica node, the writes its message may still carry (message_writes)."""
        self._unflushed = set()
        for name in sorted(names):
            stream = self.streams[name]
            for peer in stream.peers.values():
                left = room.setdefault(peer.node, self.config.message_writes)
                records = stream.unsent(peer, self.config.max_records)
                if not records:
                    if self._telling and peer.told < stream.completed and peer.acked >= 1:
                        # Nothing to send but news of completion (a replica's holds).
                        peer.told = stream.completed
                        part = self._part(stream, [], peer.node)
                        parts.setdefault(peer.node, []).append(part)
                    continue
                if left <= 0:
                    self._unflushed.add(name)  # the next flush goes on from here
                    continue
                taken = 0
                for record in records:
                    if taken and len(record.writes) > left:
                        break
                    left -= len(record.writes)
                    taken += 1
                if taken < len(records):
                    self._unflushed.add(name)
                    records = records[:taken]
                room[peer.node] = left
                peer.sent = records[-1].seq
                peer.told = max(peer.told, stream.completed)
                parts.setdefault(peer.node, []).append(self._part(stream, records, peer.node))
        actions: list[Any] = [
            Send(node, {"t": REP, "parts": ps}) for node, ps in sorted(parts.items())
        ]
        if not self._tick_armed and any(
            p.acked < s.last or (p.told_known < s.completed and p.acked >= 1)
            for s in self.streams.values()
            for p in s.peers.values()
        ):
            self._tick_armed = True
            actions.append(SetTimer(TICK, self.config.resend))
        if not self._slice_armed and any(s.deferred for s in self.streams.values()):
            self._slice_armed = True
            actions.append(SetTimer(SLICE, 0.0))
        return actions

    @staticmethod
    def _part(stream: Stream, records: list[Record], node: NodeId) -> list[Any]:
        """One partition's part of a ``rep`` message to ``node`` (module doc)."""
        return [
            stream.partition,
            stream.epoch,
            stream.stream_id,
            list(stream.base),
            [r.to_wire(node) for r in records],
            stream.completed,
        ]

    def _on_ack(self, now: float, sender: NodeId, payload: dict[str, Any]) -> None:
        parts = payload.get("parts")
        if not isinstance(parts, list):
            return
        for raw in parts:
            if not isinstance(raw, list) or len(raw) not in (5, 6):
                continue
            name, _epoch, stream_id, seq, status = raw[:5]
            stream = self.streams.get(name) if isinstance(name, str) else None
            if stream is None or stream.stream_id != stream_id or status not in STATUSES:
                continue
            peer = stream.peers.get(sender)
            if peer is None or not isinstance(seq, int) or isinstance(seq, bool):
                continue
            known = raw[5] if len(raw) == 6 else 0
            if isinstance(known, int) and not isinstance(known, bool):
                # The latest word, not the highest: a replica that restarted knows nothing
                # (and says so, unasked, while a hold of it waits: _ask_completed).
                peer.told_known = max(0, min(known, stream.completed))
            self._touched.add(name)
            if status == OK:
                peer.heard_at = now
            if status == OK and peer.acked < seq <= stream.last:
                peer.acked = seq
                peer.progress_at = now
                peer.diverged = False
            elif status == DIVERGED and not peer.copying and not peer.diverged:
                peer.diverged = True
                self.stats["diverged"] += 1

    # ------------------------------------------------------------ replica side
    def _on_rep(self, sender: NodeId, payload: dict[str, Any]) -> list[Any]:
        parts = payload.get("parts")
        if not isinstance(parts, list):
            return [Log("warning", f"replication: malformed rep from {sender}")]
        answers: list[Any] = []
        writes: list[Write] = []
        applied: list[tuple[str, int, int, Head]] = []
        bad = 0
        for raw in parts:
            part = _parse_part(raw)
            if part is None:
                bad += 1
                continue
            name, epoch, stream_id, base, records, completed = part
            status = self.replica.admit(self.views.get(name), epoch, sender)
            if status == OK:
                told = self._told.get(name)
                if told is None or told[0] != stream_id or told[1] < completed:
                    self._told[name] = (stream_id, completed)
                    self._touched.add(name)  # its holds may settle (_hold_settled)
                behind = self._unpersisted[name] > 0
                status, new = self.replica.receive(name, stream_id, base, records)
                if new:
                    writes += new
                    self._touched.add(name)  # this copy changed: its holds (_hold_settled)
                    applied.append((name, epoch, stream_id, self.data.head(name)))
                    if not (behind and self._answer_busy(sender, name)):
                        continue
                    # Records of an earlier message are still not durable here: answer now
                    # with the seq held durably, so that the active node hears this replica
                    # while its disk catches up (busy_grace).
            durable = self._durable_seq(name, stream_id)
            answers.append([name, epoch, stream_id, durable, status, self._known(name, stream_id)])
        actions: list[Any] = []
        if bad:
            actions.append(Log("warning", f"replication: {bad} malformed part(s) from {sender}"))
        if answers:
            actions.append(Send(sender, {"t": ACK, "parts": answers}))
        if writes:
            actions.append(self._persist(writes, (_REPLICA, (sender, applied))))
            self._unpersisted.update({name for name, *_ in applied})
        return actions

    def _answer_busy(self, sender: NodeId, name: str) -> bool:
        """May this replica, behind on its disk, answer a message at once (at most every
        quarter of ``replica_timeout`` per partition and sender)?"""
        key = (sender, name)
        last = self._heard_sent.get(key)
        if last is not None and self.now - last < self.config.replica_timeout / 4:
            return False
        self._heard_sent[key] = self.now
        if len(self._heard_sent) > 4096:
            self._heard_sent = {key: self.now}
        return True

    def _durable_seq(self, name: str, stream_id: int) -> int:
        head = self.durable.get(name, EMPTY)
        return head[1] if head[0] == stream_id else 0

    def _on_persisted(self, token: int) -> list[Any]:
        what = self._tokens.pop(token, None)
        if what is None:
            return []
        side, info = what
        if side == _LOCAL:
            if info is not None:
                name, stream_id, seq = info
                self.durable[name] = (stream_id, seq)
                stream = self.streams.get(name)
                if stream is not None and stream.stream_id == stream_id:
                    stream.local_durable = max(stream.local_durable, seq)
                    self._touched.add(name)
            return []
        sender, applied = info
        answers = []
        for name in {name for name, *_ in applied}:
            left = self._unpersisted.pop(name, 0) - 1
            if left > 0:
                self._unpersisted[name] = left
        for name, epoch, stream_id, head in applied:
            self.durable[name] = head
            seq = head[1] if head[0] == stream_id else 0
            answers.append([name, epoch, stream_id, seq, OK, self._known(name, stream_id)])
        return [Send(sender, {"t": ACK, "parts": answers})]

    def _known(self, name: str, stream_id: int) -> int:
        """The ``completed`` of ``stream_id`` this replica was told (echoed in its acks)."""
        told = self._told.get(name)
        return told[1] if told is not None and told[0] == stream_id else 0

    # ------------------------------------------------------------ observers
    def status(self) -> dict[str, Any]:
        return {
            "streams": {
                n: {
                    "epoch": s.epoch,
                    "last": s.last,
                    "pending": len(s.pending),
                    "deferred": len(s.deferred),
                }
                for n, s in self.streams.items()
            },
            "heads": {n: list(h) for n, h in self.data.heads.items()},
            **self.stats,
        }


def _parse_part(raw: Any) -> tuple[str, int, int, Head, list[Record], int] | None:
    if not isinstance(raw, list) or len(raw) not in (5, 6):
        return None
    name, epoch, stream_id, base_raw, records_raw = raw[:5]
    completed = raw[5] if len(raw) == 6 else 0  # (5: a sender before completed was told)
    if not isinstance(completed, int) or isinstance(completed, bool) or completed < 0:
        return None
    if not isinstance(name, str) or not isinstance(epoch, int) or isinstance(epoch, bool):
        return None
    if epoch < 0 or not isinstance(stream_id, int) or stream_id < 1:
        return None
    base = head_from_wire(base_raw)
    if base is None or not isinstance(records_raw, list):
        return None
    records = [record_from_wire(r) for r in records_raw]
    if any(r is None for r in records):
        return None
    return name, epoch, stream_id, base, [r for r in records if r is not None], completed


__all__ = [
    "ACK",
    "MUTANTS",
    "PREFIX",
    "RELEASED",
    "REP",
    "SLICE",
    "TICK",
    "ReplicationConfig",
    "ReplicationMachine",
]
