"""A branch still preparing is not timed out as a lock wait is (``Working``, dtx.md §5).

An overwrite's branch of hundreds of thousands of objects spends seconds in its
prepare after its ops are done (its write set encoded, replicated to its
partitions' replicas): before, ``branch_timeout`` (4 s on real nodes) aborted it
on a loaded machine, the coordinator retried, and the swap never committed.  Now
the resource manager reports :class:`Working`; the branch then waits up to
``prepare_limit`` while its coordinator is up, and says ``WORKING`` to the
coordinator, which holds its ``vote_timeout`` back as long (not past its own
limit).  Every other timeout stands: a lock wait, a dead coordinator, a dead
participant, a prepare that outlives ``prepare_limit``.
"""

from __future__ import annotations

from tests.unit.test_dtx_protocol import CFG, Harness, prepare_msg, replies, sends, start_transfer

from nonstop.dtx.protocol import RM, VOTE, WORKING, Ready, Working
from nonstop.runtime.interface import Log


def _waiting_branch() -> Harness:
    """p1 with c.1 prepared on x and d.1 waiting for x's lock (still 'locking')."""
    p = Harness("p1", {"x": 100})
    p.recv("c", prepare_msg("c.1", [["add", "x", -30]]))
    p.sync()
    p.recv("d", prepare_msg("d.1", [["add", "x", 1]]))
    assert p.node.branches["d.1"].state == "locking"
    return p


def test_a_working_branch_outlives_branch_timeout_and_tells_its_coordinator() -> None:
    p = _waiting_branch()
    p.recv(p.name, {"t": RM, "p": [Working("d.1")]})
    told = []
    for _ in range(12):  # 0.6 s: past branch_timeout (0.4)
        acts = p.tick(0.05)
        assert sends(acts, VOTE, "d") == [], "no vote while it works"
        told += sends(acts, WORKING, "d")
    assert "d.1" in p.node.branches
    assert len(told) >= 5 and all(s.payload == {"t": WORKING, "g": "d.1"} for s in told)
    # Past prepare_limit (2.0 s after the prepare arrived): aborted as before.
    votes = []
    while p.now < 2.1:
        votes += sends(p.tick(0.05), VOTE, "d")
    assert [v.payload["v"] for v in votes] == ["no"] and "d.1" not in p.node.branches


def test_a_branch_not_working_or_of_a_dead_coordinator_times_out_as_before() -> None:
    p = _waiting_branch()  # no Working: a lock wait
    votes = []
    while p.now < 0.5:
        votes += sends(p.tick(0.05), VOTE, "d")
    assert [v.payload["v"] for v in votes] == ["no"]
    p = _waiting_branch()
    p.recv(p.name, {"t": RM, "p": [Working("d.1")]})
    p.node.peers_down(p.now, frozenset({"d"}))
    assert [v.payload["v"] for v in sends(p.tick(0.05), VOTE, "d")] == ["no"]


def test_working_holds_the_coordinators_vote_timeout_back_up_to_its_limit() -> None:
    c = Harness("c")
    gtid = start_transfer(c)
    c.recv("p1", {"t": VOTE, "g": gtid, "v": "yes", "r": {}})
    c.tick(0.35)
    c.recv("p2", {"t": WORKING, "g": gtid})  # at 0.35 s: deadline 0.85 s
    assert replies(c.tick(0.3)) == [], "past vote_timeout (0.5), p2 still working"
    (reply,) = replies(c.tick(0.3))  # 0.95 s, nothing heard since: Unavailable
    assert reply["ok"] is False and "p2" in reply["why"]
    # However long a participant works, the coordinator waits no longer than its limit.
    c = Harness("c")
    gtid = start_transfer(c)
    started, answered = c.now, []
    while not answered and c.now < started + 5:
        c.recv("p2", {"t": WORKING, "g": gtid})
        answered = replies(c.tick(0.05))
    limit = CFG.vote_timeout + CFG.prepare_limit
    assert answered and answered[0]["ok"] is False
    assert limit - 0.1 <= c.now - started <= limit + 0.2


def test_working_does_not_hold_back_an_abort_for_a_dead_participant() -> None:
    c = Harness("c")
    gtid = start_transfer(c)
    c.node.peers_down(c.now, frozenset({"p1"}))
    c.recv("p2", {"t": WORKING, "g": gtid})
    (reply,) = replies(c.tick(0.05))
    assert reply["ok"] is False


def test_a_working_branch_still_tells_its_coordinator_while_its_record_is_made_durable() -> None:
    """A swap's prepared record is megabytes: its fsync on a loaded disk took seconds, and
    the coordinator, told nothing meanwhile, gave up on every participant at once ("no vote
    from A, B, C", the swap retried).  A working branch whose record is being persisted is
    still working: it says so until the record is durable, then votes."""
    p = _waiting_branch()
    p.recv(p.name, {"t": RM, "p": [Working("d.1")]})
    p.recv(p.name, {"t": RM, "p": [Ready("d.1", b"a large record", {})]})
    assert p.node.branches["d.1"].state == "persisting"
    told = []
    for _ in range(12):  # 0.6 s without the record durable
        acts = p.tick(0.05)
        assert sends(acts, VOTE, "d") == []
        told += sends(acts, WORKING, "d")
    assert len(told) >= 5
    votes = sends(p.sync(), VOTE, "d")
    assert [v.payload["v"] for v in votes] == ["yes"]
    assert sends(p.tick(0.2), WORKING, "d") == []  # voted: nothing more to say


def test_a_branch_that_never_worked_says_nothing_while_it_persists() -> None:
    p = _waiting_branch()
    p.recv(p.name, {"t": RM, "p": [Ready("d.1", b"record", {})]})
    assert p.node.branches["d.1"].state == "persisting"
    assert all(sends(p.tick(0.05), WORKING, "d") == [] for _ in range(12))


def test_the_coordinator_says_why_it_gave_up_on_a_vote() -> None:
    c = Harness("c")
    gtid = start_transfer(c)
    c.recv("p1", {"t": VOTE, "g": gtid, "v": "yes", "r": {}})
    logs = []
    while c.now < 1.0:
        logs += [a for a in c.tick(0.05) if isinstance(a, Log)]
    assert any("no vote from p2" in a.message and "aborted" in a.message for a in logs)
