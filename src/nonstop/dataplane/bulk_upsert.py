"""``tx.upsert``: a bulk batch as a transaction of its partitions (data-path.md §6.5).

Under routing by partition a Spark load does not write on the node it reaches
(``bulk.upsert`` creates in that node's own location, unreplicated): each batch
is an op of an ordinary session.  The coordinator maps every row's unique key
with the type's binding to its partition (:func:`nonstop.bulk.partitioned.partitions_of`,
the mapper ``tx.create`` uses), places each partition on its active node
(``DataPlane.place``: fenced by the partition's epoch, so a node that no longer
acts answers ``NotActive``), and sends one ``branch.upsert`` per node with the
rows of its partitions.  The client's ``tx.commit`` then commits it like any
transaction: a one-node commit through the replication hook, several nodes by
two-phase commit with replicated prepares -- so the batch is on every sync
replica of its partitions before it is acknowledged.

``here: true`` (the Spark writer's): every partition of the batch must be
active on this node, else ``NotActive`` at once (the writer's plan is stale: it
plans again) instead of a two-phase commit with the partition's new node.

``stream: [stream id, micro-batch id, chunk tag]`` (the streaming sink's):
each partition's rows are skipped when the micro-batch is committed in that
partition already or the chunk's tag is recorded there, and the tag is written
with the rows (:mod:`nonstop.bulk.stream_marks`, data-path.md §6.7); the reply's
``replayed`` counts the partitions skipped.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from nonstop import errors
from nonstop.bulk.handlers import batch_format, unique_key_of
from nonstop.bulk.partitioned import key_values, partitions_of
from nonstop.bulk.stream_marks import stream_arg
from nonstop.dataplane.state import Session
from nonstop.dataplane.steps import Call, OpCoroutine

if TYPE_CHECKING:
    from nonstop.dataplane.machine import DataPlane


def g_upsert(dp: DataPlane, s: Session, p: dict[str, Any]) -> OpCoroutine:
    """The session op (module doc); replies ``{"inserted", "updated", "partitions"}``."""
    placement = dp.config.placement
    if placement is None:
        raise errors.BadArgument(
            'tx.upsert is for a cluster that routes by partition ([ha] data = "partitions"); '
            "this one routes by node: use bulk.upsert"
        )
    info = dp.check_type(p.get("type"), p.get("tv"))
    assert info is not None
    key = unique_key_of(info, p)  # type: ignore[arg-type]
    fmt = batch_format(p)
    values = key_values(info, key, p.get("rows"), fmt)  # type: ignore[arg-type]
    rows_of: dict[str, list[int]] = {}
    for i, name in enumerate(partitions_of(placement, p["type"], values)):
        rows_of.setdefault(name, []).append(i)
    by_node: dict[str, list[list[Any]]] = {}
    for name in sorted(rows_of):
        node = dp.place(s, name)
        if p.get("here") and node != dp.name:
            part = dp.view.partitions[name]
            raise errors.NotActive(
                f"{dp.name} does not act for partition {name} (epoch {part.epoch}, active "
                f"{node}): plan the write again"
            )
        part = dp.view.partitions[name]
        by_node.setdefault(node, []).append([part.location, part.epoch, rows_of[name]])
    fields = {k: p.get(k) for k in ("type", "tv", "key", "rows", "format")}
    if p.get("stream") is not None:  # a streaming sink's chunk (data-path.md §6.7)
        fields["stream"] = list(stream_arg(p["stream"]))
    inserted = updated = replayed = 0
    for node in sorted(by_node):  # (one node after the other: as tx.overwrite)
        reply = yield Call(node, "branch.upsert", {**fields, "parts": by_node[node]})
        s.dirty.add(node)
        inserted += int(reply.get("inserted", 0))
        updated += int(reply.get("updated", 0))
        replayed += int(reply.get("replayed", 0))
    return {
        "inserted": inserted,
        "updated": updated,
        "replayed": replayed,
        "partitions": sorted(rows_of),
    }


__all__ = ["g_upsert"]
