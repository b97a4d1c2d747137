"""The client core without I/O: its steps driven by hand, action by action.

The blocking and asyncio drivers only perform these actions
(tests/unit/test_remote_client.py runs both against a fake node).
"""

from __future__ import annotations

from typing import Any

import pytest

from nonstop.client.core import (
    OUTCOME_POLL,
    Action,
    Call,
    ClientCore,
    Close,
    Connect,
    Notify,
    Release,
    Sleep,
    Step,
    run,
)
from nonstop.client.failures import NodeRefused
from nonstop.errors import NotCommitted, QuorumLost, Retryable, TransactionLost, Unavailable
from nonstop.net.handshake import Hello


class StubLink:
    def __init__(self, address: str, closed: bool = False) -> None:
        self.address = address
        self.closed = closed
        self.node: Hello | None = None


def core(rounds: int = 2, clock: Any = None) -> ClientCore:
    # balance="first": these tests follow the fail-over from a:1 (H5's own choice of
    # the primary is tested in test_client_balance.py).
    options: dict[str, Any] = {
        "rounds": rounds,
        "timeout": 1.0,
        "op_timeout": 3.0,
        "balance": "first",
    }
    if clock is not None:
        options["clock"] = clock
    return ClientCore(["a:1", "b:2"], **options)


def finish(step: Step[Any], value: Any) -> Any:
    with pytest.raises(StopIteration) as done:
        step.send(value)
    return done.value.value


def test_a_network_error_moves_to_the_next_address_and_a_reply_is_returned() -> None:
    c = core()
    step = c.request({"op": "ping"})
    assert next(step) == Connect("a:1")
    assert step.throw(ConnectionRefusedError("down")) == Connect("b:2")
    link = StubLink("b:2")
    assert step.send(link) == Call(link, {"op": "ping"}, 1.0)
    assert step.send({"name": "B"}) == Release(link)
    assert finish(step, None) == {"name": "B"}
    assert c.address == "b:2", "the next request starts where the last one succeeded"


def test_a_refusal_ends_the_request_at_once() -> None:
    c = core()
    step = c.request({"op": "ping"})
    next(step)
    refused = NodeRefused("a:1", "WrongCluster", "peer 'A' belongs to cluster 'x'")
    with pytest.raises(NodeRefused):
        step.throw(refused)
    assert c.address == "a:1", "a refusal is not a dead node"


def test_rounds_are_bounded_and_quorum_lost_is_reported() -> None:
    c = core(rounds=2)
    seen: list[Action] = []

    def every_node_disabled(action: Action) -> Any:
        seen.append(action)
        if isinstance(action, Connect):
            return StubLink(action.address)
        if isinstance(action, Call):
            return {"error": "QuorumLost", "message": "no quorum"}
        return None

    with pytest.raises(QuorumLost, match="no quorum"):
        run(c.request({"op": "status"}), every_node_disabled)
    assert [a.address for a in seen if isinstance(a, Connect)] == ["a:1", "b:2", "a:1", "b:2"]
    assert sum(isinstance(a, Close) for a in seen) == 4 and seen.count(Sleep(0.1)) == 2


def test_a_first_op_that_times_out_is_not_retried_elsewhere() -> None:
    c = core()
    step = c.open_session({"op": "tx.get", "begin": "serializable"})
    link = StubLink("a:1")
    assert next(step) == Connect("a:1")
    assert step.send(link) == Call(link, {"op": "tx.get", "begin": "serializable"}, 3.0)
    # An open link that timed out: is the node alive?  It is: keep the link.
    assert step.throw(TimeoutError()) == Call(link, {"op": "ping"}, 1.0)
    with pytest.raises(Unavailable, match="in time"):
        step.send({"name": "A"})
    assert c.address == "a:1"


def test_a_lost_session_link_is_unavailable_and_the_next_session_goes_elsewhere() -> None:
    """The node rolls the session back: nothing committed, so the error is one
    ``@transactional`` replays (``TransactionLost``: ``Unavailable`` and ``Retryable``,
    issue 10 H4), and the replay goes to the next node."""
    c = core()
    link = StubLink("a:1")
    step = c.send(link, {"op": "tx.get", "s": 4})
    assert next(step) == Call(link, {"op": "tx.get", "s": 4}, 3.0)
    link.closed = True  # what a reset does to a link
    assert step.throw(ConnectionResetError()) == Close(link)
    with pytest.raises(Unavailable, match="during the transaction") as raised:
        step.send(None)
    assert isinstance(raised.value, TransactionLost) and isinstance(raised.value, Retryable)
    assert c.address == "b:2"


