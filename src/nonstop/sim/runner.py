"""Running many simulation seeds on every core, with a progress bar.

Every campaign (the cluster log's, the distributed-commit protocol's) is the
same loop: a picklable function runs one unit of work (a seed) and returns an
outcome with ``seed`` and ``ok``; seeds run on a fork pool; failures are printed
as they come (each with its replay command, which only the campaign knows);
outcomes come back sorted by seed.
"""

from __future__ import annotations

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
