"""Peak memory and CPU of each node while a 3-node cluster overwrites N rows by N rows.

``python -m bench.overwrite_memory --rows 200000 1000000 [--out FILE]``

For each N: a fresh local 3-node cluster (``OwnedCluster``, the demo bank's
``Account``: ``number`` int unique key, ``owner`` str ordered key, ``balance``
int) is loaded with N rows (``bulk.upsert`` batches of 10,000 at each key's
home node), N new rows are staged (``bulk.overwrite.part``, 10,000 a part),
then one distributed transaction swaps them in (``tx.overwrite`` + ``tx.commit``)
and the script waits until every node holds its share of the new set.  From
the swap's start until then it samples each node's resident memory every 20 ms
(``/proc/<pid>/status``: ``VmRSS``, and ``RssAnon``: the heap, without the
store's memory-mapped file pages) and reports the peak over the node's
resident memory just before the swap, with the nodes' CPU time per row.  No
Spark: what is measured is the nodes' side of an overwrite.

``--phases N`` instead: one store in this process (no fsync), N rows overwritten by
N, and the CPU per row of each phase (staging the Arrow parts, the swap's
transaction, applying it: building the delete operations, building the new
records, the rest — the LMDB writes and page reads).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

TYPE = "nonstop.demos.bank.Account"
BATCH = 10_000


def _status(pid: int) -> dict[str, int]:
    """VmRSS and RssAnon of ``pid`` in KB."""
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            name, _, value = line.partition(":")
            if name in ("VmRSS", "RssAnon"):
                out[name] = int(value.split()[0])
    return out


def _cpu(pid: int) -> float:
    """User + system CPU seconds of ``pid``."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _columns(numbers: list[int], balance: int) -> bytes:
    from nonstop.model.codec import pack

    owners = [f"owner-{i % 1000}" for i in numbers]
    return pack({"number": numbers, "owner": owners, "balance": [balance] * len(numbers)})


def run(n: int, tmp: Path) -> dict[str, Any]:
    from nonstop.admin.owned import OwnedCluster
    from nonstop.client.bulk import BulkClient, cluster_nodes
    from nonstop.spark.source import homes_of

    # Routing by node: the per-node swap (bulk/swap_apply.py) is what this measures.
    with OwnedCluster(
        tmp / f"c{n}", 3, apps=["nonstop.demos.bank"], options={"ha": {"data": "nodes"}}
    ) as oc:
        oc.start_all(timeout=90)
        os.environ["NONSTOP_CREDENTIALS"] = str(oc.lc.credentials_path)
        nodes = cluster_nodes(",".join(oc.addresses))
        names = [x["name"] for x in nodes]
        address = {x["name"]: x["address"] for x in nodes}
        pids = {name: oc.pids[name] for name in names}
        numbers = list(range(n))
        homes = homes_of(numbers, len(names))
        mine = {
            name: [k for k, h in zip(numbers, homes, strict=True) if h == i]
            for i, name in enumerate(names)
        }
        del numbers, homes
        job = f"mem{n}"
        for name in names:
            keys = mine[name]
            with BulkClient(address[name], timeout=600) as c:
                for lo in range(0, len(keys), BATCH):
                    c.call(
                        "bulk.upsert",
                        type=TYPE,
                        format="columns",
                        rows=_columns(keys[lo : lo + BATCH], 1),
                    )
                c.call("bulk.overwrite.begin", type=TYPE, job=job)
                for lo in range(0, len(keys), BATCH):
                    rows = _columns(keys[lo : lo + BATCH], 2)
                    c.call(
                        "bulk.overwrite.part",
                        type=TYPE,
                        job=job,
                        tag=f"0/0/{lo}",
                        key="number",
                        format="columns",
                        rows=rows,
                    )
        before = {name: _status(pid) for name, pid in pids.items()}
        peak = {name: dict(s) for name, s in before.items()}
        stop = threading.Event()

        def sample() -> None:
            while not stop.is_set():
                for name, pid in pids.items():
                    for k, v in _status(pid).items():
                        peak[name][k] = max(peak[name][k], v)
                time.sleep(0.02)

        sampler = threading.Thread(target=sample)
        sampler.start()
        cpu0 = {name: _cpu(pid) for name, pid in pids.items()}
        started = time.monotonic()
        try:
            with BulkClient(address[names[0]], timeout=3600) as c:
                sid = c.call("tx.begin")["s"]
                swapped = c.call("tx.overwrite", s=sid, type=TYPE, job=job, parts=None)
                c.call("tx.commit", s=sid)
            committed = time.monotonic() - started
            for name in names:  # (a bulk read waits until the node's swap landed)
                with BulkClient(address[name], timeout=3600) as c:
                    deadline = time.monotonic() + 60  # (or phase two lands ms later)
                    while (count := c.call("bulk.plan", type=TYPE)["count"]) != len(mine[name]):
                        assert time.monotonic() < deadline, (name, count, len(mine[name]))
                        time.sleep(0.05)
            took = time.monotonic() - started
        finally:
            stop.set()
            sampler.join()
        cpu = sum(_cpu(pid) - cpu0[name] for name, pid in pids.items())
        assert swapped["deleted"] == n and swapped["inserted"] == n, swapped
        return {
            "n": n,
            "before": before,
            "peak": peak,
            "committed": committed,
            "took": took,
            "cpu": cpu,
        }


