"""A cluster snapshot's read views: one per node, opened together as a consistent cut.

A ``snapshot`` transaction reads each node's store through one read view
(``Transaction.committed``: every commit is in it entirely or not at all).  On
a cluster, a distributed commit is applied by each participant on its own
(phase two), so views opened on two nodes at nearly the same moment can still
show one participant's part of a transfer and not the other's: a torn total.

Before the first op of a snapshot session that can see more than one node,
the coordinator runs :func:`g_cut` (three rounds to every node that is up):

1. ``branch.cut_open`` — each node opens its branch's view, reading its commit
   journal's counter just before and after (``Transaction.pin_view``);
2. ``branch.cut_unsure`` — each node M names the gtids that may be missing
   from its view although M takes part in them: those in doubt in the view
   (a ``dtx/p/`` key in it) and those whose prepare it noted after the view
   opened, minus those whose commit tombstone (``dtx/t/``) is in the view;
3. ``branch.cut_seen`` with the union U — each node N names the gtids of U
   whose commit may be in its view: tombstone in the view, or applied and
   noted no later than the counter read just after the view opened.

The cut is consistent iff no gtid named by some M in round 2 is named by a
node N != M in round 3 (a commit visible on N is decided, so every participant
prepared it before; if it is not in M's view, M names it).  Otherwise the
views are dropped and the three rounds run again (nothing was read through
them); after ``MAX_CUT_ROUNDS`` the op fails with the retryable ``Conflict``.
A round that took longer than ``MAX_CUT_SECONDS`` is not trusted (the journal
forgets notes after ``commit_journal.KEEP_SECONDS``) and is run again.

The session then reads only the nodes of its cut (an op that needs another
node -- one that came up meanwhile -- fails with ``Conflict``).

**Views and changes of hands** (routing by partition).  A node's view shows a
partition as this node's store held it when the view opened.  If the node took
the partition over later (a failover, a handover by priority), the view holds
an older copy of it, or none: a read of it through the view would miss commits
acknowledged before.  So each node notes, at ``branch.cut_open``, the
partitions it acts for and their epochs (:func:`view_refusal`); an op fenced to
another partition or epoch is refused with ``Conflict`` (the snapshot is
replayed).  Acting includes readiness: a promoted node acts for a partition
only once its store took the copy (and, on the real node, resolved the
prepared records taken over with it).  Cost: three
round trips to every node up at the snapshot's first op, a view (an LMDB read
transaction) held on each until the session ends.  docs/design/snapshot-stamps.md.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from nonstop import errors
from nonstop.dataplane.steps import Call, Gather, OpCoroutine
from nonstop.dtx.decisions import COMMIT
from nonstop.dtx.protocol import K_PREPARED, K_TOMB
from nonstop.tx.entries import NONE

if TYPE_CHECKING:
    from nonstop.dataplane.machine import DataPlane
    from nonstop.dataplane.state import Branch, Session
    from nonstop.tx.async_transaction import AsyncTransaction

CUT_OPEN = "branch.cut_open"
CUT_UNSURE = "branch.cut_unsure"
CUT_SEEN = "branch.cut_seen"
CUT_OPS = frozenset({CUT_OPEN, CUT_UNSURE, CUT_SEEN})
"""The branch ops of the cut (peers run them too: ``branches.PEER_OPS``)."""

MAX_CUT_ROUNDS = 50
"""Attempts at a consistent cut before the op fails with ``Conflict`` (replayed)."""

MAX_CUT_SECONDS = 2.0
"""A cut whose three rounds took longer is tried again (module doc)."""

_MAX_GTIDS = 100_000
"""Bound on the gtids a peer may ask about in one ``branch.cut_seen``."""


# ------------------------------------------------------------- coordinator
def needs_cut(s: Session, op: str) -> bool:
    """Whether ``op`` of session ``s`` must first open its snapshot's views (module doc)."""
    return s.iso == "snapshot" and s.cut is None and op != "tx.commit"


def g_cut(dp: DataPlane, s: Session) -> OpCoroutine:
    """Open the session's views on every node that is up, as one consistent cut."""
    nodes = list(dp.view.up_members)
    if len(nodes) < 2:
        s.cut = frozenset(nodes)  # one store: its one view is consistent by itself
        return None
    for attempt in range(MAX_CUT_ROUNDS):
        started = dp.now
        _raise_any((yield Gather([Call(n, CUT_OPEN, {"reset": attempt > 0}) for n in nodes])))
        replies = yield Gather([Call(n, CUT_UNSURE, {}) for n in nodes])
        _raise_any(replies)
        unsure = {n: set(r.get("g") or ()) for n, r in zip(nodes, replies, strict=True)}
        if any(r.get("x") for r in replies):
            dp.stats["cut_retries"] += 1
            continue  # a journal forgot what this cut needs: open again
        union = sorted(set().union(*unsure.values()))
        seen: dict[str, set[str]] = {n: set() for n in nodes}
        if union:
            replies = yield Gather([Call(n, CUT_SEEN, {"g": union}) for n in nodes])
            _raise_any(replies)
            seen = {n: set(r.get("g") or ()) for n, r in zip(nodes, replies, strict=True)}
        if dp.now - started <= MAX_CUT_SECONDS and not torn(unsure, seen):
            s.cut = frozenset(nodes)
            dp.stats["cuts"] += 1
            return None
        dp.stats["cut_retries"] += 1
    raise errors.Conflict(
        f"no consistent snapshot across {len(nodes)} nodes after {MAX_CUT_ROUNDS} attempts "
        "(distributed commits kept straddling it)"
    )


