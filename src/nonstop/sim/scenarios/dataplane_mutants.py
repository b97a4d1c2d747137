"""Deliberately broken data-path nodes: the campaign must catch each (the mutation check).

A checker that never fails proves nothing.  Each class here breaks one promise
of the data path the way real systems have broken it, and
``tests/sim/test_dataplane.py`` asserts that a few seeds of the campaign find
a violation.  Only the simulator's tests and ``--mutant`` use them.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

from nonstop import errors
from nonstop.cluster.node import ClusterConfig
from nonstop.dataplane.branches import BranchRegistry
from nonstop.dataplane.deadlocks import DeadlockDetector
from nonstop.dataplane.ends import OwedEnds
from nonstop.dataplane.events import ClusterChanged, Decide, DecisionDone
from nonstop.dataplane.machine import DataPlane, DataPlaneConfig
from nonstop.dataplane.state import Session
from nonstop.dtx.decisions import COMMIT
from nonstop.dtx.protocol import CoordTx, DtxNode
from nonstop.sim.scenarios.dataplane_node import SimDataNode


class _Swapped(SimDataNode):
    """A node with one part replaced by a broken one (``dtx_part`` or ``dataplane_part``)."""

    dtx_part: type[DtxNode] = DtxNode
    dataplane_part: type[DataPlane] = DataPlane

    def __init__(
        self,
        cluster_config: ClusterConfig,
        rng: random.Random,
        recovered: Mapping[bytes, bytes],
        **kwargs: Any,
    ) -> None:
        kwargs.setdefault("dtx_class", self.dtx_part)
        kwargs.setdefault("dataplane_class", self.dataplane_part)
        super().__init__(cluster_config, rng, recovered, **kwargs)


class AckBeforeDecision(SimDataNode):
    """A commit is acknowledged as soon as the data plane asks for the decision.

    The data plane hears ``DecisionDone(ok)`` at once -- before any branch
    prepared, let alone the decision reached the Raft log -- and the real
    outcome is dropped: "acknowledge before the decision is durable" in its
    bluntest form.  The data plane then treats the session as committed while
    two-phase commit has not even taken its branches.
    """

    def _decide(self, now: float, action: Decide) -> None:
        super()._decide(now, action)
        corr = self._decisions.pop(self._next_internal)
        self._queue.append((True, DecisionDone(now, corr, {"ok": True})))


class _AckOnVotesDtx(DtxNode):
    """Replies commit to ``run`` once every branch voted yes, before the log decided."""

    def _on_all_yes(self, tx: CoordTx) -> None:
        reads: dict[str, Any] = {}
        for node in sorted(tx.votes):
            reads.update(tx.votes[node])
        self._reply(tx, {"ok": True, "outcome": COMMIT, "g": tx.gtid, "reads": reads})
        super()._on_all_yes(tx)  # proposes commit; its answer no longer reaches the client


class AckOnVotes(_Swapped):
    """The subtle variant: a commit is acknowledged when every participant voted yes.

    Everything else runs as it should, so the transaction nearly always commits;
    it is lost only when the decision log decides *abort* after all the yes
    votes -- the coordinator crashes before its commit proposal is logged and,
    recovered, proposes abort; or the log has no quorum until a participant in
    doubt proposes abort first (B9).  That needs a fault at the wrong moment.
    """

    dtx_part = _AckOnVotesDtx


class _AckAtDecisionDtx(DtxNode):
    """Replies commit to ``run`` as soon as the log decided, before the participants applied."""

    def _commit_decided(self, tx: CoordTx, reply: dict[str, Any]) -> None:
        self._reply(tx, reply)


class AckBeforeApply(_Swapped):
    """A commit is acknowledged once its decision is durable, before every participant applied it.

    Durable and atomic -- nothing is lost -- but a read right after the
    acknowledgement may still see the state before the commit on a participant
    that has not applied it yet: the stale read of issue 10.  The read-back check
    (no stale read after an acknowledged commit) catches it.
    """

    dtx_part = _AckAtDecisionDtx


class _QuorumBlindPlane(DataPlane):
    def _on_cluster(self, ev: ClusterChanged) -> None:
        super()._on_cluster(ev)
        self.view.quorum = "Active"  # the bug: a node cut off from the majority commits on


class CommitWithoutQuorum(_Swapped):
    """A node without quorum (Disabled) still commits its clients' local transactions.

    Distributed commits still fail there (the decision log has no quorum), so
    only one-node commits are acknowledged: the ack-without-quorum check catches it.
    """

    dataplane_part = _QuorumBlindPlane


class _KeepOrphans(BranchRegistry):
    def coordinator_down(self, peer: str) -> None:
        pass  # the bug: a dead coordinator's branches keep their locks until they idle out


class _KeepOrphansPlane(DataPlane):
    def __init__(
        self, name: str, rng: random.Random, config: DataPlaneConfig | None = None
    ) -> None:
        super().__init__(name, rng, config)
        self.registry = _KeepOrphans(self)


class KeepOrphanBranches(_Swapped):
    """A participant does not roll back a coordinator's branches when it sees it Down.

    Not a safety bug -- the branches idle out after ``branch_idle`` -- but their
    locks stall every transaction behind them meanwhile (data-path.md §7); the
    scenario's orphan check (a node that learns a peer is down holds none of
    its branches afterwards) catches it.
    """

    dataplane_part = _KeepOrphansPlane


class _EndOnce(OwedEnds):
    """The ends before issue 14: one ``branch.end``, only to a node up at the session's end."""

    def owe(self, node: str, bid: str) -> None:
        if node in self.dp.view.up:
            self.dp.calls.tell(node, {"t": "data.req", "op": "branch.end", "b": bid})

    def node_up(self, node: str) -> None:
        pass

    def retry(self, now: float) -> None:
        pass


