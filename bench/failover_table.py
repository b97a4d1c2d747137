"""Failover at the partition-table level on real processes (issue 10, ha.md sections 6-8).

``python -m bench.failover_table [--runs 12]`` (or ``make bench-failover``) writes
``bench/results/failover-table.md``.

A local 3-node cluster (real processes on 127.0.0.1, fsync on, every setting
at the node's default: keep-alive 0.1 s, non-response timeout 0.4 s, election
timeout 1 s, lease 0.6 s, drift 5 %, default policy of 16 partitions with one
sync replica).  Each run: wait until every partition is Active on its whole
list with every node acting for the partitions it is active for; SIGKILL a
node (A, B, C in turn) that is active for some; poll both survivors' status
until, for every partition the dead node was active for, a survivor *acts*
(quorum, active in its table, lease held, the dead node's lease waited out);
then restart the dead node and wait for the table to settle again.

Measured, from the instant before ``kill``:
* **committed**: the first survivor answer whose table names a new active node
  for every lost partition (detection + a committed view + the failover
  entries applied);
* **acting**: the first instant a survivor acts for each lost partition, the
  latest over them (what a client would wait for, once the data path answers
  only while acting).

Times are the survivors' own clock (``now`` in their status answer): node
processes and this one share ``CLOCK_MONOTONIC``, so the only error is the
polling interval (a few ms).  This is the table level: the data path does not
route by partition yet, so no client operation is measured.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from nonstop.admin.owned import OwnedCluster
from nonstop.client import Client
from nonstop.errors import Error

RESULTS = Path(__file__).parent / "results" / "failover-table.md"
NODE_DEFAULTS = {"keepalive_interval": 0.1, "nonresponse_timeout": 0.4, "sync": True}
"""The node's own defaults (node/config.py), stated so that OwnedCluster's slower ones
for loaded test machines do not apply."""
POLL = 0.005


def settled(oc: OwnedCluster, names: list[str]) -> dict[str, dict[str, Any]] | None:
    """The table when every node has it with every partition Active on its whole list and
    each node acts for exactly the partitions it is active for."""
    statuses = {n: oc.status(n) for n in names}
    tables = [s.get("partitions") for s in statuses.values()]
    if not tables[0] or any(t != tables[0] for t in tables):
        return None
    parts = {p["name"]: p for p in tables[0]}
    for part in parts.values():
        listed = [n for n, _ in part["nodes"]]
        if part["state"] != "Active" or [n for n, _ in part["current"]] != listed:
            return None
        if part["active"] != listed[0]:
            return None
    for n, s in statuses.items():
        if sorted(s["acting"]) != sorted(p for p, part in parts.items() if part["active"] == n):
            return None
    return parts


def wait(predicate: Any, timeout: float, what: str) -> Any:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = predicate()
        except (Error, OSError):
            value = None
        if value:
            return value
        time.sleep(0.05)
    raise RuntimeError(f"timed out after {timeout}s waiting for {what}")


def one_run(oc: OwnedCluster, victim: str) -> dict[str, Any]:
    names = oc.names
    before = wait(lambda: settled(oc, names), 60, "the table to settle")
    lost = {p for p, part in before.items() if part["active"] == victim}
    leader = oc.status(victim).get("leader")
    survivors = [n for n in names if n != victim]
    clients = {n: Client([oc.address(n)], timeout=2.0, rounds=1) for n in survivors}
    committed: float | None = None
    acting_at: dict[str, float] = {}
    try:
        killed = time.monotonic()
        oc.kill(victim)
        while len(acting_at) < len(lost):
            if time.monotonic() - killed > 30:
                raise RuntimeError(f"no takeover of {sorted(lost - set(acting_at))} in 30 s")
            for client in clients.values():
                s = client.status()
                now = float(s["now"])
                for p in set(s["acting"]) & lost:
                    acting_at.setdefault(p, now)
                if committed is None:
                    table = {part["name"]: part for part in s["partitions"]}
                    if all(table[p]["active"] not in (None, victim) for p in lost):
                        committed = now
            time.sleep(POLL)
    finally:
        for client in clients.values():
            client.close()
    assert committed is not None
    oc.start(victim)
    wait(lambda: settled(oc, names), 60, f"{victim} to be restored")
    return {
        "victim": victim,
        "leader": leader == victim,
        "partitions": len(lost),
        "committed": committed - killed,
        "acting": max(acting_at.values()) - killed,
    }


def median_ms(values: list[float]) -> str:
    return f"{statistics.median(values) * 1000:.0f} ms ({len(values)} runs)" if values else "n/a"


def summary(values: list[float]) -> str:
    ms = sorted(v * 1000 for v in values)
    return f"{statistics.median(ms):.0f} | {ms[int(0.9 * (len(ms) - 1))]:.0f} | {ms[-1]:.0f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=12, help="kills (at least 10)")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args(argv)
    runs: list[dict[str, Any]] = []
    with (
        tempfile.TemporaryDirectory(prefix="nonstop-failover-") as folder,
        OwnedCluster(Path(folder) / "c", 3, options=NODE_DEFAULTS) as oc,
    ):
        oc.start_all()
        for i in range(args.runs):
            victim = oc.names[i % len(oc.names)]
            run = one_run(oc, victim)
            runs.append(run)
            print(
                f"run {i + 1}: kill {victim} (leader: {run['leader']}, "
                f"{run['partitions']} partitions): committed "
                f"{run['committed'] * 1000:.0f} ms, acting {run['acting'] * 1000:.0f} ms",
                flush=True,
            )
        oc.stop()
    write(args.out, runs, argv if argv is not None else sys.argv[1:])
    return 0


def write(path: Path, runs: list[dict[str, Any]], argv: list[str]) -> None:
    command = " ".join(["python -m bench.failover_table", *argv])
    leader_acting = median_ms([r["acting"] for r in runs if r["leader"]])
    other_acting = median_ms([r["acting"] for r in runs if not r["leader"]])
    lines = [
        "# Failover at the partition-table level (real processes)",
        "",
        f"`{command}` (or `make bench-failover`), "
        f"{dt.datetime.now(dt.UTC).strftime('%Y-%m-%d %H:%M UTC')}, "
        f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}.",
        "",
        "3 local node processes, node defaults (keep-alive 0.1 s, non-response timeout 0.4 s, "
        "election timeout 1 s, lease 0.6 s, drift 5 %, 16 partitions, 1 sync replica). "
        "Each run SIGKILLs a node active for some partitions (A, B, C in turn), measures "
        "from the instant before the kill, then restarts it and waits until it is active "
        "again by priority. **Table level only**: the data path does not route by partition "
        "yet, so this is when a survivor *may* acknowledge, not a client's observed outage.",
        "",
        "| measure | median ms | p90 ms | max ms |",
        "| --- | --- | --- | --- |",
        f"| committed: failover entries applied on a survivor | "
        f"{summary([r['committed'] for r in runs])} |",
        f"| acting: a survivor acts for every lost partition | "
        f"{summary([r['acting'] for r in runs])} |",
        "",
        f"{len(runs)} runs:",
        "",
        "| run | killed | was the Raft leader | partitions | committed ms | acting ms |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for i, r in enumerate(runs, 1):
        lines.append(
            f"| {i} | {r['victim']} | {'yes' if r['leader'] else 'no'} | {r['partitions']} | "
            f"{r['committed'] * 1000:.0f} | "
            f"{r['acting'] * 1000:.0f} |"
        )
    lines += [
        "",
        "*committed* is detection (the node seen Down: non-response timeout, one reconnect, "
        "one more interval) + the leader's new view + one failover entry per partition, "
        "applied. *acting* adds the wait for the dead node's lease (ha.md section 8: the new "
        "active starts when the old lease, as it applied it, plus 5 % has run out); the lease "
        "is renewed every 0.2 s, so that wait mostly overlaps detection. When the dead node "
        "led the cluster log, its last renewals may be committed only by the next leader, "
        "and the wait counts from when the survivors applied them (conservative by design; "
        "the slowest runs are of this kind): "
        f"median acting {leader_acting} when the killed node was the leader, "
        f"{other_acting} otherwise.",
        "",
    ]
    path.write_text("\n".join(lines))
    print(f"wrote {path}")


if __name__ == "__main__":
    sys.exit(main())