def view_refusal(
    dp: DataPlane, branch: Branch | None, op: str, fence: dict[str, int] | None, reset: bool
) -> errors.Error | None:
    """Note the partitions acted for when ``branch``'s view opens; refuse an op fenced to a
    partition (or epoch) the view was not opened for (module doc)."""
    if branch is None:
        return None
    if op == CUT_OPEN:
        if reset or branch.view_acting is None:
            branch.view_acting = dp.acting_epochs()
        return None
    if branch.view_acting is None or not fence:
        return None
    for name, epoch in fence.items():
        if branch.view_acting.get(name) != epoch:
            return errors.Conflict(
                f"this snapshot's view on {dp.name} opened before it acted for partition "
                f"{name} at epoch {epoch}: it does not hold that copy (replayed)"
            )
    return None


def torn(unsure: dict[str, set[str]], seen: dict[str, set[str]]) -> bool:
    """Does a commit seen in one node's view miss from another's where it takes part?"""
    for m, missing in unsure.items():
        for n, visible in seen.items():
            if n != m and missing & visible:
                return True
    return False


def outside_cut(s: Session, node: str) -> errors.Error | None:
    """The error of a snapshot op on a node outside its cut (None: inside, or no cut)."""
    if s.cut is None or node in s.cut:
        return None
    return errors.Conflict(
        f"node {node} came up after this snapshot began; it is not in the snapshot (replayed)"
    )


def _raise_any(replies: list[Any]) -> None:
    for r in replies:
        if isinstance(r, BaseException):
            raise r


# ------------------------------------------------------------- the store side
def run_cut_op(tx: AsyncTransaction, op: str, p: dict[str, Any]) -> dict[str, Any]:
    """One of the cut's branch ops on this node's branch ``tx`` (real store)."""
    journal = tx.engine.commit_journal
    if op == CUT_OPEN:
        if p.get("reset"):
            tx.reset_view()
        if tx.view_marks is None:
            tx.pin_view(lambda: journal.counter)
        return {}
    marks = tx.view_marks
    if marks is None:
        raise errors.BadArgument(f"{op} before {CUT_OPEN}")
    store = tx.engine.store
    with tx.committed(NONE) as view:
        if op == CUT_UNSURE:
            since = journal.prepared_since(marks[0], time.monotonic())
            if since is None:
                return {"g": [], "x": True}
            doubt = _keys(view, store.dtx, K_PREPARED)
            missing = {g for g in since if view.get(K_TOMB + g.encode(), db=store.dtx) is None}
            return {"g": sorted(doubt | missing)}
        if op == CUT_SEEN:
            asked = p.get("g")
            if not isinstance(asked, list) or len(asked) > _MAX_GTIDS:
                raise errors.BadArgument(f"g must be a list of at most {_MAX_GTIDS} gtids")
            return {"g": [g for g in asked if isinstance(g, str) and _seen(tx, view, g)]}
    raise errors.BadArgument(f"unknown cut op {op!r:.40}")


def _seen(tx: AsyncTransaction, view: Any, gtid: str) -> bool:
    """May ``gtid``'s commit be in the view (module doc, round 3)?"""
    store = tx.engine.store
    if view.get(K_TOMB + gtid.encode(), db=store.dtx) == COMMIT.encode():
        return True
    stamp = tx.engine.commit_journal.applied_stamp(gtid)
    marks = tx.view_marks
    return stamp is not None and marks is not None and stamp <= marks[1]


def _keys(view: Any, db: Any, prefix: bytes) -> set[str]:
    """The gtids under ``prefix`` in the view's ``db``."""
    out: set[str] = set()
    cur = view.cursor(db=db)
    if not cur.set_range(prefix):
        return out
    for key in _iter_keys(cur):
        if not key.startswith(prefix):
            break
        out.add(key[len(prefix) :].decode())
    return out


def _iter_keys(cur: Any) -> Iterable[bytes]:
    for key in cur.iternext(keys=True, values=False):
        yield bytes(key)


__all__ = [
    "CUT_OPEN",
    "CUT_OPS",
    "CUT_SEEN",
    "CUT_UNSURE",
    "MAX_CUT_ROUNDS",
    "MAX_CUT_SECONDS",
    "g_cut",
    "needs_cut",
    "outside_cut",
    "run_cut_op",
    "torn",
    "view_refusal",
]