def _arrow(numbers: list[int], balance: int) -> bytes:
    import pyarrow as pa

    owners = [f"owner-{i % 1000}" for i in numbers]
    batch = pa.RecordBatch.from_pydict(
        {
            "number": pa.array(numbers, pa.int64()),
            "owner": owners,
            "balance": pa.array([balance] * len(numbers), pa.int64()),
        }
    )
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema) as out:
        out.write_batch(batch)
    return bytes(sink.getvalue().to_pybytes())


def phases(n: int, tmp: Path) -> str:
    """CPU µs per row of each phase of an overwrite of ``n`` rows by ``n`` in one store."""
    import nonstop
    from nonstop.bulk import fast as bulk_fast
    from nonstop.bulk import fast_swap, swap_apply
    from nonstop.bulk.handlers import BulkContext, handle

    db = nonstop.open(tmp / f"p{n}", durability="none")
    ctx = BulkContext(db, "n")
    base = {"type": TYPE, "format": "arrow"}
    for lo in range(0, n, BATCH):
        handle(
            ctx,
            {"op": "bulk.upsert", **base, "rows": _arrow(list(range(lo, min(n, lo + BATCH))), 1)},
        )
    handle(ctx, {"op": "bulk.overwrite.begin", "type": TYPE, "job": "j"})
    parts = [_arrow(list(range(lo, min(n, lo + BATCH))), 2) for lo in range(0, n, BATCH)]
    spent = {"delete": 0.0, "create": 0.0}
    real: dict[str, Any] = {"delete": fast_swap.delete_ops, "create": bulk_fast.create_ops}

    def timed(name: str) -> Any:
        def run(*args: Any) -> Any:
            started = time.process_time()
            try:
                return real[name](*args)
            finally:
                spent[name] += time.process_time() - started

        return run

    marks: dict[str, float] = {}
    real_apply = swap_apply.apply

    def apply(db: Any, job: str) -> None:
        marks["committed"] = time.process_time()
        real_apply(db, job)
        marks["applied"] = time.process_time()

    fast_swap.delete_ops, bulk_fast.create_ops = timed("delete"), timed("create")
    swap_apply.apply = apply
    try:
        started = time.process_time()
        for i, rows in enumerate(parts):
            part = {
                "op": "bulk.overwrite.part",
                **base,
                "job": "j",
                "tag": f"0/0/{i}",
                "key": "number",
            }
            handle(ctx, {**part, "rows": rows})
        staged = time.process_time()
        handle(ctx, {"op": "bulk.overwrite.commit", "type": TYPE, "job": "j"})
        ended = time.process_time()
    finally:
        fast_swap.delete_ops, bulk_fast.create_ops = real["delete"], real["create"]
        swap_apply.apply = real_apply
        db.close()

    def us(seconds: float) -> str:
        return f"{seconds / n * 1e6:.1f}"

    applying = marks["applied"] - marks["committed"]
    rest = applying - spent["delete"] - spent["create"]
    return (
        f"| {n:,} | {us(staged - started)} | {us(marks['committed'] - staged)} | {us(applying)} "
        f"| {us(spent['delete'])} | {us(spent['create'])} | {us(rest)} | {us(ended - started)} |"
    )


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, nargs="+", default=[200_000, 1_000_000])
    p.add_argument("--phases", type=int, default=None, metavar="N")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    if args.phases:
        with tempfile.TemporaryDirectory(prefix="nonstop-overwrite-phases-") as tmp_dir:
            row = phases(args.phases, Path(tmp_dir))
        print(
            "| rows (old = new) | staging | swap transaction | applying | of which: delete ops "
            "| new records | LMDB writes, page reads | total (CPU µs per row) |\n"
            "|---:|---:|---:|---:|---:|---:|---:|---:|\n" + row
        )
        return
    lines = [
        "| rows (old = new) | swap committed (s) | landed (s) | node CPU µs per row "
        "| per node: VmRSS before → peak (MB) | per node: RssAnon before → peak (MB) |",
        "|---:|---:|---:|---:|---|---|",
    ]
    for n in args.rows:
        with tempfile.TemporaryDirectory(prefix="nonstop-overwrite-memory-") as tmp_dir:
            r = run(n, Path(tmp_dir))
        names = sorted(r["peak"])
        rss = ", ".join(
            f"{r['before'][x]['VmRSS'] // 1024} → {r['peak'][x]['VmRSS'] // 1024}" for x in names
        )
        anon = ", ".join(
            f"{r['before'][x]['RssAnon'] // 1024} → {r['peak'][x]['RssAnon'] // 1024}"
            for x in names
        )
        per_row = r["cpu"] / n * 1e6
        lines.append(
            f"| {n:,} | {r['committed']:.1f} | {r['took']:.1f} | {per_row:.1f} | {rss} | {anon} |"
        )
        print(lines[-1], file=sys.stderr)
    text = "\n".join(lines) + "\n"
    print(text)
    if args.out:
        Path(args.out).write_text(text)


if __name__ == "__main__":
    main()
