"""Cross-node transfers with the data path routed by node vs by partition (ha.md §9a).

``python -m bench.partition_routing_ab [--clients 64] [--duration 4]``: the
distributed benchmark's cluster and transfer (``bench.distributed_bench``: 3 local
nodes, fsync on, ``nonstop.demos.bank.transfer_async``, clients attached to A and
B, one account on A and one on B per transfer), once with ``ha.data = "nodes"``
and once with ``"partitions"`` (replicas = 0).  Under partitions the accounts are
placed by the hash of their number (the pairs are still one account on A and one
on B), and each transfer's ``Transfer`` record goes to the partition of its id
(on any node).  Prints ops/s, latency and server CPU per transfer for each.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

from bench.distributed_bench import NonstopSide, _run_nonstop, arun
from nonstop.demos.bank import START_BALANCE


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.partition_routing_ab", description=__doc__)
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--duration", type=float, default=4.0)
    p.add_argument("--warmup", type=float, default=1.0)
    p.add_argument("--accounts", type=int, default=500, help="accounts on each of A and B")
    p.add_argument("--tmpdir", default=None)
    args = p.parse_args()
    for mode in ("nodes", "partitions"):
        base = Path(tempfile.mkdtemp(prefix=f"nonstop-route-{mode}-", dir=args.tmpdir))
        ns = NonstopSide(base / "cluster", args.accounts, ha_data=mode)
        try:
            res = arun(_run_nonstop(ns, args.clients, args.duration, args.warmup))
            total, _ = ns.check()
        finally:
            ns.close()
        cpu = res.extra["server_cpu_us"]
        print(
            f"{mode:10s} {args.clients} clients: {res.ops_per_s:7.0f} transfers/s "
            f"p50 {res.p50:6.2f} ms p99 {res.p99:6.2f} ms, server CPU {cpu:6.0f} µs/transfer, "
            f"errors {res.extra['errors']}, total ok {total == 2 * args.accounts * START_BALANCE}, "
            f"accounts on A/B {len(ns.on_a)}/{len(ns.on_b)}",
            flush=True,
        )


if __name__ == "__main__":
    main()
