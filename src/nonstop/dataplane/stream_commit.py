"""``tx.stream.commit``: a streaming sink's micro-batch marked committed in every partition
(data-path.md §6.7).

The driver's commit of micro-batch ``batch`` of stream ``stream`` under routing
by partition.  The coordinator ``place``s **every** partition of the table (its
active node, fenced by the partition's epoch: ``NotActive`` if it moves) and
sends each active node ONE ``branch.stream.commit`` naming its partitions
(``partitions: [[location, epoch], ...]``), one node after the other in name
order.  Each branch moves the partitions' marks to ``batch`` (never back) and
drops their chunk tags of batches up to it, as raw records of the partitions
(:func:`nonstop.bulk.stream_marks.g_commit_stream`) that ride the branch's
replicated write set; the client's ``tx.commit`` commits the session like any
transaction.  Why every partition: a replay of the batch must be skipped in
each partition it could write, and Spark sends the same rows again, but the
sink does not know which partitions they reached before a failure.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from nonstop import errors
from nonstop.bulk.stream_marks import batch_arg, stream_id
from nonstop.dataplane.state import Session
from nonstop.dataplane.steps import Call, OpCoroutine

if TYPE_CHECKING:
    from nonstop.dataplane.machine import DataPlane


def g_stream_commit(dp: DataPlane, s: Session, p: dict[str, Any]) -> OpCoroutine:
    """The session op (module doc); replies ``{"partitions", "moved"}``."""
    if dp.config.placement is None:
        raise errors.BadArgument(
            'tx.stream.commit is for a cluster that routes by partition ([ha] data = "partitions");'
            " this one routes by node: use bulk.stream.commit on every node"
        )
    stream, batch = stream_id(p.get("stream")), batch_arg(p.get("batch"))
    table = dp.view.partitions
    if not table:
        raise errors.NotActive("the partition table is not defined here yet")
    by_node: dict[str, list[list[int]]] = {}
    for name in sorted(table):
        node = dp.place(s, name)
        part = table[name]
        by_node.setdefault(node, []).append([part.location, part.epoch])
    partitions = moved = 0
    for node in sorted(by_node):
        reply = yield Call(
            node,
            "branch.stream.commit",
            {"stream": stream, "batch": batch, "partitions": by_node[node]},
        )
        s.dirty.add(node)
        partitions += int(reply.get("partitions", 0))
        moved += int(reply.get("moved", 0))
    return {"partitions": partitions, "moved": moved}


def locations_arg(value: Any) -> list[int]:
    """``partitions`` of ``branch.stream.commit``: ``[[location, epoch], ...]``."""
    if not isinstance(value, list) or not value:
        raise errors.BadArgument("'partitions' must be a non-empty list of [location, epoch]")
    out = []
    for g in value:
        if not (
            isinstance(g, list | tuple)
            and len(g) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) for v in g)
        ):
            raise errors.BadArgument("each partition is [location, epoch] (integers)")
        out.append(g[0])
    return out


__all__ = ["g_stream_commit", "locations_arg"]
