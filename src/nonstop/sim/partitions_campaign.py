"""Run the partition-table scenario over many seeds: ``python -m nonstop.sim.partitions_campaign``.

    python -m nonstop.sim.partitions_campaign --seeds 10000             # every core
    python -m nonstop.sim.partitions_campaign --seed 1234 --verbose     # replay one seed
    python -m nonstop.sim.partitions_campaign --seeds 50 --mutant no_epoch_bump   # must fail

The scenario and its checks: :mod:`nonstop.sim.scenarios.partitions` (ha.md
section 11).  Every failing seed is printed with the command that replays it;
the exit status is 1 if any seed failed.
"""

from __future__ import annotations

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
from nonstop.sim.scenarios.partitions import MUTANTS, PartitionsConfig, run_seed


class PartitionsCampaign(MutantCampaign):
    mutants = MUTANTS
    notable = frozenset({"leader", "view", "quorum", "pt.changed", "pt.rejected"})
    heading = "events (faults, leaders, views, quorum, partition changes):"
    module = "nonstop.sim.partitions_campaign"
    counters = (
        "failovers",
        "restores",
        "acting_checks",
        "settled_ms",
        "takeover_max_ms",
        "takeover_count",
        "takeover_sum_ms",
    )

    def scenario(
        self, seed: int, options: MutantOptions, **hooks: Any
    ) -> tuple[ScenarioResult, Simulation]:
        return run_seed(seed, PartitionsConfig(mutant=options.mutant), **hooks)

    def run_seed(self, seed: int, options: MutantOptions) -> SeedOutcome:
        result, _ = self.scenario(seed, options)
        stats = result.stats
        times = takeover_counters(stats["partitions_settled_after"], stats["takeovers"])
        return self.outcome(seed, result, {**stats, **times})

    def report(self, outcomes: list[SeedOutcome], options: MutantOptions) -> list[str]:
        totals = self.totals(outcomes)
        settled = sorted(dict(o.counters).get("settled_ms", -1) for o in outcomes)
        settled = [ms for ms in settled if ms >= 0]
        lines = [
            f"exercised: {totals['failovers']} failovers, {totals['restores']} restores, "
            f"{totals['acting_checks']} acting checks"
        ]
        takeovers = sorted(
            ms for o in outcomes if (ms := dict(o.counters).get("takeover_max_ms", -1)) >= 0
        )
        if takeovers:
            lines.append(
                "takeover (crash of the acting node -> another node acting), worst per seed: "
                f"median {takeovers[len(takeovers) // 2]} ms, max {takeovers[-1]} ms "
                f"over {len(takeovers)} seeds; mean of all "
                f"{totals['takeover_sum_ms'] // max(1, totals['takeover_count'])} ms "
                f"over {totals['takeover_count']} takeovers"
            )
        if settled:
            median, worst = settled[len(settled) // 2], settled[-1]
            lines.append(
                "partitions settled (all Active, every listed node in sync) after the heal, "
                f"at most: median {median} ms, max {worst} ms"
            )
        return lines


CAMPAIGN = PartitionsCampaign()


def main(argv: Sequence[str] | None = None) -> int:
    return CAMPAIGN.main(argv, __doc__)


if __name__ == "__main__":
    raise SystemExit(main())
