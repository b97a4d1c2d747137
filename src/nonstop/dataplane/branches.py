"""The branches peers' sessions open on this node: the participant side of the data path.

A remote coordinator runs its session's ops here with ``data.req`` messages
naming the branch ``"<coordinator>.<session id>"`` (data-path.md §4).  The
first op of a branch carries ``new`` (and ``iso``): only it opens the branch,
so a lost branch (this node restarted, the branch idled out or was rolled back
when its coordinator looked down) is never silently reopened without its
locks -- the coordinator hears ``BranchRolledBack`` (retryable) instead.
Every op is one ``Exec`` on the branch; its answer goes back as ``data.rep``.

A branch ends with ``branch.end``, ``branch.end_all`` (its coordinator came back
and holds no open session with it: ``ends.py``), a failure that dooms it (``Retryable``,
``TransactionClosed``), its coordinator being seen down, ``branch_idle``
seconds without an op (B8: participants that cannot be reached roll back on
their own), or two-phase commit taking it over (:meth:`BranchRegistry.take`).
Ended branch ids are remembered, so a late op cannot reopen one.
"""

from __future__ import annotations

import collections
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from nonstop import errors
from nonstop.dataplane.calls import BUSY, LONG_OPS, PROBED
from nonstop.dataplane.ends import END_ALL
from nonstop.dataplane.events import EndBranch, Exec
from nonstop.dataplane.snapshot_cut import CUT_OPS, view_refusal
from nonstop.dataplane.state import Branch
from nonstop.model.wire import error_class, error_out
from nonstop.runtime.interface import Send

if TYPE_CHECKING:
    from nonstop.dataplane.machine import DataPlane

PEER_OPS = frozenset(
    {
        "branch.get",
        "branch.ref",
        "branch.query",
        "branch.count",
        "branch.create",
        "branch.delete",
        "branch.call",
        "branch.write",
        "branch.overwrite",
        "branch.upsert",
        "branch.stream.commit",
        "branch.holdings",
        *CUT_OPS,
        # A homed request (requests.md): its record is claimed, and looked up, on
        # the branch of the node that writes its home object.
        "request.record",
        "request.lookup",
    }
)
"""The branch ops a peer may run here (besides ``branch.end``); the store ops the
machine runs on its own sessions' branches (``branch.commit``, ...) are not among them."""

WRITING_OPS = frozenset(
    {
        "branch.create",
        "branch.delete",
        "branch.call",
        "branch.write",
        "branch.overwrite",
        "branch.upsert",
        "branch.stream.commit",
    }
)
"""Branch ops that (may) write: their reply says so (``d``), for the coordinator's commit."""

BRANCH_ISOLATION = ("serializable", "snapshot")
_MAX_ENDED = 100_000


@dataclass(slots=True)
class _Served:
    """A peer's branch op running on the store."""

    sender: str
    call_id: Any
    bid: str
    op: str
    wrote: bool
    fence: dict[str, int] | None


