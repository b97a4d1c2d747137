"""What a node holds, and when a node may leave (issue 10).

Routing by partition (the default): every object lives in a partition, whose
active node and in-sync sync replicas each hold it.  A node leaving is, to the
partition table, a node gone: the partitions it was active for fail over to a
live in-sync replica, and it is dropped from the others (ha.md §6).  So a
``leave`` is refused only while the node holds the *last* in-sync copy of some
partition -- no other holder is live (its replica is down, or still copying) --
naming those partitions (:func:`last_copies`); it is read from the partition
table every node applies, so a node that is down can be removed too once its
partitions have live holders elsewhere.

Routing by node: every object lives on exactly one
node: removing that node from the membership would turn its objects into
``NotFound`` (a cluster lookup asks the members only), so ``get_or_create``
would create a second object with the same key.  A ``leave`` is therefore
checked first: the node that takes the request asks the leaving node how many
objects of which types it holds (``member.holdings``, a read-only branch op on
it), and refuses with one line naming them.  A node that cannot be asked (not
up) is not removed either: "cannot tell" is not "empty".
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Any, Protocol

from nonstop import errors
from nonstop.dataplane.state import Session
from nonstop.dataplane.steps import Call, OpCoroutine

if TYPE_CHECKING:
    from nonstop.dataplane.machine import DataPlane

HOLDINGS_OP = "member.holdings"
"""Client op ``{"op": "member.holdings", "name": node}`` → ``{"node", "objects", "types"}``."""
BRANCH_HOLDINGS = "branch.holdings"
"""The branch op a node runs on its store: ``{"types": {type name: count}}``."""


def g_holdings(dp: DataPlane, s: Session, p: dict[str, Any]) -> OpCoroutine:
    """``member.holdings``: how many objects of which types node ``name`` stores.

    Runs in a session of its own (read-only), ended here whatever the outcome.
    """
    name = p.get("name")
    try:
        if not isinstance(name, str) or name not in dp.view.known:
            raise errors.BadArgument(f"no node named {name!r:.40} in this cluster")
        reply = yield Call(name, BRANCH_HOLDINGS, {})
    finally:
        dp.end_session(s)
    types = reply.get("types")
    if not isinstance(types, dict):
        raise errors.ProtocolError(f"{name} answered {BRANCH_HOLDINGS} with {reply!r:.60}")
    counts = {str(t): int(n) for t, n in sorted(types.items()) if int(n) > 0}
    return {"node": name, "objects": sum(counts.values()), "types": counts}


def leave_refusal(holdings: dict[str, Any]) -> str | None:
    """Why node ``holdings["node"]`` may not leave (one line), or None if it holds nothing."""
    total = int(holdings.get("objects") or 0)
    if total <= 0:
        return None
    types = holdings.get("types") or {}
    parts = ", ".join(f"{n:,} {t}" for t, n in sorted(types.items(), key=lambda tn: -tn[1]))
    return (
        f"{holdings.get('node')} holds {total:,} objects ({parts}): it cannot leave while it "
        "holds objects (partitions cannot move them off a node yet); delete them first"
    )


class HeldPartition(Protocol):
    """What the leave check reads of a partition of the table (``ha.partition_table``)."""

    name: str

    def holders(self) -> list[str]: ...


def last_copies(partitions: Iterable[HeldPartition], name: str, live: Iterable[str]) -> list[str]:
    """The partitions ``name`` holds the last in-sync copy of (routing by partition):
    those it is a holder of (active, or in-sync sync replica) with no other holder that is
    live.  Removing ``name`` would leave them with no copy in the cluster; any other
    partition it holds fails over to, or keeps, a live holder (ha.md §6)."""
    others = set(live) - {name}
    return sorted(
        part.name
        for part in partitions
        if name in part.holders() and not others.intersection(part.holders())
    )


def partitions_leave_refusal(name: str, last: list[str]) -> str | None:
    """Why ``name`` may not leave a cluster routed by partition (one line), or None."""
    if not last:
        return None
    shown = ", ".join(last[:8]) + (f" and {len(last) - 8} more" if len(last) > 8 else "")
    return (
        f"{name} holds the last in-sync copy of {len(last)} partition(s) ({shown}): it "
        "cannot leave until another live node holds them (start their other nodes and "
        "wait until they are in sync)"
    )


def cannot_tell(name: str, error: dict[str, Any]) -> str:
    """The refusal when node ``name`` could not be asked what it holds."""
    return (
        f"cannot tell whether {name} holds objects ({error.get('error')}: "
        f"{error.get('message')}): it is not removed; start it, then leave again"
    )


__all__ = [
    "BRANCH_HOLDINGS",
    "HOLDINGS_OP",
    "HeldPartition",
    "cannot_tell",
    "g_holdings",
    "last_copies",
    "leave_refusal",
    "partitions_leave_refusal",
]
