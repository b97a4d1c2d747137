"""One simulated node of the data path: cluster layer + distributed commit + data plane + store.

:class:`SimDataNode` is the one ``Machine`` the simulator drives per node.  Inside
it, three sans-I/O machines and the simulated store talk to each other without
the simulator seeing it (the production node composes the same machines with
the LMDB store instead):

* :class:`~nonstop.dtx.clustered.DtxClusterNode` -- Raft, failure detection,
  quorum, and two-phase commit with the decision in the Raft log;
* :class:`~nonstop.dataplane.machine.DataPlane` -- client sessions, branches,
  the coordinator's side of a commit, request results;
* :class:`~nonstop.sim.scenarios.dataplane_store.SimDataStore` -- the objects,
  locks and branches, and the dtx machine's resource manager.

Routing:

* **Client requests** ``{"conn": c, "op": ...}`` become ``ClientOp(conn=c,
  corr=request id)``; its ``ClientReply`` becomes ``Reply(request id)``.
  ``{"conn": c, "op": "conn.close"}`` is ``ClientGone(c)`` (answered ``{}``).
  Anything without ``conn`` (``status``, admin ops) goes to the cluster node.
* **Peers' messages**: ``t`` starting with ``data.`` to the data plane, the
  rest (``dtx.*``, the cluster's envelopes) to the DtxClusterNode.
* **Exec / EndBranch** run on the store at once; its ``BranchDone`` go back to
  the data plane in the same step (a store op takes no virtual time), lock
  waits end later (a ``BranchDone`` at grant or deadline).
* **Decide** becomes the dtx machine's ``{"op": "run", "branches"}`` client
  request under an internal (negative) request id; its ``Reply`` becomes
  ``DecisionDone``.
* **Prepare progress** of the store's resource manager that happens outside
  the dtx machine's own calls (a lock granted by a data-plane branch ending) is
  fed to it as ``Received(self, {"t": "dtx.rm", "p": [...]})``, as the real
  runtime does.
* **ClusterChanged** is derived from the cluster layer (view members, the
  failure detector's Up set, quorum state, location codes) at start and
  whenever the cluster layer notifies a node state, quorum or view change.
* **Persist tokens** (each component counts from 1): :data:`TOKEN_OWNERS`.  Durable
  keys do not collide: ``raft/``, ``dtx/``, the store's ``st/``, replication's ``rep/``.
* **Timers**: the store's start with ``st.``; the data plane's get ``dp:`` in
  front (stripped when they fire); the rest are the DtxClusterNode's.
"""

from __future__ import annotations

import dataclasses
import functools
import random
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from nonstop.cluster.failure import location_code
from nonstop.cluster.node import ClusterConfig
from nonstop.dataplane.events import (
    ClientGone,
    ClientOp,
    ClientReply,
    ClusterChanged,
    DataAction,
    Decide,
    DecisionDone,
    EndBranch,
    Exec,
    LocalWaits,
    ReadWaits,
)
from nonstop.dataplane.machine import DataPlane
from nonstop.dataplane.service import CLUSTER_NOTES, partition_views
from nonstop.dtx.clustered import DtxClusterNode
from nonstop.dtx.protocol import RM, DtxConfig, DtxNode
from nonstop.ha.cluster_node import HaClusterNode
from nonstop.runtime.interface import (
    Action,
    CancelTimer,
    ClientRequest,
    Event,
    Notify,
    Persist,
    Persisted,
    Received,
    Reply,
    SetTimer,
    Started,
    TimerFired,
)
from nonstop.sim.scenarios.dataplane_store import TIMER_PREFIX, SimDataStore, StoreConfig

DP_TIMER = "dp:"
DECIDE_NOTE = "dp.decide"
"""``Notify`` the composition emits when the data plane asks for a decision (observers)."""
CLOSE = "conn.close"
"""A simulated client closing its connection: ``{"conn": c, "op": "conn.close"}``."""

TOKEN_OWNERS = 4
"""``Persist`` tokens: ``4t`` the DtxClusterNode's, ``4t + 1`` the store's, ``4t + 2`` the data
plane's, ``4t + 3`` a composed replication machine's (:mod:`.dataplane_replication`)."""

_CLUSTER_KINDS = frozenset(CLUSTER_NOTES)


