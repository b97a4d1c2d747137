"""Run the cluster scenario over many seeds: ``python -m nonstop.sim.campaign``.

    python -m nonstop.sim.campaign --seeds 10000            # seeds 0..9999 on every core
    python -m nonstop.sim.campaign --seeds 500 --start 7000  # seeds 7000..7499
    python -m nonstop.sim.campaign --seed 1234 --verbose     # replay one seed, explain it

Every failing seed is printed with the one-line command that replays it; the
exit status is 1 if any seed failed.  Runs are deterministic per seed; the
command re-executes itself with ``PYTHONHASHSEED=0`` so that even code that
iterates a ``set`` of strings replays identically in another process.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from nonstop.sim.runner import (
    Campaign,
    NotableEvents,
    SeedOutcome,
    print_fault_schedule,
    print_verdict,
)
from nonstop.sim.scenarios.cluster_log import run_seed

NOTABLE = frozenset({"role", "leader", "view", "quorum"})


class ClusterLogCampaign(Campaign[None]):
    """The cluster scenario: no options of its own."""

    module = "nonstop.sim.campaign"

    def options(self, args: argparse.Namespace) -> None:
        return None

    def run_seed(self, seed: int, options: None) -> SeedOutcome:
        result, _ = run_seed(seed, digest=False)
        return self.outcome(seed, result)

    def explain(self, seed: int, options: None, full_trace: bool) -> bool:
        """Replay one seed and print its shape, faults, notable events and verdict."""
        notable = NotableEvents(NOTABLE, 7)
        result, sim = run_seed(seed, trace=full_trace, on_start=notable.watch)
        print(f"seed {seed}: nodes {', '.join(result.nodes)}")
        print_fault_schedule(result.faults)
        if full_trace:
            print("trace:")
            for line in sim.trace:
                print("  " + line)
        else:
            print("events (faults, roles, leaders, views, quorum; --trace for everything):")
            for line in notable.lines:
                print("  " + line)
        ok = print_verdict(result)
        if full_trace:
            print(f"trace digest {result.digest}")
        return ok


CAMPAIGN = ClusterLogCampaign()


def main(argv: Sequence[str] | None = None) -> int:
    return CAMPAIGN.main(argv, __doc__)


if __name__ == "__main__":
    raise SystemExit(main())
