"""The managed types of the simulated bank (registered like any application's types).

The data-plane machine checks a client's ``type`` and ``tv`` against the
process's managed types, as the real node does, so the simulated bank declares
real :class:`~nonstop.Managed` types.  ``Account.log`` lists the ids of the
transfers that touched the account, in commit order: the list-append history
the serializability checker reads (docs/design/history-checker.md).
"""

from __future__ import annotations

from nonstop.model.fields import field, key
from nonstop.model.managed import Managed


class SimAccount(Managed, name="nonstop.sim.bank.Account"):
    number: int = key(unique=True)
    balance: int = 0
    log: list = field(default_factory=list)  # type: ignore[type-arg]


class SimTransfer(Managed, name="nonstop.sim.bank.Transfer"):
    """One record per committed transfer, created in the transfer's transaction."""

    tid: str = key(unique=True)
    """The attempt's id (the value appended to the accounts' logs)."""
    req: str = ""
    """The request id it ran under: several attempts of one request id (homed requests,
    docs/design/requests.md) have different ``tid`` and one ``req``."""
    src: int = 0
    dst: int = 0
    amount: int = 0


ACCOUNT = SimAccount.__nonstop_name__
TRANSFER = SimTransfer.__nonstop_name__

__all__ = ["ACCOUNT", "TRANSFER", "SimAccount", "SimTransfer"]
