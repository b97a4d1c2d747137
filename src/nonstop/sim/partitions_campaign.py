"""Run the partition-table scenario over many seeds: ``python -m nonstop.sim.partitions_campaign``.

    python -m nonstop.sim.partitions_campaign --seeds 10000             # every core
    python -m nonstop.sim.partitions_campaign --seed 1234 --verbose     # replay one seed
    python -m nonstop.sim.partitions_campaign --seeds 50 --mutant no_epoch_bump   # must fail

The scenario and its checks: :mod:`nonstop.sim.scenarios.partitions` (ha.md
section 11).  Every failing seed is printed with the command that replays it;
the exit status is 1 if any seed failed.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable, Sequence
from typing import Any

from nonstop.runtime.interface import Action, Event, Notify
from nonstop.sim.core import Simulation
from nonstop.sim.runner import Campaign, SeedOutcome, campaign_main, raised, run_many
from nonstop.sim.scenarios.partitions import MUTANTS, PartitionsConfig, run_seed

COUNTERS = (
    "failovers",
    "restores",
    "acting_checks",
    "settled_ms",
    "takeover_max_ms",
    "takeover_count",
    "takeover_sum_ms",
)
NOTABLE = frozenset({"leader", "view", "quorum", "pt.changed", "pt.rejected"})


def replay_command(seed: int, mutant: str | None = None) -> str:
    extra = f" --mutant {mutant}" if mutant else ""
    return f"python -m nonstop.sim.partitions_campaign --seed {seed}{extra} --verbose"


def run_one(seed: int, mutant: str | None = None) -> SeedOutcome:
    """One seed; an exception in the code under test is that seed's failure."""
    try:
        result, _ = run_seed(seed, PartitionsConfig(mutant=mutant))
    except Exception as exc:
        return raised(seed, exc)
    settled = result.stats["partitions_settled_after"]
    result.stats["settled_ms"] = round(1000 * settled) if settled is not None else -1
    takeovers = result.stats["takeovers"]
    result.stats["takeover_max_ms"] = round(1000 * max(takeovers)) if takeovers else -1
    result.stats["takeover_count"] = len(takeovers)
    result.stats["takeover_sum_ms"] = round(1000 * sum(takeovers))
    return SeedOutcome(
        seed,
        result.ok,
        result.summary(),
        tuple(str(v) for v in result.violations),
        int(result.stats["events"]),
        wall_time=float(result.stats["wall_time"]),
        counters=tuple((k, int(result.stats[k])) for k in COUNTERS),
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
    totals = {k: sum(dict(o.counters).get(k, 0) for o in outcomes) for k in COUNTERS}
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


def explain(seed: int, mutant: str | None = None, *, full_trace: bool = False) -> bool:
    """Replay one seed and print its faults, partition changes and verdict."""
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

    result, sim = run_seed(seed, PartitionsConfig(mutant=mutant), trace=full_trace, on_start=watch)
    print("events (faults, leaders, views, quorum, partition changes):")
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

    return campaign_main("nonstop.sim.partitions_campaign", __doc__, argv, configure, options)


if __name__ == "__main__":
    raise SystemExit(main())
