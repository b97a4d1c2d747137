"""``python -m tests.jepsen``: a campaign of partition rounds (``make jepsen``).

Each round is a fresh network and cluster under the bank load with the faults
of one scenario (:mod:`tests.jepsen.scenarios`); the seed of every round is
printed with its verdict, and ``--seed N --rounds 1 --scenario S`` replays it
(the faults and the load's choices; thread timing is the machine's).  The
summary is appended to ``bench/results/jepsen.md`` with the command line.
Exit status 0 if every round passed, 1 if one failed, 2 if namespaces cannot
be used here (the reason is printed).
"""

from __future__ import annotations

import argparse
import datetime
import platform
import shlex
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

from tests.jepsen.netns import netem_available, unavailable
from tests.jepsen.scenarios import SCENARIOS, RoundResult, run_round

ROTATION = [
    "leader",
    "participant",
    "one-way",
    "flap",
    "coordinator",
    "branch",
    "partition",
    "loss",
    "clients",
    "delay",
    "mix",
]
RESULTS = Path(__file__).resolve().parents[2] / "bench" / "results" / "jepsen.md"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m tests.jepsen", description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=10, help="rounds to run (default 10)")
    p.add_argument("--seed", type=int, default=None, help="first seed (default: from the clock)")
    p.add_argument(
        "--scenario",
        default="rotate",
        choices=["rotate", *SCENARIOS],
        help="one scenario for every round, or rotate through them (default)",
    )
    p.add_argument("--nodes", type=int, default=3, help="nodes per cluster (default 3)")
    p.add_argument("--clients", type=int, default=4, help="client threads (default 4)")
    p.add_argument(
        "--fault-s",
        type=float,
        default=4.0,
        help="seconds a fault lasts: drawn from 0.25 to 2.5 times this (default 4)",
    )
    p.add_argument("--fixed", action="store_true", help="every fault lasts exactly --fault-s")
    p.add_argument("--settle-s", type=float, default=30.0, help="Active within this after a heal")
    p.add_argument(
        "--final-timeout",
        type=float,
        default=150.0,
        help="give the final read this long (default 150 s: past the nodes' branch_idle)",
    )
    p.add_argument("--results", type=Path, default=RESULTS, help="markdown file to append to")
    p.add_argument("--no-results", action="store_true", help="do not append to the results")
    args = p.parse_args(argv)

    # Ctrl-C, SIGTERM, SIGHUP: unwind through the finally blocks, which stop the
    # nodes and delete the namespaces (SIGINT may arrive ignored from a shell's &).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda signum, _frame: sys.exit(128 + signum))
    reason = unavailable()
    if reason is not None:
        print(f"cannot run the partition harness here: {reason}", file=sys.stderr)
        return 2
    first = args.seed if args.seed is not None else int(time.time()) % 1_000_000
    how = "netem" if netem_available() else "the relays (no netem)"
    print(f"seeds {first}..{first + args.rounds - 1}; delay faults through {how}")
    results: list[RoundResult] = []
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="jepsen.") as tmp:
        for i in range(args.rounds):
            seed = first + i
            scenario = ROTATION[i % len(ROTATION)] if args.scenario == "rotate" else args.scenario
            r = run_round(
                Path(tmp) / f"r{i}",
                seed,
                scenario,
                nodes=args.nodes,
                clients=args.clients,
                fault_s=args.fault_s,
                settle_s=args.settle_s,
                vary=not args.fixed,
                final_timeout=args.final_timeout,
            )
            results.append(r)
            print(r.report(), flush=True)
            if not r.ok:
                kept = Path(tempfile.mkdtemp(prefix=f"jepsen-seed{seed}."))
                shutil.copytree(Path(tmp) / f"r{i}", kept, dirs_exist_ok=True)
                print(f"  replay: {replay(args, seed, scenario)}", flush=True)
                print(f"  node data and logs kept in {kept}", flush=True)
    failed = [r for r in results if not r.ok]
    took = time.monotonic() - began
    print(f"{len(results) - len(failed)}/{len(results)} rounds passed in {took:.0f}s")
    if not args.no_results:
        append_results(args.results, argv, results)
    return 1 if failed else 0


def replay(args: argparse.Namespace, seed: int, scenario: str) -> str:
    return (
        f"python -m tests.jepsen --rounds 1 --seed {seed} --scenario {scenario} "
        f"--nodes {args.nodes} --clients {args.clients} --fault-s {args.fault_s}"
        + (" --fixed" if args.fixed else "")
    )


def faults(r: RoundResult) -> str:
    """``isolate the leader A: 4.0 s, 2/s, 0.7 s; ...`` for the results table."""
    parts = []
    for f in r.faults:
        what = str(f["fault"]).split(" (")[0].replace("|", "/")
        parts.append(
            f"{what}: {f.get('held_s', '-')}, {f.get('rate', '-')}, {f.get('active_s', '-')}"
        )
    return "; ".join(parts)


def append_results(path: Path, argv: list[str] | None, results: list[RoundResult]) -> None:
    command = "python -m tests.jepsen " + shlex.join(sys.argv[1:] if argv is None else argv)
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    passed = sum(r.ok for r in results)
    lines = [
        f"\n## {now}: {passed}/{len(results)} rounds passed\n",
        f"`{command.strip()}` on {platform.node()} (kernel {platform.release()}, "
        f"netem {'yes' if netem_available() else 'no: delay through the relays'})\n",
        "Per fault: how long it held, transfers acknowledged per second meanwhile"
        " (before the first fault: *base*), seconds until every node was Active again.\n",
        "| seed | scenario | verdict | acked | failed | unknown (committed) | audits | s "
        "| base/s | faults: held s, acks/s, Active after s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        s = r.stats
        lines.append(
            f"| {r.seed} | {r.scenario} | {'ok' if r.ok else 'FAILED'} | {s.get('acked', '-')} "
            f"| {s.get('failed', '-')} "
            f"| {s.get('unknown', '-')} ({s.get('unknown_committed', '-')}) "
            f"| {s.get('audits', '-')} | {r.seconds:.0f} | {r.baseline:.0f} | {faults(r)} |"
        )
    for r in results:
        if not r.ok:
            lines.append(f"\nseed {r.seed} ({r.scenario}):\n")
            lines += [f"    {t}" for t in r.timeline]
            lines += [f"- {p}" for p in r.problems]
    path.parent.mkdir(parents=True, exist_ok=True)
    new = not path.exists()
    with path.open("a") as out:
        if new:
            out.write(
                "# Partition campaigns (`make jepsen`)\n\n"
                "Rounds of `tests/jepsen`: a fresh cluster in network namespaces under the\n"
                "bank load, one fault scenario, heal, then the checks (docs/testing.md).\n"
            )
        out.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    sys.exit(main())
