"""The data requests a coordinator sends to its peers, and their answers (data-path.md §4).

``{"t": "data.req", "id": n, "op": ..., "b": branch id, ...}`` →
``{"t": "data.rep", "id": n, "p": reply}``.  A request's answer resumes the
task waiting for it; a peer that does not answer within ``rpc_timeout`` (timer
``dp.rpc.<id>``), or that leaves Up first, fails it: ``TransactionLost`` (an
``Unavailable`` that is retryable: the session rolls back), or ``Unavailable`` for a
committing op (its outcome is unknown).

A call of a :data:`LONG_OPS` op (an overwrite's swap: its work grows with the
rows it swaps, not with time) is kept alive by its progress instead: while the
peer still runs it, the peer says so every ``sweep_every`` seconds
(``{"t": "data.busy", "id": n}``, :meth:`PeerCalls.busy`), and each such note
re-arms the call's timer.  A peer that stops running it (done: its answer
comes; or gone: down, restarted) stops the notes, and the timer fires as usual.

A call unanswered for ``probe_after`` is **probed** on the sweep tick
(``{"t": "data.probe", "id": n}`` → ``{"t": "data.probed", "id": n, "r": running}``,
again every ``probe_after``): a peer that does not run it (the request or its
answer was lost with a peer connection that dropped and came back, as at a
takeover whose promotion stalled a node's loop) makes it fail at once instead of
at ``rpc_timeout`` (15 s): ``BranchRolledBack`` (retryable: the session rolls
back and ends the branch there), or ``Unavailable`` for a committing op (its
outcome is unknown).  A probe and the request travel on the same link, in
order, so "not running" means done (its answer is ahead of the probe's) or never
received.

Call ids start at a random offset in every incarnation of a node, so a reply
a peer queued for the node's previous incarnation never resolves a call of
this one; an answer from another node than the one asked is dropped.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from nonstop import errors
from nonstop.dataplane.steps import Task
from nonstop.runtime.interface import CancelTimer, Send, SetTimer

if TYPE_CHECKING:
    from nonstop.dataplane.machine import DataPlane

LONG_OPS = frozenset({"branch.overwrite"})
"""Branch ops kept alive by the peer's progress notes rather than bounded by ``rpc_timeout``."""

BUSY = "data.busy"
"""A peer's note that it still runs a :data:`LONG_OPS` call: ``{"t": BUSY, "id": call id}``."""

PROBE = "data.probe"
"""``{"t": PROBE, "id": call id}``: does the peer still run that call of ours?"""

PROBED = "data.probed"
"""``{"t": PROBED, "id": call id, "r": bool}``: the answer to a :data:`PROBE`."""

COMMITTING_OPS = frozenset({"branch.commit"})
"""Ops whose success is a commit: a lost answer leaves the outcome unknown."""

RPC_TIMER = "dp.rpc."
"""``dp.rpc.<call id>``: a data request to a peer not answered within ``rpc_timeout``."""


@dataclass(slots=True)
class _Call:
    node: str
    op: str
    task: Task
    slot: int
    probe_at: float
    """When to ask the peer whether it still runs this call (:meth:`PeerCalls.probe`)."""


