"""The replication machine hosted in a data-path node: the glue both runtimes share.

:class:`ReplicationHost` wires the :class:`~nonstop.replication.machine.ReplicationMachine`
to a node that runs the data path (distributed commit, a store): the simulator's
``ReplicatedDataNode`` (``sim/scenarios/dataplane_replication.py``) and the real
node's ``ReplicatedClusterNode`` (``node/replicated.py``) both host it, so the
rules below are written once (replication.md §10, §10b, §10d).  What differs
between the two -- the store, the decision log's transport, token renaming,
asyncio -- goes through :class:`HostRuntime`, which each node implements.

* **Replicate** (:meth:`ReplicationHost.replicate`): a one-node commit's or a
  participant's prepared write sets, one per touched partition.  Every touched
  partition is checked acting *before* any record is made (all or nothing:
  else :class:`Refusal` ``NotActive``, retryable).  ``done`` gets None once every
  partition's record completed (durable here and on every in-sync sync replica,
  I3), or a :class:`Refusal` with ``unknown=True`` when a record failed after it
  was made (it may be on the promoted copy: "outcome unknown", §10b fix 3).  A
  one-node commit over several partitions is prepared in each (gtid
  ``<node>~rep.<n>``), decided in the decision log (first writer wins: a
  promoted copy proposes abort), then given its outcome records; the proposal
  is sent again every ``propose_again`` seconds until decided (fix 4).
  **A lapse is waited out**: when every partition that is not acting is still
  this node's in the applied table at the epoch of the call -- its liveness
  lease lapsed, most often a renewal late in the cluster log under a large
  swap's load -- the call waits, making nothing, until the node acts for them
  again (then it goes on) or the table moves or ``lapse_wait`` seconds pass
  (then ``done`` gets :class:`Refusal` ``NotActive``, ``unknown`` false: nothing
  was made).  Refusing at once made a 200,000-row swap by partition start over
  at every lapse (replication.md §4a).
* **Outcome** (:meth:`ReplicationHost.outcome`, a participant's phase two): a
  durable **hold** on the gtid for every partition its write set touched and
  every partition whose copy here holds it prepared (fixes 1, 7; the machine's
  ``held`` is the dtx machine's ``hold_ack``, ``rep.released`` ends it through
  :meth:`HostRuntime.release`), then the outcome record of each partition this
  node acts for whose copy holds it prepared.  The hold is written before the
  participant's tombstone (the runtime keeps that order: §10d).
* **Promotion**: a stream that starts here hands the copy of the partition and
  its prepared records to the store (:meth:`HostRuntime.load_copy`).  The
  machine's ``Resolve`` is answered from what this node's participant applied
  (its tombstone, or the outcome it saw), else from the decision log (abort
  proposed if nothing is decided; ``forgotten`` resolves as abort: a commit is
  forgotten only after every copy that may be promoted holds the outcome); the
  answer becomes an outcome record and :meth:`HostRuntime.resolved` in the store.
* :meth:`ReplicationHost.settled_elsewhere` tells the simulator's store which
  taken-over prepared records it may drop (fix 6); :meth:`ReplicationHost.lookup`
  answers a request result from the replicated copies, or "in doubt".
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from nonstop import errors
from nonstop.dtx.decisions import DECIDED, LOOKUP, PROPOSE, UNKNOWN
from nonstop.replication.actions import Completed, Failed, Resolve, Submit
from nonstop.replication.machine import RELEASED, ReplicationMachine
from nonstop.replication.records import OUTCOME_ABORT, OUTCOME_COMMIT, PREPARE
from nonstop.replication.view import PartitionView
from nonstop.runtime.interface import Event, Notify, Persist

LOCAL_COORDINATOR = "~rep"
"""Gtids ``<node>~rep.<n>`` name multi-partition one-node commits in the decision log: a
coordinator of its own that announces no floor, so the log never forgets them (a promoted
copy can always resolve one; the table grows by one decision per such commit)."""

RESULT_KEY = "r:"
"""Write-set key prefix of a request result ``r:<client>\\0<seq>``."""

LAPSE_WAIT = 2.0
"""Seconds a commit or prepare waits out a lapse of this node's lease (module doc): a few
leases (0.6 s), under the data path's default branch timeout."""

KNOWN_OUTCOMES = 4096
"""Outcomes this node's participant applied, remembered in memory (a restart forgets)."""

WriteSets = dict[str, dict[str, Any]]
"""Partition -> its write set: ``<ref hex>`` -> ``[type, version, state]`` (None: deleted)."""


