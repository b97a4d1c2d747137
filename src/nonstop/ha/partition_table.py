"""The partition table: partitions as state of the cluster log (ha.md sections 2-3).

:class:`PartitionTable` is a :class:`~nonstop.cluster.tables.LogTable` named
``pt``.  Every node applies the same ``pt`` entries in log order, so every
node holds the same table at the same log index; ``(partition, epoch)`` names
one active node and one current list everywhere.  Entries (ha.md section 2):

* ``{"pt": "define", "p", "policy", "nodes": [[node, style], ...]}``
* ``{"pt": "enable", "p"}`` / ``{"pt": "disable", "p"}``
* ``{"pt": "restored", "p", "e", "node"}`` -- a restore copy finished
* ``{"pt": "failover", "p", "e", "dead": [node, ...]}`` -- D8, one entry
* ``{"pt": "drop", "p", "e", "node"}`` -- D12, a silent replica leaves

each stamped by the cluster node with ``"r": [requester, incarnation]``; the
requester is who defines, enables or disables.  Applying is deterministic: it
reads only the entry, the table and the committed view at that log position
(the ``members`` and ``live`` callables, which the composition wires to the
cluster node's committed view -- applied in the same stream, so identical on
every node).  A bad entry changes nothing and is *rejected with a reason*:
``Log("warning")`` and ``Notify("pt.rejected", {"p", "kind", "reason", "by"})``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Hashable, Iterable
from dataclasses import dataclass, field
from typing import Any

import msgpack

from nonstop.cluster.tables import REQUESTER
from nonstop.ha.policies import SYNC, DistributionError, PartitionDef, check_node_list
from nonstop.runtime.interface import Action, Log, NodeId, Notify

TABLE = "pt"

DEFINE = "define"
ENABLE = "enable"
DISABLE = "disable"
RESTORED = "restored"
FAILOVER = "failover"
DROP = "drop"
LEASE = "lease"
KINDS = frozenset({DEFINE, ENABLE, DISABLE, RESTORED, FAILOVER, DROP})

# D6 partition states.
INITIAL = "Initial"
ACTIVE = "Active"
MIGRATING = "Migrating"
REPLICATING = "Replicating"
UPDATING = "Updating"
UNAVAILABLE = "Unavailable"

# D7 partition status on one node.
LOCAL_DEFINED = "LocalDefined"
REMOTE_DEFINED = "RemoteDefined"
REMOTE_ENABLED = "RemoteEnabled"
LOCAL_ENABLED = "LocalEnabled"
LOCAL_DISABLED = "LocalDisabled"

FORMAT = 1
"""Version of the snapshot value (``{"v": FORMAT, "p": {...}}``)."""


def partition_location(name: str) -> int:
    """The opaque 64-bit location code of partition ``name`` (the same on every node).

    The store side names a partition's objects by this code (ha.md section 9), so
    it depends on the name alone: stable across restarts, failovers and versions.
    """
    digest = hashlib.blake2b(b"nonstop/partition/" + name.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


class Rejected(Exception):
    """An entry that cannot be applied; the message is the reason every node logs."""


@dataclass(slots=True)
class Partition:
    """One partition's record in the table (ha.md section 2, field table)."""

    name: str
    policy: str
    nodes: list[list[str]]
    current: list[str] = field(default_factory=list)
    copying: list[str] = field(default_factory=list)
    active: str | None = None
    epoch: int = 0
    state: str = INITIAL
    status: dict[str, str] = field(default_factory=dict)
    changed: int = 0

    def names(self) -> list[str]:
        return [n for n, _ in self.nodes]

    def rank(self, node: str) -> int:
        """Priority of ``node`` in the defined list (0 = preferred active)."""
        return self.names().index(node)

    def style(self, node: str) -> str:
        for name, style in self.nodes:
            if name == node:
                return style
        return ""

    def in_sync(self) -> list[str]:
        return [n for n in self.current if n not in self.copying]

    def holders(self) -> list[str]:
        """The copies every acknowledged commit is on: the active and in-sync sync replicas."""
        return [n for n in self.in_sync() if n == self.active or self.style(n) == SYNC]

    def status_on(self, node: str) -> str:
        """D7 status of this partition on ``node`` (Remote* when it never acted itself)."""
        own = self.status.get(node)
        if own is not None:
            return own
        enabled = any(s == LOCAL_ENABLED for s in self.status.values()) or self.epoch > 0
        return REMOTE_ENABLED if enabled else REMOTE_DEFINED

    def to_value(self) -> dict[str, Any]:
        return {
            "policy": self.policy,
            "nodes": [list(x) for x in self.nodes],
            "current": list(self.current),
            "copying": list(self.copying),
            "active": self.active,
            "epoch": self.epoch,
            "state": self.state,
            "status": dict(sorted(self.status.items())),
            "changed": self.changed,
        }

    @classmethod
    def from_value(cls, name: str, value: dict[str, Any]) -> Partition:
        return cls(
            name=name,
            policy=value["policy"],
            nodes=[list(x) for x in value["nodes"]],
            current=list(value["current"]),
            copying=list(value["copying"]),
            active=value["active"],
            epoch=int(value["epoch"]),
            state=value["state"],
            status=dict(value["status"]),
            changed=int(value["changed"]),
        )


