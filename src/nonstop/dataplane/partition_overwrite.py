"""``tx.overwrite`` under routing by partition: one swap of every partition (data-path.md §6.6).

Under node routing the coordinator sends ``branch.overwrite`` to every member
(each swaps its whole extent of the type).  Under routing by partition the
objects live in partitions, each on its active node and replicated to its sync
replicas, so the coordinator:

* ``place``s **every** partition of the table (its active node, the session
  fenced by the partition's epoch: a node that no longer acts answers
  ``NotActive``, and a partition without an active node up fails the op with
  ``Unavailable`` -- nothing swapped);
* sends each active node ONE ``branch.overwrite`` naming its partitions and,
  per partition, the staged parts (tags) the driver expects there
  (``partitions: [[location, epoch, [tags]], ...]``); every other up member
  gets one with no partition, for objects in its own location (written before
  the cluster routed by partition);
* one node after the other in name order (two overwrites of a type queue on the
  first node instead of deadlocking across nodes, as under node routing).

The client's ``tx.commit`` then commits the session by two-phase commit: each
branch's write set (deletes and creates, ordinary transaction entries) is on
its partitions' sync replicas before the branch votes yes, and the decision is
in the cluster log.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from nonstop import errors
from nonstop.dataplane.state import Session
from nonstop.dataplane.steps import Call, OpCoroutine

if TYPE_CHECKING:
    from nonstop.dataplane.machine import DataPlane


def staged_arg(value: Any) -> dict[str, list[str]]:
    """``staged``: partition name -> the tags of its staged parts (may be empty)."""
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, list) and all(isinstance(t, str) for t in v)
        for k, v in value.items()
    ):
        raise errors.BadArgument("'staged' must map partition names to lists of part tags")
    return value


def g_overwrite_partitions(dp: DataPlane, s: Session, p: dict[str, Any]) -> OpCoroutine:
    """The session op (module doc); replies ``{"deleted", "inserted", "replayed"}``."""
    staged = staged_arg(p.get("staged"))
    table = dp.view.partitions
    unknown = sorted(set(staged) - set(table))
    if unknown:
        raise errors.BadArgument(
            f"staged rows name partition(s) not in the table: {', '.join(unknown[:5])}"
        )
    if not table:
        raise errors.NotActive("the partition table is not defined here yet")
    by_node: dict[str, list[list[Any]]] = {}
    for name in sorted(table):
        node = dp.place(s, name)
        part = table[name]
        by_node.setdefault(node, []).append([part.location, part.epoch, staged.get(name, [])])
    for node in dp.view.members:
        if dp.view.is_up(node):
            by_node.setdefault(node, [])
    fields = {k: p.get(k) for k in ("type", "tv", "job")}
    deleted = inserted = replayed = 0
    for node in sorted(by_node):
        reply = yield Call(node, "branch.overwrite", {**fields, "partitions": by_node[node]})
        s.dirty.add(node)
        deleted += int(reply.get("deleted", 0))
        inserted += int(reply.get("inserted", 0))
        replayed += bool(reply.get("replayed"))
    return {"deleted": deleted, "inserted": inserted, "replayed": replayed == len(by_node)}


__all__ = ["g_overwrite_partitions", "staged_arg"]
