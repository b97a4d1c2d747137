"""The back-off of ``@transactional`` between replays (tx/runner.py, issue 14)."""

from __future__ import annotations

import random

from nonstop.errors import Conflict, Deadlock, LockTimeout
from nonstop.tx.runner import BACKOFF, DEADLOCK_BACKOFF, _backoff


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