@dataclass(frozen=True, slots=True)
class Refusal:
    """Why a replicated commit or prepare did not complete.  ``unknown``: a record was made
    and then failed, so the outcome is not known here (not an abort: ask request.result)."""

    error: errors.Error
    unknown: bool = False


Done = Callable[[Refusal | None], None]


class HostRuntime(Protocol):
    """What a node hosting the replication machine provides (module doc)."""

    def persist(self, action: Persist) -> None:
        """The machine's durable write (the node renames its token)."""

    def emit(self, action: Any) -> None:
        """Any other action of the machine that leaves the node (sends, timers, notices)."""

    def submit(self, now: float, entry: dict[str, Any]) -> None:
        """A partition-table entry for the cluster log (a D12 drop)."""

    def ask_log(self, now: float, request: dict[str, Any]) -> None:
        """A request to the decision log (lookup, proposal); answers come to
        :meth:`ReplicationHost.decision`."""

    def release(self, now: float, gtid: str) -> None:
        """The hold on ``gtid`` ended: the participant may acknowledge phase two now."""

    def tomb(self, gtid: str) -> str | None:
        """The outcome this node's participant durably applied for ``gtid``, if any."""

    def own_prepare(self, gtid: str) -> Iterable[str]:
        """The partitions whose write set of ``gtid`` this node's participant prepared in
        this life and whose outcome it has not had yet (empty: none)."""

    def load_copy(
        self, name: str, stream_id: int, values: Mapping[str, Any], prepared: Mapping[str, Any]
    ) -> None:
        """This node started stream ``stream_id`` for ``name``: its store takes the copy
        ``values`` and the prepared records ``prepared`` (txid -> write set)."""

    def resolved(
        self, name: str, txid: str, writes: Mapping[str, Any] | None, commit: bool
    ) -> None:
        """A prepared record of ``name`` resolved here (promotion): ``writes`` (None if the
        copy no longer holds it) go into the store when ``commit``."""


@dataclass(slots=True)
class _Group:
    """The records of one commit or prepare, one per touched partition."""

    done: Done
    remaining: int
    failed: Refusal | None = None
    partitions: list[str] = field(default_factory=list)


@dataclass(slots=True)
class _Parked:
    """A commit or prepare waiting out a lapse of this node's lease (module doc)."""

    sets: WriteSets
    gtid: str | None
    done: Done
    epochs: dict[str, int]
    until: float


@dataclass(slots=True)
class _Deciding:
    """A multi-partition one-node commit whose prepared records ended: waits for the log."""

    names: list[str]
    done: Done
    failed: Refusal | None
    proposal: dict[str, Any]
    sent: float


