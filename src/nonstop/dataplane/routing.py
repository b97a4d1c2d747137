"""Which client ops and peer messages belong to the data plane (data-path.md §3, §4).

The node hands these to its data service (:mod:`nonstop.dataplane.service`)
instead of the cluster machine.
"""

from __future__ import annotations

from typing import Any

SESSION_OPS = frozenset(
    {
        "tx.get",
        "tx.ref",
        "tx.query",
        "tx.count",
        "tx.create",
        "tx.delete",
        "tx.call",
        "tx.overwrite",
        "tx.upsert",
        "tx.stream.commit",
        "tx.commit",
        "tx.rollback",
    }
)
"""Ops of one session (they name it with ``s``, or open it with ``begin``)."""

CLIENT_OPS = SESSION_OPS | {
    "tx.begin",
    "tx.more",
    "nodes",
    "types",
    "request.result",
    "partition.objects",
    "member.holdings",
    # The membership change is the cluster's; the data service checks first that the
    # node leaving holds no objects (dataplane/holdings.py), then hands it on.
    "leave",
}
"""Client ops the runtime hands to the data service (plus every ``bulk.*``)."""


def is_data_op(op: Any) -> bool:
    """True for the client ops the data service answers (data-path.md section 3)."""
    return isinstance(op, str) and (op in CLIENT_OPS or op.startswith("bulk."))


def is_data_message(payload: Any) -> bool:
    """True for peer messages of the data service (``t`` starts with ``data.``)."""
    if not isinstance(payload, dict):
        return False
    kind = payload.get("t")
    return isinstance(kind, str) and kind.startswith("data.")


__all__ = ["CLIENT_OPS", "SESSION_OPS", "is_data_message", "is_data_op"]
