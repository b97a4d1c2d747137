"""When a node may act as a partition's active node: liveness leases (ha.md section 8).

The failure detector is not symmetric (any message is a sign of life), so an
active node cut off one way still hears a quorum while the others promote a
replica.  Epochs fence writes at sync replicas; reads, and partitions without
a sync replica, need more.  The rule, made of cluster-log entries:

* every node renews a **lease** every ``lease / 3`` with a ``lease`` entry
  carrying its lease number ``ln``; the table accepts it only if ``ln`` is
  still the node's number (a failover of the node's partitions raises it);
* a node holds its lease until ``proposed_at + lease`` of its last renewal
  *accepted* (measured on its own clock from when it proposed it, which is
  before anyone applied it);
* every node notes, on its own clock, when it applied each node's last
  accepted renewal.  A node that becomes active for P (any entry: failover,
  handover, disable, enable) starts **acting** only once the previous
  active's lease, as it applied it, has run out: ``applied_at + lease *
  (1 + drift)``.  Renewals after the revoking entry are refused, so the old
  active's last lease is one the new active applied *before* that entry.

So at no instant do two nodes act for one partition, whatever the network
does, as long as clock *rates* differ by less than ``drift``.  Acting also
needs quorum (D16).  The data path acknowledges only while acting.

**A handover ends the old lease early.**  For a handover by priority
(``restored``, D9) the old active node is alive: when it applies the entry it
stops acting for P, and if it had been acting -- its own wait for *its*
predecessor over -- it tells the new active node so (:meth:`on_changed`
returns the ``released`` message).  The new active node, made active by that
very entry (same epoch, ``was`` the sender), starts acting when the message
comes instead of a whole lease later (:meth:`on_released`).  A message can
only be sent after the entry is applied on the old node, so the old node acts
no more; the sender's own wait being over means no earlier active acts
either.  Lost or late, the message changes nothing: the lease wait still ends
it.

:class:`LeaseKeeper` is that rule, sans-I/O: fed the table's ``pt.lease`` and
``pt.changed`` notifications with the local time, it says when to renew and
:meth:`acting` answers "may I acknowledge for P now?".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from nonstop.ha.partition_table import RESTORED, PartitionTable, lease_entry
from nonstop.runtime.interface import NodeId


@dataclass(frozen=True, slots=True)
class LeaseConfig:
    """Lease length and the bound on clock-rate difference it tolerates."""

    lease: float = 0.6
    drift: float = 0.05

    @property
    def renew_every(self) -> float:
        return self.lease / 3


class LeaseKeeper:
    """One node's view of leases: its own, and when others' were applied (module doc)."""

    def __init__(
        self,
        me: NodeId,
        incarnation: int,
        table: PartitionTable,
        config: LeaseConfig | None = None,
        *,
        wait_for_previous: bool = True,
        release_unless_acting: bool = False,
    ) -> None:
        self.me = me
        self.incarnation = incarnation
        self.table = table
        self.config = config or LeaseConfig()
        self.wait_for_previous = wait_for_previous
        """False only in the simulator's broken variant (a new active acts at once)."""
        self.release_unless_acting = release_unless_acting
        """True only in the simulator's broken variant: a handover's old active node ends
        the lease wait even while it was itself still waiting for its predecessor."""
        self._handover: dict[str, tuple[int, NodeId]] = {}
        """Partitions handed over to this node and not acted for yet: ``(epoch, was)`` --
        a ``released`` from ``was`` for that epoch ends the wait (module doc)."""
        self.released_at: dict[str, float] = {}
        """Per partition, when this node last handed it over and said ``released`` (its own
        clock): its acting for it ended then, before its lease (the status shows it)."""
        self._last_active: dict[str, NodeId] = {}
        """Per partition, the last node seen active for it: a partition enabled again after
        a spell with no active node (a failover found no live copy) has ``was`` None, but
        the node active before the spell may still act until its lease runs out."""
        self._early: dict[str, tuple[int, NodeId]] = {}
        """``released`` messages that came before this node applied their entry (the old
        active node applied it first: it is often the leader): ``(epoch, sender)`` per
        partition, used when the entry is applied here."""
        self.held_until = float("-inf")
        self._renewal = 0
        self._sent: dict[int, float] = {}
        self._next_renew = float("-inf")
        self._applied_at: dict[NodeId, float] = {}
        self._acting_from: dict[str, float] = {}
        self._seen: dict[str, tuple[object, int, int]] = {}
        """Per partition, ``(active, epoch, changed)`` as this keeper last saw it applied:
        a snapshot that leaves it unchanged moved no partition (every change of the
        active node raises the epoch), so an acting node goes on acting through it."""
        self._snapshot_at = float("-inf")

    # ------------------------------------------------------------ renewals
    def renewal(self, now: float) -> dict[str, Any] | None:
        """The next renewal entry to submit, when one is due (every ``lease / 3``)."""
        if now < self._next_renew:
            return None
        self._next_renew = now + self.config.renew_every
        self._renewal += 1
        self._sent[self._renewal] = now
        for old in [k for k in self._sent if k < self._renewal - 64]:
            del self._sent[old]
        return lease_entry(self.table.leases.get(self.me, 0), self._renewal)

    # ------------------------------------------------------------ applied entries
    def on_snapshot(self, now: float) -> None:
        """The table was replaced: any node's last lease may be inside it, so treat every
        lease as applied now (conservative: a later start, never an earlier one).

        A partition whose ``(active, epoch, changed)`` is what this node saw before the
        snapshot did not change hands inside it (a change of active raises the epoch and
        sets ``changed`` to the entry's index, which only grows): if this node was its
        active node then, it already waited out the previous one and goes on acting.
        Without this, a follower that installs the leader's snapshot (it lagged behind
        the leader's compaction point, every few seconds under load) stopped acting for
        a whole lease: a commit gap of ``lease * (1 + drift)`` (issue 14)."""
        self._snapshot_at = now
        for name, part in self.table.partitions.items():
            key = (part.active, part.epoch, part.changed)
            if part.active == self.me and not (
                self._seen.get(name) == key and name in self._acting_from
            ):
                self._acting_from[name] = now + self._wait()
        self._remember()

    def _remember(self) -> None:
        self._seen = {
            name: (part.active, part.epoch, part.changed)
            for name, part in self.table.partitions.items()
        }
        for name, part in self.table.partitions.items():
            if part.active is not None:
                self._last_active[name] = part.active

    def on_lease(self, now: float, data: dict[str, Any]) -> None:
        """``pt.lease`` applied here (``r`` in it: who asked, which incarnation)."""
        if not data.get("ok"):
            return
        node = data.get("node")
        if not isinstance(node, str):
            return
        self._applied_at[node] = now
        if node == self.me and data.get("r") == [self.me, self.incarnation]:
            sent = self._sent.get(data.get("k"))  # type: ignore[arg-type]
            if sent is not None:
                self.held_until = max(self.held_until, sent + self.config.lease)

    def on_changed(self, now: float, data: dict[str, Any]) -> tuple[NodeId, dict[str, Any]] | None:
        """``pt.changed`` applied here: a new active node waits out the previous one's lease.

        Returns ``(node, body)`` of a ``released`` message to send when this node was the
        active node a handover just took ``P`` from, and it had been acting (module doc)."""
        name, active, was = data.get("p"), data.get("active"), data.get("was")
        part = self.table.get(name) if isinstance(name, str) else None
        if part is not None:
            self._seen[part.name] = (part.active, part.epoch, part.changed)
        if not isinstance(name, str) or part is None:
            return None
        before = self._last_active.get(name)
        if isinstance(active, str):
            self._last_active[name] = active
        handover = data.get("kind") == RESTORED and isinstance(was, str) and was != active
        if was == self.me and active != self.me:
            self._handover.pop(name, None)
            waited = self._acting_from.get(name, float("inf")) <= now
            if handover and isinstance(active, str) and (waited or self.release_unless_acting):
                self.released_at[name] = now
                return active, {"t": "released", "p": name, "e": part.epoch}
            return None
        if active != self.me or was == self.me:
            self._handover.pop(name, None)
            return None
        start = now
        previous = was if isinstance(was, str) else before
        if self.wait_for_previous and isinstance(previous, str):
            applied = max(self._applied_at.get(previous, float("-inf")), self._snapshot_at)
            start = max(now, applied + self._wait())
        elif self.wait_for_previous and part.epoch > 1:
            # Someone may have been active before (this is not the first enable), and this
            # keeper does not know who (it restarted or installed a snapshot since): wait a
            # whole lease from now (seed 3502577: failover to no one, then enable).
            start = now + self._wait()
        early = self._early.pop(name, None)
        if handover and early is not None and early == (part.epoch, was):
            start = now  # the old active node stopped already: it said so first
        self._acting_from[name] = start
        if handover and start > now:
            assert isinstance(was, str)
            self._handover[name] = (part.epoch, was)
        else:
            self._handover.pop(name, None)
        return None

    def on_released(self, now: float, sender: NodeId, body: Any) -> bool:
        """A ``released`` message: the old active node of a handover stopped acting for P
        at the entry that made this node active.  True if this node may act sooner now."""
        if not isinstance(body, dict) or body.get("t") != "released":
            return False
        name, epoch = body.get("p"), body.get("e")
        if not isinstance(name, str) or not isinstance(epoch, int) or isinstance(epoch, bool):
            return False
        part = self.table.get(name)
        if part is not None and epoch > part.epoch:
            # Its entry is not applied here yet: kept for it (one per partition, so a
            # sender cannot grow this; a wrong one only fails to match).
            self._early[name] = (epoch, sender)
            return False
        if self._handover.get(name) != (epoch, sender):
            return False
        del self._handover[name]
        if part is None or part.active != self.me or part.epoch != epoch:
            return False
        if self._acting_from.get(name, float("inf")) <= now:
            return False
        self._acting_from[name] = now
        return True

    def _wait(self) -> float:
        return self.config.lease * (1 + self.config.drift)

    # ------------------------------------------------------------ answer
    def acting(self, now: float, partition: str, *, enabled: bool) -> bool:
        """May this node acknowledge for ``partition`` now? (quorum, active, lease, wait)."""
        part = self.table.get(partition)
        return (
            enabled
            and part is not None
            and part.active == self.me
            and now < self.held_until
            and now >= self._acting_from.get(partition, float("inf"))
        )

    def next_change(self, now: float) -> float:
        """The first instant after ``now`` at which :meth:`acting` may change by time alone
        (a lease running out, a wait for the previous active ending); ``inf`` if none."""
        later = [t for t in (self.held_until, *self._acting_from.values()) if t > now]
        return min(later, default=float("inf"))

    def acting_until(self, partition: str) -> float:
        """Until when the current answer of :meth:`acting` holds without another event."""
        return self.held_until


__all__ = ["LeaseConfig", "LeaseKeeper"]
