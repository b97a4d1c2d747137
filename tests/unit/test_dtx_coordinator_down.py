"""A dead coordinator's branches stop waiting for it (``DtxNode.peers_down``, dtx.md §5).

Before: a participant prepared for a coordinator that was SIGKILLed kept its branch
and its locks for ``decision_timeout`` (10 s on real nodes) when no promotion
resolved it (the partition did not move), so every transaction touching the same
objects waited ``lock_wait`` per attempt.  Now the failure detector's verdict ends
the wait at the next tick: the participant asks the log (proposing abort), and the
log's answer -- whatever it holds first -- is applied.
"""

from __future__ import annotations

from tests.unit.test_dtx_protocol import (
    Harness,
    notes,
    prepare_msg,
    replies,
    sends,
    start_transfer,
)

from nonstop.dtx.decisions import ABORT, COMMIT, DECIDED, LOG, PROPOSE
from nonstop.dtx.protocol import OUTCOME, VOTE


def test_a_prepared_branch_of_a_dead_coordinator_asks_the_log_at_the_next_tick() -> None:
    p = Harness("p1", {"x": 100})
    p.recv("c", prepare_msg("c.1", [["add", "x", -30]]))
    p.sync()
    assert sends(p.tick(0.05), PROPOSE) == [], "a live coordinator is waited for"
    p.node.peers_down(p.now, frozenset({"c"}))
    (prop,) = sends(p.tick(0.05), PROPOSE, LOG)  # far before decision_timeout (0.6)
    assert prop.payload["o"] == ABORT and prop.payload["g"] == "c.1"
    # The coordinator had decided commit before it died: the log's answer wins.
    p.recv(LOG, {"t": DECIDED, "g": "c.1", "o": COMMIT})
    acts = p.sync()
    assert notes(acts, "dtx.resolved")[0]["o"] == COMMIT and getattr(p.node.rm, "kv")["x"] == 70  # noqa: B009  (the simulated RM's)


def test_a_branch_still_locking_for_a_dead_coordinator_is_aborted_at_once() -> None:
    p = Harness("p1", {"x": 100})
    p.recv("c", prepare_msg("c.1", [["add", "x", -30]]))
    p.sync()
    p.recv("d", prepare_msg("d.1", [["add", "x", 1]]))  # waits for c.1's lock
    p.node.peers_down(p.now, frozenset({"d"}))
    acts = p.tick(0.05)  # far before branch_timeout (0.4)
    assert [s.payload["v"] for s in sends(acts, VOTE, "d")] == ["no"]
    assert "d.1" not in p.node.branches and "c.1" in p.node.branches


def test_a_branch_prepared_after_its_coordinator_died_does_not_wait_either() -> None:
    p = Harness("p1", {"x": 100, "y": 5})
    p.node.peers_down(p.now, frozenset({"c"}))
    p.recv("c", prepare_msg("c.1", [["add", "x", -30]]))  # in flight when it died
    p.sync()
    assert sends(p.tick(0.05), PROPOSE, LOG)
    # Up again (the set shrinks): a new branch of it waits decision_timeout as before.
    p.node.peers_down(p.now, frozenset())
    p.recv("c", prepare_msg("c.2", [["add", "y", -1]]))
    p.sync()
    assert p.node.branches["c.2"].state == "prepared"
    asked = [s.payload["g"] for s in sends(p.tick(0.1), PROPOSE, LOG)]
    assert asked == ["c.1"], "c.1 asked again until answered, c.2 waits for its coordinator"


def test_a_coordinator_waiting_for_a_dead_participants_vote_aborts_at_once() -> None:
    c = Harness("c")
    gtid = start_transfer(c)
    c.recv("p1", {"t": VOTE, "g": gtid, "v": "yes", "r": {}})
    assert replies(c.tick(0.05)) == [], "a live participant's vote is waited for"
    c.node.peers_down(c.now, frozenset({"p2"}))
    acts = c.tick(0.05)  # far before vote_timeout (0.5)
    (reply,) = replies(acts)
    assert reply["ok"] is False and reply["outcome"] == ABORT
    assert sends(acts, PROPOSE) == [], "aborted on its own authority: no commit was proposed"
    assert {s.to for s in sends(acts, OUTCOME)} >= {"p1"}, "p1's prepared branch is released"
