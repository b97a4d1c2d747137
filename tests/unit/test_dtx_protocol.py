"""Transitions of the distributed-commit machines, one event at a time.

The simulation campaign (tests/sim/test_dtx.py) proves the protocol under
faults; these tests pin down each rule on its own, including the inputs a
network produces: duplicated, late, malformed and misaddressed messages.
"""

from __future__ import annotations

import random
from typing import Any

import msgpack
import pytest

from nonstop.dtx.decisions import (
    ABORT,
    COMMIT,
    DECIDED,
    FORGET,
    LOG,
    LOOKUP,
    PROPOSE,
    UNKNOWN,
    DecisionTable,
    make_gtid,
    parse_gtid,
)
from nonstop.dtx.protocol import (
    ACK,
    K_COORD,
    K_PREPARED,
    K_TOMB,
    OUTCOME,
    PREPARE,
    TICK,
    VOTE,
    DtxConfig,
    DtxNode,
)
from nonstop.runtime.interface import (
    Action,
    ClientRequest,
    Log,
    Notify,
    Persist,
    Persisted,
    Received,
    Reply,
    Send,
    SetTimer,
    TimerFired,
)
from nonstop.sim.harness import Harness as Driver
from nonstop.sim.harness import VirtualClock
from nonstop.sim.scenarios.dtx_resource import SimDecisionLog, SimResourceManager

CFG = DtxConfig(tick=0.05, retry=0.1, vote_timeout=0.5, branch_timeout=0.4, decision_timeout=0.6)


class Harness:
    """One DtxNode with a durable dict: Persist is applied when the test says it synced.

    The tests' driver (:class:`nonstop.sim.harness.Harness`) with its disk by hand; the test
    gives every event its time, and nothing else runs (messages and timers stay scheduled:
    the test inspects the actions and plays the other nodes itself).
    """

    def __init__(self, name: str, accounts: dict[str, int] | None = None) -> None:
        self.name = name
        self.accounts = accounts or {}
        self.clock = VirtualClock()
        self.driver = Driver(self.clock)
        self.boot()

    @property
    def now(self) -> float:
        return self.clock.now

    @property
    def disk(self) -> dict[bytes, bytes]:
        return self.driver.durable(self.name)

    @property
    def unsynced(self) -> list[Persist]:
        return self.driver.disks[self.name].pending

    def boot(self) -> list[Action]:
        rm = SimResourceManager(self.accounts, self.disk)
        self.node = DtxNode(self.name, rm, random.Random(1), dict(self.disk), CFG)
        return self.driver.boot(self.name, self.node)

    def step(self, event: Any) -> list[Action]:
        self.clock.advance(event.now)
        return self.driver.deliver(self.name, event)

    def sync(self) -> list[Action]:
        """fsync everything buffered and deliver the Persisted events."""
        return self.driver.sync(self.name)

    def recv(self, sender: str, payload: Any, dt: float = 0.001) -> list[Action]:
        return self.step(Received(self.now + dt, sender, payload))

    def tick(self, dt: float) -> list[Action]:
        return self.step(TimerFired(self.now + dt, TICK))

    def crash(self) -> list[Action]:
        self.driver.crash(self.name)
        return self.boot()


def sends(actions: list[Action], t: str | None = None, to: str | None = None) -> list[Send]:
    return [
        a
        for a in actions
        if isinstance(a, Send)
        and (t is None or a.payload.get("t") == t)
        and (to is None or a.to == to)
    ]


def replies(actions: list[Action]) -> list[Any]:
    return [a.payload for a in actions if isinstance(a, Reply)]


def notes(actions: list[Action], kind: str) -> list[dict[str, Any]]:
    return [a.data for a in actions if isinstance(a, Notify) and a.kind == kind]


TRANSFER = {
    "op": "run",
    "branches": {"p1": [["add", "x", -10]], "p2": [["add", "y", 10]]},
}


