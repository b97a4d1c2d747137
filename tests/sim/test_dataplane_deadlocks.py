"""Distributed deadlock detection in the data-plane simulator (docs/design/deadlocks.md).

The bank clients lock their two accounts in sorted order by default, which
makes lock waits across nodes but no cycle.  With ``unordered`` they lock in
random order: cycles through two or three nodes form, which only ``lock_wait``
broke before.  The runs have no nemesis faults (the network still loses and
delays a few messages, whose lost replies cost some lock waits of their own).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from nonstop.sim.scenarios.dataplane import ScenarioConfig, run_seed, sim_dataplane_config
from nonstop.sim.scenarios.dataplane_mutants import LIVENESS_MUTANTS, STARVATION_MUTANTS
from nonstop.sim.scenarios.dataplane_node import SimDataNode
from nonstop.sim.scenarios.dataplane_store import StoreConfig

SEEDS = range(8)  # 6 gave 4-10 victims: the acknowledgement now waits for phase two


def _run(unordered: float, deadlock_every: float) -> dict[str, int]:
    totals: dict[str, int] = {"lock_timeouts": 0, "victims": 0, "wounds": 0, "acked": 0}
    for seed in SEEDS:
        config = replace(
            ScenarioConfig(),
            dataplane=replace(sim_dataplane_config(), deadlock_every=deadlock_every),
            crash_steps=False,
            fault_rate=1e-9,  # no nemesis faults
            clients=(6,),
            local_share=0.0,
            audit_share=0.0,
            unordered=unordered,
            read_back=0.0,  # only transfers: the lock waits are the subject here
        )
        result, sim = run_seed(seed, config)
        assert result.ok, (seed, result.violations[:3])
        for name in result.nodes:
            node: Any = sim.machine(name)
            totals["lock_timeouts"] += node.store.stats["lock_timeouts"]
            totals["victims"] += node.dataplane.stats["deadlock_victims"]
            totals["wounds"] += node.dataplane.stats["deadlock_wounds"]
        totals["acked"] += result.stats["acked"]
    return totals


def test_cycles_across_nodes_end_by_a_victim_not_by_the_lock_wait() -> None:
    off = _run(unordered=1.0, deadlock_every=0.0)
    on = _run(unordered=1.0, deadlock_every=0.025)
    assert off["victims"] == 0
    assert on["victims"] >= 5, on
    # The cycles no longer wait for lock_wait: fewer timeouts, more transfers done.
    assert on["lock_timeouts"] + on["victims"] // 2 <= off["lock_timeouts"], (on, off)
    assert on["acked"] > off["acked"], (on, off)


def test_no_victim_without_a_cycle_but_wounds() -> None:
    """Accounts locked in sorted order: chains of waits, no cycle.  Cycle detection
    dooms nobody; the only victims are wounds (an older transaction waiting for a
    younger one that waits itself)."""
    ordered = _run(unordered=0.0, deadlock_every=0.025)
    assert ordered["victims"] == ordered["wounds"], ordered
    assert ordered["acked"] > 100


def _contended(clients: int, node_class: type[SimDataNode] = SimDataNode) -> ScenarioConfig:
    """``clients`` on 24 accounts, random lock order, no fault and no lost message,
    ``lock_wait`` as in production (5 s)."""
    return replace(
        ScenarioConfig(),
        node_class=node_class,
        dataplane=replace(
            sim_dataplane_config(), deadlock_every=0.025, rpc_timeout=6.0, branch_idle=8.0
        ),
        store=StoreConfig(lock_wait=5.0),  # as in production: cycles must not wait for it
        op_timeout=8.0,
        settle_within=20.0,
        crash_steps=False,
        fault_rate=1e-9,
        lossless=True,
        nodes=(3,),
        clients=(clients,),
        accounts_per_node=8,
        local_share=0.0,
        audit_share=0.0,
        unordered=1.0,
        read_back=0.0,
        heal_at=4.0,
    )


@pytest.mark.parametrize(("clients", "seed"), [(16, 0), (64, 0)])
def test_no_commit_gap_over_200_ms_in_virtual_time(clients: int, seed: int) -> None:
    """In virtual time (no CPU noise) transfers never stop for more than 200 ms, at
    64 clients on 24 accounts too (0.12-0.27 s before wound-wait; the mutant below)."""
    result, _ = run_seed(seed, _contended(clients))
    assert result.ok, (seed, result.violations[:3])
    assert result.stats["acked"] > 100, (seed, result.stats)
    assert result.stats["max_gap"] <= 0.2, (seed, result.stats["max_gap"])


@pytest.mark.parametrize("mutant", sorted(LIVENESS_MUTANTS))
def test_without_wounds_the_gap_check_fails(mutant: str) -> None:
    """The gap check is not vacuous: cycle detection alone (``no-wound``) leaves a gap
    over 200 ms at 64 clients (seed 0: 0.27 s), and stays safe."""
    result, _ = run_seed(0, _contended(64, LIVENESS_MUTANTS[mutant]))
    assert result.ok, result.violations[:3]
    assert result.stats["max_gap"] > 0.2, result.stats["max_gap"]


STARVATION_SEED = 1
MAX_ATTEMPTS = 16
"""Attempts per transfer at 64 clients on 24 accounts (seed 1: 13 with stamps kept; 14 with
the ``drop-stamp`` mutant: the count alone hardly separates them, the wait does)."""
MAX_TRANSFER_WAIT = 1.0
"""Seconds from a transfer's first attempt to its commit (seed 1: 0.72 s with stamps
kept, 2.11 s with ``drop-stamp``; seeds 0-3: 0.55-1.46 s against 1.51-3.76 s)."""


def _replayed(node_class: type[SimDataNode] = SimDataNode) -> ScenarioConfig:
    """64 clients on 24 accounts, replayed as ``@transactional`` does (up to 100 times,
    its back-off, the first attempt's age carried on ``begin``), the nodes believing an
    age up to 10 s (``deadlock_age_max``; 0 by default: ranks anew)."""
    config = _contended(64, node_class)
    assert config.dataplane is not None
    return replace(
        config,
        dataplane=replace(config.dataplane, deadlock_age_max=10.0),
        replays=100,
        transactional_replays=True,
    )


def test_no_transfer_starves_a_replay_keeps_its_first_stamp() -> None:
    """Wound-wait is fair per transfer, not per attempt: a replay ranks from its first
    attempt (docs/design/deadlocks.md section 2b), so every transfer becomes the oldest
    in time and commits; none is replayed more than ``MAX_ATTEMPTS`` times or waits more
    than ``MAX_TRANSFER_WAIT``."""
    result, _ = run_seed(STARVATION_SEED, _replayed())
    assert result.ok, result.violations[:3]
    assert result.stats["acked"] > 300, result.stats
    assert result.stats["max_attempts"] <= MAX_ATTEMPTS, result.stats["max_attempts"]
    assert result.stats["max_wait"] <= MAX_TRANSFER_WAIT, result.stats["max_wait"]
    assert result.stats["max_gap"] <= 0.2, result.stats["max_gap"]


@pytest.mark.parametrize("mutant", sorted(STARVATION_MUTANTS))
def test_a_replay_ranked_from_its_own_start_starves(mutant: str) -> None:
    """The starvation check is not vacuous: a node that drops the replay's age
    (``drop-stamp``: ranks per attempt) leaves a transfer waiting over the bound, and
    stays safe."""
    result, _ = run_seed(STARVATION_SEED, _replayed(STARVATION_MUTANTS[mutant]))
    assert result.ok, result.violations[:3]
    assert result.stats["max_wait"] > MAX_TRANSFER_WAIT, result.stats["max_wait"]