class BranchRegistry:
    """The branches this node holds (its own sessions' and its peers'), by branch id."""

    def __init__(self, dp: DataPlane) -> None:
        self.dp = dp
        self.branches: dict[str, Branch] = {}
        self._ended: collections.OrderedDict[str, None] = collections.OrderedDict()
        self._waiting: dict[tuple[str, Any], str] = {}
        """(coordinator, call id) → branch id of its ops waiting out a lapse of the lease,
        before they run (``serve``) or with their answer (``done``; ``lapse_waits.py``):
        still running for the coordinator's probe."""
        self._served: dict[int, _Served] = {}

    def take(self, bid: str) -> bool:
        """Two-phase commit takes ``bid`` over: it leaves the registry (module doc)."""
        if self.branches.pop(bid, None) is None:
            return False
        self._mark_ended(bid)
        return True

    def end(self, bid: str) -> None:
        """Roll ``bid`` back (if held) and never reopen it."""
        self._mark_ended(bid)
        if self.branches.pop(bid, None) is not None:
            self.dp.emit(EndBranch(bid))

    def _mark_ended(self, bid: str) -> None:
        self._ended[bid] = None
        while len(self._ended) > _MAX_ENDED:
            self._ended.popitem(last=False)

    # ------------------------------------------------------------ serving
    def serve(self, sender: str, msg: dict[str, Any]) -> None:
        """A peer's ``data.req``: run it on its branch (or refuse it)."""
        op = msg.get("op")
        bid = msg.get("b")
        call_id = msg.get("id")
        if not isinstance(bid, str) or not bid.startswith(sender + "."):
            refusal = errors.BadArgument(f"branch {bid!r:.40} is not one of {sender}'s")
            self._answer(sender, call_id, error_out(refusal))
            return
        if op == "branch.end":
            self.end(bid)
            self._answer(sender, call_id, {})
            return
        if op == END_ALL:
            self._end_all(sender, msg.get("keep"))
            self._answer(sender, call_id, {})
            return
        if not isinstance(op, str) or op not in PEER_OPS:
            bad = errors.BadArgument(f"unknown branch op {op!r:.40}")
            self._answer(sender, call_id, error_out(bad))
            return
        w = msg.get("w") or None
        if w is not None and not isinstance(w, list):
            self._answer(sender, call_id, error_out(errors.BadArgument("w must be a list")))
            return
        fence = _fence_of(msg.get("pe"))
        if fence:
            # Routing by partition: run only while acting for each (partition, epoch)
            # the coordinator routed here (ha.md, fencing on the branch side).
            refused = self.dp.not_active(fence)
            if refused is not None:
                # A lapse of this node's lease alone is waited out (lapse_waits.py),
                # within half the coordinator's patience for an answer.
                if not self._wait_lapse(
                    sender, call_id, bid, fence, lambda: self.serve(sender, msg)
                ):
                    self._fenced_op(sender, call_id, bid, refused)
                return
        br = self.branches.get(bid)
        iso = None
        if br is None:
            if not msg.get("new") or bid in self._ended:
                over = errors.BranchRolledBack(f"branch {bid} is over on {self.dp.name}")
                self._answer(sender, call_id, error_out(over))
                return
            iso = msg.get("iso") or "serializable"
            if iso not in BRANCH_ISOLATION:
                bad = errors.BadArgument(f"bad isolation {iso!r:.40}")
                self._answer(sender, call_id, error_out(bad))
                return
            br = self.branches[bid] = Branch(bid, False, self.dp.now)
        refused_view = view_refusal(self.dp, br, op, fence, bool(msg.get("reset")))
        if refused_view is not None:
            self._answer(sender, call_id, error_out(refused_view))
            return
        br.last = self.dp.now
        br.busy += 1
        if fence:
            br.fence.update(fence)
        corr = self.dp.next_corr()
        self._served[corr] = _Served(sender, call_id, bid, op, w is not None, fence)
        self.dp.emit(Exec(corr, bid, op, msg, iso, w))

    def _wait_lapse(
        self, sender: str, call_id: Any, bid: str, fence: dict[str, int], go: Callable[[], None]
    ) -> bool:
        """Hold a peer's request (``go`` carries it on) while this node's lease lapsed
        (``lapse_waits.py``), within half the coordinator's patience for an answer;
        refused ``NotActive`` at the end.  False: not a lapse alone, refuse now."""
        key = (sender, call_id)

        def carry_on() -> None:
            self._waiting.pop(key, None)
            go()

        def refuse(exc: errors.Error) -> None:
            self._waiting.pop(key, None)
            self._fenced_op(sender, call_id, bid, exc)

        config = self.dp.config
        limit = min(config.lapse_wait, config.rpc_timeout / 2)
        if not self.dp.lapses.wait(fence, limit, carry_on, refuse):
            return False
        self._waiting[key] = bid
        return True

    def _fenced_op(self, sender: str, call_id: Any, bid: str, refused: errors.Error) -> None:
        """Refuse a peer's op fenced out here: its branch is over."""
        self.dp.stats["fenced_ops"] += 1
        self.end(bid)
        self._answer(sender, call_id, error_out(refused))

    def done(self, corr: int, reply: Any) -> None:
        """The store finished a peer's op: answer it."""
        served = self._served.pop(corr, None)
        if served is None:
            return
        self._answer_done(served, reply, True)

    def _answer_done(self, served: _Served, reply: Any, first: bool) -> None:
        bid = served.bid
        br = self.branches.get(bid)
        if br is not None and first:
            br.busy -= 1
            br.last = self.dp.now
        if not isinstance(reply, dict):
            reply = error_out(errors.ProtocolError(f"bad store reply {reply!r:.60}"))
        error = reply.get("error")
        if error is not None:
            cls = error_class(str(error))
            if issubclass(cls, errors.Retryable | errors.TransactionClosed):
                # Doomed: only rolling back is left; do it now, not at the idle timeout.
                self.end(bid)
        elif served.fence and (refused := self.dp.not_active(served.fence)) is not None:
            # The answer is an acknowledgement: only while still acting (a lease
            # lapses by time alone, seen at this event at the latest); a lapse alone
            # is waited out, the answer kept (lapse_waits.py).
            if first and self._wait_lapse(
                served.sender,
                served.call_id,
                bid,
                served.fence,
                lambda: self._answer_done(served, reply, False),
            ):
                return
            self.dp.stats["fenced_ops"] += 1
            self.end(bid)
            reply = error_out(refused)
        elif br is None:
            # Ended while the op ran (branch.end, its coordinator down): its
            # effects are rolled back, which the coordinator must hear.
            reply = error_out(errors.BranchRolledBack(f"branch {bid} is over on {self.dp.name}"))
        elif served.wrote or served.op in WRITING_OPS:
            reply["d"] = True
        self._answer(served.sender, served.call_id, reply)

    def _answer(self, sender: str, call_id: Any, reply: dict[str, Any]) -> None:
        self.dp.emit(Send(sender, {"t": "data.rep", "id": call_id, "p": reply}))

    # ------------------------------------------------------------ endings
    def sweep(self, now: float) -> None:
        """Roll back participants' branches idle for ``branch_idle`` (B8)."""
        cutoff = now - self.dp.config.branch_idle
        idle = [
            bid
            for bid, br in self.branches.items()
            if not br.local and not br.busy and br.last <= cutoff
        ]
        for bid in idle:
            idle_for = self.dp.config.branch_idle
            self.dp.log("info", f"branch {bid} idle for {idle_for:.0f} s: rolled back")
            self.dp.stats["idle_rollbacks"] += 1
            self.end(bid)

    def probed(self, sender: str, msg: dict[str, Any]) -> None:
        """A coordinator's ``data.probe``: do we still run that call of its (calls.py)?"""
        call_id = msg.get("id")
        running = (sender, call_id) in self._waiting or any(
            s.sender == sender and s.call_id == call_id for s in self._served.values()
        )
        self.dp.emit(Send(sender, {"t": PROBED, "id": call_id, "r": running}))

    def keep_alive(self) -> None:
        """Tell the coordinators of the long ops running here (``calls.LONG_OPS``: an
        overwrite's swap) that they still run, so they wait on (``calls.BUSY``)."""
        for served in self._served.values():
            if served.op in LONG_OPS:
                self.dp.emit(Send(served.sender, {"t": BUSY, "id": served.call_id}))

    def _end_all(self, coordinator: str, keep: Any) -> None:
        """``ends.END_ALL`` from ``coordinator``: its branches here but ``keep``'s are orphans."""
        kept = {f"{coordinator}.{sid}" for sid in keep} if isinstance(keep, list) else set()
        prefix = coordinator + "."
        self._end_waiting(coordinator, kept)
        orphans = [
            b
            for b, br in self.branches.items()
            if not br.local and b.startswith(prefix) and b not in kept
        ]
        for bid in orphans:
            self.dp.log(
                "info", f"branch {bid}: its coordinator {coordinator} ended it; rolled back"
            )
            self.dp.stats["orphan_rollbacks"] += 1
            self.end(bid)

    def _end_waiting(self, coordinator: str, kept: set[str]) -> None:
        """The branches of ``coordinator``'s requests waiting out a lapse here are over too:
        when an op goes on it finds its branch ended, never opens it (simulator seed
        437 of ``--partitions --replicas 1``: a restarted coordinator's ``end_all`` missed a
        waiting op's new branch, which then outlived its session)."""
        for (sender, _), bid in list(self._waiting.items()):
            if sender == coordinator and bid not in kept:
                self._mark_ended(bid)

    def coordinator_down(self, peer: str) -> None:
        """``peer`` is down: the branches it coordinates here roll back at once."""
        prefix = peer + "."
        self._end_waiting(peer, set())
        orphans = [b for b, br in self.branches.items() if not br.local and b.startswith(prefix)]
        for bid in orphans:
            self.dp.log("info", f"branch {bid}: its coordinator {peer} is down; rolled back")
            self.dp.stats["orphan_rollbacks"] += 1
            self.end(bid)


def _fence_of(raw: Any) -> dict[str, int] | None:
    """A ``pe`` field ``[[partition, epoch], ...]`` → {partition: epoch} (malformed: None)."""
    if not raw or not isinstance(raw, list):
        return None
    fence: dict[str, int] = {}
    for item in raw:
        if (
            isinstance(item, list | tuple)
            and len(item) == 2
            and isinstance(item[0], str)
            and isinstance(item[1], int)
        ):
            fence[item[0]] = item[1]
    return fence or None


__all__ = ["BRANCH_ISOLATION", "PEER_OPS", "WRITING_OPS", "BranchRegistry"]