def test_a_slow_op_on_a_live_link_tells_the_node_to_roll_back() -> None:
    c = core()
    link = StubLink("a:1")
    step = c.send(link, {"op": "tx.get", "s": 4})
    next(step)
    assert step.throw(TimeoutError()) == Notify(link, {"op": "tx.rollback", "s": 4})
    assert step.send(None) == Call(link, {"op": "ping"}, 1.0)
    with pytest.raises(Unavailable):
        step.send({"name": "A"})
    assert c.address == "a:1", "the node answers: its link stays"


def test_a_lost_commit_reply_polls_the_same_node_until_an_outcome() -> None:
    now = [0.0]
    c = core(clock=lambda: now[0])
    link = StubLink("a:1")
    step = c.commit(link, {"op": "tx.commit", "s": 4}, ["cid.1", 1])
    next(step)
    link.closed = True
    assert step.throw(ConnectionResetError("lost")) == Close(link)
    assert step.send(None) == Connect("a:1", fresh=True)
    asked = StubLink("a:1")
    ask = Call(asked, {"op": "request.result", "req": ["cid.1", 1]}, 1.0)
    assert step.send(asked) == ask
    assert step.send({"state": "running"}) == Close(asked)
    assert step.send(None) == Sleep(0.01)
    assert step.send(None) == Connect("a:1", fresh=True)
    assert step.send(asked) == ask
    assert step.send({"state": "committed"}) == Close(asked)
    assert finish(step, None) is None


def test_a_commit_still_running_after_op_timeout_is_unknown() -> None:
    now = [0.0]
    c = core(clock=lambda: now[0])
    link = StubLink("a:1", closed=True)
    step = c.request_result(link.address, ["cid.1", 1], ConnectionResetError())
    next(step)
    step.send(link)
    step.send({"state": "running"})
    now[0] = 10.0
    with pytest.raises(Unavailable, match="still running"):
        step.send(None)


HOME = b"\x01" * 20


def asking_another_node(c: ClientCore) -> tuple[Step[None], StubLink, Call]:
    """A lost commit reply of a homed request whose node ``a:1`` is dead: the step, once
    it sent its first ask to ``b:2``; that link and that ask."""
    step = c.request_result("a:1", ["cid.1", 1], ConnectionResetError(), HOME)
    assert next(step) == Connect("a:1", fresh=True)
    assert step.throw(ConnectionRefusedError("dead")) == Connect("b:2", fresh=True)
    other = StubLink("b:2")
    ask = Call(
        other, {"op": "request.result", "req": ["cid.1", 1], "home": HOME, "fence": True}, 1.0
    )
    assert step.send(other) == ask
    return step, other, ask


def test_a_lost_commit_reply_with_its_node_dead_asks_another_node_for_the_home() -> None:
    """A homed request (docs/design/requests.md): its node cannot be asked, so the next
    node is, with the home; it answers for the home partition's active node."""
    step, other, ask = asking_another_node(core())
    assert step.send({"error": "NotActive", "message": "promotion"}) == Close(other)
    assert step.send(None) == Sleep(0.05)
    assert step.send(None) == Connect("b:2", fresh=True)
    assert step.send(other) == ask
    assert step.send({"state": "committed", "result": None}) == Close(other)
    assert finish(step, None) is None


def test_a_settled_request_is_a_definite_not_committed_that_transactional_replays() -> None:
    """issue 10 (H4): every ask with a home settles the request there (``fence``,
    requests.md §3): the home recorded "not committed", so no attempt can commit after
    it, and the answer is final -- ``NotCommitted``, a ``Retryable`` (``@transactional``
    runs the function again under a new request id) -- not "outcome unknown"."""
    step, other, _ = asking_another_node(core())
    settled_reply = {
        "state": "aborted",
        "result": ["NotCommitted", "settled at its home as not committed"],
        "final": True,
    }
    assert step.send(settled_reply) == Close(other)
    with pytest.raises(NotCommitted, match="settled at its home") as raised:
        step.send(None)
    assert isinstance(raised.value, Retryable)


