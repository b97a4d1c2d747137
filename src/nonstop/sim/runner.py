"""Running many simulation seeds on every core, with a progress bar, and the command line.

Every campaign (the cluster log's, the distributed-commit protocol's) is the
same loop: a picklable function runs one unit of work (a seed) and returns an
outcome with ``seed`` and ``ok``; seeds run on a fork pool; failures are printed
as they come (each with its replay command, which only the campaign knows);
outcomes come back sorted by seed.  And the same command line
(:func:`campaign_main`): a seed range on every core, or one seed replayed and
explained; exit status 1 if any seed failed.  A campaign module says only what
is its own (:class:`Campaign`): how to run and explain a seed, how to name a
failure, what to report at the end.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar


class Outcome(Protocol):
    @property
    def seed(self) -> int: ...

    @property
    def ok(self) -> bool: ...


W = TypeVar("W")
R = TypeVar("R", bound=Outcome)


def run_many(
    fn: Callable[[W], R],
    work: Sequence[W],
    *,
    failure_text: Callable[[R], str],
    jobs: int | None = None,
    progress: bool = False,
    chunksize: int = 8,
) -> list[R]:
    """Run ``fn`` over ``work`` on ``jobs`` processes (default: every core); sorted by seed."""
    jobs = jobs or os.cpu_count() or 1
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(work), unit="seed", file=sys.stderr, dynamic_ncols=True)
    pool = None
    if jobs == 1:
        iterator: Iterable[R] = map(fn, work)
    else:
        pool = multiprocessing.get_context("fork").Pool(jobs)
        iterator = pool.imap_unordered(fn, work, chunksize=chunksize)
    outcomes: list[R] = []
    failed = 0
    try:
        for outcome in iterator:
            outcomes.append(outcome)
            if not outcome.ok:
                failed += 1
                if bar is not None:
                    bar.write(failure_text(outcome))
            if bar is not None:
                bar.update(1)
                bar.set_postfix(failed=failed)
    finally:
        if pool is not None:
            pool.close()
            pool.join()
        if bar is not None:
            bar.close()
    outcomes.sort(key=lambda o: o.seed)
    return outcomes


def pin_hash_seed(module: str, argv: Sequence[str] | None) -> list[str]:
    """Re-run ``python -m module`` with ``PYTHONHASHSEED=0`` unless it already is.

    A seed must replay identically in any process: anything iterating a set of
    strings would otherwise differ between runs.  Returns the arguments to parse.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    if argv is None and os.environ.get("PYTHONHASHSEED") != "0":
        env = {**os.environ, "PYTHONHASHSEED": "0"}
        os.execve(sys.executable, [sys.executable, "-m", module, *args], env)
    return args


def campaign_parser(module: str, description: str | None) -> argparse.ArgumentParser:
    """The options every campaign takes: a seed range, one seed to replay, workers."""
    parser = argparse.ArgumentParser(prog=f"python -m {module}", description=description)
    parser.add_argument("--seeds", type=int, default=1000, help="how many seeds to run")
    parser.add_argument("--start", type=int, default=0, help="first seed")
    parser.add_argument("--seed", type=int, help="run only this seed")
    parser.add_argument("--verbose", action="store_true", help="explain the run (with --seed)")
    parser.add_argument("--trace", action="store_true", help="print every event (with --seed)")
    parser.add_argument("--jobs", type=int, default=None, help="worker processes (default: cores)")
    return parser


@dataclass(frozen=True, slots=True)
class SeedOutcome:
    """What a worker sends back for one seed (small and picklable)."""

    seed: int
    ok: bool
    summary: str
    violations: tuple[str, ...]
    events: int
    wall_time: float = 0.0
    step: str = ""
    """The distributed-commit scenario's crash step (``""`` elsewhere)."""
    counters: tuple[tuple[str, int], ...] = ()
    """Which paths the seed exercised (Unavailable replies, in-doubt participants...)."""


def raised(seed: int, exc: BaseException, step: str = "") -> SeedOutcome:
    """The outcome of a seed whose code under test raised: that seed's failure."""
    return SeedOutcome(seed, False, f"seed {seed}: EXCEPTION", (repr(exc),), 0, step=step)


@dataclass(frozen=True, slots=True)
class Campaign:
    """One campaign's own parts, with the command line's options applied."""

    run_one: Callable[[int], SeedOutcome]
    run_all: Callable[[Sequence[int], int | None], list[SeedOutcome]]
    """``(seeds, jobs)``: every seed, with a progress bar, outcomes by seed."""
    explain: Callable[[int, bool], bool]
    """``(seed, full_trace)``: replay one seed, print what happened; True if it passed."""
    failure_text: Callable[[SeedOutcome], str]
    report: Callable[[list[SeedOutcome]], list[str]] = lambda outcomes: []
    """Lines printed before the final count (what the seeds exercised)."""


def campaign_main(
    module: str,
    description: str | None,
    argv: Sequence[str] | None,
    configure: Callable[[argparse.Namespace], Campaign],
    options: Callable[[argparse.ArgumentParser], None] | None = None,
) -> int:
    """``python -m module``: run a seed range, or replay one seed (module docstrings)."""
    args_list = pin_hash_seed(module, argv)
    parser = campaign_parser(module, description)
    if options is not None:
        options(parser)
    args = parser.parse_args(args_list)
    campaign = configure(args)
    if args.seed is not None:
        if args.verbose or args.trace:
            return 0 if campaign.explain(args.seed, args.trace) else 1
        outcome = campaign.run_one(args.seed)
        print(outcome.summary)
        for violation in outcome.violations:
            print(f"  VIOLATION {violation}")
        return 0 if outcome.ok else 1
    started = time.perf_counter()
    outcomes = campaign.run_all(range(args.start, args.start + args.seeds), args.jobs)
    failures = [o for o in outcomes if not o.ok]
    elapsed = time.perf_counter() - started
    for outcome in failures:
        print(campaign.failure_text(outcome))
    for line in campaign.report(outcomes):
        print(line)
    events = sum(o.events for o in outcomes)
    print(
        f"{len(outcomes)} seeds, {len(failures)} failed, {events} events, "
        f"{elapsed:.1f}s wall ({len(outcomes) / max(elapsed, 1e-9):.1f} seeds/s)"
    )
    return 1 if failures else 0
