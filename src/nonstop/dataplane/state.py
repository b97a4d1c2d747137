"""The data plane's records: client sessions and the branches this node holds.

Vocabulary (data-path.md §3-§5):

* A **session** is one client transaction on the node the client is attached
  to (its *coordinator*).  It belongs to the client connection that began it:
  if the connection closes, the session is rolled back, unless it is
  committing (a commit in progress always finishes).
* A **branch** is the part of a session on one node, named
  ``"<coordinator>.<session id>"``.  The coordinator's own part is a branch too,
  so the two-phase-commit participant takes every branch over the same way
  (``DataPlane.take_branch``).  A participant opens a branch on the first op
  naming it and keeps it until ``branch.end``, a commit, its coordinator being
  seen down, or ``branch_idle`` seconds without an op (B8).
"""

from __future__ import annotations

from collections import deque
from typing import Any

from nonstop.dataplane.steps import Task

ACTIVE = "active"
COMMITTING = "committing"
UNDECIDED = "undecided"
OVER = "over"


class Session:
    """A client transaction coordinated by this node."""

    __slots__ = (
        "age",
        "bid",
        "committed",
        "conn",
        "cut",
        "dirty",
        "fence",
        "iso",
        "last",
        "local_open",
        "pending",
        "queue",
        "remote",
        "sid",
        "started",
        "state",
        "task",
    )

    def __init__(self, sid: int, conn: int, iso: str, bid: str) -> None:
        self.sid = sid
        self.conn = conn
        self.iso = iso
        """The store's isolation of its branches (``serializable`` or ``snapshot``)."""
        self.bid = bid
        """Its branches' id on every node, ``"<this node>.<sid>"``."""
        self.state = ACTIVE
        """active → committing → (undecided →) over; active → over on rollback."""
        self.remote: set[str] = set()
        """Other nodes where it opened a branch (to end with it)."""
        self.dirty: set[str] = set()
        """Nodes whose branch holds changes (creates, deletes, flushed writes, calls)."""
        self.pending: dict[str, dict[bytes, list[Any]]] = {}
        """Writes not yet shipped: node → ref → write (C5)."""
        self.fence: dict[str, dict[str, int]] = {}
        """Routing by partition: node → {partition: epoch} the session touched there; every
        branch op to that node carries it and the node refuses it (NotActive) unless it
        acts for each at that epoch."""
        self.cut: frozenset[str] | None = None
        """A snapshot session: the nodes whose views form its consistent cut, once opened
        (``snapshot_cut.py``); it reads no other node."""
        self.committed: set[str] = set()
        """Nodes whose branch two-phase commit committed (theirs to end, not ours)."""
        self.local_open = False
        """Its branch here was opened (an ``Exec`` with ``iso`` went out)."""
        self.task: Task | None = None
        """The op running now: a session runs one op at a time."""
        self.queue: deque[tuple[int, Any, str, dict[str, Any]]] | None = None
        """Ops that arrived while one ran: (conn, corr, op, payload)."""
        self.last = 0.0
        """When its last op started or ended (the ``tx_idle`` sweep's clock)."""
        self.started = 0.0
        """When it began (deadlock victims are the youngest: docs/design/deadlocks.md)."""
        self.age = 0.0
        """A replay's seniority: how long before ``started`` its first attempt began, as
        its client claimed on ``begin`` and bounded by ``deadlock_age_max``
        (``dataplane/deadlocks.py``: ``claimed_age``).  Its stamp is ``started - age``,
        so a transaction replayed by ``@transactional`` keeps its rank (no starvation)."""


class Branch:
    """A branch this node holds (the store has its transaction)."""

    __slots__ = ("bid", "busy", "fence", "last", "local", "view_acting")

    def __init__(self, bid: str, local: bool, now: float) -> None:
        self.bid = bid
        self.local = local
        """The coordinator's own branch: it lives as long as its session, never idles out."""
        self.last = now
        """When an op on it last started or ended (the idle sweep's clock)."""
        self.busy = 0
        """Ops running on it now (an idle sweep leaves it alone)."""
        self.fence: dict[str, int] = {}
        """Routing by partition: {partition: epoch} its ops touched; two-phase commit takes
        it (votes) only while this node acts for each at that epoch."""
        self.view_acting: dict[str, int] | None = None
        """A snapshot's branch with a cut: {partition: epoch} this node acted for when its
        view opened (``branch.cut_open``).  A read of any other partition (or epoch)
        through that view is refused: the view predates this node's copy of it
        (snapshot_cut.py, "Views and changes of hands")."""


__all__ = ["ACTIVE", "COMMITTING", "OVER", "UNDECIDED", "Branch", "Session"]
