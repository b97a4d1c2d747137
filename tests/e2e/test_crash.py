"""Crash safety: SIGKILL a process in the middle of transfers, again and again.

A child process runs concurrent transfers and writes each transfer id on its
stdout only after the commit returned (acknowledged).  The parent kills it with
SIGKILL at a random moment (sometimes while it is still opening the store),
reopens the store and checks that

* every acknowledged transfer is there, and every recorded transfer once;
* no transaction is half applied: balances equal the transfer log and the
  total is conserved;
* the asynchronous ``Mailbox.deliver(tid)`` sent by each recorded transfer ran
  exactly once, even when the kill came between the transfer and the call, or
  in the middle of the call.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import pytest
from tests.bankmodel import Mailbox, Transfer, account_numbers, check_ledger, open_accounts
from tests.conftest import ROOT, child_env
from tests.e2e.crash_worker import N_ACCOUNTS, mailbox_name

import nonstop

KILLS = 22
"""SIGKILLs in ``make test-long``; ``make test`` runs the first 12 (two of them while the
child is still opening the store, as every sixth kill is)."""


class Child:
    """A crash_worker process whose stdout lines are collected by a thread."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.e2e.crash_worker", *args],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=child_env(),
            cwd=ROOT,
        )
        self.lines: list[str] = []
        self.ready = threading.Event()
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        buf = b""
        while chunk := self.proc.stdout.read1(65536):
            buf += chunk
            *complete, buf = buf.split(b"\n")
            for line in complete:
                text = line.decode()
                if text == "ready":
                    self.ready.set()
                self.lines.append(text)
        # a partial last line (no newline) was never acknowledged: ignore it

    def wait_for(self, line: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while line not in self.lines:
            if self.proc.poll() is not None:
                err = self.proc.stderr.read().decode() if self.proc.stderr else ""
                raise AssertionError(f"child exited {self.proc.returncode}: {err[-3000:]}")
            assert time.monotonic() < deadline, f"child never said {line!r}"
            time.sleep(0.005)

    def kill(self) -> list[str]:
        os.kill(self.proc.pid, signal.SIGKILL)
        assert self.proc.wait(30) == -signal.SIGKILL
        self._reader.join(30)
        if self.proc.stderr is not None:
            err = self.proc.stderr.read().decode()
            assert "Traceback" not in err, err[-3000:]
            self.proc.stderr.close()
        assert self.proc.stdout is not None
        self.proc.stdout.close()
        return list(self.lines)


def check_mailboxes(db: nonstop.Database) -> None:
    """Every recorded transfer's deliver(tid) ran exactly once, at its receiver's mailbox."""
    assert db.wait_for_async(60), "pending asynchronous calls did not finish"
    with db.transaction() as tx:
        expected = {t.tid: t.dst for t in tx.extent(Transfer)}
        delivered: Counter[str] = Counter()
        for number in account_numbers(N_ACCOUNTS):
            box = tx.get(Mailbox, name=mailbox_name(number))
            for tid in box.log:
                assert expected.get(tid) == number, f"{tid} delivered to the wrong mailbox"
            delivered.update(box.log)
            assert box.runs == len(box.log)
    twice = [tid for tid, n in delivered.items() if n > 1]
    assert not twice, f"asynchronous calls ran twice: {twice[:5]}"
    assert set(delivered) == set(expected), "an asynchronous call was lost"
    assert db.dead_letters() == []


@pytest.mark.timeout(120)
@pytest.mark.parametrize("kills", [12, pytest.param(KILLS, marks=pytest.mark.long)])
def test_sigkill_during_transfers_loses_nothing_acknowledged(tmp_path: Path, kills: int) -> None:
    store = tmp_path / "bank"
    numbers = account_numbers(N_ACCOUNTS)
    with nonstop.open(store) as db:
        open_accounts(db, numbers)
        with db.transaction() as tx:
            for n in numbers:
                tx.create(Mailbox, name=mailbox_name(n))
    rng = random.Random(20240)
    acked: set[str] = set()
    started = time.monotonic()
    for round_no in range(kills):
        child = Child(str(store), "transfers", str(round_no), "3")
        if round_no % 6 == 5:
            # kill while the child is still starting or opening the store
            time.sleep(rng.uniform(0.0, 0.35))
        else:
            child.wait_for("ready")
            time.sleep(rng.uniform(0.02, 0.3))
        lines = child.kill()
        acked.update(line for line in lines if line != "ready")
        with nonstop.open(store) as db:  # recovery: reopen after the kill
            recorded = check_ledger(db, numbers, acked)
            # at most one unacknowledged commit per thread can be in flight at a kill
            assert len(acked) <= recorded <= len(acked) + 3 * (round_no + 1)
            check_mailboxes(db)
    assert len(acked) > 5 * kills, f"too few transfers acknowledged ({len(acked)})"
    assert time.monotonic() - started < 100
