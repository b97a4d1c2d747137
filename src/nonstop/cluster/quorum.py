"""Quorum policies (SPEC D16): who must be reachable for a node (and the cluster log) to act.

A :class:`QuorumPolicy` is configuration: a mode plus per-node vote weights.  Binding it to a
member set gives a :class:`Quorum` with a weighted ``threshold``; a set of nodes "has quorum" when
the weights of its members add up to at least the threshold.  This one pure computation serves
two users:

* the node composition computes the D16 quorum *state* of a node from the failure detector's Up
  set: ``policy.bind(members).state(reachable)`` → Active (every member reachable) / Partial
  (quorum, but some member down) / Disabled (no quorum);
* the cluster log (:mod:`nonstop.cluster.raft`) uses the same threshold for its election and
  commit quorums (DESIGN: "quorum policies define the commit quorum").

Modes (the seed's "minimum votes" and "percentage of votes", plus the usual default):

* ``majority`` (default): more than half of the total weight;
* ``min_votes`` N: at least N votes;
* ``percentage`` P: at least P percent of the total weight (rounded up to whole votes);
* ``off``: quorum is never lost (state is never Disabled); for the cluster log every node is a
  quorum by itself (threshold 1), so two sides of a partition both keep working and diverge.

Two quorums of a policy are guaranteed to share a node only when ``2 * threshold > total``.  A
policy that does not guarantee it is rejected with :class:`ValueError` at :meth:`QuorumPolicy.bind`
unless ``allow_non_intersecting=True`` (``off`` implies it); the bound quorum then reports
``intersecting == False`` so status and logs can warn.  A threshold above the total weight (a quorum
that can never be reached) is always rejected.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from nonstop.runtime.interface import NodeId

MODES = ("majority", "min_votes", "percentage", "off")


class QuorumState(enum.StrEnum):
    """D16 node quorum states."""

    ACTIVE = "Active"
    PARTIAL = "Partial"
    DISABLED = "Disabled"


@dataclass(frozen=True, slots=True)
class QuorumPolicy:
    """A quorum policy: mode, its parameter, per-node vote weights (default 1)."""

    mode: str = "majority"
    min_votes: int | None = None
    percentage: float | None = None
    weights: Mapping[NodeId, int] = field(default_factory=dict)
    default_weight: int = 1
    allow_non_intersecting: bool = False

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"unknown quorum mode {self.mode!r}; expected one of {MODES}")
        if self.mode == "min_votes" and (
            not isinstance(self.min_votes, int)
            or isinstance(self.min_votes, bool)
            or self.min_votes < 1
        ):
            raise ValueError(f"min_votes must be a positive integer, not {self.min_votes!r}")
        if self.mode == "percentage" and (
            not isinstance(self.percentage, int | float)
            or isinstance(self.percentage, bool)
            or not 0 < self.percentage <= 100
        ):
            raise ValueError(f"percentage must be in (0, 100], not {self.percentage!r}")
        for node, w in {**self.weights, "<default>": self.default_weight}.items():
            if not isinstance(w, int) or isinstance(w, bool) or w < 0:
                raise ValueError(f"vote weight of {node} must be an integer >= 0, not {w!r}")

    @classmethod
    def majority(cls, weights: Mapping[NodeId, int] | None = None) -> QuorumPolicy:
        """More than half of the total vote weight (the default, always intersecting)."""
        return cls("majority", weights=dict(weights or {}))

    @classmethod
    def minimum_votes(
        cls,
        n: int,
        weights: Mapping[NodeId, int] | None = None,
        *,
        allow_non_intersecting: bool = False,
    ) -> QuorumPolicy:
        """At least ``n`` votes among the reachable members (seed: "minimum number of votes")."""
        return cls(
            "min_votes",
            min_votes=n,
            weights=dict(weights or {}),
            allow_non_intersecting=allow_non_intersecting,
        )

    @classmethod
    def vote_percentage(
        cls,
        p: float,
        weights: Mapping[NodeId, int] | None = None,
        *,
        allow_non_intersecting: bool = False,
    ) -> QuorumPolicy:
        """At least ``p`` percent of the total vote weight (seed: "percentage of votes")."""
        return cls(
            "percentage",
            percentage=p,
            weights=dict(weights or {}),
            allow_non_intersecting=allow_non_intersecting,
        )

    @classmethod
    def off(cls, weights: Mapping[NodeId, int] | None = None) -> QuorumPolicy:
        """Quorum switched off: never Disabled; both sides of a partition keep working."""
        return cls("off", weights=dict(weights or {}), allow_non_intersecting=True)

    @classmethod
    def from_config(cls, cfg: Mapping[str, Any]) -> QuorumPolicy:
        """Build from a configuration dict (the inverse of :meth:`to_config`)."""
        known = {"mode", "min_votes", "percentage", "weights", "default_weight"}
        known.add("allow_non_intersecting")
        extra = set(cfg) - known
        if extra:
            raise ValueError(f"unknown quorum policy settings: {sorted(extra)}")
        mode = cfg.get("mode", "majority")
        return cls(
            mode=mode,
            min_votes=cfg.get("min_votes"),
            percentage=cfg.get("percentage"),
            weights=dict(cfg.get("weights") or {}),
            default_weight=cfg.get("default_weight", 1),
            allow_non_intersecting=bool(cfg.get("allow_non_intersecting", mode == "off")),
        )

    def to_config(self) -> dict[str, Any]:
        """A msgpack-able dict; :meth:`from_config` rebuilds an equal policy."""
        return {
            "mode": self.mode,
            "min_votes": self.min_votes,
            "percentage": self.percentage,
            "weights": dict(self.weights),
            "default_weight": self.default_weight,
            "allow_non_intersecting": self.allow_non_intersecting,
        }

    def weight(self, node: NodeId) -> int:
        """The votes ``node`` carries."""
        return self.weights.get(node, self.default_weight)

    def bind(self, members: Iterable[NodeId]) -> Quorum:
        """The quorum of this policy over ``members``.

        Raises :class:`ValueError` when no quorum can ever be reached, or when two quorums need
        not intersect and the policy does not explicitly allow that.
        """
        ms = frozenset(members)
        total = sum(self.weight(m) for m in ms)
        if total <= 0:
            raise ValueError(f"members {sorted(ms)} carry no votes; a quorum is impossible")
        if self.mode == "majority":
            threshold = total // 2 + 1
        elif self.mode == "min_votes":
            assert self.min_votes is not None
            threshold = self.min_votes
        elif self.mode == "percentage":
            assert self.percentage is not None
            # Round up to whole votes; the tiny epsilon keeps 100 * 3 / 100 from becoming 3.0000001.
            threshold = max(1, math.ceil(total * self.percentage / 100 - 1e-9))
        else:  # off: for the cluster log every node is a quorum of its own
            threshold = 1
        if threshold > total:
            raise ValueError(
                f"quorum policy {self.mode} needs {threshold} votes but members {sorted(ms)} "
                f"carry only {total}: quorum could never be reached"
            )
        intersecting = 2 * threshold > total
        if not intersecting and not self.allow_non_intersecting:
            raise ValueError(
                f"quorum policy {self.mode} with threshold {threshold} of {total} votes does not "
                "make quorums intersect: both sides of a partition could have quorum (split "
                "brain). Raise the threshold above half the votes, or pass "
                "allow_non_intersecting=True to accept it knowingly."
            )
        return Quorum(self, ms, total, threshold, intersecting)

    def state(self, members: Iterable[NodeId], reachable: Iterable[NodeId]) -> QuorumState:
        """Shorthand for ``self.bind(members).state(reachable)``."""
        return self.bind(members).state(reachable)


@dataclass(frozen=True, slots=True)
class Quorum:
    """A policy bound to a member set."""

    policy: QuorumPolicy
    members: frozenset[NodeId]
    total: int
    threshold: int
    intersecting: bool

    def votes(self, nodes: Iterable[NodeId]) -> int:
        """The vote weight of the members among ``nodes`` (non-members count nothing)."""
        w = self.policy.weight
        return sum(w(n) for n in set(nodes) if n in self.members)

    def reached(self, nodes: Iterable[NodeId]) -> bool:
        """Whether ``nodes`` together hold a quorum."""
        return self.votes(nodes) >= self.threshold

    def state(self, reachable: Iterable[NodeId]) -> QuorumState:
        """D16 state given the reachable (Up) nodes, self included.

        Active: every member reachable.  Partial: quorum, but not every member.  Disabled: no
        quorum — except with mode ``off``, which never disables (Partial instead).
        """
        up = set(reachable)
        if self.members <= up:
            return QuorumState.ACTIVE
        if self.policy.mode == "off" or self.reached(up):
            return QuorumState.PARTIAL
        return QuorumState.DISABLED
