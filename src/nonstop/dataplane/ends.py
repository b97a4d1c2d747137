"""The branch ends a coordinator owes its peers: ``branch.end`` until the node answers.

The rule (dataplane-machine.md §5a, issue 14): a coordinator that opened, or may
have opened, a branch on a node -- an op sent there, its reply unknown -- ends it
there when the session ends or fails, and keeps telling that node until it
answers.  A node that is not up when the session ends is told as soon as it is
up again; a node that does not answer is told again every ``rpc_timeout`` while
it is up.  Any answer settles it: the participant's ``branch.end`` rolls the
branch back if it holds it and remembers the id as ended either way, so a first
op that reaches it later (held in a link's backlog or a TCP buffer across a
partition) is refused instead of opening a branch nobody will end.

Without this a session that failed while a node was unreachable left that
node's branch to ``branch_idle`` (90 s) as soon as its first op arrived late,
and with it the write locks it took.

``stats["ends_late"]`` counts the ends sent after the session's end (the node was
not up then, or did not answer).

Cost: one entry per (node, branch) from the session's end until the answer
(one round trip); no timer of its own (retries ride on the ``dp.sweep`` tick).
"""

from __future__ import annotations

import collections
from typing import TYPE_CHECKING, Any

from nonstop.runtime.interface import Send

if TYPE_CHECKING:
    from nonstop.dataplane.machine import DataPlane

END_ALL = "branch.end_all"
"""``{"op": END_ALL, "b": "<coordinator>.", "keep": [sid, ...]}``: end every branch of
the sender held here but those of the sessions ``keep`` (:meth:`OwedEnds.node_up`)."""

MAX_OWED = 100_000
"""Ends remembered at most (the oldest are dropped: their participant's
``branch_idle`` remains the backstop)."""


class OwedEnds:
    """``branch.end`` messages sent, or to send, and not answered yet (module doc)."""

    def __init__(self, dp: DataPlane) -> None:
        self.dp = dp
        self._owed: collections.OrderedDict[tuple[str, str], float | None] = (
            collections.OrderedDict()
        )
        """(node, branch id or :data:`END_ALL`) → when it was last sent (None: not yet, the node
        is not up)."""
        self._ids: collections.OrderedDict[int, tuple[str, str]] = collections.OrderedDict()
        """Call id of each ``branch.end`` sent → (node, branch id)."""

    def __len__(self) -> int:
        return len(self._owed)

    def owe(self, node: str, bid: str) -> None:
        """The session of ``bid`` is over and may have a branch on ``node``: end it there."""
        key = (node, bid)
        self._owed[key] = None
        while len(self._owed) > MAX_OWED:
            self._owed.popitem(last=False)
        if node in self.dp.view.up:
            self._send(key)

    def answered(self, sender: str, msg: dict[str, Any]) -> bool:
        """A ``data.rep``: True if it answers a ``branch.end`` (which is then settled)."""
        call_id = msg.get("id")
        if not isinstance(call_id, int):
            return False
        key = self._ids.get(call_id)
        if key is None or key[0] != sender:
            return False
        del self._ids[call_id]
        self._owed.pop(key, None)
        return True

    def node_up(self, node: str) -> None:
        """``node`` is up again (or for the first time since this node started): tell it
        the ends it missed, and to end every other branch of ours it holds but those of
        our sessions still open there (:data:`END_ALL`, until it answers).

        When a peer comes up no active session of ours has a branch there (those were
        rolled back when it left Up), so what it holds of ours beyond ``keep`` (the
        sessions committing with a branch there) is an orphan: a branch whose first op
        reached it after we gave up on it, or one of this node's previous incarnation
        when it restarted too fast for the peer to see it down.
        """
        for key in [k for k in self._owed if k[0] == node]:
            self.dp.stats["ends_late"] += 1
            self._send(key)
        self._send((node, END_ALL))

    def retry(self, now: float) -> None:
        """The ``dp.sweep`` tick: tell again the up nodes silent for ``rpc_timeout``."""
        if not self._owed:
            return
        cutoff = now - self.dp.config.rpc_timeout
        up = self.dp.view.up
        for key, sent in list(self._owed.items()):
            if key[0] in up and (sent is None or sent <= cutoff):
                self.dp.stats["ends_late"] += 1
                self._send(key)

    def _send(self, key: tuple[str, str]) -> None:
        node, bid = key
        call_id = self.dp.calls.next_id()
        self._ids[call_id] = key
        while len(self._ids) > 2 * MAX_OWED:
            self._ids.popitem(last=False)
        self._owed[key] = self.dp.now
        self.dp.stats["rpc"] += 1
        msg: dict[str, Any] = {"t": "data.req", "id": call_id, "op": "branch.end", "b": bid}
        if bid == END_ALL:
            # The sessions to keep are read at each sending: a session that opened a
            # branch there since the last one is among them (its op was sent first).
            msg["op"], msg["b"], msg["keep"] = (
                END_ALL,
                f"{self.dp.name}.",
                self.dp.sessions_on(node),
            )
        self.dp.emit(Send(node, msg))


__all__ = ["END_ALL", "MAX_OWED", "OwedEnds"]
