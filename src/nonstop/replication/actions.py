"""What the replication machine asks of the layer above it (besides the runtime's actions).

The machine's ``handle``/``replicate``/``outcome``/``on_table`` return the
runtime's actions (``Send``, ``Persist``, ``SetTimer``, ``Log``, ``Notify``)
mixed with these four, which the composition that drives the machine carries
out itself: answering the caller, proposing a partition-table entry to the
cluster log, looking a prepared record's outcome up in the decision log.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

NOT_ACTIVE = "NotActive"
"""This node does not act for the partition (any more): retry on the active node."""
STALE_EPOCH = "StaleEpoch"
"""The caller's epoch is not the partition's current one: read the table again, retry."""
BAD_REQUEST = "BadRequest"
"""The request itself is malformed (unknown kind, writes not a mapping ...): do not retry."""


@dataclass(frozen=True, slots=True)
class Completed:
    """Record ``ref`` is durable locally and on every in-sync sync replica of (P, epoch) (I3)."""

    ref: Any
    partition: str
    epoch: int
    seq: int


@dataclass(frozen=True, slots=True)
class Failed:
    """Record ``ref`` will not be acknowledged here; ``error`` says whether to retry where."""

    ref: Any
    partition: str
    error: str
    active: str | None = None
    """The partition's active node as this node's table says (a hint for the retry)."""


@dataclass(frozen=True, slots=True)
class Submit:
    """Propose ``entry`` to the partition table (the cluster log): a D12 ``drop``."""

    entry: dict[str, Any]


@dataclass(frozen=True, slots=True)
class Resolve:
    """Find the outcome of prepared record ``txid`` of ``partition`` in the decision log and
    call :meth:`ReplicationMachine.outcome` with it (proposing abort if nothing is decided)."""

    partition: str
    txid: str


UpperAction = Completed | Failed | Submit | Resolve

__all__ = [
    "BAD_REQUEST",
    "NOT_ACTIVE",
    "STALE_EPOCH",
    "Completed",
    "Failed",
    "Resolve",
    "Submit",
    "UpperAction",
]
