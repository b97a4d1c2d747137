"""Run the replication scenario over many seeds: ``python -m nonstop.sim.replication_campaign``.

    python -m nonstop.sim.replication_campaign --seeds 10000            # every core
    python -m nonstop.sim.replication_campaign --seed 1234 --verbose    # replay one seed
    python -m nonstop.sim.replication_campaign --seeds 50 --mutant stale_epoch   # must fail

The scenario and its checks: :mod:`nonstop.sim.scenarios.replication`
(replication.md section 7).  Every failing seed is printed with the command
that replays it; the exit status is 1 if any seed failed.  The report says
what the seeds exercised (acknowledged appends and transactions, failovers,
D12 drops, restores) and the takeover time: from the crash of a node that was
acknowledging for a partition to the partition's next acknowledgement, by
another node, in virtual time.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from nonstop.sim.core import Simulation
from nonstop.sim.runner import (
    MutantCampaign,
    MutantOptions,
    ScenarioResult,
    SeedOutcome,
    takeover_counters,
)
from nonstop.sim.scenarios.replication import MUTANTS, ReplicationScenarioConfig, run_seed


class ReplicationCampaign(MutantCampaign):
    mutants = MUTANTS
    notable = frozenset({"leader", "view", "quorum", "pt.changed", "pt.rejected", "rep.acked"})
    heading = "events (faults, leaders, views, quorum, partition changes, acknowledgements):"
    module = "nonstop.sim.replication_campaign"
    counters = (
        "acked_ops",
        "ops",
        "txns",
        "acks",
        "failovers",
        "restores",
        "drops",
        "stale_refused",
        "cpu_us",
        "settled_ms",
        "takeover_count",
        "takeover_sum_ms",
        "takeover_max_ms",
    )

    def scenario(
        self, seed: int, options: MutantOptions, **hooks: Any
    ) -> tuple[ScenarioResult, Simulation]:
        return run_seed(seed, ReplicationScenarioConfig(mutant=options.mutant), **hooks)

    def run_seed(self, seed: int, options: MutantOptions) -> SeedOutcome:
        cpu = time.process_time()
        result, _ = self.scenario(seed, options)
        cpu_us = round(1e6 * (time.process_time() - cpu))
        stats = result.stats
        times = takeover_counters(stats["settled_after"], stats["takeovers"])
        return self.outcome(seed, result, {**stats, **times, "cpu_us": cpu_us})

    def report(self, outcomes: list[SeedOutcome], options: MutantOptions) -> list[str]:
        counters = [dict(o.counters) for o in outcomes]
        totals = self.totals(outcomes)
        seeds = max(1, len(outcomes))
        lines = [
            f"exercised: {totals['acked_ops']} of {totals['ops']} client operations acknowledged "
            f"({totals['txns']} two-partition transactions), {totals['acks']} records "
            f"acknowledged, {totals['failovers']} failover and {totals['restores']} restore "
            f"applications, {totals['drops']} D12 drops, {totals['stale_refused']} stale-epoch "
            "parts refused",
            f"CPU per seed: {totals['cpu_us'] / seeds / 1000:.0f} ms (mean)",
        ]
        worst = sorted(c["takeover_max_ms"] for c in counters if c.get("takeover_max_ms", -1) >= 0)
        if worst:
            mean = totals["takeover_sum_ms"] // max(1, totals["takeover_count"])
            lines.append(
                "takeover (crash of an acknowledging node -> the partition's next "
                f"acknowledgement by another node, virtual time): mean {mean} ms over "
                f"{totals['takeover_count']} takeovers; worst per seed: median "
                f"{worst[len(worst) // 2]} ms, max {worst[-1]} ms"
            )
        settled = sorted(c["settled_ms"] for c in counters if c.get("settled_ms", -1) >= 0)
        if settled:
            lines.append(
                "settled after the heal (every partition Active, every listed node in sync, "
                f"every client operation finished): median {settled[len(settled) // 2]} ms, "
                f"max {settled[-1]} ms"
            )
        return lines


CAMPAIGN = ReplicationCampaign()


def main(argv: Sequence[str] | None = None) -> int:
    return CAMPAIGN.main(argv, __doc__)


if __name__ == "__main__":
    raise SystemExit(main())
