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

import argparse
import time
from collections.abc import Iterable, Sequence
from typing import Any

from nonstop.runtime.interface import Action, Event, Notify
from nonstop.sim.core import Simulation
from nonstop.sim.runner import Campaign, SeedOutcome, campaign_main, raised, run_many
from nonstop.sim.scenarios.replication import MUTANTS, ReplicationScenarioConfig, run_seed

COUNTERS = (
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
NOTABLE = frozenset({"leader", "view", "quorum", "pt.changed", "pt.rejected", "rep.acked"})


def replay_command(seed: int, mutant: str | None = None) -> str:
    extra = f" --mutant {mutant}" if mutant else ""
    return f"python -m nonstop.sim.replication_campaign --seed {seed}{extra} --verbose"


def run_one(seed: int, mutant: str | None = None) -> SeedOutcome:
    """One seed; an exception in the code under test is that seed's failure."""
    cpu = time.process_time()
    try:
        result, _ = run_seed(seed, ReplicationScenarioConfig(mutant=mutant))
    except Exception as exc:
        return raised(seed, exc)
    stats = result.stats
    stats["cpu_us"] = round(1e6 * (time.process_time() - cpu))
    settled = stats["settled_after"]
    stats["settled_ms"] = round(1000 * settled) if settled is not None else -1
    takeovers = stats["takeovers"]
    stats["takeover_count"] = len(takeovers)
    stats["takeover_sum_ms"] = round(1000 * sum(takeovers))
    stats["takeover_max_ms"] = round(1000 * max(takeovers)) if takeovers else -1
    return SeedOutcome(
        seed,
        result.ok,
        result.summary(),
        tuple(str(v) for v in result.violations),
        int(stats["events"]),
        wall_time=float(stats["wall_time"]),
        counters=tuple((k, int(stats[k])) for k in COUNTERS),
    )


def _run_args(args: tuple[int, str | None]) -> SeedOutcome:
    return run_one(*args)


def run_campaign(
    seeds: Iterable[int],
    *,
    mutant: str | None = None,
    jobs: int | None = None,
    progress: bool = False,
) -> list[SeedOutcome]:
    """Run ``seeds`` on ``jobs`` processes (default: every core); outcomes sorted by seed."""
    return run_many(
        _run_args,
        [(s, mutant) for s in seeds],
        failure_text=lambda outcome: failure_text(outcome, mutant),
        jobs=jobs,
        progress=progress,
        chunksize=8,
    )


def failure_text(outcome: SeedOutcome, mutant: str | None = None) -> str:
    first = outcome.violations[0] if outcome.violations else "?"
    return f"FAIL seed {outcome.seed}: {first}\n  replay: {replay_command(outcome.seed, mutant)}"


def report(outcomes: list[SeedOutcome]) -> list[str]:
    counters = [dict(o.counters) for o in outcomes]
    totals = {k: sum(c.get(k, 0) for c in counters) for k in COUNTERS}
    seeds = max(1, len(outcomes))
    lines = [
        f"exercised: {totals['acked_ops']} of {totals['ops']} client operations acknowledged "
        f"({totals['txns']} two-partition transactions), {totals['acks']} records acknowledged, "
        f"{totals['failovers']} failover and {totals['restores']} restore applications, "
        f"{totals['drops']} D12 drops, {totals['stale_refused']} stale-epoch parts refused",
        f"CPU per seed: {totals['cpu_us'] / seeds / 1000:.0f} ms (mean)",
    ]
    worst = sorted(c["takeover_max_ms"] for c in counters if c.get("takeover_max_ms", -1) >= 0)
    if worst:
        mean = totals["takeover_sum_ms"] // max(1, totals["takeover_count"])
        lines.append(
            "takeover (crash of an acknowledging node -> the partition's next acknowledgement "
            f"by another node, virtual time): mean {mean} ms over {totals['takeover_count']} "
            f"takeovers; worst per seed: median {worst[len(worst) // 2]} ms, max {worst[-1]} ms"
        )
    settled = sorted(c["settled_ms"] for c in counters if c.get("settled_ms", -1) >= 0)
    if settled:
        lines.append(
            "settled after the heal (every partition Active, every listed node in sync, every "
            f"client operation finished): median {settled[len(settled) // 2]} ms, "
            f"max {settled[-1]} ms"
        )
    return lines


def explain(seed: int, mutant: str | None = None, *, full_trace: bool = False) -> bool:
    """Replay one seed and print its faults, partition changes, acknowledgements and verdict."""
    notable: list[str] = []

    def watch(sim: Simulation) -> None:
        def on_actions(sim: Simulation, node: str, event: Event, actions: list[Action]) -> None:
            for action in actions:
                if isinstance(action, Notify) and action.kind in NOTABLE:
                    notable.append(f"{sim.now:10.6f} {node:4s} {action.kind:11s} {action.data}")

        def on_fault(sim: Simulation, what: str, details: dict[str, Any]) -> None:
            notable.append(f"{sim.now:10.6f} ---- {what:11s} {details}")

        sim.observers.append(on_actions)
        sim.fault_observers.append(on_fault)

    config = ReplicationScenarioConfig(mutant=mutant)
    result, sim = run_seed(seed, config, trace=full_trace, on_start=watch)
    print("events (faults, leaders, views, quorum, partition changes, acknowledgements):")
    for line in notable if not full_trace else sim.trace:
        print("  " + line)
    print(result.summary())
    for violation in result.violations:
        print(f"  VIOLATION {violation}")
    return result.ok


def main(argv: Sequence[str] | None = None) -> int:
    def options(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--mutant", choices=MUTANTS, help="run a deliberately broken variant")

    def configure(args: argparse.Namespace) -> Campaign:
        mutant = args.mutant
        return Campaign(
            run_one=lambda seed: run_one(seed, mutant),
            run_all=lambda seeds, jobs: run_campaign(
                seeds, mutant=mutant, jobs=jobs, progress=True
            ),
            explain=lambda seed, full_trace: explain(seed, mutant, full_trace=full_trace),
            failure_text=lambda outcome: failure_text(outcome, mutant),
            report=report,
        )

    return campaign_main("nonstop.sim.replication_campaign", __doc__, argv, configure, options)


if __name__ == "__main__":
    raise SystemExit(main())