def start_transfer(c: Harness) -> str:
    acts = c.step(ClientRequest(c.now, 7, TRANSFER))
    assert sends(acts) == [], "nothing leaves before the record is durable"
    assert any(isinstance(a, Persist) for a in acts)
    acts = c.sync()
    prepares = sends(acts, PREPARE)
    assert sorted(s.to for s in prepares) == ["p1", "p2"]
    gtid = prepares[0].payload["g"]
    assert notes(acts, "dtx.begin")[0]["g"] == gtid
    return gtid


# ----------------------------------------------------------------- decision table
def test_gtids_parse_and_reject_garbage():
    assert parse_gtid(make_gtid("n.1", 42)) == ("n.1", 42)
    for bad in (None, 3, "", "n1", "n1.", ".3", "n1.x", "n1.-3", b"n1.3", "n1." + "9" * 30):
        assert parse_gtid(bad) is None


def test_decision_table_first_writer_wins_and_floors_forget_for_good():
    t = DecisionTable()
    assert t.decide("c.1", COMMIT) == COMMIT
    assert t.decide("c.1", ABORT) == COMMIT  # the first decision stays
    assert t.decide("c.2", ABORT) == ABORT
    assert t.decide("d.1", ABORT) == ABORT
    assert t.forget("c", 2) == ["c.1"]
    assert t.forget("c", 1) == []  # floors never go down
    assert t.decide("c.1", ABORT) is None  # a late proposal cannot decide it again
    assert t.forgotten("c.1") and not t.forgotten("c.2")
    assert t.lookup("c.2") == ABORT and t.lookup("d.1") == ABORT
    with pytest.raises(ValueError):
        t.decide("c.3", "maybe")


def test_sim_log_announces_only_durable_decisions_and_keeps_the_first():
    log = SimDecisionLog(random.Random(0), {})
    acts = log.handle(Received(0.0, "c", {"t": PROPOSE, "g": "c.1", "o": COMMIT, "n": ["p1"]}))
    assert [type(a) for a in acts] == [Persist]
    token = acts[0].token
    # A competing proposal and a lookup before the fsync: answered after it, with the first.
    assert log.handle(Received(0.0, "p1", {"t": PROPOSE, "g": "c.1", "o": ABORT})) == []
    assert log.handle(Received(0.0, "p2", {"t": LOOKUP, "g": "c.1"})) == []
    acts = log.handle(Persisted(0.1, token))
    told = {(s.to, s.payload["o"]) for s in sends(acts, DECIDED)}
    assert told == {("c", COMMIT), ("p1", COMMIT), ("p2", COMMIT)}
    assert notes(acts, "dl.decided") == [{"g": "c.1", "o": COMMIT}]
    acts = log.handle(Received(0.2, "p1", {"t": PROPOSE, "g": "c.1", "o": ABORT}))
    assert [s.payload["o"] for s in sends(acts, DECIDED)] == [COMMIT]
    # Undecided lookups say so; compaction makes later proposals 'forgotten'.
    acts = log.handle(Received(0.3, "p1", {"t": LOOKUP, "g": "c.9"}))
    assert sends(acts, UNKNOWN)[0].payload["forgotten"] is False
    acts = log.handle(Received(0.3, "c", {"t": FORGET, "c": "c", "f": 2}))
    assert any(isinstance(a, Persist) for a in acts)
    acts = log.handle(Received(0.4, "p1", {"t": PROPOSE, "g": "c.1", "o": ABORT}))
    assert sends(acts, UNKNOWN)[0].payload["forgotten"] is True
    # Only a coordinator may raise its own floor; garbage is logged, never raised.
    assert isinstance(log.handle(Received(0.5, "x", {"t": FORGET, "c": "c", "f": 9}))[0], Log)
    for junk in (None, [], {"t": PROPOSE}, {"t": PROPOSE, "g": "c.5", "o": "x"}, {"t": "?"}):
        assert all(isinstance(a, Log) for a in log.handle(Received(0.6, "z", junk)))


