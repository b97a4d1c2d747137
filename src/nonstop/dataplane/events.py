"""Events and actions of the data-plane machine, beyond those of the runtime contract.

The data plane of a node (client sessions, branches, the coordinator's two-phase
orchestration, request results, the reaction to membership changes) is one
sans-I/O machine, :class:`nonstop.dataplane.machine.DataPlane`.  It follows the
rules of :mod:`nonstop.runtime.interface` (time from events, randomness from the
injected RNG, never blocks, never raises on bad input) and takes, besides
``Started``, ``TimerFired`` and ``Received`` (the peers' ``data.*`` messages), the
events below; it returns, besides ``Send``, ``SetTimer``, ``CancelTimer``, ``Log``
and ``Notify``, the actions below.

What the machine does not do itself, it asks for by an action and hears back by
an event with the same ``corr``:

* **The store** -- every branch op (a lookup, a query, a create, applying a write
  set, recording a request's result, ...) runs on the node's local store:
  :class:`Exec` → :class:`BranchDone`.  The real runtime runs it on an
  ``AsyncTransaction`` of the LMDB store (lock waits included), the simulator on
  a simulated store (:mod:`nonstop.sim.scenarios.dataplane`).  The machine never
  sees a transaction object, only branch ids.
* **The commit decision** -- a transaction that wrote on several nodes is handed
  to the distributed-commit machine (:mod:`nonstop.dtx`): :class:`Decide` →
  :class:`DecisionDone`.
* **The client** -- :class:`ClientOp` in, :class:`ClientReply` out, per
  connection (a session belongs to the connection that began it).

Which node is up, which nodes are members, whether this node has quorum and which
node holds which location code come from the cluster layer as
:class:`ClusterChanged`; the machine keeps the latest one.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from nonstop.runtime.interface import Payload


# ----------------------------------------------------------------- events
@dataclass(frozen=True, slots=True)
class ClientOp:
    """A data op from client connection ``conn`` (data-path.md §3): ``{"op": "tx.get", ...}``.

    Answered by exactly one :class:`ClientReply` with the same ``conn`` and ``corr``
    (unless the connection is gone first).
    """

    now: float
    conn: int
    corr: int
    payload: Payload


@dataclass(frozen=True, slots=True)
class ClientGone:
    """Client connection ``conn`` closed: its active sessions roll back (B8)."""

    now: float
    conn: int


@dataclass(frozen=True, slots=True)
class BranchDone:
    """The local store finished the :class:`Exec` with this ``corr``.

    ``reply`` is the op's reply dict, or an error reply ``{"error": class name,
    "message": text}`` (:func:`nonstop.model.wire.error_out`).
    """

    now: float
    corr: int
    reply: dict[str, Any]


@dataclass(frozen=True, slots=True)
class DecisionDone:
    """The distributed-commit machine answered the :class:`Decide` with this ``corr``.

    ``reply`` is its ``run`` reply (``{"ok": True}`` or ``{"error": ..., "why": ...}``).
    """

    now: float
    corr: int
    reply: Payload


@dataclass(frozen=True, slots=True)
class PartitionView:
    """One partition of the table as this node applied it (ha.md sections 2, 8).

    Not used for routing yet: the data path still routes by the node a
    reference names (the next step of issue 10 routes by partition).
    """

    name: str
    location: int
    """The partition's opaque 64-bit location code (``ha.partition_table.partition_location``)."""
    active: str | None
    epoch: int
    current: tuple[tuple[str, str], ...]
    """The nodes holding it now, priority order, each with its style (``sync``/``async``)."""
    acting: bool
    """This node acted for it when the event was built: quorum, active, lease held, the
    previous active's lease waited out (ha.md section 8).  A lease runs out by time alone:
    whoever acknowledges must ask the cluster node's ``acting(now, name)`` at that instant."""


@dataclass(frozen=True, slots=True)
class ClusterChanged:
    """What the cluster layer knows now (sent at start and on every change)."""

    now: float
    members: tuple[str, ...]
    """The committed view's members (every known node while there is no view)."""
    up: frozenset[str]
    """Nodes the failure detector sees Up; this node is always in it."""
    quorum: str
    """``"Active"``, ``"Partial"`` or ``"Disabled"`` (D16)."""
    locations: Mapping[int, str] = field(default_factory=dict)
    """Location code (first 8 bytes of a reference) → the node it names."""
    partitions: Mapping[str, PartitionView] = field(default_factory=dict)
    """The partition table by name (empty on a node without one); rebuilt only when the
    table or this node's acting set changed, else the same mapping as before."""


@dataclass(frozen=True, slots=True)
class LocalWaits:
    """The store's wait-for edges now, answering :class:`ReadWaits`.

    ``edges``: (waiting branch id, branch id it waits for) for every lock
    request of a branch that waits for another branch's lock (holders and
    incompatible requests queued ahead, as in ``LockManager.wait_for``).
    Transactions that are not branches are left out.
    """

    now: float
    edges: tuple[tuple[str, str], ...]


# ---------------------------------------------------------------- actions
@dataclass(frozen=True, slots=True)
class ClientReply:
    """Answer the :class:`ClientOp` (``conn``, ``corr``)."""

    conn: int
    corr: int
    payload: Payload


@dataclass(frozen=True, slots=True)
class Exec:
    """Run branch op ``op`` with ``fields`` on the local store, then feed ``BranchDone(corr)``.

    ``bid`` names the branch (``"<coordinator>.<session id>"``); with ``iso`` set
    the store opens the branch first (``"serializable"`` or ``"snapshot"``).
    ``writes`` (a write set, data-path.md §2) are applied to the branch before
    the op.  ``bid`` is None for ops outside any branch (``request.lookup``).
    The runtime runs the Execs of one branch in the order they were emitted,
    one at a time; Execs of different branches may run concurrently.
    """

    corr: int
    bid: str | None
    op: str
    fields: dict[str, Any]
    iso: str | None = None
    writes: list[Any] | None = None


@dataclass(frozen=True, slots=True)
class EndBranch:
    """Roll the local branch ``bid`` back (if still open) and forget it; no answer."""

    bid: str


@dataclass(frozen=True, slots=True)
class Decide:
    """Two-phase commit of ``branches`` (node → ops, ``[["b", bid], ["w", ...], ...]``).

    The distributed-commit machine's ``{"op": "run", "branches": branches}``;
    answered by ``DecisionDone(corr)``.
    """

    corr: int
    branches: dict[str, list[Any]]


@dataclass(frozen=True, slots=True)
class ReadWaits:
    """Read the store's wait-for edges between branches; answer with :class:`LocalWaits`."""


DataEvent = ClientOp | ClientGone | BranchDone | DecisionDone | ClusterChanged | LocalWaits
DataAction = ClientReply | Exec | EndBranch | Decide | ReadWaits

__all__ = [
    "BranchDone",
    "ClientGone",
    "ClientOp",
    "ClientReply",
    "ClusterChanged",
    "DataAction",
    "DataEvent",
    "Decide",
    "DecisionDone",
    "EndBranch",
    "Exec",
    "LocalWaits",
    "ReadWaits",
]
