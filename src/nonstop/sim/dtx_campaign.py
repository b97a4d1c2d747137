"""Run the distributed-commit scenario over many seeds: ``python -m nonstop.sim.dtx_campaign``.

    python -m nonstop.sim.dtx_campaign --seeds 10000             # seeds 0..9999 on every core
    python -m nonstop.sim.dtx_campaign --seeds 500 --start 7000  # seeds 7000..7499
    python -m nonstop.sim.dtx_campaign --seed 1234 --verbose     # replay one seed, explain it
    python -m nonstop.sim.dtx_campaign --seed 1234 --step after_propose   # force the crash step
    python -m nonstop.sim.dtx_campaign --seeds 1000 --clustered  # the decision log is the Raft log

Every failing seed is printed with the one-line command that replays it; the
exit status is 1 if any seed failed.  (Its own module rather than a plug-in of
``nonstop.sim.campaign``, which runs the cluster scenario only.)
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass

from nonstop.sim.runner import (
    Campaign,
    SeedOutcome,
    print_fault_schedule,
    print_trace,
    print_verdict,
)
from nonstop.sim.scenarios.dtx import STEPS, ScenarioConfig, run_seed

COUNTERS = (
    "begun",
    "committed",
    "acked_commit",
    "unavailable",
    "audits",
    "in_doubt_asks",
    "asked_then_commit",
    "asked_then_abort",
)


@dataclass(frozen=True, slots=True)
class DtxOptions:
    step: str | None = None
    """The coordinator crash step to force (:data:`STEPS`), or the seed's own."""
    clustered: bool = False
    """The decision log is the real cluster (Raft) log, not the simulated one."""

    def config(self) -> ScenarioConfig | None:
        return ScenarioConfig(clustered=True) if self.clustered else None


class DtxCampaign(Campaign[DtxOptions]):
    module = "nonstop.sim.dtx_campaign"
    counters = COUNTERS
    chunksize = 16

    def add_options(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--step", choices=STEPS, help="force the coordinator crash step")
        parser.add_argument(
            "--clustered",
            action="store_true",
            help="the decision log is the real cluster (Raft) log, not the simulated one",
        )

    def options(self, args: argparse.Namespace) -> DtxOptions:
        return DtxOptions(args.step, args.clustered)

    def replay_options(self, options: DtxOptions) -> str:
        forced = f" --step {options.step}" if options.step is not None else ""
        return forced + (" --clustered" if options.clustered else "")

    def run_seed(self, seed: int, options: DtxOptions) -> SeedOutcome:
        result, _ = run_seed(seed, options.config(), step=options.step)
        return self.outcome(seed, result, step=result.step)

    def raised_step(self, options: DtxOptions) -> str:
        return options.step or "?"

    def report(self, outcomes: list[SeedOutcome], options: DtxOptions) -> list[str]:
        return ["paths: " + self.paths(outcomes)]

    def paths(self, outcomes: list[SeedOutcome]) -> str:
        """Sums of :data:`COUNTERS` over ``outcomes`` (what the campaign exercised)."""
        return " ".join(f"{k}={v}" for k, v in self.totals(outcomes).items())

    def explain(self, seed: int, options: DtxOptions, full_trace: bool) -> bool:
        """Replay one seed and print its shape, faults, notable events and verdict."""
        result, sim = run_seed(seed, options.config(), step=options.step, trace=True)
        print(f"seed {seed}: nodes {', '.join(result.nodes)}; coordinator crash step {result.step}")
        print_fault_schedule(result.faults)
        print_trace(sim.trace, ("FAULT", "dtx.", "dl."), full_trace)
        return print_verdict(result)


CAMPAIGN = DtxCampaign()


def main(argv: Sequence[str] | None = None) -> int:
    return CAMPAIGN.main(argv, __doc__)


if __name__ == "__main__":
    raise SystemExit(main())
