"""Invariant checkers for the cluster log, run while a simulation runs and after it.

The checker only looks at what nodes *say* (their ``Notify``, ``Send`` and
``Reply`` actions, see :mod:`nonstop.cluster.node`), never at their insides,
except for the final liveness question (who leads, which view) which it asks
the machines directly.  Safety properties, checked online:

* **election safety** -- at most one node becomes leader in any term;
* **log safety** -- every node's applied sequence is a prefix of one global
  sequence: the ``applied`` notifications carry a hash chain over all entries
  before, so "equal digest at every index reported by several nodes" is the
  prefix property, gaps and reorderings included; within one incarnation a
  node's applied indexes strictly increase;
* **durability of acknowledgements** -- a ``propose`` answered ``ok`` at index
  *i* has its value at *i* in the global sequence (and, after the heal, on
  every node);
* **views** -- every view id means the same view (members and live set) on
  every node, view ids grow with the log index, and each node applies them
  one after the other (id + 1 each time; a snapshot may jump ahead), so every
  node goes through the same sequence of views; after the heal the final view
  has every node live (checked by the scenario's agreement condition);
* **no acting while Disabled** -- a node whose last ``quorum`` notification
  was Disabled does not answer keep-alives, does not put work into the log
  (``proposed``), and answers every work request with ``QuorumLost``.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any, Self

from nonstop.runtime.interface import (
    Action,
    ClientRequest,
    Event,
    NodeId,
    Notify,
    Reply,
    Send,
)
from nonstop.sim.core import Simulation

WORK_OPS = ("join", "leave", "propose")


@dataclass(slots=True)
class Violation:
    """One broken invariant, with when and where."""

    time: float
    invariant: str
    detail: str

    def __str__(self) -> str:
        return f"t={self.time:.3f} {self.invariant}: {self.detail}"


@dataclass(slots=True)
class OnlineChecker(abc.ABC):
    """A checker that watches every event of a run (the cluster's, the partition table's,
    replication's): attach with :meth:`attach`; read :attr:`violations` during and after."""

    violations: list[Violation] = field(default_factory=list)
    max_violations: int = 20

    def attach(self, sim: Simulation) -> Self:
        sim.observers.append(self.observe)
        sim.fault_observers.append(self.on_fault)
        return self

    def fail(self, sim: Simulation, invariant: str, detail: str) -> None:
        if len(self.violations) < self.max_violations:
            self.violations.append(Violation(sim.now, invariant, detail))

    def on_fault(self, sim: Simulation, what: str, details: dict[str, Any]) -> None:  # noqa: B027
        """A fault the nemesis injected (crash, start, partition...); by default none
        matters (an optional hook, not abstract: most checkers judge only events)."""

    @abc.abstractmethod
    def observe(self, sim: Simulation, node: NodeId, event: Event, actions: list[Action]) -> None:
        """``node`` handled ``event`` and answered ``actions``."""


@dataclass(slots=True)
class ClusterChecker(OnlineChecker):
    """The cluster log's invariants (module doc)."""

    quorum: dict[NodeId, str] = field(default_factory=dict)
    leaders: dict[int, NodeId] = field(default_factory=dict)
    digests: dict[int, str] = field(default_factory=dict)
    values: dict[int, Any] = field(default_factory=dict)
    view_at: dict[int, int] = field(default_factory=dict)  # log index -> view id
    view_members: dict[int, tuple[list[NodeId], list[NodeId]]] = field(default_factory=dict)
    node_view: dict[NodeId, int] = field(default_factory=dict)  # last view id applied
    last_applied: dict[NodeId, int] = field(default_factory=dict)
    acked: dict[int, tuple[int, Any]] = field(default_factory=dict)  # rid -> (index, value)
    acked_at: dict[int, list[int]] = field(default_factory=dict)  # index -> rids
    refused_while_disabled: int = 0

    # ---------------------------------------------------------------- faults
    def on_fault(self, sim: Simulation, what: str, details: dict[str, Any]) -> None:
        if what in ("start", "crash"):
            node = details["node"]
            self.quorum[node] = "Disabled"  # a node (re)starts Disabled
            self.last_applied.pop(node, None)
            self.node_view.pop(node, None)

    # ---------------------------------------------------------------- events
    def observe(self, sim: Simulation, node: NodeId, event: Event, actions: list[Action]) -> None:
        disabled_work: int | None = None
        if isinstance(event, ClientRequest) and self.quorum.get(node) == "Disabled":
            payload = event.payload
            if isinstance(payload, dict) and payload.get("op") in WORK_OPS:
                disabled_work = event.request_id
        for action in actions:
            if isinstance(action, Notify):
                self._on_notify(sim, node, action)
            elif isinstance(action, Send):
                payload = action.payload
                if (
                    self.quorum.get(node) == "Disabled"
                    and isinstance(payload, dict)
                    and payload.get("k") == "fd"
                    and isinstance(payload.get("b"), dict)
                    and payload["b"].get("t") == "kar"
                ):
                    self.fail(sim, "disabled-acts", f"{node} answered a keep-alive while Disabled")
            elif isinstance(action, Reply):
                self._on_reply(sim, node, action, disabled_work)

    def _on_notify(self, sim: Simulation, node: NodeId, action: Notify) -> None:
        data = action.data
        kind = action.kind
        if kind == "quorum":
            self.quorum[node] = data["state"]
        elif kind == "role" and data.get("role") == "leader":
            term = int(data["term"])
            other = self.leaders.setdefault(term, node)
            if other != node:
                self.fail(sim, "election-safety", f"term {term} has leaders {other} and {node}")
        elif kind == "proposed":
            if self.quorum.get(node) == "Disabled":
                self.fail(sim, "disabled-acts", f"{node} proposed index {data['index']} Disabled")
        elif kind == "applied":
            self._on_applied(sim, node, data)

    def _on_applied(self, sim: Simulation, node: NodeId, data: dict[str, Any]) -> None:
        index = int(data["index"])
        digest = data["digest"]
        last = self.last_applied.get(node)
        if last is not None and index <= last:
            self.fail(sim, "log-order", f"{node} applied index {index} after {last}")
        self.last_applied[node] = index
        known = self.digests.setdefault(index, digest)
        if known != digest:
            self.fail(sim, "log-prefix", f"{node} applied a different history at index {index}")
        if data["kind"] == "snapshot":
            if "view" in data:
                self.node_view[node] = int(data["view"])
            return
        value = data.get("value")
        if index not in self.values:
            self.values[index] = value
            for rid in self.acked_at.get(index, ()):
                self._check_ack(sim, rid)
        if data["kind"] in ("config", "view") and isinstance(value, dict):
            view = int(value.get("view_id", 0))
            members = sorted(value.get("members", []))
            live = sorted(value.get("live", []))
            seen = self.view_members.setdefault(view, (members, live))
            if seen != (members, live):
                self.fail(sim, "views", f"view {view} is {seen} and {(members, live)} ({node})")
            if not set(live) <= set(members):
                self.fail(sim, "views", f"view {view} has live {live} outside {members}")
            previous = self.node_view.get(node)
            if previous is not None and view != previous + 1:
                self.fail(sim, "views", f"{node} applied view {view} after view {previous}")
            self.node_view[node] = view
            self.view_at.setdefault(index, view)
            for other_index, other_view in self.view_at.items():
                if (other_index < index) != (other_view < view) and other_index != index:
                    self.fail(
                        sim,
                        "views",
                        f"view {view} at index {index} vs view {other_view} at {other_index}",
                    )

    def _on_reply(
        self, sim: Simulation, node: NodeId, action: Reply, disabled_work: int | None
    ) -> None:
        reply = action.payload
        ok = isinstance(reply, dict) and reply.get("ok") is True
        if disabled_work is not None and action.request_id == disabled_work:
            if ok or not isinstance(reply, dict) or reply.get("error") != "QuorumLost":
                self.fail(
                    sim,
                    "disabled-acts",
                    f"{node} answered {reply!r} to a work request while Disabled",
                )
            else:
                self.refused_while_disabled += 1
        record = sim.requests.get(action.request_id)
        if ok and record is not None and "index" in reply:
            value = record.payload.get("value") if isinstance(record.payload, dict) else None
            self.acked[action.request_id] = (int(reply["index"]), value)
            self.acked_at.setdefault(int(reply["index"]), []).append(action.request_id)
            self._check_ack(sim, action.request_id)

    def _check_ack(self, sim: Simulation, rid: int) -> None:
        index, value = self.acked[rid]
        stored = self.values.get(index)
        if stored is None:
            return  # checked again at the end
        if not isinstance(stored, dict) or stored.get("v") != value:
            self.fail(sim, "durability", f"request {rid} acked at {index} but log has {stored!r}")

    # ------------------------------------------------------------------ end
    def final(
        self,
        sim: Simulation,
        live: list[NodeId],
        applied: dict[NodeId, int],
        *,
        converged: bool = True,
    ) -> None:
        """End-of-run checks: every ack is in the log, and (once converged) on every live node.

        When the cluster did not converge the liveness violation already says
        why; nodes lagging behind acknowledged entries would only repeat it.
        """
        for rid in sorted(self.acked):
            index, _ = self.acked[rid]
            if index not in self.values:
                self.fail(sim, "durability", f"acked index {index} (request {rid}) never applied")
                continue
            self._check_ack(sim, rid)
            if not converged:
                continue
            for node in live:
                if applied.get(node, 0) < index:
                    self.fail(
                        sim, "durability", f"{node} ends at {applied.get(node)} < acked {index}"
                    )
