"""What the simulation tests share: small clusters of simulated nodes (``sim_cluster``), and
running a campaign's seeds that must all pass (``run_clean``)."""

from __future__ import annotations

import functools
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import pytest

from nonstop.cluster.failure import DetectorConfig
from nonstop.cluster.node import ClusterConfig
from nonstop.cluster.raft import RaftConfig
from nonstop.runtime.interface import Machine
from nonstop.sim.core import Simulation
from nonstop.sim.runner import Campaign, SeedOutcome

RAFT = RaftConfig(election_timeout=0.5, heartbeat_interval=0.05)
"""Fast elections: a simulated cluster has a leader within a second."""


class SimCluster:
    """Nodes ``n1``, ``n2``… of a simulated cluster, at ``sim://<name>``, each knowing the
    others at theirs; ``add`` puts them on a :class:`Simulation` (booted at once)."""

    @staticmethod
    def config(
        name: str, members: Sequence[str], peers: Iterable[str] = (), **options: Any
    ) -> ClusterConfig:
        """Node ``name``'s configuration (``peers``: the names it knows, itself ignored)."""
        return ClusterConfig(
            name=name,
            address=f"sim://{name}",
            store_timestamp=1000 + int(name[1:]),
            members=tuple(members),
            static_peers={p: f"sim://{p}" for p in peers if p != name},
            detector=DetectorConfig(),
            raft=RAFT,
            **options,
        )

    @staticmethod
    def add(
        sim: Simulation,
        names: Sequence[str],
        make_node: Callable[[ClusterConfig, random.Random, Mapping[bytes, bytes]], Machine],
        *,
        members: Sequence[str] | None = None,
        **options: Any,
    ) -> None:
        """Every node of ``names``; those outside ``members`` (default: all) start as joiners."""
        members = list(names) if members is None else members
        for name in names:
            own = members if name in members else []
            config = SimCluster.config(name, own, names, **options)
            sim.add_node(name, functools.partial(make_node, config))


@pytest.fixture
def sim_cluster() -> SimCluster:
    return SimCluster()


def run_clean_seeds(
    campaign: Campaign[Any], seeds: Sequence[int], options: Any
) -> list[SeedOutcome]:
    """``seeds`` of ``campaign`` on 2 workers, all passed (else: the failures, replay commands)."""
    outcomes = campaign.run(seeds, options, jobs=2)
    failures = [o for o in outcomes if not o.ok]
    report = "\n".join(campaign.failure_text(o, options) for o in failures[:20])
    assert [o.seed for o in outcomes] == list(seeds)
    assert not failures, f"{len(failures)} of {len(outcomes)} seeds failed:\n{report}"
    return outcomes


@pytest.fixture
def run_clean() -> Callable[[Campaign[Any], Sequence[int], Any], list[SeedOutcome]]:
    """The test's way to run seeds that must all pass (:func:`run_clean_seeds`)."""
    return run_clean_seeds
