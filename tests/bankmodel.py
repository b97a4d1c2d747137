"""Managed types shared by the foundation tests and their child processes.

Stored type names are given explicitly (``name=``) so that a child process
started with ``python -m tests.e2e.crash_worker`` and the pytest process agree
on them whatever the import path.
"""

from __future__ import annotations

import threading
import time

import nonstop
from nonstop import Managed, asynchronous, key

SLOW_STARTED = threading.Event()


class Account(Managed, name="bank.Account"):
    number: str = key(unique=True)
    owner: str = key(ordered=True, mutable=True, default="")
    balance: int = 0


class Transfer(Managed, name="bank.Transfer"):
    """One acknowledged transfer; created in the same transaction as the balance moves."""

    tid: str = key(unique=True)
    src: str = ""
    dst: str = ""
    amount: int = 0


class Mailbox(Managed, name="bank.Mailbox"):
    """Target of asynchronous methods: ``log`` records the calls that ran, in order."""

    name: str = key(unique=True)
    log: list = nonstop.field(default_factory=list)
    runs: int = 0

    @asynchronous
    def deliver(self, item: str) -> None:
        self.log = [*self.log, item]
        self.runs += 1

    @asynchronous
    def slow_deliver(self, item: str, seconds: float = 0.02) -> None:
        SLOW_STARTED.set()  # lets an in-process test know a call is really running
        time.sleep(seconds)  # a window for a kill or a close while calls are pending
        self.log = [*self.log, item]
        self.runs += 1

    @asynchronous
    def explode(self, why: str) -> None:
        raise ValueError(why)


class Sent(Managed, name="bank.Sent"):
    """Marks which asynchronous sends were acknowledged (committed) by a crashing worker."""

    tag: str = key(unique=True)


INITIAL_BALANCE = 1000


def account_numbers(n: int) -> list[str]:
    return [f"A{i:03d}" for i in range(n)]


@nonstop.transactional
def open_accounts(tx: nonstop.Transaction, numbers: list[str]) -> None:
    for number in numbers:
        tx.create(Account, number=number, owner=f"owner-{number}", balance=INITIAL_BALANCE)


@nonstop.transactional
def transfer(tx: nonstop.Transaction, tid: str, src: str, dst: str, amount: int) -> None:
    """Move ``amount`` and record the transfer, in one transaction (locks in call order)."""
    a = tx.get(Account, number=src, lock="write")
    b = tx.get(Account, number=dst, lock="write")
    a.balance -= amount
    b.balance += amount
    tx.create(Transfer, tid=tid, src=src, dst=dst, amount=amount)


@nonstop.transactional
async def transfer_async(
    tx: nonstop.AsyncTransaction, tid: str, src: str, dst: str, amount: int
) -> None:
    a = await tx.get(Account, number=src, lock="write")
    b = await tx.get(Account, number=dst, lock="write")
    a.balance -= amount
    b.balance += amount
    await tx.create(Transfer, tid=tid, src=src, dst=dst, amount=amount)


def check_ledger(db: nonstop.Database, numbers: list[str], acked: set[str] | None = None) -> int:
    """Assert the bank invariants; return the number of transfers recorded.

    * total balance conserved;
    * every recorded transfer's id appears exactly once;
    * every balance equals initial + received - sent according to the transfer log;
    * every id in ``acked`` is recorded.
    """
    with db.transaction() as tx:
        accounts = {a.number: a.balance for a in tx.extent(Account)}
        transfers = [(t.tid, t.src, t.dst, t.amount) for t in tx.extent(Transfer)]
        n_transfers = tx.count(Transfer)
        n_accounts = tx.count(Account)
    assert sorted(accounts) == sorted(numbers)
    assert n_accounts == len(numbers)
    assert n_transfers == len(transfers)
    assert sum(accounts.values()) == INITIAL_BALANCE * len(numbers)
    ids = [t[0] for t in transfers]
    assert len(ids) == len(set(ids)), "a transfer was applied twice"
    expected = dict.fromkeys(numbers, INITIAL_BALANCE)
    for _, src, dst, amount in transfers:
        expected[src] -= amount
        expected[dst] += amount
    assert accounts == expected, "balances do not match the transfer log"
    if acked is not None:
        missing = acked - set(ids)
        assert not missing, f"acknowledged transfers lost: {sorted(missing)[:10]}"
    return len(transfers)
