"""The users of a cluster as a table of the cluster log: :class:`UsersLogTable`.

Users are replicated like the commit decisions (``dtx/log_table.py`` is the
model): an admin's ``user.*`` request on any node becomes an entry of the
cluster log, applied in log order on every node, and the table's state is in
every snapshot (under ``"users"``).  What is stored per user is its password
*verifier* (salt, scrypt parameters, StoredKey, ServerKey: :mod:`nonstop.net.auth`)
-- computed by whoever sends the request (the CLI, or a node's admin API for a
password it took over HTTPS or loopback: ``nonstop.commands.context.ask``), so
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
exists, or does not) is answered ``{"error": "BadArgument", ...}`` then.

**Without a leader, at once.** A change asked of a node that knows no cluster-log
leader (an election) is answered ``{"error": "NoLeader", ...}`` at once, and one
asked of a Disabled node ``QuorumLost``: nothing was sent, nothing changed, a retry
is safe (the CLI, the admin API and the console retry ``NoLeader`` a few times,
``nonstop.commands.context.ask``).  (The cluster node drops a table's entry it
cannot route, so such a change used to wait for the client's whole timeout.)

**Sent to a leader that died.** A change forwarded to a leader that dies before
proposing it is lost with it; so a change not applied yet is sent again every
:data:`RESEND` seconds, to the leader known then, under the same tag, until it is
applied (then answered) or :data:`GIVE_UP` seconds passed (``Timeout``: it may
still be applied; ``user.list`` tells).  A change sent twice may be in the log
twice (the old leader appended it, the new one committed it, and the resend
too): the table applies a requester's tag once (:attr:`UsersLogTable.applied`,
part of the snapshot, so every node skips the same duplicate).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from nonstop.cluster.node import ClusterNode, quorum_lost, table_timer
from nonstop.cluster.raft import ROLE_LEADER
from nonstop.cluster.tables import REQUESTER
from nonstop.net.auth import Verifier
from nonstop.runtime.interface import Action, Log, NodeId, Notify, Reply, SetTimer
from nonstop.security.roles import check_roles, check_user_name

TABLE = "users"
RESEND = 1.0
"""Seconds between two sends of a change not applied yet (module doc)."""
GIVE_UP = 30.0
"""Seconds after which a change not applied is answered ``Timeout`` and no longer sent."""
TAGS_KEPT = 64
"""Tags of applied changes remembered per requester (duplicates come within seconds)."""
REQUESTERS_KEPT = 256
"""Requesters (node incarnations) whose applied tags are remembered, the newest."""

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


def no_leader(name: str) -> dict[str, Any]:
    return {
        "error": "NoLeader",
        "message": f"node {name} knows no cluster-log leader now (an election is in "
        "progress): the change was not made; retry in a moment",
    }


@dataclass(slots=True)
class _Waiting:
    """A change sent to the log and not applied yet."""

    request_id: int
    entry: dict[str, Any]
    give_up_at: float


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
        self.applied: dict[str, list[int]] = {}
        """``"<node>/<incarnation>"`` of a requester → the tags of its changes applied
        last (applied state, in the snapshot: a change sent twice is applied once)."""
        self._pending: dict[int, _Waiting] = {}
        """tag of a local request → the client request waiting for its entry."""
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
        unroutable = self._unroutable()
        if unroutable is not None:  # nothing sent: the client may retry (module doc)
            return [Reply(request_id, unroutable)]
        self._next_tag += 1
        tag = entry["q"] = self._next_tag
        self._pending[tag] = _Waiting(request_id, entry, now + GIVE_UP)
        return [*self.cluster.submit(now, TABLE, dict(entry)), self._resend_timer(tag)]

    def _unroutable(self) -> dict[str, Any] | None:
        """Why a change cannot go to the log from here now (None: it can)."""
        cluster = self.cluster
        if not cluster.enabled:
            return quorum_lost(cluster.name)
        leader = cluster.raft.leader
        if leader is None or (leader == cluster.name and cluster.raft.role != ROLE_LEADER):
            return no_leader(cluster.name)
        return None

    def _resend_timer(self, tag: int) -> SetTimer:
        return SetTimer(table_timer(TABLE, str(tag)), RESEND)

    def on_timer(self, now: float, rest: str) -> list[Action]:
        """Send a change not applied yet again, to the leader known now (module doc)."""
        tag = int(rest) if rest.isdigit() else -1
        waiting = self._pending.get(tag)
        if waiting is None:
            return []  # applied (and answered) meanwhile
        if now >= waiting.give_up_at:
            del self._pending[tag]
            message = (
                f"the change of user {waiting.entry['u']!r} was not applied within "
                f"{GIVE_UP:g}s (no cluster-log leader?); it may still be: user list tells"
            )
            return [Reply(waiting.request_id, {"error": "Timeout", "message": message})]
        return [*self.cluster.submit(now, TABLE, dict(waiting.entry)), self._resend_timer(tag)]

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
        return {
            "u": {name: dict(record) for name, record in self.users.items()},
            "t": {requester: list(tags) for requester, tags in self.applied.items()},
        }

    def restore(self, state: Any) -> None:
        users = (state or {}).get("u", {})
        self.users = {str(n): dict(r) for n, r in users.items()} if isinstance(users, dict) else {}
        applied = (state or {}).get("t", {})  # absent in snapshots of older versions
        self.applied = (
            {str(r): [int(t) for t in tags] for r, tags in applied.items()}
            if isinstance(applied, dict)
            else {}
        )

    def _first_time(self, entry: dict[str, Any]) -> bool:
        """Whether this is the first entry of its requester's tag (and remember it)."""
        requester, tag = entry.get(REQUESTER), entry.get("q")
        if not isinstance(requester, list) or not isinstance(tag, int) or isinstance(tag, bool):
            return True
        key = "/".join(str(part) for part in requester)
        tags = self.applied.pop(key, [])
        self.applied[key] = tags  # the newest requester last
        if tag in tags:
            return False
        tags.append(tag)
        del tags[:-TAGS_KEPT]
        while len(self.applied) > REQUESTERS_KEPT:
            del self.applied[next(iter(self.applied))]
        return True

    def apply(self, index: int, entry: dict[str, Any]) -> list[Action]:
        """Apply one users entry (every node, same order); answer it on the node asked."""
        kind, user = entry.get(TABLE), entry.get("u")
        if not self._first_time(entry):
            return []  # sent twice (module doc): applied, and answered, the first time
        mine = entry.get(REQUESTER) == [self.cluster.name, self.cluster.incarnation]
        waiting = self._pending.pop(entry.get("q"), None) if mine else None  # type: ignore[arg-type]
        request_id = None if waiting is None else waiting.request_id
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


__all__ = ["GIVE_UP", "RESEND", "TABLE", "UsersLogTable", "entry_for", "no_leader"]