class PeerCalls:
    """The data requests this node waits answers for, by call id."""

    def __init__(self, dp: DataPlane, rng: random.Random) -> None:
        self.dp = dp
        self._calls: dict[int, _Call] = {}
        self._next = rng.randrange(1, 1 << 52)

    def next_id(self) -> int:
        call_id = self._next
        self._next += 1
        return call_id

    def send(self, node: str, msg: dict[str, Any], task: Task, slot: int) -> None:
        """Send request ``msg`` to ``node``; its answer resumes ``task`` (gather ``slot``)."""
        call_id = msg["id"] = self.next_id()
        probe_at = self.dp.now + self.dp.config.probe_after
        self._calls[call_id] = _Call(node, msg["op"], task, slot, probe_at)
        self.dp.stats["rpc"] += 1
        self.dp.emit(Send(node, msg))
        self.dp.emit(SetTimer(f"{RPC_TIMER}{call_id}", self.dp.config.rpc_timeout))

    def tell(self, node: str, msg: dict[str, Any]) -> None:
        """Send request ``msg`` to ``node`` without waiting for its answer."""
        msg["id"] = self.next_id()
        self.dp.stats["rpc"] += 1
        self.dp.emit(Send(node, msg))

    def answered(self, sender: str, msg: dict[str, Any]) -> None:
        """A ``data.rep``: resume the task that waits for it (if any still does)."""
        call_id = msg.get("id")
        call = self._calls.get(call_id) if isinstance(call_id, int) else None
        if call is None or call.node != sender:
            return  # not ours (any more): a late answer
        del self._calls[call_id]  # type: ignore[arg-type]
        self.dp.emit(CancelTimer(f"{RPC_TIMER}{call_id}"))
        reply = msg.get("p")
        if not isinstance(reply, dict):
            exc = errors.ProtocolError(f"{sender} answered {call.op} with {reply!r:.60}")
            self.dp.resolve(call.task, call.slot, None, exc)
            return
        if reply.pop("d", None) and call.task.session is not None:
            call.task.session.dirty.add(sender)  # the branch there changed: a writer
        self.dp.resolve_reply(call.task, call.slot, reply)

    def busy(self, sender: str, msg: dict[str, Any]) -> None:
        """A :data:`BUSY` note: the peer still runs that long call; wait ``rpc_timeout`` more."""
        call_id = msg.get("id")
        call = self._calls.get(call_id) if isinstance(call_id, int) else None
        if call is None or call.node != sender or call.op not in LONG_OPS:
            return  # answered meanwhile, not ours, or not an op that may run long
        self.dp.emit(SetTimer(f"{RPC_TIMER}{call_id}", self.dp.config.rpc_timeout))

    def probe(self, now: float) -> None:
        """The sweep tick: ask about the calls unanswered for ``probe_after`` (module doc)."""
        every = self.dp.config.probe_after
        if every <= 0:
            return
        up = self.dp.view.up
        for call_id, call in self._calls.items():
            if call.probe_at <= now and call.node in up:
                call.probe_at = now + every
                self.dp.emit(Send(call.node, {"t": PROBE, "id": call_id}))

    def probed(self, sender: str, msg: dict[str, Any]) -> None:
        """A :data:`PROBED` answer: a call the peer does not run fails now (module doc)."""
        call_id = msg.get("id")
        call = self._calls.get(call_id) if isinstance(call_id, int) else None
        if call is None or call.node != sender or msg.get("r") is not False:
            return  # answered meanwhile, not ours, or still running there
        del self._calls[call_id]  # type: ignore[arg-type]
        self.dp.emit(CancelTimer(f"{RPC_TIMER}{call_id}"))
        self.dp.stats["calls_lost"] += 1
        why = f"node {sender} lost {call.op} (the request or its answer; a connection dropped)"
        exc: errors.Error
        if call.op in COMMITTING_OPS:
            exc = errors.Unavailable(f"{why}: the outcome is unknown")
        else:
            exc = errors.BranchRolledBack(f"{why}: the transaction is rolled back")
        self.dp.resolve(call.task, call.slot, None, exc)

    def timed_out(self, name: str) -> bool:
        """Timer ``name`` fired: True if it was a call's (which then fails)."""
        number = name[len(RPC_TIMER) :]
        if not name.startswith(RPC_TIMER) or not number.isdigit():
            return False
        call = self._calls.pop(int(number), None)
        if call is not None:
            exc = _lost(call.op, f"node {call.node} did not answer {call.op}")
            self.dp.resolve(call.task, call.slot, None, exc)
        return True

    def node_down(self, peer: str) -> None:
        """``peer`` left Up: the calls waiting for it fail now, not at their timeout (B8)."""
        for call_id, call in list(self._calls.items()):
            if call.node == peer and self._calls.pop(call_id, None) is not None:
                self.dp.emit(CancelTimer(f"{RPC_TIMER}{call_id}"))
                exc = _lost(call.op, f"node {peer} is down")
                self.dp.resolve(call.task, call.slot, None, exc)


def _lost(op: str, why: str) -> errors.Error:
    """A call that failed with its peer: ``Unavailable`` for a committing op (its outcome
    is unknown), else ``TransactionLost`` -- the op's session is rolled back, nothing of it
    committed, an ``Unavailable`` that ``@transactional`` replays (issue 10 H4)."""
    if op in COMMITTING_OPS:
        return errors.Unavailable(f"{why}: the outcome is unknown")
    return errors.TransactionLost(f"{why}: the transaction is rolled back")


__all__ = ["BUSY", "COMMITTING_OPS", "LONG_OPS", "PROBE", "PROBED", "RPC_TIMER", "PeerCalls"]
