"""The partition harness's bank: an application module the nodes load and the clients import.

An account keeps, besides its balance, the ids of the transfers that touched it
in commit order (``log``).  A transfer appends its id to both accounts' logs, so
every transaction is also a list-append transaction: the history checker infers
the order of commits from the logs it reads (docs/design/history-checker.md).
A ``Transfer`` record, written in the same transaction, proves exactly once.
"""

from __future__ import annotations

from nonstop import Managed, field, key


class Account(Managed, name="tests.jepsen.app.Account"):
    number: int = key(unique=True)
    balance: int = 0
    log: list[str] = field(default_factory=list)


class Transfer(Managed, name="tests.jepsen.app.Transfer"):
    tid: str = key(unique=True)
    src: int = 0
    dst: int = 0
    amount: int = 0
