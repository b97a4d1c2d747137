"""``make demo``: the main job a newcomer runs.

Creates a bank in an embedded nonstop store, runs concurrent transfers from
threads and asyncio tasks while an asynchronous audit method keeps a running
count, then checks what nonstop promises: the total is conserved, every
acknowledged transfer was applied exactly once, and the store survives a
reopen.  Prints a short report.

    python -m nonstop.demos.embedded [--accounts N] [--transfers N] [--dir DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shutil
import sys
import threading
import time
from pathlib import Path

import nonstop
from nonstop.demos.progress import Progress


class Account(nonstop.Managed, name="nonstop.demos.embedded.Account"):
    number: int = nonstop.key(unique=True)
    owner: str = nonstop.key(ordered=True, mutable=True)
    balance: int = 0


class Transfer(nonstop.Managed, name="nonstop.demos.embedded.Transfer"):
    """One record per acknowledged transfer: proves each ran exactly once."""

    tid: str = nonstop.key(unique=True)
    src: int
    dst: int
    amount: int


class Ledger(nonstop.Managed, name="nonstop.demos.embedded.Ledger"):
    """Counts transfers through an asynchronous method (A6): runs after commit, exactly once."""

    name: str = nonstop.key(unique=True)
    recorded: int = 0

    @nonstop.asynchronous
    def record(self, n: int) -> None:
        self.recorded += n


OWNERS = ["ann", "bob", "cho", "dev", "eve", "fay", "gus", "hal", "ivy", "joe"]
START_BALANCE = 1_000


@nonstop.transactional
def transfer(tx: nonstop.Transaction, tid: str, src: int, dst: int, amount: int) -> None:
    a = tx.get(Account, number=src, lock="write")
    b = tx.get(Account, number=dst, lock="write")
    if a.balance < amount:
        raise nonstop.Abort("insufficient funds")
    a.balance -= amount
    b.balance += amount
    tx.create(Transfer, tid=tid, src=src, dst=dst, amount=amount)
    tx.get(Ledger, name="main", lock="none").record(1)


@nonstop.transactional
async def transfer_async(
    tx: nonstop.AsyncTransaction, tid: str, src: int, dst: int, amount: int
) -> None:
    a = await tx.get(Account, number=src, lock="write")
    b = await tx.get(Account, number=dst, lock="write")
    if a.balance < amount:
        raise nonstop.Abort("insufficient funds")
    a.balance -= amount
    b.balance += amount
    await tx.create(Transfer, tid=tid, src=src, dst=dst, amount=amount)
    (await tx.get(Ledger, name="main", lock="none")).record(1)


def build_bank(db: nonstop.Database, accounts: int) -> None:
    batch = 2_000
    with Progress("creating accounts", "acct", accounts) as bar:
        for start in range(0, accounts, batch):
            with db.transaction() as tx:
                for n in range(start, min(start + batch, accounts)):
                    tx.create(
                        Account, number=n, owner=OWNERS[n % len(OWNERS)], balance=START_BALANCE
                    )
            bar.update(min(batch, accounts - start))
    with db.transaction() as tx:
        tx.create(Ledger, name="main")


def run_transfers(db: nonstop.Database, accounts: int, total: int) -> tuple[int, float]:
    """Half the transfers from 8 threads, half from 64 asyncio tasks, at the same time."""
    acked: list[str] = []
    lock = threading.Lock()
    bar = Progress("transfers", "tx", total)
    threads_share = total // 2

    def thread_worker(worker: int, n: int) -> None:
        rng = random.Random(worker)
        for i in range(n):
            src, dst = rng.sample(range(accounts), 2)
            tid = f"t{worker}-{i}"
            try:
                transfer(db, tid, src, dst, rng.randint(1, 50))
            except nonstop.Abort:
                pass
            else:
                with lock:
                    acked.append(tid)
            bar.update(1)

    async def task_worker(worker: int, n: int) -> None:
        rng = random.Random(1000 + worker)
        for i in range(n):
            src, dst = rng.sample(range(accounts), 2)
            tid = f"a{worker}-{i}"
            try:
                await transfer_async(db, tid, src, dst, rng.randint(1, 50))
            except nonstop.Abort:
                pass
            else:
                with lock:
                    acked.append(tid)
            bar.update(1)

    async def tasks(n: int) -> None:
        per, extra = divmod(n, 64)
        await asyncio.gather(*(task_worker(w, per + (w < extra)) for w in range(64)))

    started = time.perf_counter()
    per, extra = divmod(threads_share, 8)
    workers = [
        threading.Thread(target=thread_worker, args=(w, per + (w < extra))) for w in range(8)
    ]
    for t in workers:
        t.start()
    try:
        import uvloop

        uvloop.run(tasks(total - threads_share))
    except ImportError:
        asyncio.run(tasks(total - threads_share))
    for t in workers:
        t.join()
    elapsed = time.perf_counter() - started
    bar.close()
    return len(acked), elapsed


def check(db: nonstop.Database, accounts: int, acked: int) -> list[str]:
    problems = []
    with db.transaction(isolation="snapshot") as tx:
        balances = [a.balance for a in tx.query(Account).all()]
        transfers = tx.count(Transfer)
        ledger = tx.get(Ledger, name="main")
        by_owner = len(tx.query(Account).range("owner", "ann", "bob", inclusive=(True, True)).all())
        if sum(balances) != accounts * START_BALANCE:
            problems.append(f"total is {sum(balances)}, expected {accounts * START_BALANCE}")
        if min(balances) < 0:
            problems.append("a balance went negative")
        if transfers != acked:
            problems.append(f"{transfers} transfer records for {acked} acknowledged transfers")
        if ledger.recorded != acked:
            problems.append(f"ledger counted {ledger.recorded} transfers, expected {acked}")
        expected_owner_rows = sum(
            1 for n in range(accounts) if OWNERS[n % len(OWNERS)] in ("ann", "bob")
        )
        if by_owner != expected_owner_rows:
            problems.append(f"range query found {by_owner} rows, expected {expected_owner_rows}")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="nonstop-demo", description=__doc__.split("\n")[0])
    parser.add_argument("--accounts", type=int, default=20_000)
    parser.add_argument("--transfers", type=int, default=20_000)
    parser.add_argument("--dir", default=".nonstop/demo")
    args = parser.parse_args(argv)
    path = Path(args.dir)
    shutil.rmtree(path, ignore_errors=True)

    print(f"nonstop {nonstop.__version__} demo — embedded store in {path}")
    db = nonstop.open(path)
    t0 = time.perf_counter()
    build_bank(db, args.accounts)
    print(f"  created {args.accounts:,} accounts in {time.perf_counter() - t0:.1f} s")
    acked, elapsed = run_transfers(db, args.accounts, args.transfers)
    print(
        f"  {acked:,} transfers acknowledged in {elapsed:.1f} s "
        f"({args.transfers / elapsed:,.0f}/s from 8 threads + 64 asyncio tasks, durable)"
    )
    stats = db.stats()
    print(
        f"  group commit: {stats['commits']:,} commits in {stats['commit_groups']:,} fsyncs "
        f"(up to {stats['largest_group']} per fsync)"
    )
    db.wait_for_async(timeout=120)
    db.close()

    db = nonstop.open(path)  # reopen: everything must have survived
    t0 = time.perf_counter()
    problems = check(db, args.accounts, acked)
    print(f"  reopened and audited in {time.perf_counter() - t0:.1f} s")
    db.close()
    if problems:
        print("FAILED:\n  " + "\n  ".join(problems))
        return 1
    print(
        "OK: total conserved, every acknowledged transfer applied exactly once, "
        "async ledger exact, indexes consistent after reopen."
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
