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
from collections.abc import Iterable, Sequence

from nonstop.sim.runner import Campaign, SeedOutcome, campaign_main, raised, run_many
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


def replay_command(seed: int, step: str | None = None, clustered: bool = False) -> str:
    forced = f" --step {step}" if step is not None else ""
    forced += " --clustered" if clustered else ""
    return f"python -m nonstop.sim.dtx_campaign --seed {seed}{forced} --verbose"


def run_one(
    seed: int, step: str | None = None, config: ScenarioConfig | None = None
) -> SeedOutcome:
    """One seed; an exception in the code under test is that seed's failure."""
    try:
        result, _ = run_seed(seed, config, step=step)
    except Exception as exc:
        return raised(seed, exc, step or "?")
    return SeedOutcome(
        seed,
        result.ok,
        result.summary(),
        tuple(str(v) for v in result.violations),
        int(result.stats["events"]),
        wall_time=float(result.stats["wall_time"]),
        step=result.step,
        counters=tuple((k, int(result.stats[k])) for k in COUNTERS),
    )


def _run_args(args: tuple[int, str | None, ScenarioConfig | None]) -> SeedOutcome:
    return run_one(*args)


def run_campaign(
    seeds: Iterable[int],
    *,
    step: str | None = None,
    config: ScenarioConfig | None = None,
    jobs: int | None = None,
    progress: bool = False,
) -> list[SeedOutcome]:
    """Run ``seeds`` on ``jobs`` processes (default: every core); outcomes sorted by seed."""
    clustered = bool(config and config.clustered)
    return run_many(
        _run_args,
        [(s, step, config) for s in seeds],
        failure_text=lambda outcome: failure_text(outcome, step, clustered),
        jobs=jobs,
        progress=progress,
        chunksize=16,
    )


def totals(outcomes: Iterable[SeedOutcome]) -> str:
    """Sums of :data:`COUNTERS` over ``outcomes`` (what the campaign exercised)."""
    sums: dict[str, int] = dict.fromkeys(COUNTERS, 0)
    for o in outcomes:
        for k, v in o.counters:
            sums[k] += v
    return " ".join(f"{k}={v}" for k, v in sums.items())


def failure_text(outcome: SeedOutcome, step: str | None = None, clustered: bool = False) -> str:
    first = outcome.violations[0] if outcome.violations else "?"
    replay = replay_command(outcome.seed, step, clustered)
    return f"FAIL seed {outcome.seed}: {first}\n  replay: {replay}"


def explain(
    seed: int,
    step: str | None = None,
    *,
    full_trace: bool = False,
    config: ScenarioConfig | None = None,
) -> bool:
    """Replay one seed and print its shape, faults, notable events and verdict."""
    result, sim = run_seed(seed, config, step=step, trace=True)
    print(f"seed {seed}: nodes {', '.join(result.nodes)}; coordinator crash step {result.step}")
    print("fault schedule:")
    for fault in result.faults:
        print("  " + fault.describe())
    keep = ("FAULT", "dtx.", "dl.")
    for line in sim.trace:
        if full_trace or any(k in line for k in keep):
            print("  " + (line if full_trace else line[:400]))
    print(result.summary())
    for violation in result.violations:
        print(f"  VIOLATION {violation}")
    return result.ok


def main(argv: Sequence[str] | None = None) -> int:
    def options(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--step", choices=STEPS, help="force the coordinator crash step")
        parser.add_argument(
            "--clustered",
            action="store_true",
            help="the decision log is the real cluster (Raft) log, not the simulated one",
        )

    def configure(args: argparse.Namespace) -> Campaign:
        step: str | None = args.step
        clustered: bool = args.clustered
        config = ScenarioConfig(clustered=True) if clustered else None
        return Campaign(
            run_one=lambda seed: run_one(seed, step, config),
            run_all=lambda seeds, jobs: run_campaign(
                seeds, step=step, config=config, jobs=jobs, progress=True
            ),
            explain=lambda seed, full_trace: explain(
                seed, step, full_trace=full_trace, config=config
            ),
            failure_text=lambda outcome: failure_text(outcome, step, clustered),
            report=lambda outcomes: ["paths: " + totals(outcomes)],
        )

    return campaign_main("nonstop.sim.dtx_campaign", __doc__, argv, configure, options)


if __name__ == "__main__":
    raise SystemExit(main())
