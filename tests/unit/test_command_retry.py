"""A command asked during a cluster-log election is asked again, as a user would (G2).

The CLI, the admin API and the console run their commands through
``nonstop.commands.context.ask``; a node that knows no cluster-log leader answers a
change ``NoLeader`` at once (``nonstop.security.users_table``), and ``ask`` retries it
a few times within ``NO_LEADER_WAIT``.
"""

from __future__ import annotations

from typing import Any

import pytest

from nonstop import errors
from nonstop.commands.context import NO_LEADER_PAUSES, NO_LEADER_WAIT, CommandContext, ask
from nonstop.commands.failure import CommandError


class ElectingClient:
    """A client whose node answers ``NoLeader`` ``elections`` times, then ``reply``."""

    def __init__(self, elections: int, reply: Any = None) -> None:
        self.elections = elections
        self.reply = reply
        self.calls = 0

    def __enter__(self) -> ElectingClient:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def call(self, payload: dict[str, Any]) -> Any:
        self.calls += 1
        if self.calls <= self.elections:
            raise errors.NoLeader("node A knows no cluster-log leader now; retry in a moment")
        if isinstance(self.reply, Exception):
            raise self.reply
        return self.reply


class Context(CommandContext):
    def __init__(self, client: ElectingClient) -> None:
        super().__init__(["127.0.0.1:1"])
        self.fake = client

    def client(self, ping: bool = True) -> Any:
        return self.fake


def clock_and_sleep() -> tuple[Any, Any, list[float]]:
    now = [0.0]
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        now[0] += seconds

    return (lambda: now[0]), sleep, slept


def test_no_leader_is_asked_again_until_a_leader_answers() -> None:
    client = ElectingClient(elections=4, reply={"ok": True, "user": "bob", "index": 9})
    clock, sleep, slept = clock_and_sleep()
    payload = {"op": "user.remove", "user": "bob"}
    assert ask(Context(client), payload, sleep=sleep, clock=clock)["ok"] is True
    assert client.calls == 5
    assert slept == [*NO_LEADER_PAUSES, NO_LEADER_PAUSES[-1]]


def test_no_leader_for_too_long_is_unavailable_within_the_bound() -> None:
    client = ElectingClient(elections=1_000)
    clock, sleep, slept = clock_and_sleep()
    with pytest.raises(CommandError, match="no cluster-log leader") as refused:
        ask(Context(client), {"op": "user.remove", "user": "bob"}, sleep=sleep, clock=clock)
    assert refused.value.kind == "unavailable"
    assert sum(slept) <= NO_LEADER_WAIT and client.calls > 3


def test_other_refusals_are_not_retried() -> None:
    client = ElectingClient(elections=0, reply=errors.BadArgument("no user 'bob'"))
    with pytest.raises(CommandError) as refused:
        ask(Context(client), {"op": "user.remove", "user": "bob"}, sleep=pytest.fail)
    assert refused.value.kind == "usage" and client.calls == 1


class LeaderlessClient(ElectingClient):
    """The node answers ``NotLeader`` naming no leader (its own election after a leave)."""

    def call(self, payload: dict[str, Any]) -> Any:
        self.calls += 1
        if self.calls <= self.elections:
            raise errors.NotLeader("the leader is None", None)
        return self.reply


def test_not_leader_naming_no_leader_is_asked_again() -> None:
    client = LeaderlessClient(elections=2, reply={"ok": True, "members": ["A", "B"]})
    clock, sleep, slept = clock_and_sleep()
    assert ask(Context(client), {"op": "leave", "name": "C"}, sleep=sleep, clock=clock)["ok"]
    assert client.calls == 3 and len(slept) == 2


def test_not_leader_naming_a_leader_is_not_retried() -> None:
    client = ElectingClient(elections=0, reply=errors.NotLeader("the leader is B", "B"))
    with pytest.raises(CommandError, match="the leader is B") as refused:
        ask(Context(client), {"op": "leave", "name": "C"}, sleep=pytest.fail)
    assert refused.value.kind == "failed" and client.calls == 1
