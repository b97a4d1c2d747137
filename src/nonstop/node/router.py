"""Which service of a node answers a client op or a peer message: the node's routing.

The runtime (``nonstop.runtime``) knows one machine and the network; it offers
every client op and peer message to the node's
:class:`~nonstop.runtime.routing.Router` first.  This is that router: the
client ops of the data path (``tx.*``, ``bulk.*``, ``nodes``, ``types``,
``request.result``; ``docs/design/data-path.md`` section 3) and the peer
messages whose ``t`` starts with ``data.`` go to the node's data service
(``nonstop.dataplane.service.DataService``, which serves the bulk operations
too); the application commands' ops (``app.run``, ``app.commands``) to
``nonstop.node.app_commands``; everything else goes on to the machine (the
cluster layer and distributed commit).

Before any of that, :class:`OpPermissions` checks every client request against
the principal its connection proved (``runtime/clients.py``): ops only nodes
send are refused to every user, the rest need a role that grants them
(:mod:`nonstop.security.roles`); a refusal is logged with who, what and from
where and answered ``NotAuthorized``.

A node without an object store has no data service: its data ops are answered
with ``Unavailable`` (a client fails over to a node that serves them) and its
``data.*`` messages are dropped with a log line, instead of reaching a machine
that does not know them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any, Protocol

from nonstop import errors
from nonstop.bulk.arrow_import import BULK_OPS, warm_arrow
from nonstop.dataplane.service import is_data_message, is_data_op
from nonstop.model.wire import error_out
from nonstop.net.auth import SCHEME_NODE, SCHEME_USER
from nonstop.net.connection import Connection
from nonstop.security.roles import (
    APPLICATION_OPS,
    NODE,
    allows,
    permission_of,
    roles_granting,
)

log = logging.getLogger("nonstop.node")


class DataPlane(Protocol):
    """What the router needs of the data service."""

    stats: Any

    def start(self) -> None: ...

    async def stop(self) -> None: ...

    def on_client(self, conn: Any, client_id: Any, payload: dict[str, Any]) -> None: ...

    def connection_closed(self, conn: Any) -> None: ...

    def on_peer(self, sender: str, payload: dict[str, Any]) -> None: ...


class NodeRouter:
    """The node's :class:`~nonstop.runtime.routing.Router` (module doc).

    ``data`` is the data service (None without an object store); ``db`` the
    object store, whose group-commit counters ``runtime_stats`` reports.
    """

    def __init__(self, name: str, data: DataPlane | None, db: Any = None) -> None:
        self.name = name
        self.data = data
        self.db = db
        self._dropped_kinds: set[str] = set()
        self.applications: Any = None
        """The application commands (``nonstop.node.app_commands``): ops ``app.*``."""
        self.samples: Callable[[float], dict[str, Any]] | None = None
        """The node's recent metric samples (op ``samples``; set with the admin API, whose
        sampler keeps them): how a console served by another node charts this one."""

    def start(self) -> None:
        if self.data is not None:
            self.data.start()

    async def stop(self) -> None:
        if self.data is not None:
            await self.data.stop()

    def on_client(self, conn: Connection, client_id: Any, payload: Any) -> bool:
        op = payload.get("op") if isinstance(payload, dict) else None
        if op in APPLICATION_OPS and self.applications is not None:
            self.applications.on_client(conn, client_id, payload)
            return True
        if op == "samples":
            conn.send({"t": "rep", "id": client_id, "p": self._samples(payload)})
            return True
        if op in BULK_OPS:
            warm_arrow()  # Arrow batches are coming: import pyarrow off the loop
        if not is_data_op(op):
            return False
        if self.data is None:
            error = errors.Unavailable(
                f"node {self.name} has no object store: it does not serve {op!r}"
            )
            conn.send({"t": "rep", "id": client_id, "p": error_out(error)})
            return True
        self.data.on_client(conn, client_id, payload)
        return True

    def _samples(self, payload: dict[str, Any]) -> dict[str, Any]:
        since = payload.get("since", 0.0)
        if isinstance(since, bool) or not isinstance(since, int | float) or not since >= 0:
            return error_out(errors.BadArgument("samples: since is epoch seconds (>= 0)"))
        if self.samples is None:
            return error_out(
                errors.Unavailable(f"node {self.name} keeps no samples (it serves no admin API)")
            )
        return self.samples(float(since))

    def connection_closed(self, conn: Connection) -> None:
        if self.data is not None:
            # Its open transactions are rolled back (B8).
            self.data.connection_closed(conn)

    def on_peer(self, sender: str, payload: Any) -> bool:
        if not is_data_message(payload):
            return False
        if self.data is None:
            kind = str(payload.get("t"))
            if kind not in self._dropped_kinds:  # once per kind: a busy peer would flood
                self._dropped_kinds.add(kind)
                log.warning(
                    "dropped %s from %s: node %s has no data service (no object store)",
                    kind,
                    sender,
                    self.name,
                )
            return True
        self.data.on_peer(sender, payload)
        return True

    def stats(self) -> dict[str, Any]:
        return {
            "data": {} if self.data is None else dict(self.data.stats),
            # The object store's group commit: store commits per fsync (commits/groups).
            "store": {} if self.db is None else self.db.stats(),
            # What the node would lose if it left the cluster (`nonstop cluster remove`).
            "objects": None if self.db is None else self.db.object_count(),
            # The lock table: waits, deadlock victims found in it, lock-wait timeouts.
            "locks": self._lock_counters(),
        }

    def _lock_counters(self) -> dict[str, int]:
        locks = getattr(getattr(self.db, "engine", None), "locks", None)
        if locks is None:
            return {}
        return {k: int(getattr(locks, k, 0)) for k in ("waits", "deadlocks", "timeouts")}


class OpPermissions:
    """Who may send which client op: the runtime's ``permissions`` (module doc).

    ``roles_of(user)`` gives a user's roles as this node knows them now (the
    bootstrap admin, then the users table): a role change or a removed user
    takes effect on the next request, not only on the next connection.
    """

    def __init__(self, node: str, roles_of: Callable[[str], list[str] | None]) -> None:
        self.node = node
        self.roles_of = roles_of
        self.refused = 0

    def __call__(self, conn: Connection, payload: Any) -> dict[str, Any] | None:
        principal = conn.principal
        if principal.kind == SCHEME_NODE or principal.kind == "open":
            return None  # a member (the cluster secret), or a node that authenticates no one
        op = payload.get("op") if isinstance(payload, dict) else None
        needed = permission_of(op)
        roles = (self.roles_of(principal.name) or []) if principal.kind == SCHEME_USER else []
        if needed != NODE and allows(roles, needed):
            return None
        self.refused += 1
        if needed == NODE:
            why = "only nodes of the cluster send it, whatever the user's roles"
        else:
            granting = ", ".join(roles_granting(needed))
            why = f"it needs permission {needed!r}, granted by roles {granting}"
        log.warning(
            "refused %r from user %r (roles %s) at %s: %s",
            op,
            principal.name,
            ",".join(roles) or "none",
            conn.remote,
            why,
        )
        error = errors.NotAuthorized(
            f"user {principal.name!r} (roles {', '.join(roles) or 'none'}) may not run "
            f"{op!r} on node {self.node}: {why}"
        )
        return error_out(error)


__all__ = ["DataPlane", "NodeRouter", "OpPermissions"]
