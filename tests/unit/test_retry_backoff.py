"""The back-off of ``@transactional`` between replays, and the age a replay carries
(tx/runner.py, issue 14)."""

from __future__ import annotations

import random

from nonstop.client.remote import RemoteTransactionBase
from nonstop.errors import Conflict, Deadlock, LockTimeout
from nonstop.tx.runner import BACKOFF, DEADLOCK_BACKOFF, _backoff, run_with_retries


def test_a_deadlock_victim_waits_about_a_lock_hold_before_its_first_replay() -> None:
    random.seed(3)
    first = [_backoff(0, Deadlock("wounded")) for _ in range(300)]
    assert all(0 <= b <= DEADLOCK_BACKOFF for b in first)
    assert max(first) > 10 * BACKOFF  # longer than other retries can ever wait first
    for other in (Conflict("c"), LockTimeout("t"), None):
        assert all(_backoff(0, other) <= BACKOFF for _ in range(100))


def test_the_back_off_doubles_per_attempt_up_to_50_ms() -> None:
    random.seed(4)
    for attempt in range(14):
        bound = min(0.05, DEADLOCK_BACKOFF * 2 ** min(attempt, 10))
        samples = [_backoff(attempt, Deadlock("d")) for _ in range(200)]
        assert all(0 <= b <= bound for b in samples)
        assert max(samples) > bound / 2


class _FakeRemoteTx:
    """Stands for a cluster client's transaction (what ``@transactional`` sees of it)."""

    __nonstop_transaction__ = True

    def __init__(self) -> None:
        self.replay_age: float | None = None

    def __enter__(self) -> _FakeRemoteTx:
        return self

    def __exit__(self, *exc: object) -> None:
        return None


class _FakeCluster:
    def __init__(self) -> None:
        self.opened: list[_FakeRemoteTx] = []

    def transaction(self, isolation: str = "serializable") -> _FakeRemoteTx:
        self.opened.append(_FakeRemoteTx())
        return self.opened[-1]


def test_a_replay_carries_the_age_of_its_first_attempt() -> None:
    # The node ranks a replay from its first attempt (deadlocks.md section 2b): the
    # first attempt claims nothing, each replay how long ago the first one began.
    cluster = _FakeCluster()
    ages: list[float | None] = []

    def transfer(tx: _FakeRemoteTx) -> str:
        ages.append(tx.replay_age)
        if len(ages) < 3:
            raise Deadlock("wounded")
        return "done"

    assert run_with_retries(cluster, transfer) == "done"  # type: ignore[arg-type]
    assert ages[0] is None
    assert ages[1] is not None and ages[2] is not None and 0 <= ages[1] <= ages[2]


def test_a_remote_replay_sends_its_age_with_begin() -> None:
    tx = RemoteTransactionBase(sessions=None)  # type: ignore[arg-type]
    assert "age" not in tx._first({"op": "tx.get", "s": None})
    tx.replay_age = 0.25
    assert tx._first({"op": "tx.get"}) == {"op": "tx.get", "begin": "serializable", "age": 0.25}
