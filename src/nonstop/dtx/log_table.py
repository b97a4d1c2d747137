"""The commit-decision table as a table of the cluster log: :class:`DecisionLogTable`.

The decision log of distributed commit (:mod:`nonstop.dtx.decisions`) is the
cluster's Raft log (dtx.md section 8.1, cluster-log.md "Tables of the log").
This module is the part that knows both: a
:class:`~nonstop.cluster.tables.LogTable` registered with the node's
:class:`~nonstop.cluster.node.ClusterNode` (by
:class:`~nonstop.dtx.clustered.DtxClusterNode`), which

* turns the DtxNode's ``dl.*`` requests into log entries (:meth:`request`),
  validated before they reach the log: ``{"dl": "decide", "g", "o", "n"}``,
  ``{"dl": "forget", "c", "f"}``, ``{"dl": "lookup", "g"}``, each stamped by
  the cluster node with ``"r": [node, incarnation]``;
* applies them in log order on every node to a
  :class:`~nonstop.dtx.decisions.DecisionTable` (first writer wins, floors),
  kept in every snapshot as ``{"d": decisions, "f": floors}`` under ``"dl"``
  -- the layout of the snapshots written before the table was a plug-in;
* produces the log's answers (``dl.decided`` / ``dl.unknown`` / ``dl.forgot``)
  for the local DtxNode when an entry is applied here (:meth:`take_answers`),
  and a ``dl.decided`` notification on every node for every decision.

Lookups are linearizable because they are entries too: the answer is the table
as applied at the lookup's own position in the log, so it reflects every
decision committed before the lookup was asked.  (A read index would save the
entry, but lookups are rare -- recovery and in-doubt participants -- and the
entry needs no extra machinery.)
"""

from __future__ import annotations

from typing import Any

from nonstop.cluster.node import ClusterNode
from nonstop.cluster.tables import REQUESTER
from nonstop.dtx.decisions import (
    DECIDED,
    FORGET,
    FORGOT,
    LOOKUP,
    OUTCOMES,
    PROPOSE,
    UNKNOWN,
    DecisionTable,
    parse_gtid,
)
from nonstop.runtime.interface import Action, Log, NodeId, Notify

TABLE = "dl"
"""The table's name: the tag of its entries, its message kind and its snapshot key."""

DECIDE_ENTRY = "decide"
FORGET_ENTRY = "forget"
LOOKUP_ENTRY = "lookup"
_REQUEST_OF_ENTRY = {DECIDE_ENTRY: PROPOSE, LOOKUP_ENTRY: LOOKUP, FORGET_ENTRY: FORGET}


def entry_for(payload: Any, requester: NodeId) -> dict[str, Any] | None:
    """The log entry for a ``dl.*`` request of ``requester``, or None if it is malformed.

    Bad input never reaches the log; only a coordinator moves its own floor
    (dtx.md section 7, point 5).
    """
    if not isinstance(payload, dict):
        return None
    kind = payload.get("t")
    if kind == FORGET:
        coord, floor = payload.get("c"), payload.get("f")
        if coord != requester or not isinstance(floor, int) or isinstance(floor, bool):
            return None
        return {TABLE: FORGET_ENTRY, "c": coord, "f": floor}
    gtid = payload.get("g")
    if parse_gtid(gtid) is None:
        return None
    if kind == LOOKUP:
        return {TABLE: LOOKUP_ENTRY, "g": gtid}
    if kind == PROPOSE:
        tell = payload.get("n", [])
        if payload.get("o") not in OUTCOMES or not isinstance(tell, list):
            return None
        names = sorted({n for n in tell if isinstance(n, str)})
        return {TABLE: DECIDE_ENTRY, "g": gtid, "o": payload["o"], "n": names}
    return None