# ----------------------------------------------------------------- coordinator
def test_coordinator_commits_only_after_the_log_decided():
    c = Harness("c")
    gtid = start_transfer(c)
    acts = c.recv("p1", {"t": VOTE, "g": gtid, "v": "yes", "r": {}})
    assert sends(acts) == []
    acts = c.recv("p2", {"t": VOTE, "g": gtid, "v": "yes", "r": {"y": 5}})
    (prop,) = sends(acts, PROPOSE, LOG)
    assert prop.payload["o"] == COMMIT and set(prop.payload["n"]) == {"c", "p1", "p2"}
    assert replies(acts) == [] and sends(acts, OUTCOME) == []
    # The decision arrives: phase two; the reply waits for every participant to apply.
    acts = c.recv(LOG, {"t": DECIDED, "g": gtid, "o": COMMIT})
    assert replies(acts) == []
    assert sorted(s.to for s in sends(acts, OUTCOME)) == ["p1", "p2"]
    # Duplicated decision and duplicated votes change nothing.
    assert c.recv(LOG, {"t": DECIDED, "g": gtid, "o": COMMIT}) == []
    assert c.recv("p1", {"t": VOTE, "g": gtid, "v": "no"}) == []
    # Phase two is retried until every participant acknowledged.
    assert replies(c.recv("p1", {"t": ACK, "g": gtid})) == []
    acts = c.tick(0.2)
    assert [s.to for s in sends(acts, OUTCOME)] == ["p2"] and replies(acts) == []
    acts = c.recv("p2", {"t": ACK, "g": gtid})
    # Every participant applied it: now the client hears it committed (read-your-writes).
    assert replies(acts) == [{"ok": True, "outcome": COMMIT, "g": gtid, "reads": {"y": 5}}]
    assert notes(acts, "dtx.finished") == [{"g": gtid, "o": COMMIT}]
    # Compaction is batched: the floor goes to the log on the tick, once per forget_every.
    assert sends(acts, FORGET) == []
    assert sends(c.tick(1.0), FORGET, LOG)[0].payload == {"t": FORGET, "c": "c", "f": 2}
    assert sends(c.tick(0.5), FORGET) == []  # not yet resent
    assert sends(c.tick(0.6), FORGET, LOG)[0].payload["f"] == 2  # unconfirmed: resent
    c.recv(LOG, {"t": "dl.forgot", "c": "c", "f": 2})
    assert sends(c.tick(1.1), FORGET) == []  # confirmed
    c.sync()
    assert not any(k.startswith(K_COORD) for k in c.disk)
    assert c.recv("p2", {"t": ACK, "g": gtid}) == []  # late ack of a finished gtid


def test_a_participant_that_does_not_apply_holds_the_reply_back_only_apply_wait():
    c = Harness("c")
    gtid = start_transfer(c)
    c.recv("p1", {"t": VOTE, "g": gtid, "v": "yes", "r": {}})
    c.recv("p2", {"t": VOTE, "g": gtid, "v": "yes", "r": {}})
    decided_at = c.now
    assert replies(c.recv(LOG, {"t": DECIDED, "g": gtid, "o": COMMIT})) == []
    c.recv("p1", {"t": ACK, "g": gtid})
    # p2 is down: the reply leaves at apply_wait after the decision, naming it.
    acts = c.tick(CFG.apply_wait - 0.05)
    assert replies(acts) == []
    acts = c.tick(0.1)
    assert c.now - decided_at >= CFG.apply_wait
    (reply,) = replies(acts)
    assert reply["ok"] is True and reply["unapplied"] == ["p2"]
    # Phase two goes on until p2 acks; the client is answered once only.
    assert [s.to for s in sends(c.tick(0.2), OUTCOME)] == ["p2"]
    acts = c.recv("p2", {"t": ACK, "g": gtid})
    assert replies(acts) == [] and notes(acts, "dtx.finished") == [{"g": gtid, "o": COMMIT}]