class _EndOncePlane(DataPlane):
    def __init__(
        self, name: str, rng: random.Random, config: DataPlaneConfig | None = None
    ) -> None:
        super().__init__(name, rng, config)
        self.ends = _EndOnce(self)


class EndBranchesOnce(_Swapped):
    """A coordinator ends its session's branches with one ``branch.end`` to the nodes
    up at that moment, and never again (the data plane before issue 14).

    A first op still on its way to a node cut off (or paused) when the session
    failed opens its branch there later, and a lost end leaves one open: nobody
    ends them until ``branch_idle``.  The ``branch-outlives-session`` check
    (``dataplane_orphans.py``) catches it.
    """

    dataplane_part = _EndOncePlane


class _UnfencedPlane(DataPlane):
    def not_active(self, fence: dict[str, int]) -> errors.NotActive | None:
        return None


class AckWithoutActing(_Swapped):
    """Routing by partition: a node runs and acknowledges branch ops (and votes) for a
    partition whatever it acts for -- at a stale epoch, or after its lease ran out.  The
    partitioned scenario's ack-acting check catches it
    (:mod:`.dataplane_partitions`)."""

    dataplane_part = _UnfencedPlane


class _NoWoundDetector(DeadlockDetector):
    def _wound(self, edges: frozenset[tuple[str, str]]) -> None:
        pass  # cycles only, found and confirmed as before wound-wait


class _NoWoundPlane(DataPlane):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.deadlocks = _NoWoundDetector(self)


class NoWound(_Swapped):
    """Deadlock handling without wound-wait: only cycles are broken, a period and a
    confirmation after they form, while an old transaction queues behind younger ones
    that wait themselves.  Safe, but at 64 clients on 24 accounts the commits stop for
    over 200 ms (a liveness mutant, caught by ``tests/sim/test_dataplane_deadlocks.py``,
    not by the safety checks)."""

    dataplane_part = _NoWoundPlane