class DecisionLogTable:
    """The decision table applied from the cluster log, and its requests (module doc)."""

    def __init__(self, cluster: ClusterNode) -> None:
        self.cluster = cluster
        self.table = DecisionTable()
        self._answers: list[dict[str, Any]] = []

    @property
    def name(self) -> str:
        return TABLE

    # ------------------------------------------------------------ requests
    def request(self, now: float, payload: Any) -> list[Action]:
        """A request of the local DtxNode (``Send(to="@decisions")``) into the log.

        ``dl.propose`` and ``dl.forget`` become ``decide``/``forget`` entries,
        ``dl.lookup`` a ``lookup`` entry.  Nothing is answered now: answers come
        when the entry is applied here (:meth:`take_answers`).  Without quorum,
        leader or valid input the request is dropped: the machine retries
        (dtx.md section 7, point 3).
        """
        entry = entry_for(payload, self.cluster.name)
        if entry is None:
            return [Log("warning", f"decision log: malformed request {payload!r:.80}")]
        return self.cluster.submit(now, TABLE, entry)

    def take_answers(self) -> list[dict[str, Any]]:
        """The log's answers for the local DtxNode since the last call, in order."""
        answers, self._answers = self._answers, []
        return answers

    # ------------------------------------------------------------ LogTable
    def forwarded(self, sender: NodeId, entry: dict[str, Any]) -> dict[str, Any] | None:
        """A request a peer forwarded (entry form), validated as if it were local."""
        payload = dict(entry)
        kind = entry.get(TABLE)
        payload["t"] = _REQUEST_OF_ENTRY.get(kind) if isinstance(kind, str) else None
        return entry_for(payload, sender)

    def request_key(self, entry: dict[str, Any]) -> tuple[Any, ...]:
        return (entry[TABLE], entry.get("g"), entry.get("o"), entry.get("c"), entry.get("f"))

    def snapshot(self) -> dict[str, Any]:
        return {"d": self.table.decisions, "f": self.table.floors}

    def restore(self, state: Any) -> None:
        state = state or {}
        self.table = DecisionTable(
            dict(state.get("d", {})), {c: int(f) for c, f in state.get("f", {}).items()}
        )

    def apply(self, index: int, entry: dict[str, Any]) -> list[Action]:
        """Apply a decision-log entry to the table (every node, same order) and answer.

        Only the incarnation that asked (``r`` = name and this incarnation's nonce) gets the
        answer: a restarted node re-applying its log must not hear stale ``unknown``
        answers meant for its previous life.  ``dl.decided`` also goes to the nodes named in
        a new decision's ``n`` -- always the table's outcome, never the proposal's.
        """
        kind = entry.get(TABLE)
        me = self.cluster.name
        mine = entry.get(REQUESTER) == [me, self.cluster.incarnation]
        actions: list[Action] = []
        if kind == FORGET_ENTRY:
            coord, floor = entry.get("c"), entry.get("f")
            if not isinstance(coord, str) or not isinstance(floor, int):
                return [Log("error", f"decision log: bad forget entry {entry!r:.80}")]
            self.table.forget(coord, floor)
            if mine:
                self._answers.append({"t": FORGOT, "c": coord, "f": floor})
            return actions
        gtid = entry.get("g")
        if parse_gtid(gtid) is None:
            return [Log("error", f"decision log: bad entry {entry!r:.80}")]
        assert isinstance(gtid, str)
        if kind == LOOKUP_ENTRY:
            if mine:
                outcome = self.table.lookup(gtid)
                if outcome is not None:
                    self._answers.append({"t": DECIDED, "g": gtid, "o": outcome})
                else:
                    forgotten = self.table.forgotten(gtid)
                    self._answers.append({"t": UNKNOWN, "g": gtid, "forgotten": forgotten})
            return actions
        if kind != DECIDE_ENTRY or entry.get("o") not in OUTCOMES:
            return [Log("error", f"decision log: bad entry {entry!r:.80}")]
        known = self.table.lookup(gtid)
        decided = self.table.decide(gtid, entry["o"])
        if decided is None:
            if mine:
                self._answers.append({"t": UNKNOWN, "g": gtid, "forgotten": True})
            return actions
        actions.append(Notify("dl.decided", {"g": gtid, "o": decided}))
        tell = entry.get("n", []) if known is None else []
        if mine or me in tell:
            self._answers.append({"t": DECIDED, "g": gtid, "o": decided})
        return actions


__all__ = ["TABLE", "DecisionLogTable", "entry_for"]