def test_an_abort_another_node_only_remembers_is_not_believed() -> None:
    """An "aborted" that is not final (the asked node's memory of an abort, not the
    home's record) may be followed by a commit of the same id elsewhere: unknown."""
    step, other, _ = asking_another_node(core())
    assert step.send({"state": "aborted", "result": ["Aborted", "x"]}) == Close(other)
    with pytest.raises(Unavailable, match="cannot be asked"):
        step.send(None)


def test_the_commit_s_own_node_settles_a_homed_request_too() -> None:
    """Asked on its own node (alive) with the home, the request is settled there as well:
    its "not committed" is the recorded error, retryable."""
    c = core()
    step = c.request_result("a:1", ["cid.1", 1], ConnectionResetError(), HOME)
    assert next(step) == Connect("a:1", fresh=True)
    own = StubLink("a:1")
    ask = Call(own, {"op": "request.result", "req": ["cid.1", 1], "home": HOME, "fence": True}, 1.0)
    assert step.send(own) == ask
    reply = {"state": "aborted", "result": ["NotCommitted", "settled"], "final": True}
    assert step.send(reply) == Close(own)
    with pytest.raises(NotCommitted):
        step.send(None)


def test_another_node_s_unknown_leaves_the_outcome_unknown() -> None:
    step, other, _ = asking_another_node(core())
    assert step.send({"state": "unknown", "result": None}) == Close(other)
    with pytest.raises(Unavailable, match="cannot be asked"):
        step.send(None)


def test_a_late_answer_from_another_node_hands_over_and_the_search_goes_on() -> None:
    """issue 10 (H4): another node's lookup may wait for the record's lock on the home
    (a prepared branch being resolved) longer than the client's ``timeout``.  That node's
    late answer hands over to the next node, and the search goes on within one
    ``op_timeout``: the old client gave up after one late answer per node (5 s each, so
    ~10.6 s with three nodes before ``Unavailable``, the outcome unknown)."""
    step, other, ask = asking_another_node(core())
    assert step.throw(TimeoutError("late")) == Close(other)
    # The only other node answered late: after a pause, it is asked again.
    assert step.send(None) == Sleep(0.05)
    assert step.send(None) == Connect("b:2", fresh=True)
    assert step.send(other) == ask
    assert step.send({"state": "committed", "result": None}) == Close(other)
    assert finish(step, None) is None


def test_the_home_s_unknown_ends_the_search_without_asking_every_node() -> None:
    """Every node asks the same home partition's active node, so its "unknown" (no
    record there once the record's lock is free) is the answer: the client does not
    ask the next node for another ``op_timeout``."""
    c = ClientCore(["a:1", "b:2", "c:3"], rounds=2, timeout=1.0, op_timeout=3.0, balance="first")
    step, other, _ = asking_another_node(c)
    assert step.send({"state": "unknown", "result": None}) == Close(other)
    with pytest.raises(Unavailable, match="the outcome is unknown"):
        step.send(None)


def test_one_op_timeout_bounds_the_asks_of_every_other_node() -> None:
    """A promotion that never ends: the search stops at one ``op_timeout`` (3 s here)
    after it began, however many nodes there are to ask, with pauses of at most
    ``OUTCOME_POLL`` between the asks (the client learns an outcome soon after the
    cluster does)."""
    now = [0.0]
    c = ClientCore(
        ["a:1", "b:2", "c:3"],
        rounds=2,
        timeout=1.0,
        op_timeout=3.0,
        clock=lambda: now[0],
        balance="first",
    )

    def promoting(action: Action) -> Any:
        if isinstance(action, Connect):
            if action.address == "a:1":
                raise ConnectionRefusedError("dead")
            return StubLink(action.address)
        if isinstance(action, Call):
            return {"error": "NotActive", "message": "promotion in progress"}
        if isinstance(action, Sleep):
            assert action.seconds <= OUTCOME_POLL
            now[0] += action.seconds
        return None

    with pytest.raises(Unavailable, match="cannot be asked"):
        run(c.request_result("a:1", ["cid.1", 1], ConnectionResetError(), HOME), promoting)
    assert 3.0 < now[0] <= 3.0 + OUTCOME_POLL
