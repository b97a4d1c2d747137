"""What a node holds, and why a node that holds objects may not leave (issue 10).

Until partitions can move data off a node, every object lives on exactly one
node: removing that node from the membership would turn its objects into
``NotFound`` (a cluster lookup asks the members only), so ``get_or_create``
would create a second object with the same key.  A ``leave`` is therefore
checked first: the node that takes the request asks the leaving node how many
objects of which types it holds (``member.holdings``, a read-only branch op on
it), and refuses with one line naming them.  A node that cannot be asked (not
up) is not removed either: "cannot tell" is not "empty".
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

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


def cannot_tell(name: str, error: dict[str, Any]) -> str:
    """The refusal when node ``name`` could not be asked what it holds."""
    return (
        f"cannot tell whether {name} holds objects ({error.get('error')}: "
        f"{error.get('message')}): it is not removed; start it, then leave again"
    )


__all__ = [
    "BRANCH_HOLDINGS",
    "HOLDINGS_OP",
    "cannot_tell",
    "g_holdings",
    "leave_refusal",
]
