"""A child process for the crash and restart tests; the parent SIGKILLs it.

    python -m tests.e2e.crash_worker STORE transfers ROUND THREADS
        transfer money between the bank accounts in THREADS threads, forever;
        each transfer also sends ``Mailbox.deliver(tid)`` to the receiving
        account's mailbox.  After each commit returns, write ``tid`` on stdout.

    python -m tests.e2e.crash_worker STORE async N
        send N ``slow_deliver`` calls to mailbox "slow" (4 per transaction),
        write ``committed``, then idle until killed.

    python -m tests.e2e.crash_worker STORE populate N
        create N objects with keys, write ``done``, then idle until killed.

Stdout lines are written with one ``os.write`` each, so a line is either
complete or absent when the process dies.
"""

from __future__ import annotations

import os
import random
import sys
import threading
import time

from tests.bankmodel import Account, Mailbox, Transfer, account_numbers

import nonstop

N_ACCOUNTS = 6


def say(line: str) -> None:
    os.write(1, (line + "\n").encode())


def mailbox_name(number: str) -> str:
    return f"mb-{number}"


@nonstop.transactional
def transfer_and_notify(tx: nonstop.Transaction, tid: str, src: str, dst: str, n: int) -> None:
    a = tx.get(Account, number=src, lock="write")
    b = tx.get(Account, number=dst, lock="write")
    a.balance -= n
    b.balance += n
    tx.create(Transfer, tid=tid, src=src, dst=dst, amount=n)
    tx.get(Mailbox, name=mailbox_name(dst), lock="none").deliver(tid)


def run_transfers(db: nonstop.Database, round_no: str, threads: int) -> None:
    numbers = account_numbers(N_ACCOUNTS)

    def work(w: int) -> None:
        rng = random.Random(f"{round_no}-{w}")
        i = 0
        while True:
            src, dst = rng.sample(numbers, 2)
            tid = f"r{round_no}-w{w}-{i}"
            transfer_and_notify(db, tid, src, dst, rng.randint(1, 100))
            say(tid)
            i += 1

    for w in range(threads):
        threading.Thread(target=work, args=(w,), daemon=True).start()


def main() -> None:
    store, mode, *args = sys.argv[1:]
    db = nonstop.open(store)
    say("ready")
    if mode == "transfers":
        run_transfers(db, args[0], int(args[1]))
    elif mode == "async":
        n = int(args[0])
        for start in range(0, n, 4):  # several sending transactions, 4 calls each
            with db.transaction() as tx:
                box, _ = tx.get_or_create(Mailbox, name="slow")
                for i in range(start, min(n, start + 4)):
                    box.slow_deliver(f"call-{i}")
        say("committed")
    elif mode == "populate":
        with db.transaction() as tx:
            for i in range(int(args[0])):
                tx.create(Account, number=f"P{i:04d}", owner=f"o{i % 7}", balance=i)
        say("done")
    else:
        raise SystemExit(f"unknown mode {mode}")
    while True:
        time.sleep(1)


if __name__ == "__main__":
    main()