def test_a_no_vote_aborts_without_the_log_and_rolls_back_everywhere():
    c = Harness("c")
    gtid = start_transfer(c)
    c.recv("p1", {"t": VOTE, "g": gtid, "v": "yes", "r": {}})
    acts = c.recv("p2", {"t": VOTE, "g": gtid, "v": "no", "why": "insufficient funds"})
    (reply,) = replies(acts)
    assert reply["outcome"] == ABORT and reply["error"] == "Aborted"
    assert sends(acts, PROPOSE) == []
    assert {(s.to, s.payload["o"]) for s in sends(acts, OUTCOME)} == {
        ("p1", ABORT),
        ("p2", ABORT),
    }
    # A later yes (duplicate, reordered) cannot revive it.
    assert sends(c.recv("p2", {"t": VOTE, "g": gtid, "v": "yes", "r": {}}), PROPOSE) == []


def test_missing_votes_mean_unavailable_and_rollback_until_acknowledged():
    c = Harness("c")
    gtid = start_transfer(c)
    c.recv("p1", {"t": VOTE, "g": gtid, "v": "yes", "r": {}})
    acts = c.tick(0.15)
    assert [s.to for s in sends(acts, PREPARE)] == ["p2"]  # prepares are retransmitted
    acts = c.tick(0.5)
    (reply,) = replies(acts)
    assert reply["error"] == "Unavailable" and reply["outcome"] == ABORT
    for _ in range(3):  # B8: rollback retried until each participant has it
        acts = c.tick(0.15)
        assert sorted(s.to for s in sends(acts, OUTCOME)) == ["p1", "p2"]
    c.recv("p1", {"t": ACK, "g": gtid})
    assert [s.to for s in sends(c.tick(0.15), OUTCOME)] == ["p2"]


def test_a_participant_abort_that_wins_the_log_race_aborts_the_coordinator_too():
    c = Harness("c")
    gtid = start_transfer(c)
    c.recv("p1", {"t": VOTE, "g": gtid, "v": "yes", "r": {}})
    c.recv("p2", {"t": VOTE, "g": gtid, "v": "yes", "r": {}})
    acts = c.recv(LOG, {"t": DECIDED, "g": gtid, "o": ABORT})  # p1 timed out first
    assert replies(acts)[0]["outcome"] == ABORT
    assert {s.payload["o"] for s in sends(acts, OUTCOME)} == {ABORT}


def test_recovered_coordinator_asks_the_log_and_never_guesses():
    c = Harness("c")
    gtid = start_transfer(c)
    c.recv("p1", {"t": VOTE, "g": gtid, "v": "yes", "r": {}})
    c.recv("p2", {"t": VOTE, "g": gtid, "v": "yes", "r": {}})
    c.crash()  # the votes and the commit proposal are gone
    acts = c.tick(0.1)
    assert [s.payload for s in sends(acts, LOOKUP, LOG)] == [{"t": LOOKUP, "g": gtid}]
    assert sends(acts, OUTCOME) == []
    # Undecided: it can only propose abort ...
    acts = c.recv(LOG, {"t": UNKNOWN, "g": gtid, "forgotten": False})
    assert sends(acts, PROPOSE)[0].payload["o"] == ABORT
    # ... and if its old commit proposal landed first, it finishes the commit.
    acts = c.recv(LOG, {"t": DECIDED, "g": gtid, "o": COMMIT})
    assert replies(acts) == []  # the client's request died with the old process
    assert {s.payload["o"] for s in sends(acts, OUTCOME)} == {COMMIT}
    # New gtids never reuse a number.
    c.step(ClientRequest(c.now, 8, TRANSFER))
    assert sends(c.sync(), PREPARE)[0].payload["g"] == make_gtid("c", 2)


def test_recovered_coordinator_drops_a_gtid_the_log_already_compacted():
    c = Harness("c")
    gtid = start_transfer(c)
    c.crash()
    acts = c.recv(LOG, {"t": UNKNOWN, "g": gtid, "forgotten": True})
    assert notes(acts, "dtx.finished")[0]["g"] == gtid
    c.sync()
    assert c.node.coord == {}


