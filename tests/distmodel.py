"""Managed types the data-path tests load into every node with ``--app tests.distmodel``.

Type names are explicit (``name=``) so the nodes and the test process agree on
them whatever the import path.
"""

from __future__ import annotations

import time

import nonstop
from nonstop import Managed, key


class Account(Managed, name="dist.Account"):
    number: str = key(unique=True)
    owner: str = key(ordered=True, mutable=True, default="")
    balance: int = 0

    @nonstop.remote
    def deposit(self, amount: int) -> int:
        """Runs on the account's master node (C4); returns the new balance."""
        if amount <= 0:
            raise nonstop.BadArgument("a deposit is positive")
        self.balance += amount
        return self.balance

    def audit_note(self) -> str:
        """Not remote: callable only on the node the client is attached to."""
        return f"{self.number}:{self.balance}"


class Note(Managed, name="dist.Note", version=2):
    """A type at version 2, to test the client's type version check."""

    text: str = ""


class Inbox(Managed, name="dist.Inbox"):
    """Target of asynchronous methods called from clients (A6 to remote targets)."""

    name: str = key(unique=True)
    items: list = nonstop.field(default_factory=list)

    @nonstop.asynchronous
    def post(self, item: str) -> None:
        """Queued in the caller's commit on the inbox's master node; runs there afterwards."""
        self.items = [*self.items, item]

    @nonstop.asynchronous
    def slow_post(self, item: str, seconds: float) -> None:
        """``post`` that takes ``seconds``: a backlog of queued calls for a kill to meet."""
        time.sleep(seconds)
        self.items = [*self.items, item]
