"""Managed types of the pipeline tests: one field of every kind Spark can carry.

Named explicitly (``name=``) so that a bulk server started in a child process
(``--app tests.spark.model``) and the pytest process agree on them.
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import Any

from nonstop import Managed, key


class Owner(Managed, name="pipe.Owner"):
    name: str = key(unique=True)


class Item(Managed, name="pipe.Item"):
    """Every Arrow-mappable field kind, most of them optional."""

    sku: str = key(unique=True)
    qty: int = 0
    price: float = 0.0
    active: bool = True
    label: str | None = key(ordered=True, mutable=True, default=None)
    blob: bytes | None = None
    made: dt.datetime | None = None
    day: dt.date | None = None
    cost: Decimal | None = None
    owner: Owner | None = None


class Tagged(Managed, name="pipe.Tagged"):
    """A type with a field Spark cannot carry (a dict)."""

    code: int = key(unique=True)
    extra: dict[str, Any] | None = None


class Plain(Managed, name="pipe.Plain"):
    """Plain fields only (no reference, no trigger, one unique key): an overwrite swaps
    it without a transaction entry per object (``bulk/fast_swap.py``)."""

    sku: str = key(unique=True)
    qty: int = 0
    label: str | None = key(ordered=True, mutable=True, default=None)


class Keyless(Managed, name="pipe.Keyless"):
    value: int = 0


_fired: list[bool] = []


class Flaky(Managed, name="pipe.Flaky"):
    """Fails the first update of the object ``boom`` (in this process) — after first
    setting ``poke``'s qty to -1 in a transaction of its own, committed at once.

    A Spark task that writes ``boom`` thus fails on its first attempt with the
    batches before it committed, and ``poke`` changed behind the writer's back.
    """

    sku: str = key(unique=True)
    qty: int = 0
    poke: str = ""

    def on_update(self) -> None:
        if self.sku != "boom" or _fired:
            return
        _fired.append(True)
        from nonstop import Abort, transaction_of

        with transaction_of(self).db.transaction() as other:
            other.get(Flaky, sku=self.poke).qty = -1
        raise Abort("injected failure: the first update of 'boom'")