def test_bad_client_requests_are_refused_not_raised():
    c = Harness("c")
    bad = [
        None,
        {"op": "nope"},
        {"op": "run"},
        {"op": "run", "branches": {}},
        {"op": "run", "branches": {"p1": []}},
        {"op": "run", "branches": {"p1": [["add", "x"]]}},
        {"op": "run", "branches": {"p1": [["drop", "x", 1]]}},
        {"op": "run", "branches": {LOG: [["add", "x", 1]]}},
        {"op": "run", "branches": {"p1": [["add", "x", True]]}},
    ]
    for i, payload in enumerate(bad):
        acts = c.step(ClientRequest(c.now, i, payload))
        assert replies(acts)[0]["error"] == "BadRequest", payload
        assert not any(isinstance(a, Persist | Send) for a in acts)
    acts = c.step(ClientRequest(c.now, 99, {"op": "status"}))
    assert replies(acts)[0]["node"] == "c"


# ----------------------------------------------------------------- participant
def prepare_msg(gtid: str, ops: list[Any], floor: int = 1) -> dict[str, Any]:
    return {"t": PREPARE, "g": gtid, "ops": ops, "f": floor}


def test_participant_votes_yes_only_once_durably_prepared_and_applies_once():
    p = Harness("p1", {"x": 100})
    acts = p.recv("c", prepare_msg("c.1", [["add", "x", -30]]))
    assert sends(acts) == [] and any(isinstance(a, Persist) for a in acts)
    acts = p.sync()
    assert sends(acts, VOTE)[0].payload == {"t": VOTE, "g": "c.1", "v": "yes", "r": {}}
    assert K_PREPARED + b"c.1" in p.disk
    # A duplicated prepare gets the vote again, nothing new is written.
    acts = p.recv("c", prepare_msg("c.1", [["add", "x", -30]]))
    assert sends(acts, VOTE)[0].payload["v"] == "yes" and p.unsynced == []
    acts = p.recv("c", {"t": OUTCOME, "g": "c.1", "o": COMMIT, "f": 1})
    assert sends(acts, ACK) == []  # not before the outcome is durable
    acts = p.sync()
    assert sends(acts, ACK, "c")
    assert notes(acts, "dtx.resolved") == [{"g": "c.1", "o": COMMIT, "node": "p1"}]
    assert p.node.rm.kv["x"] == 70 and p.disk[K_TOMB + b"c.1"] == b"commit"
    # Duplicates are acknowledged without applying again; a contrary late message cannot flip it.
    acts = p.recv("c", {"t": OUTCOME, "g": "c.1", "o": COMMIT, "f": 1})
    assert sends(acts, ACK) and p.unsynced == []
    acts = p.recv("c", {"t": OUTCOME, "g": "c.1", "o": ABORT, "f": 1})
    assert sends(acts, ACK) == [] and notes(acts, "dtx.conflict")
    acts = p.recv(LOG, {"t": DECIDED, "g": "c.1", "o": ABORT})
    assert p.unsynced == [] and p.node.rm.kv["x"] == 70
    # Nor can a late duplicate of the prepare start it over.
    acts = p.recv("c", prepare_msg("c.1", [["add", "x", -30]]))
    assert sends(acts, VOTE) == [] and p.unsynced == []


def test_participant_refuses_what_breaks_its_rules():
    p = Harness("p1", {"x": 10})
    acts = p.recv("c", prepare_msg("c.1", [["add", "x", -30]]))
    assert sends(acts, VOTE)[0].payload == {
        "t": VOTE,
        "g": "c.1",
        "v": "no",
        "why": "insufficient funds",
    }
    acts = p.recv("c", prepare_msg("c.2", [["add", "nobody", 1]]))
    assert sends(acts, VOTE)[0].payload["v"] == "no"
    acts = p.recv("c", prepare_msg("c.3", "garbage"))
    assert sends(acts, VOTE)[0].payload["v"] == "no"


