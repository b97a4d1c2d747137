"""The application module every node loads (``--app bank.model``) and clients import.

Only declarations: a node imports it at start, so it must not run anything then.
"""

from __future__ import annotations

import nonstop


class Account(nonstop.Managed):
    number: str = nonstop.key(unique=True)  # immutable unique key
    owner: str = nonstop.key(ordered=True, mutable=True)  # non-unique, ordered
    balance: int = 0


@nonstop.transactional  # replayed on deadlock or conflict
def transfer(tx: nonstop.Transaction, src: str, dst: str, amount: int) -> None:
    # Both locks in number order: two transfers over one pair never deadlock.
    locked = {n: tx.get(Account, number=n, lock="write") for n in sorted((src, dst))}
    a, b = locked[src], locked[dst]
    if a.balance < amount:
        raise nonstop.Abort("insufficient funds")
    a.balance -= amount
    b.balance += amount


@nonstop.transactional
async def transfer_async(tx: nonstop.AsyncTransaction, src: str, dst: str, amount: int) -> None:
    """The asyncio twin of :func:`transfer`: the same steps, awaited."""
    locked = {n: await tx.get(Account, number=n, lock="write") for n in sorted((src, dst))}
    a, b = locked[src], locked[dst]
    if a.balance < amount:
        raise nonstop.Abort("insufficient funds")
    a.balance -= amount
    b.balance += amount
