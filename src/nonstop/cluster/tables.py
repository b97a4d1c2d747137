"""Tables of the cluster log: applied state that plugs into the cluster node.

The cluster log (Raft, :mod:`nonstop.cluster.raft`) replicates entries; what
they *mean* above membership and views belongs to the layers that use the log
-- the commit-decision table of distributed commit today
(:mod:`nonstop.dtx.log_table`), the partition table next.  Each is a
:class:`LogTable` registered with the cluster node
(:meth:`nonstop.cluster.node.ClusterNode.register_table`), so that the cluster
package imports none of them: it only routes.

What a table gets from the cluster node
---------------------------------------
* **Its entries, in log order, on every node.**  A table named ``name`` owns
  every command entry (Raft kind ``cmd``) whose data is a dict with a ``name``
  key; the node hands it to :meth:`LogTable.apply` with the entry's index.
  ``apply`` must be deterministic (same entries, same state on every node) and
  may return actions (notifications, logs) for the node to emit.
* **A place in every snapshot.**  The applied state of the node is a dict
  (``{"digest", "views", <table name>: table.snapshot(), ...}``, msgpack);
  :meth:`LogTable.restore` gets the value back, or ``None`` for the empty
  initial state (a fresh log, a split-brain reset, a snapshot taken before the
  table existed).  Tables are never persisted on their own: a restarted node
  rebuilds them from its snapshot and the entries after it.
* **Routing of requests to the leader.**  :meth:`ClusterNode.submit` takes an
  entry a table built from a local request: the leader proposes it, a follower
  forwards it to the leader it knows in an envelope of kind ``name`` (one
  hop), and without quorum (Disabled, D16) or a known leader it is dropped --
  the requester retries.  The node stamps ``"r": [node, incarnation]`` on the
  entry (who asked, see :attr:`ClusterNode.incarnation`); a leader accepts a
  forwarded entry only if ``r`` names the peer that sent it, then asks
  :meth:`LogTable.forwarded` to validate the rest.  Identical requests
  (:meth:`LogTable.request_key`, plus ``r``) still in flight in the leader's
  term are proposed once, so retries do not flood the log.

A table's name is also its message kind and its snapshot key: it must not be
one of the cluster node's own (:data:`RESERVED_NAMES`) nor of the snapshot's
own fields.  Every member of one cluster must register the same tables (every
node built by ``nonstop.node.machine`` does): a node without a table cannot
carry its state in the snapshots it sends to others.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterator, Mapping
from typing import Any, Protocol

from nonstop.runtime.interface import Action, NodeId

RESERVED_NAMES = frozenset({"fd", "raft", "adm", "disc", "digest", "views"})
"""Envelope kinds of the cluster node itself and fields of its snapshot state."""

REQUESTER = "r"
"""The field the cluster node stamps on submitted entries: ``[node, incarnation]``."""


class LogTable(Protocol):
    """Applied state built from the cluster log's command entries tagged with its name."""

    @property
    def name(self) -> str:
        """The key that tags this table's entries; also its message kind and snapshot key."""
        ...

    def apply(self, index: int, entry: dict[str, Any]) -> list[Action]:
        """Apply one committed entry (every node, same order); actions for the node to emit."""
        ...

    def snapshot(self) -> Any:
        """The table's state as a msgpack-able value (put in the node's snapshots)."""
        ...

    def restore(self, state: Any) -> None:
        """Replace the state by a :meth:`snapshot` value, or by the empty state (``None``)."""
        ...

    def forwarded(self, sender: NodeId, entry: dict[str, Any]) -> dict[str, Any] | None:
        """Validate an entry a peer forwarded to this leader (its ``r`` already checked).

        Returns the entry to propose, or None when it is malformed or not the
        sender's to ask for (it is then dropped and logged): bad input never
        reaches the log.
        """
        ...

    def request_key(self, entry: dict[str, Any]) -> Hashable:
        """What makes two requests the same one (a retry), ``r`` aside."""
        ...


class TableRegistry:
    """The tables registered with one cluster node, by name, in registration order."""

    def __init__(self) -> None:
        self._tables: dict[str, LogTable] = {}

    def register(self, table: LogTable) -> None:
        name = table.name
        if not isinstance(name, str) or not name or name in RESERVED_NAMES:
            raise ValueError(f"a log table cannot be named {name!r}")
        if name in self._tables:
            raise ValueError(f"a log table named {name!r} is registered already")
        self._tables[name] = table

    def __contains__(self, name: object) -> bool:
        return name in self._tables

    def __iter__(self) -> Iterator[LogTable]:
        return iter(self._tables.values())

    def __len__(self) -> int:
        return len(self._tables)

    def get(self, name: str) -> LogTable | None:
        return self._tables.get(name)

    def owner(self, data: Any) -> LogTable | None:
        """The table a command entry belongs to (None: an application command)."""
        if not self._tables or not isinstance(data, dict):
            return None
        for name, table in self._tables.items():
            if name in data:
                return table
        return None

    def snapshot(self) -> dict[str, Any]:
        """Every table's state, keyed by its name (merged into the node's snapshot)."""
        return {name: table.snapshot() for name, table in self._tables.items()}

    def restore(self, state: Mapping[str, Any]) -> list[str]:
        """Restore every table from a snapshot's state; the names the snapshot did not carry."""
        missing = []
        for name, table in self._tables.items():
            if name not in state:
                missing.append(name)
            table.restore(state.get(name))
        return missing


__all__ = ["REQUESTER", "RESERVED_NAMES", "LogTable", "TableRegistry"]