def test_in_doubt_participant_asks_the_log_and_applies_its_answer():
    p = Harness("p1", {"x": 100})
    p.recv("c", prepare_msg("c.1", [["add", "x", -30]]))
    p.sync()
    assert sends(p.tick(0.3), PROPOSE) == []
    acts = p.tick(0.35)  # past decision_timeout: B9
    (prop,) = sends(acts, PROPOSE, LOG)
    assert prop.payload["o"] == ABORT and set(prop.payload["n"]) == {"p1", "c"}
    assert sends(p.tick(0.11), PROPOSE), "asked again until answered"
    # The coordinator's commit won the race: the participant commits.
    p.recv(LOG, {"t": DECIDED, "g": "c.1", "o": COMMIT})
    acts = p.sync()
    assert notes(acts, "dtx.resolved")[0]["o"] == COMMIT and p.node.rm.kv["x"] == 70


def test_prepared_branch_survives_a_crash_with_its_locks():
    p = Harness("p1", {"x": 100})
    p.recv("c", prepare_msg("c.1", [["add", "x", -30]]))
    p.sync()
    p.crash()
    assert p.node.branches["c.1"].state == "prepared"
    # Its write lock is back: a second branch on x waits, then times out and votes no.
    acts = p.recv("c", prepare_msg("c.2", [["add", "x", 5]]))
    assert sends(acts, VOTE) == [] and p.unsynced == []
    acts = p.tick(0.45)
    assert [s.payload["v"] for s in sends(acts, VOTE) if s.payload["g"] == "c.2"] == ["no"]
    assert sends(acts, PROPOSE) == []
    # The recovered one is in doubt: it proposes abort and applies the log's answer.
    acts = p.tick(0.2)
    assert sends(acts, PROPOSE)[0].payload == {
        "t": PROPOSE,
        "g": "c.1",
        "o": ABORT,
        "n": ["c", "p1"],
    }
    p.recv(LOG, {"t": DECIDED, "g": "c.1", "o": ABORT})
    p.sync()
    assert p.node.rm.kv["x"] == 100 and not p.node.branches


def test_a_lock_waiter_proceeds_when_the_holder_resolves():
    p = Harness("p1", {"x": 100})
    p.recv("c", prepare_msg("c.1", [["add", "x", -30]]))
    p.sync()
    p.recv("c", prepare_msg("c.2", [["add", "x", -50], ["read", "x", 0]]))
    p.recv("c", {"t": OUTCOME, "g": "c.1", "o": COMMIT, "f": 1})
    assert p.node.branches["c.2"].state == "persisting"  # granted by c.1's release
    acts = p.sync()
    votes = [s.payload for s in sends(acts, VOTE)]
    assert votes == [{"t": VOTE, "g": "c.2", "v": "yes", "r": {"x": 70}}]


def test_branch_timeout_aborts_and_late_prepares_get_no():
    p = Harness("p1", {"x": 100})
    p.recv("c", prepare_msg("c.1", [["add", "x", -30]]))
    p.sync()
    p.recv("d", prepare_msg("d.1", [["add", "x", 1]]))  # waits for c.1's lock
    acts = p.tick(0.45)
    assert [s.payload["v"] for s in sends(acts, VOTE, "d")] == ["no"]
    assert "d.1" not in p.node.branches
    acts = p.recv("d", prepare_msg("d.1", [["add", "x", 1]]))
    assert sends(acts, VOTE)[0].payload["v"] == "no"
    # An abort for a branch it never prepared is acknowledged (rollback reaches it).
    acts = p.recv("e", {"t": OUTCOME, "g": "e.4", "o": ABORT, "f": 1})
    assert sends(acts, ACK, "e")
    assert sends(p.recv("e", prepare_msg("e.4", [["add", "x", 1]])), VOTE)[0].payload["v"] == "no"


