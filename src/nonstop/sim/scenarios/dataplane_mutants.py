"""Deliberately broken data-path nodes: the campaign must catch each (the mutation check).

A checker that never fails proves nothing.  Each class here breaks one promise
of the data path the way real systems have broken it, and
``tests/sim/test_dataplane.py`` asserts that a few seeds of the campaign find
a violation.  Only the simulator's tests and ``--mutant`` use them.
"""

from __future__ import annotations

from nonstop.dataplane.events import Decide, DecisionDone
from nonstop.sim.scenarios.dataplane_node import SimDataNode


class AckBeforeDecision(SimDataNode):
    """A commit is acknowledged as soon as the data plane asks for the decision.

    The data plane hears ``DecisionDone(ok)`` at once -- before any branch
    prepared, let alone the decision reached the Raft log -- and the real
    outcome is dropped: the classic "acknowledge before the decision is
    durable" bug.  A transaction that then aborts (a participant votes no, a
    vote times out, a node crashes) was acknowledged but is not in the store.
    """

    def _decide(self, now: float, action: Decide) -> None:
        super()._decide(now, action)
        corr = self._decisions.pop(self._next_internal)
        self._queue.append((True, DecisionDone(now, corr, {"ok": True})))


MUTANTS: dict[str, type[SimDataNode]] = {"ack-before-decision": AckBeforeDecision}
"""Name (``--mutant``) -> node class."""

__all__ = ["MUTANTS", "AckBeforeDecision"]
