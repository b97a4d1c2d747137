"""Quorum policies (D16): thresholds, states, weights, and the non-intersecting guard."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from nonstop.cluster.quorum import QuorumPolicy, QuorumState

A, P, D = QuorumState.ACTIVE, QuorumState.PARTIAL, QuorumState.DISABLED
ABC = ["a", "b", "c"]
ABCDE = ["a", "b", "c", "d", "e"]


@pytest.mark.parametrize(
    ("policy", "members", "reachable", "state"),
    [
        # majority of 3
        (QuorumPolicy.majority(), ABC, "abc", A),
        (QuorumPolicy.majority(), ABC, "ab", P),
        (QuorumPolicy.majority(), ABC, "a", D),
        # majority of 4: 3 needed; 2 of 4 is not enough (no tie-breaking by name)
        (QuorumPolicy.majority(), ["a", "b", "c", "d"], "abc", P),
        (QuorumPolicy.majority(), ["a", "b", "c", "d"], "ab", D),
        # weights: a has 3 of 5 votes
        (QuorumPolicy.majority({"a": 3}), ABC, "a", P),
        (QuorumPolicy.majority({"a": 3}), ABC, "bc", D),
        # weight 0: a member that never counts
        (QuorumPolicy.majority({"c": 0}), ABC, "ab", P),
        (QuorumPolicy.majority({"c": 0}), ABC, "ac", D),
        # minimum votes
        (QuorumPolicy.minimum_votes(3), ABCDE, "abc", P),
        (QuorumPolicy.minimum_votes(3), ABCDE, "ab", D),
        (QuorumPolicy.minimum_votes(4), ABCDE, "abcde", A),
        (QuorumPolicy.minimum_votes(4, {"a": 2}), ABCDE, "abc", P),
        (QuorumPolicy.minimum_votes(4, {"a": 2}), ABCDE, "bcd", D),
        # percentage: 60% of 5 = 3 votes; 51% of 4 = 2.04 -> 3 votes
        (QuorumPolicy.vote_percentage(60), ABCDE, "abc", P),
        (QuorumPolicy.vote_percentage(60), ABCDE, "ab", D),
        (QuorumPolicy.vote_percentage(51), ["a", "b", "c", "d"], "abc", P),
        (QuorumPolicy.vote_percentage(51), ["a", "b", "c", "d"], "ab", D),
        (QuorumPolicy.vote_percentage(100), ABC, "abc", A),
        (QuorumPolicy.vote_percentage(100), ABC, "ab", D),
        # off: never Disabled
        (QuorumPolicy.off(), ABC, "abc", A),
        (QuorumPolicy.off(), ABC, "a", P),
        # unknown reachable nodes do not count
        (QuorumPolicy.majority(), ABC, "axyz", D),
    ],
)
def test_quorum_state_table(
    policy: QuorumPolicy, members: list[str], reachable: str, state: QuorumState
) -> None:
    assert policy.state(members, list(reachable)) == state


@pytest.mark.parametrize(
    ("policy", "members", "threshold", "total"),
    [
        (QuorumPolicy.majority(), ABC, 2, 3),
        (QuorumPolicy.majority(), ["a", "b", "c", "d"], 3, 4),
        (QuorumPolicy.majority({"a": 2, "b": 2}), ABC, 3, 5),
        (QuorumPolicy.minimum_votes(2), ABC, 2, 3),
        (QuorumPolicy.vote_percentage(66.7), ABC, 3, 3),
        (QuorumPolicy.vote_percentage(66), ABC, 2, 3),
        (QuorumPolicy.off(), ABC, 1, 3),
    ],
)
def test_thresholds(policy: QuorumPolicy, members: list[str], threshold: int, total: int) -> None:
    q = policy.bind(members)
    assert (q.threshold, q.total) == (threshold, total)


@pytest.mark.parametrize(
    "make",
    [
        lambda **kw: QuorumPolicy.minimum_votes(2, **kw),  # 2 of 5: two disjoint sides
        lambda **kw: QuorumPolicy.vote_percentage(40, **kw),  # 2 of 5
        lambda **kw: QuorumPolicy.vote_percentage(50, {"e": 0}, **kw),  # 2 of 4 votes
    ],
)
def test_non_intersecting_policies_are_rejected_unless_allowed(
    make: Callable[..., QuorumPolicy],
) -> None:
    with pytest.raises(ValueError, match="intersect"):
        make().bind(ABCDE)
    q = make(allow_non_intersecting=True).bind(ABCDE)
    assert q.intersecting is False
    # Two disjoint sides both have quorum: exactly the split brain the flag accepts.
    assert q.reached(["a", "b"]) and q.reached(["c", "d"])


def test_intersecting_flag_and_off() -> None:
    assert QuorumPolicy.majority().bind(ABC).intersecting
    assert QuorumPolicy.minimum_votes(3).bind(ABCDE).intersecting
    assert QuorumPolicy.off().bind(ABC).intersecting is False
    assert QuorumPolicy.off().bind(["a"]).intersecting  # a single node cannot split


def test_unreachable_threshold_is_rejected() -> None:
    with pytest.raises(ValueError, match="never be reached"):
        QuorumPolicy.minimum_votes(4).bind(ABC)
    with pytest.raises(ValueError, match="no votes"):
        QuorumPolicy.majority({"a": 0}).bind(["a"])


@pytest.mark.parametrize(
    "kwargs",
    [
        {"mode": "sometimes"},
        {"mode": "min_votes"},
        {"mode": "min_votes", "min_votes": 0},
        {"mode": "min_votes", "min_votes": True},
        {"mode": "percentage", "percentage": 0},
        {"mode": "percentage", "percentage": 101},
        {"mode": "majority", "weights": {"a": -1}},
        {"mode": "majority", "weights": {"a": 1.5}},
    ],
)
def test_bad_policies(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError):
        QuorumPolicy(**kwargs)


def test_config_round_trip() -> None:
    for p in [
        QuorumPolicy.majority({"a": 2}),
        QuorumPolicy.minimum_votes(3),
        QuorumPolicy.vote_percentage(60, allow_non_intersecting=True),
        QuorumPolicy.off(),
    ]:
        assert QuorumPolicy.from_config(p.to_config()) == p
    assert QuorumPolicy.from_config({"mode": "off"}).allow_non_intersecting
    with pytest.raises(ValueError, match="unknown"):
        QuorumPolicy.from_config({"mode": "majority", "quorum": 3})
