"""The replication scenario's clients: list appends and two-partition transactions.

Each :class:`Client` runs one operation at a time, with at most one request
in flight, and follows the cluster as an application would (D15):

* **append** ``(k, v)`` with a request id, sent to the node it believes
  active for ``k``'s partition; ``NotActive`` moves the belief to the named
  active node (or a random one), ``Locked`` waits, no answer within
  ``timeout`` tries another node -- always with the *same* request id, so an
  append is applied at most once however often it is retried (the node finds
  the request id's record);
* **transaction** -- appends to two keys of two partitions, atomically: the
  client prepares a branch on each partition's active node (a replicated
  prepared record), asks any node to decide ``commit`` in the decision log (or
  ``abort`` if the prepares take longer than ``prepare_timeout``), then sends
  the outcome to both partitions until each acknowledged.  A transaction is
  acknowledged when the log's decision is ``commit`` and the client heard it.

New operations start until ``stop_at``; the ones in flight then run to their
end (or the run's deadline).  :meth:`Client.history` is the run as the
history checker reads it (``ok``: acknowledged, ``fail``: aborted, ``info``:
unknown).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from nonstop.runtime.interface import NodeId
from nonstop.sim.core import Simulation
from nonstop.sim.history import FAIL, INFO, OK, Txn
from nonstop.sim.scenarios.replication_node import partition_of


@dataclass(slots=True)
class Op:
    """One client operation and what became of it."""

    kind: str  # "append" | "txn"
    rid: str
    values: dict[str, int]
    invoke: float
    complete: float | None = None
    type: str = INFO
    phase: str = "prepare"
    prepared: set[str] = field(default_factory=set)
    outcome: str | None = None
    told: set[str] = field(default_factory=set)
    failover_retries: int = 0


@dataclass(slots=True)
class WorkloadConfig:
    clients: int = 3
    keys: int = 10
    txn_probability: float = 0.2
    step: float = 0.01
    timeout: float = 0.4
    prepare_timeout: float = 1.0
    think: float = 0.02


class Client:
    """One simulated application client (module doc)."""

    def __init__(
        self,
        number: int,
        sim: Simulation,
        rng: random.Random,
        nodes: list[NodeId],
        partitions: list[str],
        config: WorkloadConfig,
        stop_at: float,
    ) -> None:
        self.number = number
        self.sim = sim
        self.rng = rng
        self.nodes = nodes
        self.partitions = partitions
        self.config = config
        self.stop_at = stop_at
        self.keys = [f"k{i}" for i in range(config.keys)]
        self.belief: dict[str, NodeId] = {}
        self.ops: list[Op] = []
        self.op: Op | None = None
        self.request: tuple[int, str, str | None] | None = None
        """(sim request id, what, partition) in flight."""
        self.wait_until = 0.0
        self.errors: list[str] = []
        self._count = 0

    # ------------------------------------------------------------ driving
    def start(self) -> None:
        self.sim.at(self.sim.now, self.step)

    @property
    def done(self) -> bool:
        return self.op is None and self.sim.now >= self.stop_at

    def step(self) -> None:
        sim = self.sim
        if self.request is not None:
            rid, what, partition = self.request
            record = sim.requests[rid]
            if record.reply is None:
                if sim.now - record.sent_at > self.config.timeout:
                    self.request = None  # silence: try another node
                    if partition is not None:
                        self.belief[partition] = self.rng.choice(self.nodes)
            else:
                self.request = None
                self._on_reply(what, partition, record.reply)
        if self.request is None and sim.now >= self.wait_until:
            self._advance()
        if not self.done:
            sim.at(sim.now + self.config.step, self.step)

    def _send(self, node: NodeId, payload: dict[str, Any], what: str, part: str | None) -> None:
        rid = self.sim.request(node, payload)
        self.request = (rid, what, part)

    def _node_for(self, partition: str) -> NodeId:
        if partition not in self.belief:
            self.belief[partition] = self.rng.choice(self.nodes)
        return self.belief[partition]

    def _advance(self) -> None:
        op = self.op
        if op is None:
            if self.sim.now >= self.stop_at:
                return
            op = self.op = self._new_op()
        if op.kind == "append":
            ((key, value),) = op.values.items()
            part = partition_of(key, self.partitions)
            payload = {"op": "append", "k": key, "v": value, "rid": op.rid}
            self._send(self._node_for(part), payload, "append", part)
        elif op.phase == "prepare":
            if self.sim.now - op.invoke > self.config.prepare_timeout:
                op.outcome, op.phase = "abort", "decide"
                return self._advance()
            for key, value in op.values.items():
                part = partition_of(key, self.partitions)
                if part not in op.prepared:
                    payload = {"op": "prepare", "k": key, "v": value, "rid": op.rid}
                    return self._send(self._node_for(part), payload, "prepare", part)
            op.outcome, op.phase = "commit", "decide"
            self._advance()
        elif op.phase == "decide":
            payload = {"op": "decide", "txid": op.rid, "o": op.outcome}
            self._send(self.rng.choice(self.nodes), payload, "decide", None)
        elif op.phase == "outcome":
            for key in op.values:
                part = partition_of(key, self.partitions)
                if part not in op.told:
                    payload = {"op": "outcome", "txid": op.rid, "o": op.outcome, "p": part}
                    return self._send(self._node_for(part), payload, "outcome", part)
            self._finish(op)

    def _new_op(self) -> Op:
        self._count += 1
        n = self._count
        base = self.number * 1_000_000 + n * 10
        if self.rng.random() < self.config.txn_probability:
            first = self.rng.choice(self.keys)
            others = [
                k
                for k in self.keys
                if partition_of(k, self.partitions) != partition_of(first, self.partitions)
            ]
            if others:
                second = self.rng.choice(others)
                values = {first: base, second: base + 1}
                return Op("txn", f"c{self.number}.{n}", values, self.sim.now)
        key = self.rng.choice(self.keys)
        return Op("append", f"a{self.number}.{n}", {key: base}, self.sim.now)

    def _on_reply(self, what: str, partition: str | None, reply: Any) -> None:
        op = self.op
        assert op is not None
        if not isinstance(reply, dict):
            self.errors.append(f"{op.rid}: reply {reply!r}")
            return
        error = reply.get("error")
        if error in ("NotActive", "StaleEpoch"):
            active = reply.get("active")
            if partition is not None:
                self.belief[partition] = (
                    active if isinstance(active, str) else self.rng.choice(self.nodes)
                )
            self.wait_until = self.sim.now + self.config.think
            return
        if error == "Locked":
            self.wait_until = self.sim.now + self.config.think
            return
        if error is not None or not reply.get("ok"):
            self.errors.append(f"{op.rid}: {what} answered {reply!r}")
            return
        if what == "append":
            op.type, op.complete = OK, self.sim.now
            self._finish(op)
        elif what == "prepare" and partition is not None:
            op.prepared.add(partition)
        elif what == "decide":
            op.outcome = reply.get("o")
            op.type = OK if op.outcome == "commit" else FAIL
            op.complete = self.sim.now
            op.phase = "outcome"
        elif what == "outcome" and partition is not None:
            op.told.add(partition)

    def _finish(self, op: Op) -> None:
        self.ops.append(op)
        self.op = None
        self.wait_until = self.sim.now + self.config.think

    def all_ops(self) -> list[Op]:
        """Every operation started, the unfinished one included."""
        return self.ops + ([self.op] if self.op is not None else [])

    def history(self) -> list[Txn]:
        return [
            Txn(
                [("append", k, v) for k, v in op.values.items()],
                op.type,
                self.number,
                op.invoke,
                op.complete,
            )
            for op in self.all_ops()
        ]


__all__ = ["Client", "Op", "WorkloadConfig"]
