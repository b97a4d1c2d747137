"""``make bench``: ``python -m bench.run [--only local|cluster|all] [options]``.

By default the local benchmark runs (writing ``bench/results/local.md``), then the
cluster benchmark if ``bench/cluster_bench.py`` exists.  ``--only`` picks one.
Options this module does not know are passed on to the cluster benchmark (and
``--quick`` too).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import inspect
import shlex
import sys
from collections.abc import Callable
from pathlib import Path

from bench import local_bench
from bench.peers import WORKLOADS

SUITES = ("local", "cluster", "all")


def _ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(",") if x)


def _names(allowed: tuple[str, ...]) -> Callable[[str], tuple[str, ...]]:
    def parse(text: str) -> tuple[str, ...]:
        names = tuple(x for x in text.split(",") if x)
        bad = [n for n in names if n not in allowed]
        if bad:
            raise argparse.ArgumentTypeError(f"unknown {bad}; choose from {', '.join(allowed)}")
        return names

    return parse


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__)
    p.add_argument("--only", choices=SUITES, default="all", help="which benchmark (default: all)")
    p.add_argument("--duration", type=float, default=4.0, help="measured seconds per cell")
    p.add_argument(
        "--rounds", type=int, default=3, help="interleaved slices per cell (split the duration)"
    )
    p.add_argument("--warmup", type=float, default=0.3, help="warm-up seconds per slice")
    p.add_argument("--accounts", type=int, default=10_000, help="accounts in the dataset")
    p.add_argument(
        "--read-objects", type=int, default=200_000, help="objects in the snapshot-read test"
    )
    p.add_argument("--clients", type=_ints, default=local_bench.CLIENTS, help="e.g. 1,8,64")
    p.add_argument("--workloads", type=_names(WORKLOADS), default=WORKLOADS, help="rmw,transfer")
    p.add_argument(
        "--modes", type=_names(local_bench.MODES), default=local_bench.MODES, help="threads,asyncio"
    )
    p.add_argument(
        "--profile",
        choices=("auto", "always", "never"),
        default="auto",
        help="profile the goal cases: auto = only where a goal is missed",
    )
    p.add_argument("--quick", action="store_true", help="1 s cells, 50k read objects (smoke test)")
    p.add_argument("--tmpdir", default=None, help="where the temporary stores go (which disk)")
    p.add_argument("--out", type=Path, default=local_bench.RESULTS, help="the report to write")
    return p


def run_cluster(rest: list[str]) -> None:
    if importlib.util.find_spec("bench.cluster_bench") is None:
        print("bench/cluster_bench.py does not exist yet: skipping the cluster benchmark")
        return
    mod = importlib.import_module("bench.cluster_bench")
    entry = getattr(mod, "main", None) or getattr(mod, "run", None)
    if entry is None:
        raise SystemExit("bench.cluster_bench has neither main() nor run()")
    if inspect.signature(entry).parameters:
        entry(rest)
    else:
        entry()


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    args, rest = parser().parse_known_args(argv)
    if args.only in ("local", "all"):
        if rest and args.only == "local":
            parser().error(f"unrecognized arguments: {' '.join(rest)}")
        cfg = local_bench.Config(
            duration=1.0 if args.quick else args.duration,
            warmup=0.2 if args.quick else args.warmup,
            rounds=1 if args.quick else args.rounds,
            accounts=args.accounts,
            read_objects=50_000 if args.quick else args.read_objects,
            clients=args.clients,
            workloads=args.workloads,
            modes=args.modes,
            profile=args.profile,
            tmpdir=args.tmpdir,
            out=args.out,
            command=("make bench" if not argv else "python -m bench.run " + shlex.join(argv)),
        )
        local_bench.run(cfg)
    if args.only in ("cluster", "all"):
        run_cluster([*rest, "--quick"] if args.quick else rest)


if __name__ == "__main__":
    main()
