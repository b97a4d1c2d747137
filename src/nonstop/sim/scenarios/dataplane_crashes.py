"""Crashes at the data path's delicate moments (on top of the nemesis' random ones).

A random crash rarely lands between a commit's steps, so each seed may also
crash one node right after it reached one of :data:`STEPS` (recognised from
what the node did in that step, as the dtx scenario's ``CrashAtStep`` does):

* ``decide`` -- the data plane handed a commit to two-phase commit (the
  coordinator's gtid record may be lost, or survive torn);
* ``local_commit`` -- a local group commit (or an abort's outcome record) is on
  its way to the disk, not yet durable;
* ``commit_reply`` -- a commit was acknowledged to its client: from here on the
  commit and its request result must survive anything;
* ``voted_yes`` -- a participant voted yes (its prepared branch is durable and
  must come back with its locks).

The node restarts after a random delay; nothing else about the run changes.
"""

from __future__ import annotations

from dataclasses import dataclass

from nonstop.dtx.protocol import VOTE
from nonstop.runtime.interface import Action, Event, NodeId, Notify, Persist, Reply, Send
from nonstop.sim.core import Simulation
from nonstop.sim.scenarios.dataplane_node import DECIDE_NOTE, TOKEN_OWNERS
from nonstop.sim.scenarios.dataplane_store import K_OBJ, K_RESULT

STEPS = ("none", "decide", "local_commit", "commit_reply", "voted_yes")


@dataclass(slots=True)
class CrashAtStep:
    """Crash ``target`` the first time (after ``after``) it reaches ``step``."""

    step: str
    target: NodeId
    after: float
    down_for: float
    fired_at: float | None = None

    def attach(self, sim: Simulation) -> CrashAtStep:
        if self.step != "none":
            sim.observers.append(self.observe)
        return self

    def observe(self, sim: Simulation, node: NodeId, event: Event, actions: list[Action]) -> None:
        if self.fired_at is not None or node != self.target or sim.now < self.after:
            return
        if not any(self._matches(a) for a in actions):
            return
        self.fired_at = sim.now
        sim.at(sim.now, lambda: sim.crash(node))  # right after the step's actions
        sim.at(sim.now + self.down_for, lambda: sim.restart(node))

    def _matches(self, action: Action) -> bool:
        step = self.step
        if step == "decide":
            return isinstance(action, Notify) and action.kind == DECIDE_NOTE
        if step == "local_commit":
            return (
                isinstance(action, Persist)
                and any(k.startswith((K_OBJ, K_RESULT)) for k, _ in action.writes)
                and action.token % TOKEN_OWNERS == 1
            )
        if step == "commit_reply":
            return isinstance(action, Reply) and action.payload == {"ok": True}
        if step == "voted_yes":
            return (
                isinstance(action, Send)
                and isinstance(action.payload, dict)
                and action.payload.get("t") == VOTE
                and action.payload.get("v") == "yes"
            )
        return False


__all__ = ["STEPS", "CrashAtStep"]
