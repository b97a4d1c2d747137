"""Running many simulation seeds on every core, with a progress bar, and the command line.

Every campaign (the cluster log's, the distributed-commit protocol's, the data
plane's, the partition table's, replication's) is the same loop, written once
here as :class:`Campaign`: one seed runs in a worker and comes back as a small
:class:`SeedOutcome` (an exception in the code under test is that seed's
failure); seeds run on a fork pool (:func:`run_many`); failures are printed as
they come, each with the command that replays it; outcomes come back sorted by
seed; the same command line (:meth:`Campaign.main`): a seed range on every
core, or one seed replayed and explained; exit status 1 if any seed failed.
A campaign module subclasses :class:`Campaign` with only what is its own: its
options, how to run and explain a seed, what to report at the end.
"""

from __future__ import annotations

import abc
import argparse
import multiprocessing
import os
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, Protocol, TypeVar

from nonstop.runtime.interface import Action, Event, Notify
from nonstop.sim.core import Simulation
from nonstop.sim.nemesis import Fault


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


class ScenarioResult(Protocol):
    """What every scenario's ``run_seed`` returns first: the verdict and the counts."""

    @property
    def ok(self) -> bool: ...

    @property
    def violations(self) -> Sequence[object]: ...

    @property
    def stats(self) -> Mapping[str, Any]: ...

    def summary(self) -> str: ...


def print_verdict(result: ScenarioResult) -> bool:
    """Print a seed's summary line and its violations; True if it passed."""
    print(result.summary())
    for violation in result.violations:
        print(f"  VIOLATION {violation}")
    return result.ok


def print_fault_schedule(faults: Iterable[Fault]) -> None:
    print("fault schedule:")
    for fault in faults:
        print("  " + fault.describe())


def print_trace(trace: Iterable[str], keep: tuple[str, ...], full_trace: bool) -> None:
    """The trace lines that mention one of ``keep`` (cut at 400 characters), or all of it."""
    for line in trace:
        if full_trace or any(k in line for k in keep):
            print("  " + (line if full_trace else line[:400]))


class NotableEvents:
    """While a seed replays: the faults and the notifications of chosen kinds, as lines.

    ``width`` pads the kind so that the lines of one campaign line up as before.
    """

    def __init__(self, kinds: frozenset[str], width: int) -> None:
        self.kinds = kinds
        self.width = width
        self.lines: list[str] = []

    def watch(self, sim: Simulation) -> None:
        """The ``on_start`` hook of a scenario's ``run_seed``."""
        sim.observers.append(self._on_actions)
        sim.fault_observers.append(self._on_fault)

    def _on_actions(self, sim: Simulation, node: str, event: Event, actions: list[Action]) -> None:
        for action in actions:
            if isinstance(action, Notify) and action.kind in self.kinds:
                self.lines.append(
                    f"{sim.now:10.6f} {node:4s} {action.kind:{self.width}s} {action.data}"
                )

    def _on_fault(self, sim: Simulation, what: str, details: dict[str, Any]) -> None:
        self.lines.append(f"{sim.now:10.6f} ---- {what:{self.width}s} {details}")


Opts = TypeVar("Opts")
"""A campaign's options from its command line (a small frozen dataclass: it is pickled)."""


