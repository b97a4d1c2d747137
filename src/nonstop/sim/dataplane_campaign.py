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
from collections.abc import Iterable, Sequence
from dataclasses import replace

from nonstop.replication.machine import MUTANTS as REPLICATION_MUTANTS
from nonstop.sim.runner import Campaign, SeedOutcome, campaign_main, raised, run_many
from nonstop.sim.scenarios.dataplane import ScenarioConfig, partitioned_config, run_seed
from nonstop.sim.scenarios.dataplane_mutants import MUTANTS, PARTITION_MUTANTS

MODULE = "nonstop.sim.dataplane_campaign"
COUNTERS = ("transfers", "acked", "failed", "unknown", "audits", "cpu_us")
"""What each seed reports: its transfer attempts and how they ended, its audits, and
the CPU it took (microseconds)."""


def config_for(
    mutant: str | None, partitions: bool = False, replicas: int = 0
) -> ScenarioConfig | None:
    """The scenario's configuration: routed by node (default) or by partition, maybe broken."""
    if partitions:
        base = partitioned_config(replicas=replicas)
        if mutant is None:
            return base
        if mutant in REPLICATION_MUTANTS:
            return replace(base, replication_mutant=mutant)
        return replace(base, node_class={**MUTANTS, **PARTITION_MUTANTS}[mutant])
    if mutant is None:
        return None
    return replace(ScenarioConfig(), node_class=MUTANTS[mutant])


def replay_command(
    seed: int, mutant: str | None = None, partitions: bool = False, replicas: int = 0
) -> str:
    extra = f" --mutant {mutant}" if mutant else ""
    extra += " --partitions" if partitions else ""
    extra += f" --replicas {replicas}" if replicas else ""
    return f"python -m {MODULE} --seed {seed}{extra} --verbose"


def run_one(
    seed: int, mutant: str | None = None, partitions: bool = False, replicas: int = 0
) -> SeedOutcome:
    """One seed; an exception in the code under test is that seed's failure."""
    try:
        result, _ = run_seed(seed, config_for(mutant, partitions, replicas))
    except Exception as exc:
        return raised(seed, exc)
    s = {**result.stats, "cpu_us": int(result.stats["cpu_time"] * 1e6)}
    return SeedOutcome(
        seed,
        result.ok,
        result.summary(),
        tuple(str(v) for v in result.violations),
        int(s["events"]),
        wall_time=float(s["wall_time"]),
        step=str(s["step"]),
        counters=tuple((k, int(s[k])) for k in COUNTERS),
    )


def _run_args(args: tuple[int, str | None, bool, int]) -> SeedOutcome:
    return run_one(*args)


def failure_text(
    outcome: SeedOutcome, mutant: str | None = None, partitions: bool = False, replicas: int = 0
) -> str:
    first = outcome.violations[0] if outcome.violations else "?"
    replay = replay_command(outcome.seed, mutant, partitions, replicas)
    return f"FAIL seed {outcome.seed}: {first}\n  replay: {replay}"


def run_campaign(
    seeds: Iterable[int],
    *,
    mutant: str | None = None,
    jobs: int | None = None,
    progress: bool = False,
    partitions: bool = False,
    replicas: int = 0,
) -> list[SeedOutcome]:
    """Run ``seeds`` on ``jobs`` processes (default: every core); outcomes sorted by seed."""
    return run_many(
        _run_args,
        [(s, mutant, partitions, replicas) for s in seeds],
        failure_text=lambda outcome: failure_text(outcome, mutant, partitions, replicas),
        jobs=jobs,
        progress=progress,
        chunksize=8,
    )


def totals(outcomes: Iterable[SeedOutcome]) -> dict[str, int]:
    """Sums of :data:`COUNTERS` over ``outcomes``."""
    sums = dict.fromkeys(COUNTERS, 0)
    for o in outcomes:
        for k, v in o.counters:
            sums[k] += v
    return sums


def report(outcomes: list[SeedOutcome]) -> list[str]:
    """What the seeds did, and the CPU per seed (the budget is 0.3 s)."""
    sums = totals(outcomes)
    cpu = sorted(dict(o.counters).get("cpu_us", 0) / 1e6 for o in outcomes)
    lines = ["totals: " + " ".join(f"{k}={v}" for k, v in sums.items() if k != "cpu_us")]
    if cpu:
        lines.append(
            f"cpu per seed: mean {sum(cpu) / len(cpu):.3f}s, "
            f"p90 {cpu[int(len(cpu) * 0.9)]:.3f}s, max {cpu[-1]:.3f}s"
        )
    return lines


def explain(
    seed: int,
    mutant: str | None = None,
    *,
    full_trace: bool = False,
    partitions: bool = False,
    replicas: int = 0,
) -> bool:
    """Replay one seed and print its shape, faults, client requests, replies and verdict."""
    result, sim = run_seed(seed, config_for(mutant, partitions, replicas), trace=True)
    s = result.stats
    print(
        f"seed {seed}: nodes {', '.join(result.nodes)}; {s['clients']} clients; "
        f"crash step {s['step']} (fired at {s['crash_fired']})"
    )
    print("fault schedule:")
    for fault in result.faults:
        print("  " + fault.describe())
    keep = ("FAULT", "ClientRequest", "Reply(", "dp.decide")
    for line in sim.trace:
        if full_trace or any(k in line for k in keep):
            print("  " + (line if full_trace else line[:400]))
    print(f"counts: {s['counts']}")
    print(result.summary())
    for violation in result.violations:
        print(f"  VIOLATION {violation}")
    return result.ok


def main(argv: Sequence[str] | None = None) -> int:
    def options(parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--mutant",
            choices=sorted({*MUTANTS, *PARTITION_MUTANTS, *REPLICATION_MUTANTS}),
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

    def configure(args: argparse.Namespace) -> Campaign:
        mutant: str | None = args.mutant
        parts: bool = args.partitions
        replicas: int = args.replicas
        return Campaign(
            run_one=lambda seed: run_one(seed, mutant, parts, replicas),
            run_all=lambda seeds, jobs: run_campaign(
                seeds, mutant=mutant, jobs=jobs, progress=True, partitions=parts, replicas=replicas
            ),
            explain=lambda seed, full_trace: explain(
                seed, mutant, full_trace=full_trace, partitions=parts, replicas=replicas
            ),
            failure_text=lambda outcome: failure_text(outcome, mutant, parts, replicas),
            report=report,
        )

    return campaign_main(MODULE, __doc__, argv, configure, options)


if __name__ == "__main__":
    raise SystemExit(main())
