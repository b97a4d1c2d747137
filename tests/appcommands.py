"""Application commands for the G4 tests (loaded by nodes with ``--app``).

Target ``ledger``: ``ledger.open`` (role ``ledger.clerk``) creates an account and
answers where it ran; ``ledger.balances`` (permission ``status``) lists accounts
as rows; ``ledger.fail`` creates an account, then raises (the transaction rolls
back); ``ledger.refuse`` refuses with ``nonstop.Abort``; ``ledger.deposit`` is
asynchronous (an ``async def``: it runs on the node's event loop).
"""

from __future__ import annotations

import os
import threading
from typing import Any

from pydantic import Field

import nonstop
from nonstop.commands.application import Arguments, app_command
from tests.bankmodel import Account

NUMBER = r"^[a-z0-9-]{1,32}$"


class OpenArguments(Arguments):
    number: str = Field(pattern=NUMBER, description="Account number.")
    balance: int = Field(ge=0, le=10**9, description="Opening balance.")


@app_command("ledger.open", arguments=OpenArguments, role="ledger.clerk", positional=("number",))
def open_account(tx: Any, args: OpenArguments) -> list[dict[str, Any]]:
    """Open an account; answers the process it ran in."""
    tx.create(Account, number=args.number, balance=args.balance)
    return [{"number": args.number, "balance": args.balance, "pid": os.getpid()}]


class PrefixArguments(Arguments):
    prefix: str = Field(default="", max_length=32, description="Numbers starting so.")


@app_command("ledger.balances", arguments=PrefixArguments, permission="status", changes=False)
def balances(tx: Any, args: PrefixArguments) -> list[list[Any]]:
    """The accounts and their balances (the first row names the columns)."""
    rows: list[list[Any]] = [["number", "balance"]]
    accounts = sorted(tx.query(Account).all(), key=lambda a: a.number)
    rows += [[a.number, a.balance] for a in accounts if a.number.startswith(args.prefix)]
    return rows


@app_command("ledger.fail", arguments=OpenArguments, role="ledger.clerk")
def open_then_fail(tx: Any, args: OpenArguments) -> None:
    """Open an account, then fail: nothing stays."""
    tx.create(Account, number=args.number, balance=args.balance)
    raise RuntimeError("failed after the create")


@app_command("ledger.refuse", role="ledger.clerk")
def refuse(tx: Any, args: Arguments) -> None:
    """Refuse, always."""
    raise nonstop.Abort("the ledger is closed today")


class DepositArguments(Arguments):
    number: str = Field(pattern=NUMBER, description="Account number.")
    amount: int = Field(ge=1, le=10**6, description="Amount to add.")


@app_command("ledger.deposit", arguments=DepositArguments, role="ledger.clerk")
async def deposit(tx: Any, args: DepositArguments) -> list[dict[str, Any]]:
    """Add AMOUNT to an account (asynchronous: on the node's event loop)."""
    account = await tx.get(Account, number=args.number)
    account.balance = account.balance + args.amount
    thread = threading.current_thread().name
    return [{"number": args.number, "balance": account.balance, "thread": thread}]