class Campaign(abc.ABC, Generic[Opts]):
    """The loop every campaign shares; a subclass says only what is its own.

    Its own: :attr:`module` (the ``python -m`` name, for replay commands),
    :attr:`counters` (what a seed counts), its command-line options
    (:meth:`add_options`, :meth:`options`, :meth:`replay_options`), how to run
    one seed (:meth:`run_seed`) and explain it (:meth:`explain`), and what to
    report at the end (:meth:`report`).  Shared here: an exception as that
    seed's failure, the seeds on a pool with a progress bar, the failure lines
    with their replay commands, the final count and the exit status
    (:meth:`main`).  An instance holds no state, so its bound methods pickle.
    """

    module: ClassVar[str]
    counters: ClassVar[tuple[str, ...]] = ()
    chunksize: ClassVar[int] = 8

    # ------------------------------------------------------------ its own
    def add_options(self, parser: argparse.ArgumentParser) -> None:
        """Options beyond the common ones (:func:`campaign_parser`)."""

    @abc.abstractmethod
    def options(self, args: argparse.Namespace) -> Opts:
        """The campaign's options from its command line."""

    def replay_options(self, options: Opts) -> str:
        """The options, as typed after ``--seed N`` to replay a seed (``" --mutant x"``)."""
        return ""

    @abc.abstractmethod
    def run_seed(self, seed: int, options: Opts) -> SeedOutcome:
        """One seed's outcome (an exception is caught by :meth:`run_one`)."""

    def raised_step(self, options: Opts) -> str:
        """The ``step`` of a seed whose code under test raised."""
        return ""

    @abc.abstractmethod
    def explain(self, seed: int, options: Opts, full_trace: bool) -> bool:
        """Replay one seed, print what happened; True if it passed."""

    def report(self, outcomes: list[SeedOutcome], options: Opts) -> list[str]:
        """Lines printed before the final count (what the seeds exercised)."""
        return []

    # ------------------------------------------------------------ shared
    def outcome(
        self,
        seed: int,
        result: ScenarioResult,
        stats: Mapping[str, Any] | None = None,
        step: str = "",
    ) -> SeedOutcome:
        """The small picklable outcome of ``result`` (``stats``: its stats with derived counts)."""
        s = result.stats if stats is None else stats
        return SeedOutcome(
            seed,
            result.ok,
            result.summary(),
            tuple(str(v) for v in result.violations),
            int(s["events"]),
            wall_time=float(s["wall_time"]),
            step=step,
            counters=tuple((k, int(s[k])) for k in self.counters),
        )

    def run_one(self, seed: int, options: Opts) -> SeedOutcome:
        """One seed; an exception in the code under test is that seed's failure."""
        try:
            return self.run_seed(seed, options)
        except Exception as exc:
            return raised(seed, exc, self.raised_step(options))

    def _run_task(self, task: tuple[int, Opts]) -> SeedOutcome:
        return self.run_one(*task)

    def run(
        self,
        seeds: Iterable[int],
        options: Opts,
        *,
        jobs: int | None = None,
        progress: bool = False,
    ) -> list[SeedOutcome]:
        """Run ``seeds`` on ``jobs`` processes (default: every core); outcomes sorted by seed."""
        return run_many(
            self._run_task,
            [(seed, options) for seed in seeds],
            failure_text=lambda outcome: self.failure_text(outcome, options),
            jobs=jobs,
            progress=progress,
            chunksize=self.chunksize,
        )

    def replay_command(self, seed: int, options: Opts) -> str:
        return f"python -m {self.module} --seed {seed}{self.replay_options(options)} --verbose"

    def failure_text(self, outcome: SeedOutcome, options: Opts) -> str:
        first = outcome.violations[0] if outcome.violations else "?"
        replay = self.replay_command(outcome.seed, options)
        return f"FAIL seed {outcome.seed}: {first}\n  replay: {replay}"

    def totals(self, outcomes: Iterable[SeedOutcome]) -> dict[str, int]:
        """Sums of :attr:`counters` over ``outcomes``."""
        sums = dict.fromkeys(self.counters, 0)
        for outcome in outcomes:
            for key, value in outcome.counters:
                sums[key] += value
        return sums

    def main(self, argv: Sequence[str] | None, description: str | None) -> int:
        """``python -m module``: run a seed range, or replay one seed (module docstrings)."""
        args_list = pin_hash_seed(self.module, argv)
        parser = campaign_parser(self.module, description)
        self.add_options(parser)
        args = parser.parse_args(args_list)
        options = self.options(args)
        if args.seed is not None:
            if args.verbose or args.trace:
                return 0 if self.explain(args.seed, options, args.trace) else 1
            outcome = self.run_one(args.seed, options)
            print(outcome.summary)
            for violation in outcome.violations:
                print(f"  VIOLATION {violation}")
            return 0 if outcome.ok else 1
        started = time.perf_counter()
        seeds = range(args.start, args.start + args.seeds)
        outcomes = self.run(seeds, options, jobs=args.jobs, progress=True)
        failures = [o for o in outcomes if not o.ok]
        elapsed = time.perf_counter() - started
        for outcome in failures:
            print(self.failure_text(outcome, options))
        for line in self.report(outcomes, options):
            print(line)
        events = sum(o.events for o in outcomes)
        print(
            f"{len(outcomes)} seeds, {len(failures)} failed, {events} events, "
            f"{elapsed:.1f}s wall ({len(outcomes) / max(elapsed, 1e-9):.1f} seeds/s)"
        )
        return 1 if failures else 0


def takeover_counters(settled_after: float | None, takeovers: list[float]) -> dict[str, int]:
    """The HA scenarios' times as integer counters (ms; -1 where there was none)."""
    return {
        "settled_ms": round(1000 * settled_after) if settled_after is not None else -1,
        "takeover_count": len(takeovers),
        "takeover_sum_ms": round(1000 * sum(takeovers)),
        "takeover_max_ms": round(1000 * max(takeovers)) if takeovers else -1,
    }


@dataclass(frozen=True, slots=True)
class MutantOptions:
    mutant: str | None = None
    """A deliberately broken variant (the campaign's ``mutants``), or the real nodes."""


class MutantCampaign(Campaign[MutantOptions]):
    """A campaign whose one option is ``--mutant``, explained by its notable events.

    Its own: :attr:`mutants`, :attr:`notable` (the notifications a replay
    lists, with the faults, under :attr:`heading`) and :meth:`scenario`.
    """

    mutants: ClassVar[tuple[str, ...]] = ()
    notable: ClassVar[frozenset[str]] = frozenset()
    heading: ClassVar[str] = "events:"

    @abc.abstractmethod
    def scenario(
        self, seed: int, options: MutantOptions, **hooks: Any
    ) -> tuple[ScenarioResult, Simulation]:
        """One seed's scenario; ``hooks``: its ``run_seed``'s ``trace``, ``on_start``."""

    def add_options(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument(
            "--mutant", choices=self.mutants, help="run a deliberately broken variant"
        )

    def options(self, args: argparse.Namespace) -> MutantOptions:
        return MutantOptions(args.mutant)

    def replay_options(self, options: MutantOptions) -> str:
        return f" --mutant {options.mutant}" if options.mutant else ""

    def explain(self, seed: int, options: MutantOptions, full_trace: bool) -> bool:
        notable = NotableEvents(self.notable, 11)
        result, sim = self.scenario(seed, options, trace=full_trace, on_start=notable.watch)
        print(self.heading)
        for line in notable.lines if not full_trace else sim.trace:
            print("  " + line)
        return print_verdict(result)
