"""Run the data-plane scenario over many seeds: ``python -m nonstop.sim.dataplane_campaign``.

    python -m nonstop.sim.dataplane_campaign --seeds 3000             # seeds 0..2999, every core
    python -m nonstop.sim.dataplane_campaign --seeds 500 --start 7000 # seeds 7000..7499
    python -m nonstop.sim.dataplane_campaign --seed 1234 --verbose    # replay one seed, explain it
    python -m nonstop.sim.dataplane_campaign --seeds 50 --mutant ack-on-votes
    python -m nonstop.sim.dataplane_campaign --seeds 300 --partitions   # routing by partition
    python -m nonstop.sim.dataplane_campaign --seeds 50 --partitions --mutant ack-without-acting
    python -m nonstop.sim.dataplane_campaign --seeds 300 --partitions --replicas 1  # sync replicas
    python -m nonstop.sim.dataplane_campaign --seeds 20 --partitions --replicas 1 \
        --mutant ack_before_replica

Every failing seed is printed with the one-line command that replays it; the
exit status is 1 if any seed failed.  ``--mutant`` runs a deliberately broken
node instead of the real one (the mutation check: the campaign must fail).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass, replace

from nonstop.replication.machine import MUTANTS as REPLICATION_MUTANTS
from nonstop.sim.runner import (
    Campaign,
    SeedOutcome,
    print_fault_schedule,
    print_trace,
    print_verdict,
)
from nonstop.sim.scenarios.dataplane import ScenarioConfig, partitioned_config, run_seed
from nonstop.sim.scenarios.dataplane_mutants import MUTANTS, PARTITION_MUTANTS, REPLICA_MUTANTS

MODULE = "nonstop.sim.dataplane_campaign"
COUNTERS = ("transfers", "acked", "failed", "unknown", "audits", "cpu_us")
"""What each seed reports: its transfer attempts and how they ended, its audits, and
the CPU it took (microseconds)."""


def config_for(
    mutant: str | None,
    partitions: bool = False,
    replicas: int = 0,
    prepare_delay: float = 0.0,
    late_renewals: float = 0.0,
) -> ScenarioConfig | None:
    """The scenario's configuration: routed by node (default) or by partition, maybe broken."""
    if partitions:
        base = partitioned_config(
            replicas=replicas, prepare_delay=prepare_delay, late_renewals=late_renewals
        )
        if mutant is None:
            return base
        if mutant in REPLICATION_MUTANTS:
            return replace(base, replication_mutant=mutant)
        return replace(base, node_class={**MUTANTS, **PARTITION_MUTANTS, **REPLICA_MUTANTS}[mutant])
    if mutant is None:
        return None
    return replace(ScenarioConfig(), node_class=MUTANTS[mutant])


@dataclass(frozen=True, slots=True)
class DataPlaneOptions:
    mutant: str | None = None
    partitions: bool = False
    replicas: int = 0
    prepare_delay: float = 0.0
    late_renewals: float = 0.0

    def config(self) -> ScenarioConfig | None:
        return config_for(
            self.mutant, self.partitions, self.replicas, self.prepare_delay, self.late_renewals
        )


class DataPlaneCampaign(Campaign[DataPlaneOptions]):
    module = MODULE
    counters = COUNTERS

    def add_options(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--mutant",
            choices=sorted({*MUTANTS, *PARTITION_MUTANTS, *REPLICA_MUTANTS, *REPLICATION_MUTANTS}),
            help="run a deliberately broken node (must fail)",
        )
        parser.add_argument(
            "--partitions",
            action="store_true",
            help="route by partition (HA cluster nodes; dataplane_partitions)",
        )
        parser.add_argument(
            "--replicas",
            type=int,
            default=0,
            help="with --partitions: sync replicas per partition (dataplane_replication)",
        )
        parser.add_argument(
            "--prepare-delay",
            type=float,
            default=0.0,
            help="with --replicas: a prepare reaches the replication host up to this many "
            "seconds late (a large prepare's encoding; leases may lapse meanwhile)",
        )
        parser.add_argument(
            "--late-renewals",
            type=float,
            default=0.0,
            help="with --replicas: drop this share of the lease renewals (a node's loop held "
            "up: its lease lapses while the table stays; the lapses ops and votes wait out)",
        )

    def options(self, args: argparse.Namespace) -> DataPlaneOptions:
        return DataPlaneOptions(
            args.mutant, args.partitions, args.replicas, args.prepare_delay, args.late_renewals
        )

    def replay_options(self, options: DataPlaneOptions) -> str:
        extra = f" --mutant {options.mutant}" if options.mutant else ""
        extra += " --partitions" if options.partitions else ""
        extra += f" --prepare-delay {options.prepare_delay}" if options.prepare_delay else ""
        extra += f" --late-renewals {options.late_renewals}" if options.late_renewals else ""
        return extra + (f" --replicas {options.replicas}" if options.replicas else "")

    def run_seed(self, seed: int, options: DataPlaneOptions) -> SeedOutcome:
        result, _ = run_seed(seed, options.config())
        s = {**result.stats, "cpu_us": int(result.stats["cpu_time"] * 1e6)}
        return self.outcome(seed, result, s, step=str(s["step"]))

    def report(self, outcomes: list[SeedOutcome], options: DataPlaneOptions) -> list[str]:
        """What the seeds did, and the CPU per seed (the budget is 0.3 s)."""
        sums = self.totals(outcomes)
        cpu = sorted(dict(o.counters).get("cpu_us", 0) / 1e6 for o in outcomes)
        lines = ["totals: " + " ".join(f"{k}={v}" for k, v in sums.items() if k != "cpu_us")]
        if cpu:
            lines.append(
                f"cpu per seed: mean {sum(cpu) / len(cpu):.3f}s, "
                f"p90 {cpu[int(len(cpu) * 0.9)]:.3f}s, max {cpu[-1]:.3f}s"
            )
        return lines

    def explain(self, seed: int, options: DataPlaneOptions, full_trace: bool) -> bool:
        """Replay one seed and print its shape, faults, client requests, replies and verdict."""
        result, sim = run_seed(seed, options.config(), trace=True)
        s = result.stats
        print(
            f"seed {seed}: nodes {', '.join(result.nodes)}; {s['clients']} clients; "
            f"crash step {s['step']} (fired at {s['crash_fired']})"
        )
        print_fault_schedule(result.faults)
        print_trace(sim.trace, ("FAULT", "ClientRequest", "Reply(", "dp.decide"), full_trace)
        print(f"counts: {s['counts']}")
        return print_verdict(result)


CAMPAIGN = DataPlaneCampaign()


def main(argv: Sequence[str] | None = None) -> int:
    return CAMPAIGN.main(argv, __doc__)


if __name__ == "__main__":
    raise SystemExit(main())
