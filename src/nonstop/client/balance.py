"""Load balancing (H5): which of the given addresses a client handle's sessions go to.

Every client handle has its own *primary* among the addresses it was given,
and its *backups* are the other addresses in a fixed order after it (the list
read on from the primary, wrapping round).  Its sessions (transactions, admin
requests) go to the primary while it answers, and to the next backup only
once the primary fails (``ClientCore.switch``): the seed's rule (002 §5.6)
that a backup takes a client's sessions over only once their primary has left.

``balance`` chooses the primary:

* ``"spread"`` (the default) — handles are spread over the addresses: the
  handles one process makes on one address list take its addresses in turn,
  starting at a random one, so N handles on N nodes use every node once, and
  many processes with one handle each spread at random.  (Turns are counted per
  address list, so handles on one node or on another cluster made in between
  do not skew them.)  Every node coordinates its share of the
  clients' transactions instead of the first address coordinating them all.
* ``"first"`` — the first address, then the others in the order given: the
  caller pins the order (a test of "the client attached to A", an operator's
  command that should be answered by the node named first).

No I/O here; the random start is the only state, one :class:`Spreader` per
process.
"""

from __future__ import annotations

import itertools
import random
import threading
from collections.abc import Sequence
from typing import Final, Literal, get_args

Balance = Literal["spread", "first"]
BALANCES: Final[tuple[str, ...]] = get_args(Balance)
DEFAULT_BALANCE: Final[Balance] = "spread"


class Spreader:
    """Hands out primaries in turn: the k-th ``"spread"`` handle on one address list
    takes its address ``(start + k) mod n``.

    ``start`` is random for each list unless given (tests), so that processes with
    one handle each do not all pick the first address.
    """

    def __init__(self, start: int | None = None) -> None:
        self._start = start
        self._turns: dict[tuple[str, ...], itertools.count[int]] = {}
        self._lock = threading.Lock()

    def next_index(self, addresses: Sequence[str]) -> int:
        """The primary's index in ``addresses`` for the next handle on them."""
        if len(addresses) < 2:
            return 0  # nothing to spread
        key = tuple(addresses)
        with self._lock:
            turns = self._turns.get(key)
            if turns is None:
                start = random.randrange(len(key)) if self._start is None else self._start
                turns = self._turns[key] = itertools.count(start)
            return next(turns) % len(key)


PROCESS_SPREADER: Final = Spreader()
"""The turns of every handle this process makes."""


def check_balance(balance: object) -> Balance:
    """``balance`` if it is one of :data:`BALANCES`, else a ``ValueError`` naming them."""
    if balance not in BALANCES:
        raise ValueError(
            f"balance must be one of {', '.join(repr(b) for b in BALANCES)}, not {balance!r}"
        )
    return balance  # type: ignore[return-value]


def primary_index(
    balance: object, addresses: Sequence[str], spreader: Spreader = PROCESS_SPREADER
) -> int:
    """The index of a new handle's primary in ``addresses``."""
    if not addresses:
        raise ValueError("no node address given")
    if check_balance(balance) == "first":
        return 0
    return spreader.next_index(addresses)


__all__ = [
    "BALANCES",
    "DEFAULT_BALANCE",
    "PROCESS_SPREADER",
    "Balance",
    "Spreader",
    "check_balance",
    "primary_index",
]