LIVENESS_MUTANTS: dict[str, type[SimDataNode]] = {"no-wound": NoWound}
"""Mutants of deadlock handling: they break the commit-gap bound, not safety."""


class _AgelessPlane(DataPlane):
    def _begin(self, conn: int, iso: Any, age: Any = None) -> Session:
        return super()._begin(conn, iso, None)  # the replay's age is dropped


class DropStamp(_Swapped):
    """A replay ranks from its own start, not its first attempt's (the ``age`` a replay
    carries on ``begin`` is ignored): wound-wait is fair per attempt, not per
    transaction, and a transfer wounded as the youngest replays as the youngest again.
    Safe, but at 64 clients on 24 accounts some transfers are replayed far more often
    (caught by ``tests/sim/test_dataplane_deadlocks.py``'s starvation check)."""

    dataplane_part = _AgelessPlane


STARVATION_MUTANTS: dict[str, type[SimDataNode]] = {"drop-stamp": DropStamp}
"""Mutants of replay ranks: they break the bound on replays per transfer, not safety."""


class RecordNotReplicated(SimDataNode):
    """A request's record is committed on the node that wrote it but left out of the
    replicated records: after a failover the promoted copy does not know the request
    ran, and a retry of the same request id runs it a second time (requests.md).
    Run with replicas (``--partitions --replicas 1``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.store.replicate_results = False


class FenceNotRecorded(SimDataNode):
    """``request.result`` with ``fence`` answers "not committed" without recording it at
    the home: the client runs the transfer again under a new id while the first attempt
    may still commit (requests.md §3).  Run with replicas (``--partitions --replicas 1``)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.store.fence_records = False


PARTITION_MUTANTS: dict[str, type[SimDataNode]] = {"ack-without-acting": AckWithoutActing}
"""Mutants of routing by partition: run with ``dataplane.partitioned_config()``."""


class SnapshotReadsLatest(SimDataNode):
    """A snapshot branch reads the latest committed state at every read, not its view: a
    sum that straddles a transfer sees half of it (issue 10's torn total)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.store.read_latest = True


class BlindSnapshotCut(SimDataNode):
    """Each node's snapshot view is one state, but the cut never finds a straddling
    distributed commit: a transfer applied on one node and still in doubt on the other
    is seen in part (views opened "at the same moment" are not a consistent cut)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.store.cut_blind = True


SNAPSHOT_MUTANTS: dict[str, type[SimDataNode]] = {
    "snapshot-reads-latest": SnapshotReadsLatest,
    "blind-snapshot-cut": BlindSnapshotCut,
}
"""Broken snapshot reads (``tests/sim/test_dataplane.py``)."""


REPLICA_MUTANTS: dict[str, type[SimDataNode]] = {
    "record-not-replicated": RecordNotReplicated,
    "fence-not-recorded": FenceNotRecorded,
}
"""Mutants of the data path with replicas: ``dataplane.partitioned_config(replicas=1)``."""

MUTANTS: dict[str, type[SimDataNode]] = {
    "ack-before-apply": AckBeforeApply,
    "ack-before-decision": AckBeforeDecision,
    "ack-on-votes": AckOnVotes,
    "commit-without-quorum": CommitWithoutQuorum,
    "end-branches-once": EndBranchesOnce,
    "keep-orphan-branches": KeepOrphanBranches,
}
"""Name (``--mutant``) -> node class."""

__all__ = [
    "LIVENESS_MUTANTS",
    "MUTANTS",
    "PARTITION_MUTANTS",
    "REPLICA_MUTANTS",
    "SNAPSHOT_MUTANTS",
    "AckBeforeApply",
    "AckBeforeDecision",
    "AckOnVotes",
    "AckWithoutActing",
    "BlindSnapshotCut",
    "CommitWithoutQuorum",
    "EndBranchesOnce",
    "FenceNotRecorded",
    "KeepOrphanBranches",
    "RecordNotReplicated",
    "SnapshotReadsLatest",
]