def test_floors_prune_tombstones_and_refuse_stale_prepares():
    p = Harness("p1", {"x": 100})
    p.recv("c", prepare_msg("c.1", [["add", "x", -1]]))
    p.sync()
    p.recv("c", {"t": OUTCOME, "g": "c.1", "o": COMMIT, "f": 1})
    p.sync()
    assert K_TOMB + b"c.1" in p.disk
    p.recv("c", prepare_msg("c.5", [["add", "x", -1]], floor=3))
    p.sync()
    # The floor refuses stale prepares at once; the tombstones go on the next pruning.
    assert p.node.floors == {"c": 3} and K_TOMB + b"c.1" in p.disk
    assert sends(p.recv("c", prepare_msg("c.2", [["add", "x", -1]])), VOTE)[0].payload["v"] == "no"
    p.tick(1.0)
    p.sync()
    assert K_TOMB + b"c.1" not in p.disk and "c.1" not in p.node.tombs
    p.crash()
    acts = p.recv("c", prepare_msg("c.1", [["add", "x", -1]]))
    assert sends(acts, VOTE)[0].payload == {
        "t": VOTE,
        "g": "c.1",
        "v": "no",
        "why": "finished long ago",
    }


def test_misaddressed_and_malformed_messages_are_dropped_and_logged():
    p = Harness("p1", {"x": 100})
    cases = [
        ("c", None),
        ("c", 5),
        ("c", {"g": "c.1"}),
        ("c", {"t": PREPARE, "g": "nope", "ops": []}),
        ("d", prepare_msg("c.1", [["add", "x", 1]])),  # not the gtid's coordinator
        ("c", {"t": DECIDED, "g": "c.1", "o": COMMIT}),  # decisions only come from the log
        (LOG, {"t": DECIDED, "g": "c.1", "o": "perhaps"}),
        ("c", {"t": "dtx.hello", "g": "c.1"}),
        ("c", {"t": FORGET, "c": "c", "f": 3}),
    ]
    for sender, payload in cases:
        acts = p.recv(sender, payload)
        assert not any(isinstance(a, Send | Persist | Reply) for a in acts), payload
    assert not p.node.branches


def test_fuzzed_messages_never_raise():
    rng = random.Random(7)
    p = Harness("p1", {"x": 100, "y": 5})
    kinds = [PREPARE, VOTE, OUTCOME, ACK, DECIDED, UNKNOWN, FORGET, "x", None]
    values: list[Any] = [None, 0, -1, "c.1", "c.2", "p1.1", "x", [], {}, True, 1.5, b"\x00"]
    ops = [["add", "x", 5], ["read", "y", 0], ["add", "y", -9], ["add", 1, 1], "z"]
    p.step(ClientRequest(0.0, 1, {"op": "run", "branches": {"c": [["add", "q", 1]]}}))
    for _ in range(3000):
        payload: dict[str, Any] = {"t": rng.choice(kinds)}
        for key in ("g", "o", "v", "f", "r", "c", "n", "forgotten"):
            if rng.random() < 0.6:
                payload[key] = rng.choice([*values, COMMIT, ABORT, "yes", "no"])
        if rng.random() < 0.5:
            payload["ops"] = rng.sample(ops, rng.randint(0, 3))
        sender = rng.choice(["c", "d", LOG, "p1"])
        p.recv(sender, msgpack.unpackb(msgpack.packb(payload), raw=False))
        if rng.random() < 0.2:
            p.sync()
        if rng.random() < 0.1:
            p.tick(0.1)
        if rng.random() < 0.01:
            p.crash()


def test_tick_timer_is_rearmed():
    p = Harness("p1")
    assert SetTimer(TICK, CFG.tick) in p.tick(0.05)


def test_a_ghost_prepare_of_a_compacted_gtid_is_discarded_not_applied():
    p = Harness("p1", {"x": 100})
    p.recv("c", prepare_msg("c.1", [["add", "x", -30]]))
    p.sync()
    p.tick(0.7)
    acts = p.recv(LOG, {"t": UNKNOWN, "g": "c.1", "forgotten": True})
    assert notes(acts, "dtx.resolved") == [] and not p.node.branches
    p.sync()
    assert K_PREPARED + b"c.1" not in p.disk and p.node.rm.kv["x"] == 100
    assert p.node.rm.locks.holders("x") == {}