# ------------------------------------------------------------------ entries
def define_entry(part: PartitionDef) -> dict[str, Any]:
    return {
        TABLE: DEFINE,
        "p": part.name,
        "policy": part.policy,
        "nodes": [list(x) for x in part.nodes],
    }


def enable_entry(name: str) -> dict[str, Any]:
    return {TABLE: ENABLE, "p": name}


def disable_entry(name: str) -> dict[str, Any]:
    return {TABLE: DISABLE, "p": name}


def restored_entry(name: str, epoch: int, node: NodeId) -> dict[str, Any]:
    return {TABLE: RESTORED, "p": name, "e": epoch, "node": node}


def failover_entry(name: str, epoch: int, dead: Iterable[NodeId]) -> dict[str, Any]:
    return {TABLE: FAILOVER, "p": name, "e": epoch, "dead": sorted(dead)}


def drop_entry(name: str, epoch: int, node: NodeId) -> dict[str, Any]:
    return {TABLE: DROP, "p": name, "e": epoch, "node": node}


def lease_entry(lease_number: int, renewal: int) -> dict[str, Any]:
    """A node renews its lease (ha.md section 8): ``ln`` is the lease number it holds."""
    return {TABLE: LEASE, "ln": lease_number, "k": renewal}


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def well_formed(entry: Any) -> bool:
    """The entry's shape (types of its fields), before any meaning is checked."""
    if isinstance(entry, dict) and entry.get(TABLE) == LEASE:
        return _is_int(entry.get("ln")) and _is_int(entry.get("k"))
    if not isinstance(entry, dict) or entry.get(TABLE) not in KINDS:
        return False
    kind = entry[TABLE]
    if not isinstance(entry.get("p"), str) or not entry["p"]:
        return False
    if kind == DEFINE:
        nodes = entry.get("nodes")
        return isinstance(entry.get("policy"), str) and isinstance(nodes, list)
    if kind in (RESTORED, FAILOVER, DROP) and not _is_int(entry.get("e")):
        return False
    if kind in (RESTORED, DROP):
        return isinstance(entry.get("node"), str)
    if kind == FAILOVER:
        dead = entry.get("dead")
        return isinstance(dead, list) and bool(dead) and all(isinstance(n, str) for n in dead)
    return True


def _requester(entry: dict[str, Any]) -> str | None:
    r = entry.get(REQUESTER)
    if isinstance(r, list) and r and isinstance(r[0], str):
        return r[0]
    return None


