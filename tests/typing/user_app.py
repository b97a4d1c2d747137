"""A user's application, type-checked with ``mypy --strict`` by tests/unit/test_typing.py.

It is what a newcomer writes after reading the README: managed types, embedded
transactions, a transactional function (sync and async), queries, and a client.
It is only type-checked, never run: every call below must type-check as written.
"""

from __future__ import annotations

import nonstop


class Account(nonstop.Managed):
    number: str = nonstop.key(unique=True)
    owner: str = nonstop.key(ordered=True, mutable=True)
    balance: int = nonstop.field(default=0)


@nonstop.transactional
def transfer(tx: nonstop.Transaction, src: str, dst: str, amount: int) -> int:
    a = tx.get(Account, number=src, lock="write")
    b = tx.get(Account, number=dst, lock="write")
    if a.balance < amount:
        raise nonstop.Abort("insufficient funds")
    a.balance -= amount
    b.balance += amount
    return a.balance


@nonstop.transactional(isolation="snapshot", max_retries=5)
def total(tx: nonstop.Transaction) -> int:
    return sum(a.balance for a in tx.query(Account))


@nonstop.transactional
async def transfer_async(tx: nonstop.AsyncTransaction, src: str, dst: str, amount: int) -> int:
    a = await tx.get(Account, number=src, lock="write")
    a.balance -= amount
    return a.balance


def embedded(path: str) -> None:
    db: nonstop.Database = nonstop.open(path)
    with db.transaction() as tx:
        account: Account = tx.create(Account, number="A-1", owner="ann", balance=100)
        owners: list[str] = [a.owner for a in tx.query(Account).range("owner", "a", "m")]
        print(account.number, owners)
    left: int = transfer(db, "A-1", "A-2", 5)
    everything: int = total(db)
    print(left, everything)
    db.close()


def cluster(addresses: str) -> None:
    client: nonstop.Client = nonstop.connect(addresses)
    with client.transaction() as tx:
        tx.create(Account, number="B-7", owner="cy", balance=0, node="B")
    left: int = transfer(client, "A-1", "B-7", 5)
    print(left)
    client.close()


async def cluster_async(addresses: str) -> int:
    async with nonstop.connect_async(addresses) as client:
        left: int = await transfer_async(client, "A-1", "B-7", 5)
        return left
