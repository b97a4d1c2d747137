"""Running many simulation seeds on every core, with a progress bar.

Every campaign (the cluster log's, the distributed-commit protocol's) is the
same loop: a picklable function runs one unit of work (a seed) and returns an
outcome with ``seed`` and ``ok``; seeds run on a fork pool; failures are printed
as they come (each with its replay command, which only the campaign knows);
outcomes come back sorted by seed.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from typing import Protocol, TypeVar


class Outcome(Protocol):
    seed: int
    ok: bool


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
