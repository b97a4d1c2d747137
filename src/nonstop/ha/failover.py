"""Who proposes what to the partition table, sans-I/O (ha.md sections 6-7).

:class:`Promoter` runs on the node that leads the cluster log *and* has quorum
(the composition checks both; a Disabled node never acts, D16).  It compares
the table with the committed view's live set and proposes, per partition,

* ``failover(P, e, dead)`` when P's active node is not live -- D8: one entry
  promotes the next in-sync sync replica, bumps the epoch and drops every dead
  node of the current list;
* ``drop(P, e, node)`` when a replica of a live active node is not live (D12
  from the cluster's side; the active node proposes the same entry when a
  replica stops answering its replication messages).

:class:`Restorer` runs on every node for the partitions its configuration
lists it in: it defines and enables them (the seed's advice, automated; again
whenever the node sees itself left out of a current list it should be in), and
on the active node it reports restore copies as done (``restored``).  The copy
itself belongs to the data path; ``copy_done`` says whether it finished (in
the simulator: at once).

Both only *propose*: the table decides when the entry is applied, refusing a
stale epoch, so a proposal made from an old table is harmless.  Both resend a
proposal after ``retry`` seconds while the table has not moved (a request can
be dropped on the way to the leader), and never faster.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from nonstop.ha.partition_table import (
    LOCAL_ENABLED,
    PartitionTable,
    define_entry,
    drop_entry,
    enable_entry,
    failover_entry,
    restored_entry,
)
from nonstop.ha.policies import PartitionDef
from nonstop.runtime.interface import NodeId


@dataclass(frozen=True, slots=True)
class PromoterConfig:
    """How often a proposal that the table has not answered yet is sent again."""

    retry: float = 0.5


class _Throttle:
    """One proposal per key per ``retry`` seconds."""

    def __init__(self, retry: float) -> None:
        self.retry = retry
        self._sent: dict[Any, float] = {}

    def ready(self, now: float, key: Any) -> bool:
        last = self._sent.get(key)
        if last is not None and now - last < self.retry:
            return False
        self._sent[key] = now
        if len(self._sent) > 4096:  # keys carry epochs: old ones never come back
            for old in [k for k, t in self._sent.items() if now - t >= self.retry]:
                del self._sent[old]
        return True


class Promoter:
    """Failover and dead-replica removal proposals of the cluster's leader (module doc)."""

    def __init__(self, table: PartitionTable, config: PromoterConfig | None = None) -> None:
        self.table = table
        self.config = config or PromoterConfig()
        self._throttle = _Throttle(self.config.retry)

    def proposals(self, now: float, live: Iterable[NodeId]) -> list[dict[str, Any]]:
        up = set(live)
        out: list[dict[str, Any]] = []
        for name in sorted(self.table.partitions):
            part = self.table.partitions[name]
            if part.active is None:
                continue
            dead = [n for n in part.current if n not in up]
            if not dead:
                continue
            if part.active in dead:
                entry = failover_entry(name, part.epoch, dead)
            else:
                entry = drop_entry(name, part.epoch, dead[0])
            if self._throttle.ready(now, (name, part.epoch)):
                out.append(entry)
        return out


class Restorer:
    """Define, enable and restore this node's partitions (module doc)."""

    def __init__(
        self,
        me: NodeId,
        table: PartitionTable,
        layout: Sequence[PartitionDef],
        config: PromoterConfig | None = None,
        copy_done: Callable[[str, NodeId], bool] | None = None,
    ) -> None:
        self.me = me
        self.table = table
        self.layout = [p for p in layout if me in p.node_names()]
        self.config = config or PromoterConfig()
        self.copy_done = copy_done or (lambda partition, node: True)
        self._throttle = _Throttle(self.config.retry)
        self.held: set[str] = set()
        """Partitions an operator disabled on this node: not re-enabled until the operator
        enables them again (in this life of the node; a restart restores, section 7)."""

    def proposals(self, now: float, live: Iterable[NodeId]) -> list[dict[str, Any]]:
        up = set(live)
        out: list[dict[str, Any]] = []
        for pdef in self.layout:
            if pdef.name in self.held:
                continue
            part = self.table.get(pdef.name)
            if part is None:
                entry = define_entry(pdef)
            elif part.active is None and self.me in part.in_sync():
                # Unavailable and this node holds the last copy: enabling makes it active.
                entry = enable_entry(pdef.name)
            elif self.me not in part.current and not (
                part.status.get(self.me) == LOCAL_ENABLED and part.active is None
            ):
                # Not holding it: enable (again).  While the partition is Unavailable and this
                # node holds no copy, enabling again changes nothing: wait for a holder.
                entry = enable_entry(pdef.name)
            elif part.status.get(self.me) not in (LOCAL_ENABLED, None):
                entry = enable_entry(pdef.name)
            else:
                entry = None
            if entry is not None and self._throttle.ready(
                now, (pdef.name, entry["pt"], part and part.epoch)
            ):
                out.append(entry)
        for name in sorted(self.table.partitions):
            part = self.table.partitions[name]
            if part.active != self.me:
                continue
            for node in part.copying:
                if node in up and self.copy_done(name, node):
                    if self._throttle.ready(now, (name, "restored", part.epoch)):
                        out.append(restored_entry(name, part.epoch, node))
                    break
        return out


__all__ = ["Promoter", "PromoterConfig", "Restorer"]
