"""What the sync replicas get of a transaction: one list, for a commit and a prepare.

A one-node commit (``node/replica_store.replicated_commit``) and a participant's
prepare (``dataplane/participant.py``) hand the replication machine the same
records: the transaction's objects (``tx/replica.write_set_records``), its
request records (requests.md), its queued calls and timers (ha.md) and its
streaming sink records (``bulk/stream_marks.py``, data-path.md §6.7).
``node/replica_store.partition_write_sets`` splits them by partition.
"""

from __future__ import annotations

from typing import Any

from nonstop.bulk.stream_marks import mark_records
from nonstop.tx.asyncmethods import queue_records
from nonstop.tx.replica import write_set_records
from nonstop.tx.requests import result_records
from nonstop.tx.transaction import Transaction


def replicated_records(tx: Transaction) -> list[list[Any]]:
    """Every record of ``tx`` its partitions' sync replicas get (module doc)."""
    return write_set_records(tx) + side_records(tx)


def side_records(tx: Transaction) -> list[list[Any]]:
    """The records of ``tx`` beside its objects' (a caller that makes those in slices,
    ``node/replica_store.records_sliced``, adds these)."""
    return result_records(tx) + queue_records(tx) + mark_records(tx)


__all__ = ["replicated_records", "side_records"]
