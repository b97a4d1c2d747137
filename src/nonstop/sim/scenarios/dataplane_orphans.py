"""The ``branch-outlives-session`` check: after the heal, no branch outlives its session.

A participant's branch ``"<coordinator>.<sid>"`` exists for its coordinator's
session ``sid``.  Once that session is over on the coordinator (ended, failed,
committed, forgotten), the branch must be gone soon, not at ``branch_idle``:
while it stays, it holds its locks and every transaction touching those
objects waits (issue 14: an account write-locked for 90 s after a heal, when a
session's first op on a node reached it only after the coordinator had given
up on it).  The check samples every node at most every ``every`` seconds from
``start`` (the heal) on; a branch whose session is over for more than
``grace`` seconds of that time is a violation.

Branches of a coordinator that is down (crashed, not restarted yet) are not
judged: the participant ends them when it sees that coordinator down (the
``orphan-branch`` check).  The coordinator's session table is read from its
machine as it is now: a restarted coordinator has none of its old sessions,
so a branch of its previous incarnation counts as over from the restart.
"""

from __future__ import annotations

from collections.abc import Callable

from nonstop.runtime.interface import Action, Event, NodeId
from nonstop.sim.core import Simulation
from nonstop.sim.scenarios.dataplane_node import SimDataNode

Fail = Callable[[str, str], None]


class BranchOutlivesSession:
    """A simulator observer carrying out the check (module doc)."""

    def __init__(self, start: float, grace: float, fail: Fail, every: float = 0.02) -> None:
        self.start = start
        self.grace = grace
        self.every = every
        self.fail = fail
        self._sampled = float("-inf")
        self._over_since: dict[tuple[NodeId, str], float] = {}
        self._reported: set[tuple[NodeId, str]] = set()

    def attach(self, sim: Simulation) -> BranchOutlivesSession:
        sim.observers.append(self.observe)
        return self

    def observe(self, sim: Simulation, name: NodeId, event: Event, actions: list[Action]) -> None:
        now = sim.now
        if now < self.start or now - self._sampled < self.every:
            return
        self._sampled = now
        seen: set[tuple[NodeId, str]] = set()
        for holder in sorted(sim.nodes):
            machine = sim.machine(holder)
            if not isinstance(machine, SimDataNode):
                continue
            for bid, branch in machine.dataplane.branches.items():
                if branch.local or not self._session_over(sim, bid):
                    continue
                key = (holder, bid)
                seen.add(key)
                since = self._over_since.setdefault(key, now)
                if now - since > self.grace and key not in self._reported:
                    self._reported.add(key)
                    self.fail(
                        "branch-outlives-session",
                        f"{holder} still holds {bid} {now - since:.2f} s after its session "
                        f"ended on its coordinator (grace {self.grace:g} s)",
                    )
        for key in list(self._over_since):
            if key not in seen:
                del self._over_since[key]

    @staticmethod
    def _session_over(sim: Simulation, bid: str) -> bool:
        coordinator, _, sid = bid.rpartition(".")
        machine = sim.machine(coordinator) if coordinator in sim.nodes else None
        if not isinstance(machine, SimDataNode) or not sid.isdigit():
            return False  # coordinator down: the orphan-branch check's business
        return int(sid) not in machine.dataplane.sessions


__all__ = ["BranchOutlivesSession"]
