"""A child process running distributed transfers between two real stores; the parent SIGKILLs it.

    python -m tests.e2e.dtx_crash_worker DIR run ROUND [NODE POINT NTH]
        recover the two nodes (n1 holds account A, n2 account B) and the
        decision log under DIR, then run transfers forever, two at a time, each
        a two-phase commit with n1 coordinating.  Every transfer moves money
        between A and B and creates ``Transfer(tid)`` on both stores.  Writes
        ``g TID GTID`` when the gtid is durably recorded (before any prepare
        leaves), ``c TID`` / ``a TID`` when the client hears commit / abort.
        With NODE POINT NTH the process SIGKILLs itself at the NTH store commit
        of NODE that records a prepare (POINT ``p-submit``: right after handing
        it to the writer, so it may or may not land; ``p-durable``: once it is
        durable, before the machine hears so) or an outcome (``t-submit``,
        ``t-durable``).

    python -m tests.e2e.dtx_crash_worker DIR settle
        recover, wait until nothing is in doubt or in flight, write ``settled``.

Stdout lines are written with one ``os.write`` each (whole or absent after a kill).
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.bankmodel import Account, Transfer
from tests.dtx_store_harness import Cluster

from nonstop.dtx.protocol import K_PREPARED, K_TOMB
from nonstop.runtime.interface import Notify


def say(line: str) -> None:
    os.write(1, (line + "\n").encode())


async def one_transfer(c: Cluster, rng: random.Random, tid: str, tids: dict[int, str]) -> None:
    n = rng.randint(1, 20)
    src, dst = ("A", "B") if rng.random() < 0.5 else ("B", "A")
    b1, tx1 = await c.branch("n1")
    b2, tx2 = await c.branch("n2")
    try:
        a = await tx1.get(Account, number="A", lock="write")
        b = await tx2.get(Account, number="B", lock="write")
        await tx1.create(Transfer, tid=tid, src=src, dst=dst, amount=n)
        await tx2.create(Transfer, tid=tid, src=src, dst=dst, amount=n)
        da = -n if src == "A" else n
        ops = {
            "n1": [["b", b1], c.write(a, balance=a.balance + da)],
            "n2": [["b", b2], c.write(b, balance=b.balance - da)],
        }
        rid = c.submit("n1", ops)
        tids[rid] = tid
        reply = await c.replies[rid]
        say(("c " if reply.get("ok") else "a ") + tid)
    finally:
        await asyncio.sleep(0.05)
        for tx in (tx1, tx2):
            if tx.active:  # never handed to the 2PC (the data service's idle rollback)
                await tx.rollback()


def die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def arm(c: Cluster, node: str, point: str, nth: int) -> None:
    """Kill this process at the ``nth`` prepare / outcome commit of ``node`` (module doc)."""
    persister = c.persisters[node]
    plain = persister.persist
    seen = [0]

    def persist(
        writes: tuple[tuple[bytes, bytes | None], ...],
        done: Callable[[BaseException | None], None],
    ) -> None:
        prefix = K_PREPARED if point.startswith("p") else K_TOMB
        if not any(k.startswith(prefix) and v is not None for k, v in writes):
            return plain(writes, done)
        seen[0] += 1
        if seen[0] < nth:
            return plain(writes, done)
        if point.endswith("submit"):
            plain(writes, done)
            die()
        plain(writes, lambda exc: die())

    persister.persist = persist  # type: ignore[method-assign]


async def run(root: Path, round_no: str, crash: list[str]) -> None:
    c = Cluster(root, ["n1", "n2"], lock_timeout=5.0)
    if crash:
        arm(c, crash[0], crash[1], int(crash[2]))
    tids: dict[int, str] = {}

    def on_notify(node: str, note: Notify) -> None:
        if note.kind == "dtx.begin" and note.data.get("request_id") in tids:
            say(f"g {tids[note.data['request_id']]} {note.data['g']}")

    c.on_notify = on_notify
    say("ready")

    async def loop(w: int) -> None:
        rng = random.Random(f"{round_no}-{w}")
        i = 0
        while True:
            await one_transfer(c, rng, f"r{round_no}-w{w}-{i}", tids)
            i += 1

    await asyncio.gather(loop(0), loop(1))


async def settle(root: Path) -> None:
    c = Cluster(root, ["n1", "n2"])
    try:
        await c.settled(timeout=20.0)
        await asyncio.sleep(0.3)  # acks and the last tombstones
        await c.settled(timeout=20.0)
        assert not c.errors, c.errors
    finally:
        c.close()
    say("settled")


def main(argv: list[str]) -> Any:
    root, mode, *rest = argv
    if mode == "run":
        return asyncio.run(run(Path(root), rest[0], rest[1:]))
    return asyncio.run(settle(Path(root)))


if __name__ == "__main__":
    main(sys.argv[1:])
