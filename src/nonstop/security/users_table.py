"""The users of a cluster as a table of the cluster log: :class:`UsersLogTable`.

Users are replicated like the commit decisions (``dtx/log_table.py`` is the
model): an admin's ``user.*`` request on any node becomes an entry of the
cluster log, applied in log order on every node, and the table's state is in
every snapshot (under ``"users"``).  What is stored per user is its password
*verifier* (salt, scrypt parameters, StoredKey, ServerKey: :mod:`nonstop.net.auth`)
-- computed by whoever sends the request (the CLI, or a node's admin API for a
password it took over HTTPS or loopback: ``nonstop.commands.user_commands``), so
the password itself is never in a request to the node port -- and its
roles (:mod:`nonstop.security.roles`).

Client ops (offered by the cluster node before its own, ``ClusterNode._on_client``;
the role check already happened in the node's router):

* ``{"op": "user.add", "user", "verifier", "roles"}`` -- a new user;
* ``{"op": "user.passwd", "user", "verifier"}`` -- a new password;
* ``{"op": "user.roles", "user", "roles"}`` -- new roles;
* ``{"op": "user.remove", "user"}``;
* ``{"op": "user.list"}`` -- answered from this node's applied table at once, once
  the node caught up with the log since its start (``ClusterNode.caught_up``;
  before, ``Unavailable``: a restarted node's table is its snapshot's until a
  leader tells it what followed).

A change is answered ``{"ok": True, "user", "index"}`` once its entry is applied on
the node that was asked; a change the table refuses when applied (the user
exists, or does not) is answered ``{"error": "BadArgument", ...}`` then.  Without
quorum or leader the request is dropped by the cluster node: the client's
timeout tells, and a retry is harmless (``user.add`` of an existing user with
the same verifier is refused, nothing else changes).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from nonstop.cluster.node import ClusterNode
from nonstop.cluster.tables import REQUESTER
from nonstop.net.auth import Verifier
from nonstop.runtime.interface import Action, Log, NodeId, Notify, Reply
from nonstop.security.roles import check_roles, check_user_name

TABLE = "users"

ADD, PASSWD, ROLES, REMOVE = "add", "passwd", "roles", "remove"
_KINDS = (ADD, PASSWD, ROLES, REMOVE)


def bad(message: str) -> dict[str, Any]:
    return {"error": "BadArgument", "message": message}


def catching_up(name: str) -> dict[str, Any]:
    return {
        "error": "Unavailable",
        "message": f"node {name} is catching up with the cluster log since its start: "
        "its users table may be behind; retry in a moment, or ask another node",
    }


def entry_for(payload: Any) -> dict[str, Any]:
    """The log entry of a ``user.*`` change request; ``ValueError`` when malformed."""
    if not isinstance(payload, dict):
        raise ValueError("a request is a map")
    op = payload.get("op")
    kind = op.removeprefix("user.") if isinstance(op, str) else ""
    if kind not in _KINDS:
        raise ValueError(f"unknown users op {op!r}")
    entry: dict[str, Any] = {TABLE: kind, "u": check_user_name(payload.get("user"))}
    if kind in (ADD, PASSWD):
        entry["v"] = Verifier.from_wire(payload.get("verifier")).to_wire()
    if kind in (ADD, ROLES):
        entry["roles"] = check_roles(payload.get("roles"))
    return entry


class UsersLogTable:
    """The users, applied from the cluster log, and their client requests (module doc).

    ``reserved``: user names no entry may take (the bootstrap admin of the node's
    configuration, which the log must not shadow or remove).
    """

    def __init__(
        self, cluster: ClusterNode, reserved: Callable[[], frozenset[str]] = frozenset
    ) -> None:
        self.cluster = cluster
        self.reserved = reserved
        self.users: dict[str, dict[str, Any]] = {}
        """name → ``{"v": verifier wire, "roles": [str]}``."""
        self._pending: dict[int, int] = {}
        """tag of a local request → the client request id waiting for its entry."""
        self._next_tag = 0

    @property
    def name(self) -> str:
        return TABLE

    # ------------------------------------------------------------ lookups
    def lookup(self, user: str) -> tuple[Verifier, list[str]] | None:
        """The verifier and roles of ``user`` as applied here (None: no such user)."""
        record = self.users.get(user)
        if record is None:
            return None
        try:
            return Verifier.from_wire(record["v"]), list(record["roles"])
        except (KeyError, ValueError):
            return None

    def listing(self) -> list[dict[str, Any]]:
        return [{"user": u, "roles": list(r["roles"])} for u, r in sorted(self.users.items())]

    # ------------------------------------------------------------ requests
    def on_client(self, now: float, request_id: int, payload: Any) -> list[Action] | None:
        """A client's ``user.*`` op (None: not one of ours)."""
        op = payload.get("op") if isinstance(payload, dict) else None
        if not (isinstance(op, str) and op.startswith("user.")):
            return None
        if op == "user.list":
            if not self.cluster.caught_up:
                return [Reply(request_id, catching_up(self.cluster.name))]
            return [Reply(request_id, {"users": self.listing()})]
        try:
            entry = entry_for(payload)
        except ValueError as exc:
            return [Reply(request_id, bad(str(exc)))]
        if entry["u"] in self.reserved():
            return [
                Reply(
                    request_id,
                    bad(
                        f"user {entry['u']!r} is the bootstrap admin of the nodes' "
                        "configuration (auth.admin_file): change that file instead"
                    ),
                )
            ]
        refused = self._refusal(entry)
        if refused is not None:  # answered now; the log would refuse it the same way
            return [Reply(request_id, bad(refused))]
        self._next_tag += 1
        entry["q"] = self._next_tag
        self._pending[self._next_tag] = request_id
        return self.cluster.submit(now, TABLE, entry)

    def _refusal(self, entry: dict[str, Any]) -> str | None:
        exists = entry["u"] in self.users
        if entry[TABLE] == ADD and exists:
            return f"user {entry['u']!r} exists (user.passwd / user.roles change it)"
        if entry[TABLE] != ADD and not exists:
            return f"no user {entry['u']!r}"
        return None

    # ------------------------------------------------------------ LogTable
    def forwarded(self, sender: NodeId, entry: dict[str, Any]) -> dict[str, Any] | None:
        request = {
            "op": f"user.{entry.get(TABLE)}",
            "user": entry.get("u"),
            "verifier": entry.get("v"),
            "roles": entry.get("roles"),
        }
        try:
            checked = entry_for(request)
        except (ValueError, TypeError):
            return None
        tag = entry.get("q")
        if isinstance(tag, int) and not isinstance(tag, bool):
            checked["q"] = tag
        return checked

    def request_key(self, entry: dict[str, Any]) -> tuple[Any, ...]:
        return (entry.get(TABLE), entry.get("u"), entry.get("q"))

    def snapshot(self) -> dict[str, Any]:
        return {"u": {name: dict(record) for name, record in self.users.items()}}

    def restore(self, state: Any) -> None:
        users = (state or {}).get("u", {})
        self.users = {str(n): dict(r) for n, r in users.items()} if isinstance(users, dict) else {}

    def apply(self, index: int, entry: dict[str, Any]) -> list[Action]:
        """Apply one users entry (every node, same order); answer it on the node asked."""
        kind, user = entry.get(TABLE), entry.get("u")
        mine = entry.get(REQUESTER) == [self.cluster.name, self.cluster.incarnation]
        request_id = self._pending.pop(entry.get("q"), None) if mine else None  # type: ignore[arg-type]
        if not isinstance(user, str) or kind not in _KINDS:
            return [Log("error", f"users table: bad entry {entry!r:.80}")]
        refused = self._refusal(entry)  # deterministic: the same on every node
        actions: list[Action] = []
        if refused is None:
            if kind == ADD:
                self.users[user] = {"v": entry["v"], "roles": list(entry["roles"])}
            elif kind == PASSWD:
                self.users[user]["v"] = entry["v"]
            elif kind == ROLES:
                self.users[user]["roles"] = list(entry["roles"])
            else:
                del self.users[user]
            roles = self.users[user]["roles"] if user in self.users else []
            actions.append(Notify("user", {"change": kind, "user": user, "roles": roles}))
        if request_id is not None:
            answer = bad(refused) if refused else {"ok": True, "user": user, "index": index}
            actions.append(Reply(request_id, answer))
        return actions


__all__ = ["TABLE", "UsersLogTable", "entry_for"]
