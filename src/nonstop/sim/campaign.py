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

from collections.abc import Iterable, Sequence
from typing import Any

from nonstop.runtime.interface import Action, Event, Notify
from nonstop.sim.core import Simulation
from nonstop.sim.runner import Campaign, SeedOutcome, campaign_main, raised, run_many
from nonstop.sim.scenarios.cluster_log import RunResult, run_seed


def replay_command(seed: int) -> str:
    return f"python -m nonstop.sim.campaign --seed {seed} --verbose"


def run_one(seed: int) -> SeedOutcome:
    """Run one seed; an exception in the code under test is a failure, not a crash."""
    try:
        result, _ = run_seed(seed, digest=False)
    except Exception as exc:  # the code under test raised: report it as this seed's failure
        return raised(seed, exc)
    return SeedOutcome(
        seed,
        result.ok,
        result.summary(),
        tuple(str(v) for v in result.violations),
        int(result.stats["events"]),
        wall_time=float(result.stats["wall_time"]),
    )


def run_campaign(
    seeds: Iterable[int], *, jobs: int | None = None, progress: bool = False
) -> list[SeedOutcome]:
    """Run ``seeds`` on ``jobs`` worker processes (default: every core); outcomes by seed."""
    return run_many(run_one, list(seeds), failure_text=_failure_text, jobs=jobs, progress=progress)


def _failure_text(outcome: SeedOutcome) -> str:
    first = outcome.violations[0] if outcome.violations else "?"
    return f"FAIL seed {outcome.seed}: {first}\n  replay: {replay_command(outcome.seed)}"


def explain(seed: int, *, full_trace: bool = False) -> RunResult:
    """Replay one seed and print its shape, faults, notable events and verdict."""
    notable: list[str] = []

    def watch(sim: Simulation) -> None:
        def on_actions(sim: Simulation, node: str, event: Event, actions: list[Action]) -> None:
            for action in actions:
                if isinstance(action, Notify) and action.kind in NOTABLE:
                    notable.append(f"{sim.now:10.6f} {node:4s} {action.kind:7s} {action.data}")

        def on_fault(sim: Simulation, what: str, details: dict[str, Any]) -> None:
            notable.append(f"{sim.now:10.6f} ---- {what:7s} {details}")

        sim.observers.append(on_actions)
        sim.fault_observers.append(on_fault)

    result, sim = run_seed(seed, trace=full_trace, on_start=watch)
    print(f"seed {seed}: nodes {', '.join(result.nodes)}")
    print("fault schedule:")
    for fault in result.faults:
        print("  " + fault.describe())
    if full_trace:
        print("trace:")
        for line in sim.trace:
            print("  " + line)
    else:
        print("events (faults, roles, leaders, views, quorum; --trace for everything):")
        for line in notable:
            print("  " + line)
    print(result.summary())
    for violation in result.violations:
        print(f"  VIOLATION {violation}")
    if full_trace:
        print(f"trace digest {result.digest}")
    return result


NOTABLE = frozenset({"role", "leader", "view", "quorum"})


def main(argv: Sequence[str] | None = None) -> int:
    campaign = Campaign(
        run_one=run_one,
        run_all=lambda seeds, jobs: run_campaign(seeds, jobs=jobs, progress=True),
        explain=lambda seed, full_trace: explain(seed, full_trace=full_trace).ok,
        failure_text=_failure_text,
    )
    return campaign_main("nonstop.sim.campaign", __doc__, argv, lambda args: campaign)


if __name__ == "__main__":
    raise SystemExit(main())
