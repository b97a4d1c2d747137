"""Deliberately wrong calls: tests/unit/test_typing.py asserts mypy reports each one.

Each line marked ``# expect-error`` must produce a mypy error on that line.
"""

from __future__ import annotations

import nonstop


class Account(nonstop.Managed):
    number: str = nonstop.key(unique=True)
    balance: int = nonstop.field(default="zero")  # expect-error


@nonstop.transactional
def transfer(tx: nonstop.Transaction, src: str, dst: str, amount: int) -> int:
    return amount


@nonstop.transactional
async def transfer_async(tx: nonstop.AsyncTransaction, src: str, amount: int) -> int:
    return amount


def misuse(db: nonstop.Database) -> None:
    transfer(db, "A-1", "A-2", "five")  # expect-error
    transfer(db, "A-1")  # expect-error
    print(transfer(db, "A-1", "A-2", 5).upper())  # expect-error
    transfer(42, "A-1", "A-2", 5)  # expect-error
    transfer(db, "A-1", "A-2", amount=5, fee=1)  # expect-error


async def misuse_async(db: nonstop.Database) -> None:
    print((await transfer_async(db, "A-1", 5)).upper())  # expect-error
