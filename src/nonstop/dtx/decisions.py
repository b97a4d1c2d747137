"""The decision log: where a distributed transaction's outcome is decided, once.

The two-phase-commit machines (:mod:`nonstop.dtx.protocol`) never decide an
outcome on their own authority when a commit is possible: the coordinator
*proposes* ``commit`` and a participant in doubt *proposes* ``abort``, and the
**first decision recorded for a gtid is the outcome for everybody**.  This
module holds what any implementation of that log must do, in two parts:

* :class:`DecisionTable` -- the deterministic state machine: first writer wins
  per gtid, plus compaction by per-coordinator *floors*.  The production
  implementation applies ``decide`` and ``forget`` entries of the Raft cluster
  log to one ``DecisionTable`` per node, in log order; the simulated log
  (:class:`nonstop.sim.scenarios.dtx_resource.SimDecisionLog`) applies them as they arrive
  at its single, durable, sometimes unavailable node.
* the **wire contract** between the machines and the log: the machines address
  the log as the pseudo node :data:`LOG` with the ``dl.*`` messages below, and
  the log answers with ``dl.decided`` / ``dl.unknown``.  A runtime that hosts
  the log in-process (Raft) turns a ``Send(LOG, ...)`` into a proposal and feeds
  the answer back as ``Received(sender=LOG, ...)``; nothing else changes.

Why floors rather than deleting single entries: once a gtid's decision is
compacted, a late ``propose(gtid, abort)`` (a duplicated, long-delayed
message) must not decide the gtid a *second* time.  A gtid is
``"<coordinator>.<seq>"`` with ``seq`` increasing per coordinator forever
(durably, across restarts), and the coordinator announces a floor: "every gtid
of mine below ``seq`` has finished phase two everywhere".  The table answers
``forgotten`` for anything below the floor, so the history is bounded by the
number of unfinished transactions, and nothing is ever decided twice.

Guarantees the log must give (what :mod:`nonstop.sim` checks it against):

1. **First writer wins, forever**: every answer for a gtid (``dl.decided``)
   carries the outcome of the first ``decide`` applied for it, until the gtid
   falls below its coordinator's floor; after that only ``forgotten``.
2. **Durable before announced**: a decision is on a majority's disk (here: the
   log node's synced disk) before any node is told about it.
3. **Liveness only with a quorum**: proposals may be lost or delayed at any
   time (the machines retry), and nothing is decided while the quorum is lost.
4. **Per-gtid agreement is all the machines need**; they do not rely on the
   total order across gtids that Raft also provides.
"""

from __future__ import annotations

from dataclasses import dataclass, field

LOG = "@decisions"
"""The pseudo node id the machines send decision-log requests to."""

COMMIT = "commit"
ABORT = "abort"
OUTCOMES = (COMMIT, ABORT)

# Requests to the log.
PROPOSE = "dl.propose"  # {"t", "g": gtid, "o": outcome, "n": [nodes to tell]}
LOOKUP = "dl.lookup"  # {"t", "g"}
FORGET = "dl.forget"  # {"t", "c": coordinator, "f": floor}
# Answers from the log.
DECIDED = "dl.decided"  # {"t", "g", "o"}
UNKNOWN = "dl.unknown"  # {"t", "g", "forgotten": bool}
FORGOT = "dl.forgot"  # {"t", "c", "f"}: the floor is applied (the coordinator stops resending)


def make_gtid(coordinator: str, seq: int) -> str:
    """A global transaction id: the coordinator's name and its per-coordinator sequence."""
    return f"{coordinator}.{seq}"


def parse_gtid(gtid: object) -> tuple[str, int] | None:
    """``(coordinator, seq)`` of a well-formed gtid, else None (malformed input is dropped)."""
    if not isinstance(gtid, str):
        return None
    coord, dot, seq = gtid.rpartition(".")
    if not dot or not coord or not seq.isdigit() or len(seq) > 18:
        return None
    return coord, int(seq)


@dataclass(slots=True)
class DecisionTable:
    """First-writer-wins decisions with per-coordinator floors (see the module doc).

    Deterministic and side-effect free: the same sequence of ``decide`` and
    ``forget`` calls gives the same table on every node, which is what lets the
    Raft log replicate it by replicating the calls.
    """

    decisions: dict[str, str] = field(default_factory=dict)
    floors: dict[str, int] = field(default_factory=dict)

    def forgotten(self, gtid: str) -> bool:
        parsed = parse_gtid(gtid)
        if parsed is None:
            return False
        coord, seq = parsed
        return seq < self.floors.get(coord, 0)

    def decide(self, gtid: str, outcome: str) -> str | None:
        """Apply ``decide(gtid, outcome)``; return *the* outcome (None: forgotten).

        Raises ValueError for a malformed gtid or outcome: callers validate input
        before it reaches the log, so this is a bug, not bad input.
        """
        if outcome not in OUTCOMES or parse_gtid(gtid) is None:
            raise ValueError(f"bad decision {gtid!r} {outcome!r}")
        if self.forgotten(gtid):
            return None
        return self.decisions.setdefault(gtid, outcome)

    def lookup(self, gtid: str) -> str | None:
        return self.decisions.get(gtid)

    def forget(self, coordinator: str, floor: int) -> list[str]:
        """Raise ``coordinator``'s floor to ``floor``; return the gtids compacted away."""
        if floor <= self.floors.get(coordinator, 0):
            return []
        self.floors[coordinator] = floor
        gone = []
        for gtid in list(self.decisions):
            parsed = parse_gtid(gtid)
            if parsed is not None and parsed[0] == coordinator and parsed[1] < floor:
                del self.decisions[gtid]
                gone.append(gtid)
        return gone