class PartitionTable:
    """The partition table applied from the cluster log (module doc)."""

    def __init__(
        self,
        members: Callable[[], Iterable[NodeId]],
        live: Callable[[], Iterable[NodeId]],
    ) -> None:
        self._members = members
        self._live = live
        self.partitions: dict[str, Partition] = {}
        self.leases: dict[str, int] = {}
        """Lease number per node: a failover revokes the old active's lease by raising it."""
        self.rejections = 0

    @property
    def name(self) -> str:
        return TABLE

    # ------------------------------------------------------------ reading
    def get(self, name: str) -> Partition | None:
        return self.partitions.get(name)

    def local_state(self, name: str, *, enabled: bool) -> str:
        """The D6 state as a node sees it: Unavailable everywhere while it has no quorum (D16)."""
        part = self.partitions[name]
        return part.state if enabled else UNAVAILABLE

    def describe(
        self, nodes: Iterable[NodeId] = (), only: str | None = None
    ) -> list[dict[str, Any]]:
        """Per partition, what ``partition list --json`` shows (status on each of ``nodes``)."""
        out = []
        nodes = list(nodes)
        for name in sorted(self.partitions) if only is None else [only]:
            part = self.partitions[name]
            everyone = sorted(set(nodes) | set(part.names()) | set(part.status))
            out.append(
                {
                    "name": name,
                    "location": partition_location(name),
                    "policy": part.policy,
                    "state": part.state,
                    "epoch": part.epoch,
                    "active": part.active,
                    "nodes": [list(x) for x in part.nodes],
                    "current": [[n, part.style(n)] for n in part.current],
                    "copying": list(part.copying),
                    "replicas": [
                        {"node": n, "style": part.style(n), "in_sync": n not in part.copying}
                        for n in part.current
                        if n != part.active
                    ],
                    "status": {n: part.status_on(n) for n in everyone},
                }
            )
        return out

    def digest(self) -> bytes:
        """Bytes that are equal exactly when two tables are equal (the simulator compares them)."""
        packed: bytes = msgpack.packb(self.snapshot(), use_bin_type=True)
        return packed

    # ------------------------------------------------------------ LogTable
    def snapshot(self) -> dict[str, Any]:
        return {
            "v": FORMAT,
            "p": {n: self.partitions[n].to_value() for n in sorted(self.partitions)},
            "l": dict(sorted(self.leases.items())),
        }

    def restore(self, state: Any) -> None:
        self.partitions = {}
        self.leases = {}
        if not state:
            return
        self.leases = {n: int(ln) for n, ln in state.get("l", {}).items()}
        for name, value in state.get("p", {}).items():
            self.partitions[name] = Partition.from_value(name, value)

    def forwarded(self, sender: NodeId, entry: dict[str, Any]) -> dict[str, Any] | None:
        return entry if well_formed(entry) else None

    def request_key(self, entry: dict[str, Any]) -> Hashable:
        key: bytes = msgpack.packb(
            sorted((k, v) for k, v in entry.items() if k != REQUESTER), use_bin_type=True
        )
        return key

    def apply(self, index: int, entry: dict[str, Any]) -> list[Action]:
        """Apply one committed entry; a bad one changes nothing and is rejected (module doc)."""
        kind = entry.get(TABLE)
        by = _requester(entry)
        if kind == LEASE:
            return self._lease(entry, by)
        name = entry.get("p")
        before = self.partitions.get(name) if isinstance(name, str) else None
        old_state = before.state if before is not None else None
        was = before.active if before is not None else None
        try:
            if not well_formed(entry):
                raise Rejected(f"malformed entry {entry!r:.120}")
            assert isinstance(name, str)
            actions = self._apply(index, kind, name, by, entry)
        except Rejected as exc:
            self.rejections += 1
            reason = str(exc)
            return [
                Log("warning", f"partition table: {kind} of {name!r} by {by} rejected: {reason}"),
                Notify("pt.rejected", {"p": name, "kind": kind, "reason": reason, "by": by}),
            ]
        part = self.partitions[name]
        if old_state is not None and old_state != part.state and not actions:
            actions.append(Notify("pt.state", {"p": name, "old": old_state, "new": part.state}))
        actions.append(
            Notify(
                "pt.changed",
                {
                    "p": name,
                    "kind": kind,
                    "epoch": part.epoch,
                    "active": part.active,
                    "was": was,
                    "by": by,
                    "current": list(part.current),
                    "state": part.state,
                },
            )
        )
        return actions

    def _lease(self, entry: dict[str, Any], by: str | None) -> list[Action]:
        """A renewal: accepted only with the node's current lease number (not revoked since)."""
        ok = by is not None and well_formed(entry) and entry["ln"] == self.leases.get(by, 0)
        data = {
            "node": by,
            "ln": entry.get("ln"),
            "k": entry.get("k"),
            "r": entry.get(REQUESTER),
            "ok": ok,
        }
        return [Notify("pt.lease", data)]

    # ------------------------------------------------------------ transitions
    def _apply(
        self, index: int, kind: Any, name: str, by: str | None, entry: dict[str, Any]
    ) -> list[Action]:
        if kind == DEFINE:
            return self._define(index, name, by, entry["policy"], entry["nodes"])
        part = self.partitions.get(name)
        if part is None:
            raise Rejected(f"partition {name!r} is not defined")
        if kind in (RESTORED, FAILOVER, DROP) and entry["e"] != part.epoch:
            raise Rejected(f"stale epoch {entry['e']}: partition {name!r} is at epoch {part.epoch}")
        if kind == ENABLE:
            return self._enable(index, part, by)
        if kind == DISABLE:
            return self._disable(index, part, by)
        if kind == RESTORED:
            return self._restored(index, part, entry["node"])
        if kind == FAILOVER:
            return self._failover(index, part, entry["dead"])
        return self._drop(index, part, entry["node"])

    def _need_requester(self, by: str | None, what: str) -> str:
        if by is None:
            raise Rejected(f"{what} names no requesting node")
        return by

    def _define(
        self, index: int, name: str, by: str | None, policy: str, nodes: list[Any]
    ) -> list[Action]:
        who = self._need_requester(by, "define")
        try:
            check_node_list(name, nodes)
        except DistributionError as exc:
            raise Rejected(str(exc)) from exc
        members = set(self._members())
        for node, _ in nodes:
            if node not in members:
                raise Rejected(
                    f"node {node!r} in the list of {name!r} is not a member of the cluster "
                    f"{sorted(members)}"
                )
        wanted = [list(x) for x in nodes]
        part = self.partitions.get(name)
        if part is None:
            self.partitions[name] = Partition(
                name, policy, wanted, status={who: LOCAL_DEFINED}, changed=index
            )
            return []
        if wanted != part.nodes or policy != part.policy:
            if part.state == INITIAL and not part.current:
                part.nodes, part.policy = wanted, policy  # redefined before anyone enabled it
            else:
                raise Rejected(
                    f"node lists disagree: {name!r} is defined as {part.nodes} "
                    f"(policy {part.policy}), {who} asks {wanted} (policy {policy}); "
                    "changing a list is a migration"
                )
        if part.status.get(who) != LOCAL_ENABLED:
            part.status[who] = LOCAL_DEFINED
        part.changed = index
        return []

    def _enable(self, index: int, part: Partition, by: str | None) -> list[Action]:
        who = self._need_requester(by, "enable")
        part.status[who] = LOCAL_ENABLED
        part.changed = index
        if who not in part.names():
            return []  # foreign (D4): it knows the partition, hosts nothing
        if part.active is None:
            if not part.current:  # never held: the first listed node to enable takes it
                part.current = [who]
                return self._activate(part, who)
            if who in part.in_sync():  # Unavailable: a holder of the last copy is back
                return self._activate(part, who)
            return [
                Log(
                    "info",
                    f"partition {part.name}: {who} enabled but holds no copy; it stays "
                    f"{part.state} until one of {part.current} returns",
                )
            ]
        if who in part.current:
            return []  # enabling again has no effect
        part.current = self._ordered(part, [*part.current, who])
        part.copying = self._ordered(part, [*part.copying, who])
        part.epoch += 1
        part.state = self._settled_state(part)
        return []

    def _disable(self, index: int, part: Partition, by: str | None) -> list[Action]:
        who = self._need_requester(by, "disable")
        if who in part.current:
            left = [n for n in part.holders() if n != who]
            if who in part.holders() and not left:
                raise Rejected(
                    f"{who} holds the last in-sync copy of {part.name!r}; move the partition "
                    "first (membership never loses objects)"
                )
        part.status[who] = LOCAL_DISABLED
        part.changed = index
        if who not in part.current:
            return []
        was_active = part.active == who
        holders = part.holders()
        part.current = [n for n in part.current if n != who]
        part.copying = [n for n in part.copying if n != who]
        part.epoch += 1
        if was_active:
            return self._promote(part, holders)
        part.state = self._settled_state(part)
        return []

    def _restored(self, index: int, part: Partition, node: str) -> list[Action]:
        if node not in part.copying:
            raise Rejected(
                f"{node} is not being restored in {part.name!r} (copying: {part.copying})"
            )
        part.copying = [n for n in part.copying if n != node]
        part.epoch += 1
        part.changed = index
        if part.active is not None and part.rank(node) < part.rank(part.active):
            old = part.active
            part.active = node  # handover by priority (D9)
            part.state = self._settled_state(part)
            return self._migrated(part, old)
        part.state = self._settled_state(part)
        return []

    def _failover(self, index: int, part: Partition, dead: list[str]) -> list[Action]:
        if part.active is None or part.active not in dead:
            raise Rejected(f"failover of {part.name!r} does not name its active node {part.active}")
        live = set(self._live())
        back = sorted(n for n in dead if n in live)
        if back:
            raise Rejected(f"nodes {back} named dead are live in the committed view")
        part.changed = index
        holders = part.holders()
        self.leases[part.active] = self.leases.get(part.active, 0) + 1  # revoked (section 8)
        part.current = [n for n in part.current if n not in dead]
        part.copying = [n for n in part.copying if n not in dead]
        part.epoch += 1
        return self._promote(part, holders)

    def _drop(self, index: int, part: Partition, node: str) -> list[Action]:
        if node not in part.current:
            raise Rejected(f"{node} is not in the current list of {part.name!r}")
        if node == part.active:
            raise Rejected(f"{node} is the active node of {part.name!r}: that is a failover")
        part.current = [n for n in part.current if n != node]
        part.copying = [n for n in part.copying if n != node]
        part.epoch += 1
        part.changed = index
        part.state = self._settled_state(part)
        return []

    # ------------------------------------------------------------ helpers
    def _activate(self, part: Partition, node: str) -> list[Action]:
        old = part.state
        part.active = node
        part.epoch += 1
        part.state = self._settled_state(part)
        return [Notify("pt.state", {"p": part.name, "old": old, "new": part.state})]

    def _promote(self, part: Partition, holders: list[str]) -> list[Action]:
        """The active node is gone (already out of ``current``): next in-sync sync node by priority.

        No candidate: Unavailable, and ``current`` shrinks to the copies that hold every
        acknowledged commit -- the old active and in-sync sync replicas -- so that only one of
        them may become active again when it returns (ha.md section 2).
        """
        old = part.active
        candidates = [n for n in part.in_sync() if part.style(n) == SYNC]
        if candidates:
            part.active = candidates[0]
            part.state = self._settled_state(part)
            return self._migrated(part, old)
        part.current = self._ordered(part, holders)
        part.copying = []
        part.active = None
        part.state = UNAVAILABLE
        return [
            Notify("pt.state", {"p": part.name, "old": ACTIVE, "new": MIGRATING}),
            Notify("pt.state", {"p": part.name, "old": MIGRATING, "new": UNAVAILABLE}),
        ]

    def _migrated(self, part: Partition, old: str | None) -> list[Action]:
        """The active node changed in one entry: Migrating is entered and left at once."""
        return [
            Notify("pt.state", {"p": part.name, "old": ACTIVE, "new": MIGRATING, "from": old}),
            Notify(
                "pt.state",
                {"p": part.name, "old": MIGRATING, "new": part.state, "to": part.active},
            ),
        ]

    @staticmethod
    def _ordered(part: Partition, nodes: Iterable[str]) -> list[str]:
        return sorted(set(nodes), key=part.rank)

    @staticmethod
    def _settled_state(part: Partition) -> str:
        if part.active is None:
            return UNAVAILABLE if part.current else INITIAL
        if any(part.rank(n) < part.rank(part.active) for n in part.copying):
            return MIGRATING
        if part.copying:
            return REPLICATING
        return ACTIVE


__all__ = [
    "ACTIVE",
    "INITIAL",
    "MIGRATING",
    "REPLICATING",
    "TABLE",
    "UNAVAILABLE",
    "UPDATING",
    "Partition",
    "PartitionTable",
    "Rejected",
    "define_entry",
    "disable_entry",
    "drop_entry",
    "enable_entry",
    "failover_entry",
    "lease_entry",
    "partition_location",
    "restored_entry",
    "well_formed",
]