class SimDataNode:
    """The data path's node for the simulator (module doc)."""

    def __init__(
        self,
        cluster_config: ClusterConfig,
        rng: random.Random,
        recovered: Mapping[bytes, bytes],
        *,
        dtx_config: DtxConfig | None = None,
        dataplane_config: Any = None,
        store_config: StoreConfig | None = None,
        dataplane_class: Callable[..., DataPlane] = DataPlane,
        dtx_class: type[DtxNode] = DtxNode,
        cluster_factory: Callable[..., Any] | None = None,
    ) -> None:
        self.name = cluster_config.name
        self.everyone = tuple(
            sorted({self.name, *cluster_config.members, *cluster_config.static_peers})
        )
        self.locations = {location_code(n): n for n in self.everyone}
        self.store = SimDataStore(
            self.name,
            location_code(self.name),
            cluster_config.store_timestamp,
            recovered,
            store_config,
        )
        if cluster_factory is None:
            self.node = DtxClusterNode(
                cluster_config, self.store.rm, rng, recovered, dtx_config, dtx_class
            )
        else:  # the HA cluster node (routing by partition): as the real node builds it
            self.node = DtxClusterNode(
                cluster_config,
                self.store.rm,
                rng,
                recovered,
                dtx_config,
                dtx_class,
                cluster_factory=cluster_factory,
            )
        ha = self.node.cluster
        if (
            isinstance(ha, HaClusterNode)
            and dataplane_config is not None
            and dataplane_config.placement is not None
        ):
            # This node's own answer of "do I act for P now" (ha.md §8).
            dataplane_config = dataclasses.replace(
                dataplane_config,
                acting=ha.acting,
                applied_epoch=functools.partial(_applied_epoch, ha),
            )
        self.dataplane = dataplane_class(
            self.name, random.Random(rng.getrandbits(64)), dataplane_config
        )
        # (At the step's time: the data plane's own may be an earlier step's.)
        self.store.rm.take_branch = lambda bid: self.dataplane.take_branch(bid, self.now)
        self.store.rm.branch_lapsed = lambda bid: self.dataplane.vote_lapsed(bid, self.now)
        self._queue: deque[tuple[bool, Any]] = deque()
        """(to the data plane?, event) still to handle in this step."""
        self._out: list[Action] = []
        self._decisions: dict[int, int] = {}
        """internal request id of a ``run`` -> the ``Decide``'s corr."""
        self._next_internal = 0
        self._cluster_dirty = False
        self._last_view: tuple[Any, ...] | None = None
        self.acting_at_start: dict[str, tuple[bool, int]] = {}
        """Routing by partition: ``acting(now, P)`` and P's epoch at the start of the step
        being handled."""
        self.lost_peers: set[str] = set()
        """Peers the data plane was told went down since an observer last cleared this
        (the scenario checks their branches are gone: data-path.md §7)."""
        self.now = 0.0

    # ------------------------------------------------------------ the machine
    def handle(self, event: Event) -> list[Action]:
        now = self.now = event.now
        self._out = []
        # The store's answers in this step happen now (a commit's phase two reaching
        # the store through the dtx machine releases locks and answers waiting ops).
        self.store.now = now
        ha = self.node.cluster
        if isinstance(ha, HaClusterNode) and self.dataplane.config.placement is not None:
            # What it acted for before this step changed anything (the ack-acting check).
            self.acting_at_start = {
                p: (ha.acting(now, p), part.epoch)
                for p, part in ha.partition_table.partitions.items()
            }
        if isinstance(event, Started):
            self._queue.append((False, event))
            self._queue.append((True, event))
            self._cluster_dirty = True
        elif self._side_event(event):
            pass  # the replication machine's (a subclass composes it)
        elif isinstance(event, TimerFired):
            name = event.name
            if name.startswith(TIMER_PREFIX):
                self.store.timer(now, name)
            elif name.startswith(DP_TIMER):
                self._queue.append((True, TimerFired(now, name[len(DP_TIMER) :])))
            else:
                self._queue.append((False, event))
        elif isinstance(event, Received):
            payload = event.payload
            kind = payload.get("t") if isinstance(payload, dict) else None
            to_dp = isinstance(kind, str) and kind.startswith("data.")
            self._queue.append((to_dp, event))
        elif isinstance(event, Persisted):
            inner, owner = divmod(event.token, TOKEN_OWNERS)
            if owner == 0:
                self._queue.append((False, Persisted(now, inner)))
            elif owner == 1:
                self.store.persisted(now, inner)
            elif owner == 2:
                self._queue.append((True, Persisted(now, inner)))
            else:
                self._side_persisted(Persisted(now, inner))
        elif isinstance(event, ClientRequest):
            self._client(event)
        self._drain(now)
        out, self._out = self._out, []
        return out

    def _client(self, event: ClientRequest) -> None:
        payload = event.payload
        conn = payload.get("conn") if isinstance(payload, dict) else None
        if not isinstance(conn, int) or isinstance(conn, bool):
            self._queue.append((False, event))
            return
        if payload.get("op") == CLOSE:
            self._queue.append((True, ClientGone(event.now, conn)))
            self._out.append(Reply(event.request_id, {}))
            return
        op = {k: v for k, v in payload.items() if k != "conn"}
        self._queue.append((True, ClientOp(event.now, conn, event.request_id, op)))

    # ------------------------------------------------------------ plumbing
    def _drain(self, now: float) -> None:
        """Handle queued events and the store's results until nothing is left."""
        store = self.store
        while True:
            while self._queue:
                to_dp, event = self._queue.popleft()
                if to_dp:
                    self._from_dataplane(now, self.dataplane.handle(event))
                else:
                    self._from_node(now, self.node.handle(event))
            progress = store.take_progress()
            if progress:
                self._queue.append((False, Received(now, self.name, {"t": RM, "p": progress})))
            for done in store.take_done():
                self._queue.append((True, done))
            for action in store.take_actions():
                if isinstance(action, Persist):
                    self._out.append(Persist(TOKEN_OWNERS * action.token + 1, action.writes))
                else:
                    self._out.append(action)
            if not self._queue and self._cluster_dirty:
                self._cluster_dirty = False
                changed = self._cluster_changed(now)
                if changed is not None:
                    self._queue.append((True, changed))
            if not self._queue and store.idle() and not self._settle(now):
                return

    def _side_event(self, event: Event) -> bool:
        """Take an event of a component a subclass composes (True: taken)."""
        return False

    def _side_persisted(self, event: Persisted) -> None:
        """A ``Persisted`` of a composed component's write (token owner 3)."""

    def _settle(self, now: float) -> bool:
        """Called when nothing is left to handle in this step; True if it queued more."""
        return False

    def _from_node(self, now: float, actions: list[Action]) -> None:
        for action in actions:
            if isinstance(action, Persist):
                self._out.append(Persist(TOKEN_OWNERS * action.token, action.writes))
            elif isinstance(action, Reply) and action.request_id in self._decisions:
                corr = self._decisions.pop(action.request_id)
                self._decided(now, corr, action.payload)
            else:
                if isinstance(action, Notify) and action.kind in _CLUSTER_KINDS:
                    self._cluster_dirty = True
                self._out.append(action)

    def _from_dataplane(self, now: float, actions: list[Action | DataAction]) -> None:
        for action in actions:
            if isinstance(action, Exec):
                self.store.execute(now, action)
            elif isinstance(action, EndBranch):
                self.store.end(now, action.bid)
            elif isinstance(action, Decide):
                self._decide(now, action)
            elif isinstance(action, ReadWaits):
                # The simulated store's lock manager knows transactions by branch id.
                graph = self.store.locks.wait_for()
                edges = tuple(
                    (str(w), str(h)) for w, hs in graph.items() for h in sorted(hs, key=str)
                )
                self._queue.append((True, LocalWaits(now, edges)))
            elif isinstance(action, ClientReply):
                self._out.append(Reply(action.corr, action.payload))
            elif isinstance(action, Persist):
                self._out.append(Persist(TOKEN_OWNERS * action.token + 2, action.writes))
            elif isinstance(action, SetTimer):
                self._out.append(SetTimer(DP_TIMER + action.name, action.delay))
            elif isinstance(action, CancelTimer):
                self._out.append(CancelTimer(DP_TIMER + action.name))
            else:
                self._out.append(action)

    def _decide(self, now: float, action: Decide) -> None:
        """Hand a commit to the dtx machine as its ``run`` request (internal request id)."""
        self._next_internal -= 1
        rid = self._next_internal
        self._decisions[rid] = action.corr
        self._out.append(Notify(DECIDE_NOTE, {"nodes": sorted(action.branches)}))
        request = ClientRequest(now, rid, {"op": "run", "branches": action.branches})
        self._queue.append((False, request))

    def _decided(self, now: float, corr: int, reply: Any) -> None:
        self._queue.append((True, DecisionDone(now, corr, reply)))

    def _cluster_changed(self, now: float) -> ClusterChanged | None:
        """What the cluster layer knows now, if it differs from what the data plane has."""
        cluster = self.node.cluster
        members = tuple(sorted(cluster.view_members)) or self.everyone
        up = frozenset(
            {self.name} | {n for n in self.everyone if n != self.name and _is_up(cluster, n)}
        )
        ha = cluster if isinstance(cluster, HaClusterNode) else None
        table = None if ha is None else ha.partition_table
        parts_key = None if ha is None else (ha.table_version, ha.acting_set)
        view = (members, up, cluster.quorum_state, parts_key)
        if view == self._last_view:
            return None
        if self._last_view is not None:
            self.lost_peers |= self._last_view[1] - up
        self._last_view = view
        partitions = {} if ha is None else partition_views(table, ha.acting_set)
        return ClusterChanged(
            now, members, up, cluster.quorum_state, dict(self.locations), partitions
        )

    # ------------------------------------------------------------ inspection
    def status(self) -> dict[str, Any]:
        return {
            "dtx": self.node.dtx.status(),
            "in_doubt": self.store.in_doubt(),
            "branches": sorted(self.store.branches),
        }


def _applied_epoch(ha: HaClusterNode, partition: str) -> int | None:
    """``partition``'s epoch in ``ha``'s applied table now (the data plane's fence)."""
    part = ha.partition_table.partitions.get(partition)
    return None if part is None else part.epoch


def _is_up(cluster: Any, name: str) -> bool:
    return str(cluster.detector.state_of(name)) == "Up"


def make_factory(
    cluster_config: ClusterConfig,
    node_class: type[SimDataNode] = SimDataNode,
    **kwargs: Any,
) -> Callable[[random.Random, Mapping[bytes, bytes]], SimDataNode]:
    """A simulator factory ``(rng, recovered) -> SimDataNode``."""

    def factory(rng: random.Random, recovered: Mapping[bytes, bytes]) -> SimDataNode:
        return node_class(cluster_config, rng, recovered, **kwargs)

    return factory


__all__ = ["CLOSE", "DECIDE_NOTE", "DP_TIMER", "SimDataNode", "make_factory"]
