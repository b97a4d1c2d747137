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

from nonstop.sim.scenarios.dataplane import ScenarioConfig, run_seed, sim_dataplane_config

SEEDS = range(8)  # 6 gave 4-10 victims: the acknowledgement now waits for phase two


def _run(unordered: float, deadlock_every: float) -> dict[str, int]:
    totals: dict[str, int] = {"lock_timeouts": 0, "victims": 0, "acked": 0}
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


def test_no_victim_without_a_cycle() -> None:
    ordered = _run(unordered=0.0, deadlock_every=0.025)
    assert ordered["victims"] == 0, ordered
    assert ordered["acked"] > 100
