"""The README's cluster example: run it next to a local cluster started with --app bank.model."""

import asyncio

from bank.model import Account, transfer, transfer_async

import nonstop

cluster = nonstop.connect()  # the local cluster of this folder (./.nonstop/local)
with cluster.transaction() as tx:  # re-runnable: creates the accounts only once
    tx.get_or_create(Account, number="A-1", defaults={"owner": "ann", "balance": 100}, node="A")
    tx.get_or_create(Account, number="B-7", defaults={"owner": "cy", "balance": 0}, node="B")
transfer(cluster, "A-1", "B-7", 5)  # the same function as embedded; objects on two nodes


async def main() -> None:
    async with nonstop.connect_async() as c:  # tasks share one connection
        await transfer_async(c, "B-7", "A-1", 2)


asyncio.run(main())
with cluster.transaction() as tx:
    print({a.number: a.balance for a in tx.query(Account)})
cluster.close()