class ReplicationHost:
    """The replication machine and the glue of a data-path node (module doc)."""

    def __init__(
        self,
        machine: ReplicationMachine,
        runtime: HostRuntime,
        *,
        first_local_txid: int,
        propose_again: Callable[[], float],
        lookup_again: float | None = None,
        lapse_wait: float = LAPSE_WAIT,
    ) -> None:
        self.machine = machine
        self.name = machine.me
        self.runtime = runtime
        self.propose_again = propose_again
        """Seconds before an undecided proposal goes again (the log drops a request without
        quorum or leader; seed 738)."""
        self.lookup_again = lookup_again
        """Seconds before an unanswered lookup goes again (None: the machine's own
        ``resolve_after`` does it)."""
        self.dirty = True
        """The machine must see the table again (:meth:`settle`): a record was made."""
        self.now = 0.0
        """The time of the event being handled (callbacks of completions use it)."""
        self._groups: dict[int, _Group] = {}
        self._next_group = 0
        self._local_txid = first_local_txid
        self._deciding: dict[str, _Deciding] = {}
        self._resolving: dict[str, set[str]] = {}
        """gtid -> the partitions whose prepared record of it waits for its outcome."""
        self._lookups: dict[str, float] = {}
        self._outcomes: dict[str, str] = {}
        """gtid -> outcome this node's participant applied (bounded)."""
        self._streams_seen = (-1, 0)
        """The machine's ``streams_started`` and the size of ``loaded`` after the last
        :meth:`_load_new_streams` (a host forgets a failed load from ``loaded``)."""
        self.loaded: dict[str, int] = {}
        """Partition -> the stream whose copy the store was given (promotion)."""
        self.lapse_wait = lapse_wait
        """Seconds a call waits out a lapse of this node's lease (0: refused at once)."""
        self._parked: list[_Parked] = []
        self.lapses_waited = 0
        """Calls that waited out a lapse (tests, the simulator's counters)."""

    # ------------------------------------------------------------ events
    def handle(self, event: Event) -> None:
        """A ``rep.*`` message or timer, or a ``Persisted`` of the machine's own token."""
        self.now = event.now
        self.dirty = True
        self._actions(event.now, self.machine.handle(event))

    def settle(self, now: float, views: Mapping[str, PartitionView], acting: Iterable[str]) -> None:
        """After an event: the applied table and what this node acts for."""
        self.now = now
        self.dirty = False
        self._actions(now, self.machine.on_table(now, views, acting))
        self._load_new_streams()
        if self._deciding:
            self._propose_again(now)
        if self._lookups:
            self._lookup_again(now)
        if self._parked:
            self._unpark(now)

    def _actions(self, now: float, actions: list[Any]) -> None:
        runtime = self.runtime
        for action in actions:
            if isinstance(action, Persist):
                runtime.persist(action)
            elif isinstance(action, Completed | Failed):
                self._finished(action)
            elif isinstance(action, Notify) and action.kind == RELEASED:
                runtime.emit(action)
                runtime.release(now, str(action.data["g"]))
            elif isinstance(action, Submit):
                runtime.submit(now, dict(action.entry))
            elif isinstance(action, Resolve):
                self._resolve(now, action)
            else:
                runtime.emit(action)

    # ------------------------------------------------------------ commits and prepares
    def replicate(
        self, now: float, sets: WriteSets, gtid: str | None, done: Done
    ) -> Refusal | None:
        """Replicate a commit's (``gtid`` None) or a prepare's write sets (module doc); a
        refusal made before anything is returned (``done`` is then not called)."""
        rep = self.machine
        self.now = now
        if not sets:
            done(None)  # nothing of a partition: nothing to replicate
            return None
        refusal, lapsed = self._refusal(sets)
        if refusal is None:
            self._make(now, sets, gtid, done)
            return None
        if not lapsed or self.lapse_wait <= 0:
            return refusal
        epochs = {name: rep.views[name].epoch for name in sets}
        self._parked.append(_Parked(sets, gtid, done, epochs, now + self.lapse_wait))
        self.lapses_waited += 1
        return None

    def _refusal(self, sets: WriteSets) -> tuple[Refusal | None, bool]:
        """Why nothing of ``sets`` may be made now (None: go on), and whether only a lapse
        of this node's lease is in the way (every refusing partition still this node's in
        the applied table, with its stream)."""
        rep = self.machine
        refusal: Refusal | None = None
        lapsed = True
        for name in sorted(sets):
            view = rep.views.get(name)
            if name not in rep.acting or name not in rep.streams or view is None:
                active = None if view is None else view.active
                why = f"{self.name} does not act for {name} (active: {active})"
                refusal = refusal or Refusal(errors.NotActive(why))
                lapsed = lapsed and active == self.name and name in rep.streams
                continue
            taker = rep.handing_over(name)
            if taker is not None:
                # Before a handover nothing new is made here (replication.md §10e): the
                # retry finds ``taker`` active once ``restored`` applied.
                why = f"{self.name} hands {name} over to {taker}: retry there"
                return Refusal(errors.NotActive(why)), False
        return refusal, refusal is not None and lapsed

    def _unpark(self, now: float) -> None:
        """After an event: the calls waiting out a lapse go on, or are refused."""
        rep = self.machine
        parked, self._parked = self._parked, []
        for p in parked:
            moved = [
                name
                for name, epoch in p.epochs.items()
                if (view := rep.views.get(name)) is None
                or view.epoch != epoch
                or view.active != self.name
            ]
            if moved:
                why = f"{moved[0]} changed hands while {self.name}'s lease had lapsed: retry"
                p.done(Refusal(errors.NotActive(why)))
                continue
            refusal, lapsed = self._refusal(p.sets)
            if refusal is None:
                self._make(now, p.sets, p.gtid, p.done)
            elif not lapsed or now >= p.until:
                p.done(refusal)
            else:
                self._parked.append(p)

    def _make(self, now: float, sets: WriteSets, gtid: str | None, done: Done) -> None:
        """Make the records of ``sets``, every partition acting (:meth:`replicate`)."""
        rep = self.machine
        large = any(len(writes) > rep.config.record_writes for writes in sets.values())
        if gtid is None and (len(sets) > 1 or large):
            # A one-node commit over several partitions: one record per partition would not
            # be atomic on the replicas (one can arrive, not the other, when this node dies).
            # So is a large one: its write set goes in parts (replication.md §4a), which only
            # a prepared record may (its outcome applies it whole).
            self._local_txid += 1
            txid = f"{self.name}{LOCAL_COORDINATOR}.{self._local_txid}"
            names, outer = sorted(sets), done

            def prepared(failed: Refusal | None) -> None:
                self._local_prepared(self.now, txid, names, outer, failed)

            gtid, done = txid, prepared
        self._next_group += 1
        ref = self._next_group
        group = self._groups[ref] = _Group(done, len(sets), partitions=sorted(sets))
        self.dirty = True
        for name in group.partitions:
            epoch = rep.views[name].epoch
            if gtid is None:
                actions = rep.replicate(now, ref, name, epoch, sets[name])
            else:
                actions = rep.replicate(now, ref, name, epoch, sets[name], PREPARE, gtid)
            self._actions(now, actions)

    def _finished(self, action: Completed | Failed) -> None:
        group = self._groups.get(action.ref) if isinstance(action.ref, int) else None
        if group is None:
            return
        if isinstance(action, Failed) and group.failed is None:
            why = (
                f"{action.partition}: {action.error} (active {action.active}) before every "
                "sync replica held the commit: outcome unknown, ask request.result"
            )
            group.failed = Refusal(errors.Unavailable(why), unknown=True)
        group.remaining -= 1
        if group.remaining == 0:
            del self._groups[action.ref]
            group.done(group.failed)

    def _local_prepared(
        self, now: float, txid: str, names: list[str], done: Done, failed: Refusal | None
    ) -> None:
        """Every prepared record of a one-node commit ended: decide it in the log."""
        outcome = OUTCOME_ABORT if failed is not None else OUTCOME_COMMIT
        proposal = {"t": PROPOSE, "g": txid, "o": outcome, "n": []}
        self._deciding[txid] = _Deciding(names, done, failed, proposal, now)
        self.runtime.ask_log(now, proposal)

    def _propose_again(self, now: float) -> None:
        retry = self.propose_again()
        for deciding in list(self._deciding.values()):
            if now - deciding.sent >= retry:
                deciding.sent = now
                self.runtime.ask_log(now, deciding.proposal)

    def _local_decided(self, now: float, txid: str, decision: str) -> None:
        deciding = self._deciding.pop(txid)
        self._remember(txid, decision)
        rep = self.machine
        for name in deciding.names:
            if rep.prepared_here(name, txid):
                self.dirty = True
                self._actions(now, rep.outcome(now, None, name, txid, decision))
        if decision == OUTCOME_COMMIT:
            deciding.done(None)
        elif deciding.failed is not None:
            deciding.done(Refusal(deciding.failed.error))  # decided: an abort, not unknown
        else:
            deciding.done(Refusal(errors.Aborted(f"{txid}: a promoted copy decided abort first")))

    # ------------------------------------------------------------ phase two
    def outcome(self, now: float, gtid: str, commit: bool, partitions: Iterable[str]) -> None:
        """The participant's phase two of ``gtid`` (its write set touched ``partitions``):
        the hold, then the outcome records (module doc).  Call it before the participant's
        tombstone is written."""
        rep = self.machine
        self.now = now
        decision = OUTCOME_COMMIT if commit else OUTCOME_ABORT
        self._remember(gtid, decision)
        for p in [p for p in self._parked if p.gtid == gtid]:
            # Its coordinator decided while it waited out a lapse: nothing is made of it.
            self._parked.remove(p)
            p.done(Refusal(errors.NotActive(f"{gtid} ended while {self.name} waited to act")))
        # Right after a restart the table is not applied yet and the write set names no
        # partition, while the copies are recovered from the disk (seed 2440).
        parts = set(partitions)
        parts |= {name for name, held in rep.data.prepared.items() if gtid in held}
        self._actions(now, rep.hold(gtid, sorted(parts)))
        self.dirty = True
        # (a prepared record whose parts are still to make gets its outcome behind them)
        waiting = self._resolving.get(gtid, set())
        for name in [n for n in sorted(rep.streams) if rep.prepared_here(n, gtid)]:
            if name in waiting:
                # Taken over at promotion (another participant's prepared record, of the
                # same gtid as this node's own branch): the store holds it apart, so it is
                # resolved -- its writes go into the store -- not only given its record
                # (seed 3100502: the store served the copy without them).
                waiting.discard(name)
                self._resolved(now, name, gtid, decision)
            else:
                self._actions(now, rep.outcome(now, None, name, gtid, decision))
        if not waiting:
            self._resolving.pop(gtid, None)

    def _remember(self, gtid: str, decision: str) -> None:
        self._outcomes[gtid] = decision
        if len(self._outcomes) > KNOWN_OUTCOMES:
            self._outcomes.pop(next(iter(self._outcomes)))

    def known_outcome(self, gtid: str) -> str | None:
        """The outcome this node's own participant applied for ``gtid``, if it knows it."""
        known = self._outcomes.get(gtid) or self.runtime.tomb(gtid)
        return known if known in (OUTCOME_COMMIT, OUTCOME_ABORT) else None

    # ------------------------------------------------------------ promotion
    def _load_new_streams(self) -> None:
        """A partition this node just started acting for: the store takes the copy."""
        rep = self.machine
        if (rep.streams_started, len(self.loaded)) == self._streams_seen:
            return  # no stream started, no failed load forgotten (``loaded``) since
        waiting = False
        for name, stream in sorted(rep.streams.items()):
            if self.loaded.get(name) == stream.stream_id:
                continue
            if rep.making(name):
                # Records of P still to make (an outcome resolved at the stream's start,
                # step_writes): the copy shows them only once made -- hand it over then.
                waiting = True
                continue
            self.loaded[name] = stream.stream_id
            values, prepared = rep.data.values(name), rep.data.prepared_of(name)
            self.runtime.load_copy(name, stream.stream_id, values, prepared)
        if not waiting:
            self._streams_seen = (rep.streams_started, len(self.loaded))

    def _resolve(self, now: float, action: Resolve) -> None:
        if action.partition in self.runtime.own_prepare(action.txid):
            # This node's participant prepared it and waits for its outcome: the distributed
            # commit gives it (the coordinator, or the participant's own termination rule,
            # which knows a coordinator still collecting the votes of a large prepare).
            # Resolving it here proposed abort to the log 2 s into a 200,000-row swap by
            # partition, while the other participants were still preparing (session 13).
            return
        self._resolving.setdefault(action.txid, set()).add(action.partition)
        known = self.known_outcome(action.txid)
        if known is not None:
            # This node was the participant and applied the outcome while it did not act
            # for the partition (a restart): the log may have forgotten it since.
            self.decision(now, {"t": DECIDED, "g": action.txid, "o": known})
            return
        self._lookup(now, action.txid)

    def _lookup(self, now: float, txid: str) -> None:
        if self.lookup_again is not None:
            self._lookups[txid] = now
        self.runtime.ask_log(now, {"t": LOOKUP, "g": txid})

    def _lookup_again(self, now: float) -> None:
        assert self.lookup_again is not None
        for txid, at in list(self._lookups.items()):
            if txid not in self._resolving:
                del self._lookups[txid]
            elif now - at >= self.lookup_again:
                self._lookup(now, txid)

    def decision(self, now: float, answer: Any) -> None:
        """An answer of the decision log to this node."""
        self.now = now
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
                names = sorted(self._resolving.pop(txid))
                self.runtime.emit(Notify("rep.forgotten", {"g": txid, "p": names}))
                for name in names:
                    self._resolved(now, name, txid, OUTCOME_ABORT)
                return
            # Nothing decided: propose abort; whatever the log holds first is the outcome.
            self.runtime.ask_log(now, {"t": PROPOSE, "g": txid, "o": OUTCOME_ABORT, "n": []})

    def _resolved(self, now: float, name: str, txid: str, decision: str) -> None:
        """P's prepared record of ``txid`` gets its outcome: a record, and the store's copy."""
        writes = self.machine.data.prepared_of(name).get(txid)
        if writes is not None:
            # A copy: the outcome's first part may be applied at once, and a part takes its
            # writes out of the prepared record (data.py) -- the store needs them all.
            writes = dict(writes)
        self.dirty = True
        self._actions(now, self.machine.outcome(now, None, name, txid, decision))
        self.runtime.resolved(name, txid, writes, decision == OUTCOME_COMMIT)

    def settled_elsewhere(self, name: str, txid: str) -> bool:
        """A prepared record taken over here, of a partition this node no longer has a stream
        for, that its copy no longer holds (the new active node resolved it; seed 1294):
        the store may drop it, and this node stops waiting for its outcome."""
        rep = self.machine
        if name in rep.streams or txid in rep.data.prepared_of(name):
            return False
        waiting = self._resolving.get(txid)
        if waiting is not None:
            waiting.discard(name)
            if not waiting:
                del self._resolving[txid]
        return True

    # ------------------------------------------------------------ request results
    def lookup(self, client: str, seq: int) -> tuple[tuple[bool, Any] | None, bool]:
        """A request's result in the replicated copies here, and whether one may be in doubt."""
        data = self.machine.data
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
        stream = self.machine.streams.get(name)
        return stream is not None and stream.completed >= 1

    def status(self) -> dict[str, Any]:
        return self.machine.status()


__all__ = [
    "LOCAL_COORDINATOR",
    "RESULT_KEY",
    "Done",
    "HostRuntime",
    "Refusal",
    "ReplicationHost",
    "WriteSets",
]
