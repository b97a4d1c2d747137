"""The bank of the cluster demo and the distributed benchmark: an application module.

Nodes load it at start (``nonstop local up -n 3 --app nonstop.demos.bank``) and
clients import it, so both sides know the same managed types.  Stored type names
equal the dotted import paths, so the Spark data source's ``type`` option can name
either.

A transfer takes both write locks in account-number order: two transfers over the
same pair always queue in the same order, so they cannot deadlock — across nodes a
deadlock is only broken by the lock-wait timeout, which is slow.
"""

from __future__ import annotations

import nonstop
from nonstop import Managed, key

START_BALANCE = 1_000
OWNERS = ("ann", "bob", "cho", "dev", "eve", "fay", "gus", "hal", "ivy", "joe")


class Account(Managed, name="nonstop.demos.bank.Account"):
    number: int = key(unique=True)
    owner: str = key(ordered=True, mutable=True, default="")
    balance: int = 0


class Transfer(Managed, name="nonstop.demos.bank.Transfer"):
    """One record per committed transfer, in the same transaction: proves exactly once."""

    tid: str = key(unique=True)
    src: int = 0
    dst: int = 0
    amount: int = 0


def owner_of(number: int) -> str:
    return OWNERS[number % len(OWNERS)]


@nonstop.transactional
def transfer(tx: nonstop.Transaction, tid: str, src: int, dst: int, amount: int) -> None:
    """Move ``amount`` from ``src`` to ``dst`` and record it as ``Transfer(tid)``."""
    first, second = sorted((src, dst))
    accounts = {
        first: tx.get(Account, number=first, lock="write"),
        second: tx.get(Account, number=second, lock="write"),
    }
    a, b = accounts[src], accounts[dst]
    if a.balance < amount:
        raise nonstop.Abort("insufficient funds")
    a.balance -= amount
    b.balance += amount
    tx.create(Transfer, tid=tid, src=src, dst=dst, amount=amount)


@nonstop.transactional
async def transfer_async(
    tx: nonstop.AsyncTransaction, tid: str, src: int, dst: int, amount: int
) -> None:
    """:func:`transfer` for asyncio handles (embedded or a cluster's)."""
    first, second = sorted((src, dst))
    accounts = {
        first: await tx.get(Account, number=first, lock="write"),
        second: await tx.get(Account, number=second, lock="write"),
    }
    a, b = accounts[src], accounts[dst]
    if a.balance < amount:
        raise nonstop.Abort("insufficient funds")
    a.balance -= amount
    b.balance += amount
    await tx.create(Transfer, tid=tid, src=src, dst=dst, amount=amount)
