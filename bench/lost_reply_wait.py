"""How long a client waits for a commit whose reply was lost with its dead node (issue 10, H4).

Three replicating nodes on loopback (``tests/cluster/replicated_bank.py``), client
threads running transfers with B as their first address, B SIGKILLed under the
load.  Every commit whose reply was lost goes through the client's own path
(``ClientCore.request_result``: the dead node cannot be asked, the survivors are,
with the commit's home); each one's wait and answer are printed, measured from
when the client began asking::

    PYTHONPATH=src:. python -m bench.lost_reply_wait [threads]

Not a timed test: the number of lost replies depends on the moment of the kill.
"""

from __future__ import annotations

import random
import sys
import tempfile
import threading
import time
from collections.abc import Generator
from pathlib import Path
from typing import Any

from tests.cluster.replicated_bank import replicated_bank
from tests.distmodel import Account

import nonstop
from nonstop import errors
from nonstop.client import core

waits: list[tuple[float, float, str]] = []
"""(began after the kill, seconds, answer) of every lost reply's outcome search."""
_original = core.ClientCore.request_result


def _timed(
    self: core.ClientCore, address: str, req: list[Any], cause: BaseException, home: Any = None
) -> Generator[core.Action, Any, None]:
    began = time.monotonic()
    try:
        yield from _original(self, address, req, cause, home)
        waits.append((began, time.monotonic() - began, "committed"))
    except errors.Error as exc:
        waits.append((began, time.monotonic() - began, type(exc).__name__))
        raise


def main(threads: int) -> None:
    core.ClientCore.request_result = _timed  # type: ignore[method-assign]
    numbers = [f"T-{i}" for i in range(48)]
    with (
        tempfile.TemporaryDirectory(prefix="lost-reply.") as folder,
        replicated_bank(Path(folder), numbers) as bank,
    ):
        stop = threading.Event()

        def transfers(seed: int) -> None:
            rng = random.Random(seed)
            # B coordinates (balance="first"): B is the node the bench kills.
            db = nonstop.connect(",".join(bank.p.address(n) for n in "BAC"), balance="first")
            try:
                while not stop.is_set():
                    src, dst = sorted(rng.sample(numbers, 2))
                    try:
                        with db.transaction() as tx:
                            tx.get(Account, number=src, lock="write").balance -= 1
                            tx.get(Account, number=dst, lock="write").balance += 1
                    except errors.Error:
                        time.sleep(0.05)
            finally:
                db.close()

        workers = [threading.Thread(target=transfers, args=(i,)) for i in range(threads)]
        for w in workers:
            w.start()
        time.sleep(3)
        killed_at = time.monotonic()
        bank.p.kill("B")
        time.sleep(15)
        stop.set()
        for w in workers:
            w.join(60)
    for began, seconds, answer in sorted(waits):
        print(f"began {began - killed_at:+.2f} s after the kill, waited {seconds:.2f} s: {answer}")
    longest = max((s for _, s, _ in waits), default=0.0)
    print(f"{len(waits)} lost replies, the longest wait {longest:.2f} s")


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 16)
