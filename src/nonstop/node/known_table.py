"""The partition table as a stopped node's cluster log last knew it.

A node deciding at start whether it may rebuild its damaged object store
(:mod:`nonstop.node.store_repair`) needs to know, before it joins anybody, which
partitions it holds the only in-sync copy of.  Its durable Raft state (``raft/``
keys of ``DATA/cluster``) has the last snapshot (the applied state of every log
table, the partition table under its name) and the log entries after it; the
table is rebuilt by replaying them, as the running node does.

The view may be stale (the cluster went on while the node was down) and its
tail may hold entries that never committed.  It serves only a conservative
check: the node refuses to repair when this view says it holds the last copy
of a partition.  A stale view cannot make a repair lose data the object store
alone held, because no partition's data is the object store's alone: the
node's copy of every partition it holds (``rep/`` keys) lives in ``DATA/cluster``
with its place in the history, and the repair keeps it (replication.md §11).
"""

from __future__ import annotations

from collections.abc import Mapping

import msgpack

from nonstop.cluster.raft import K_CMD, K_CONFIG, K_VIEW, KEY_SNAPSHOT, log_key
from nonstop.ha.partition_table import TABLE, PartitionTable
from nonstop.net import plain


def known_table(recovered: Mapping[bytes, bytes]) -> PartitionTable:
    """The partition table of the snapshot in ``recovered`` (a cluster store's durable keys)
    with every table entry of the log after it applied, in order, under the membership and
    liveness views the log's own entries make (as ``Raft`` applies them; module doc)."""
    members: set[str] = set()
    live: set[str] = set()
    table = PartitionTable(members=lambda: sorted(members), live=lambda: sorted(live))
    first = 1
    raw = recovered.get(KEY_SNAPSHOT)
    if raw is not None:
        snap = plain.unpack(raw)
        first = int(snap["index"]) + 1
        members = set(snap.get("view_members") or snap.get("voters") or [])
        live = set(snap.get("view_live") or members)
        state = snap.get("state")
        if state is not None:
            table.restore(msgpack.unpackb(state, raw=False).get(TABLE))
    index = first
    while (raw := recovered.get(log_key(index))) is not None:
        _term, kind, data = plain.unpack(raw)
        if kind == K_CMD and isinstance(data, dict) and TABLE in data:
            table.apply(index, data)
        elif kind == K_CONFIG and isinstance(data, dict) and data.get("old") is None:
            voters = set(data.get("voters") or [])
            live = (live & voters) | (voters - members)
            members = voters
        elif kind == K_VIEW and isinstance(data, dict):
            live = set(data.get("live") or []) & members
        index += 1
    return table


def only_copies(table: PartitionTable, node: str) -> list[str]:
    """The partitions of ``table`` whose only holder (active or in-sync sync replica: the
    copies every acknowledged commit is on) is ``node``."""
    out: list[str] = []
    for name, part in sorted(table.partitions.items()):
        holders = part.holders()
        if node in holders and len(holders) == 1:
            out.append(name)
    return out


__all__ = ["known_table", "only_copies"]
