"""Run the data-plane scenario over many seeds: ``python -m nonstop.sim.dataplane_campaign``.

    python -m nonstop.sim.dataplane_campaign --seeds 3000             # seeds 0..2999, every core
    python -m nonstop.sim.dataplane_campaign --seeds 500 --start 7000 # seeds 7000..7499
    python -m nonstop.sim.dataplane_campaign --seed 1234 --verbose    # replay one seed, explain it
    python -m nonstop.sim.dataplane_campaign --seeds 50 --mutant ack-before-decision

Every failing seed is printed with the one-line command that replays it; the
exit status is 1 if any seed failed.  ``--mutant`` runs a deliberately broken
node instead of the real one (the mutation check: the campaign must fail).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

from nonstop.sim.runner import campaign_parser, pin_hash_seed, run_many
from nonstop.sim.scenarios.dataplane import ScenarioConfig, run_seed
from nonstop.sim.scenarios.dataplane_mutants import MUTANTS

MODULE = "nonstop.sim.dataplane_campaign"
TOTALS = ("transfers", "acked", "failed", "unknown", "audits")


@dataclass(slots=True)
class SeedOutcome:
    seed: int
    ok: bool
    summary: str
    violations: tuple[str, ...]
    events: int
    cpu: float
    totals: tuple[tuple[str, int], ...] = ()


def config_for(mutant: str | None) -> ScenarioConfig | None:
    if mutant is None:
        return None
    return replace(ScenarioConfig(), node_class=MUTANTS[mutant])


def replay_command(seed: int, mutant: str | None = None) -> str:
    extra = f" --mutant {mutant}" if mutant else ""
    return f"python -m {MODULE} --seed {seed}{extra} --verbose"


def run_one(seed: int, mutant: str | None = None) -> SeedOutcome:
    """One seed; an exception in the code under test is that seed's failure."""
    try:
        result, _ = run_seed(seed, config_for(mutant))
    except Exception as exc:
        return SeedOutcome(seed, False, f"seed {seed}: EXCEPTION", (repr(exc),), 0, 0.0)
    s = result.stats
    return SeedOutcome(
        seed,
        result.ok,
        result.summary(),
        tuple(str(v) for v in result.violations),
        int(s["events"]),
        float(s["cpu_time"]),
        tuple((k, int(s[k])) for k in TOTALS),
    )


def _run_args(args: tuple[int, str | None]) -> SeedOutcome:
    return run_one(*args)


def failure_text(outcome: SeedOutcome, mutant: str | None = None) -> str:
    first = outcome.violations[0] if outcome.violations else "?"
    return f"FAIL seed {outcome.seed}: {first}\n  replay: {replay_command(outcome.seed, mutant)}"


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


def totals(outcomes: Iterable[SeedOutcome]) -> str:
    sums = dict.fromkeys(TOTALS, 0)
    for o in outcomes:
        for k, v in o.totals:
            sums[k] += v
    return " ".join(f"{k}={v}" for k, v in sums.items())


def explain(seed: int, mutant: str | None = None, *, full_trace: bool = False) -> bool:
    """Replay one seed and print its shape, faults, notable events and verdict."""
    result, sim = run_seed(seed, config_for(mutant), trace=True)
    print(f"seed {seed}: nodes {', '.join(result.nodes)}; {result.stats['clients']} clients")
    print("fault schedule:")
    for fault in result.faults:
        print("  " + fault.describe())
    keep = ("FAULT", "ClientRequest", "Reply(", "dp.decide")
    for line in sim.trace:
        if full_trace or any(k in line for k in keep):
            print("  " + (line if full_trace else line[:400]))
    print(f"counts: {result.stats['counts']}")
    print(result.summary())
    for violation in result.violations:
        print(f"  VIOLATION {violation}")
    return result.ok


def main(argv: Sequence[str] | None = None) -> int:
    args_list = pin_hash_seed(MODULE, argv)
    parser = campaign_parser(MODULE, __doc__)
    parser.add_argument(
        "--mutant", choices=sorted(MUTANTS), help="run a deliberately broken node (must fail)"
    )
    args = parser.parse_args(args_list)
    if args.seed is not None:
        if args.verbose or args.trace:
            return 0 if explain(args.seed, args.mutant, full_trace=args.trace) else 1
        outcome = run_one(args.seed, args.mutant)
        print(outcome.summary)
        for v in outcome.violations:
            print(f"  VIOLATION {v}")
        return 0 if outcome.ok else 1
    started = time.perf_counter()
    outcomes = run_campaign(
        range(args.start, args.start + args.seeds),
        mutant=args.mutant,
        jobs=args.jobs,
        progress=True,
    )
    failures = [o for o in outcomes if not o.ok]
    elapsed = time.perf_counter() - started
    for outcome in failures:
        print(failure_text(outcome, args.mutant))
    events = sum(o.events for o in outcomes)
    cpu = sorted(o.cpu for o in outcomes)
    print("totals: " + totals(outcomes))
    if cpu:
        print(
            f"cpu per seed: mean {sum(cpu) / len(cpu):.3f}s, "
            f"p90 {cpu[int(len(cpu) * 0.9)]:.3f}s, max {cpu[-1]:.3f}s"
        )
    print(
        f"{len(outcomes)} seeds, {len(failures)} failed, {events} events, "
        f"{elapsed:.1f}s wall ({len(outcomes) / max(elapsed, 1e-9):.1f} seeds/s)"
    )
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
