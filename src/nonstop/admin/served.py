"""Is every partition served?  What ``nonstop local up`` and the demo wait for.

Quorum ``Active`` says the cluster log works; it does not say a client's first
transaction will find each partition's active node acting (its lease taken, the
previous holder's waited out) and, when the partition replicates, its store holding
the replicated copy (replication.md §10d).  Until then ops on that partition are
refused with the retryable ``NotActive``, which a plain ``with cluster.transaction()``
does not replay -- so a command that says "the cluster is up" waits for this too.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def partitions_served(statuses: Mapping[str, Mapping[str, Any]]) -> bool:
    """True once, per the nodes' ``status`` replies (name -> status), every partition of
    the table is settled -- its active node is the first of its defined nodes that
    answered, every answering defined node holds it, none is still being copied to --
    and that active node acts for it and, if it replicates, took the partition's
    replicated copy.  (Settled, not only served: at start-up the first node serves
    every partition until the others enable theirs and take them back by priority,
    and each such move is a moment of ``NotActive``.)  Nodes that run the partition
    table (their status has ``acting``) must all have applied the same, non-empty,
    table, holding every partition a node's configuration defines (``layout``: each
    definition is a log entry of its own, and a lost one is proposed again a retry later,
    so a table can stay settled for a while with a partition missing); for nodes without
    one, a table with no partition is served."""
    if not statuses:
        return False
    first = next(iter(statuses.values()))
    names = {str(p.get("name")) for p in first.get("partitions") or []}
    if any("acting" in s for s in statuses.values()):
        # Nodes that run the partition table: wait until it is defined (the default
        # policy's partitions, proposed by the leader after start) and every node
        # applied the same partitions.
        if not names:
            return False
        for applied in statuses.values():
            if {str(p.get("name")) for p in applied.get("partitions") or []} != names:
                return False
            if not {str(n) for n in applied.get("layout") or []} <= names:
                return False
    for part in first.get("partitions") or []:
        name, active = part.get("name"), part.get("active")
        defined = [n for n, *_ in part.get("nodes") or [] if n in statuses]
        current = {n for n, *_ in part.get("current") or []}
        if part.get("copying") or not set(defined) <= current:
            return False
        if defined and active != defined[0]:
            return False
        status = statuses.get(active) if isinstance(active, str) else None
        if status is None or name not in (status.get("acting") or []):
            return False
        replication = status.get("replication")
        if isinstance(replication, Mapping) and name not in (replication.get("ready") or []):
            return False
    return True
