"""A node rebuilds its damaged object store from the partitions' copies (issue 14).

Three replicating nodes on loopback (``tests/cluster/replicated_bank.py``).  B is
stopped, its object store damaged (a bit flipped in an account's record), and
started again: B starts, logs the repair in one line naming the damaged file,
keeps the damaged store aside, is restored and an in-sync replica again
(``nonstop partition list --json``), and every account reads as acknowledged.
Damage found at run time (a read that fails its checksum) stops B and marks its
store; its next start repairs it the same way.  A kill of A afterwards loses
nothing.  Then B holds the only copy of the partitions
it shared with A: stopped and damaged again, it refuses to start, names those
partitions in its one line, and moves nothing.  replication.md §11.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import signal
from pathlib import Path
from typing import Any

import pytest

import nonstop
from nonstop import errors
from nonstop.admin.local import LocalError
from nonstop.node.datadir import pid_alive
from tests.cluster.conftest import REAL_CLUSTER, Procs, run_cli, wait_until
from tests.cluster.replicated_bank import (
    accounts_on,
    balances,
    read_all,
    replicated_bank,
    restored,
    served,
    table,
)
from tests.distmodel import Account

pytestmark = [
    pytest.mark.skipif(not REAL_CLUSTER, reason="replication is the real cluster node's"),
    pytest.mark.long,
]

ACCOUNTS = 48


def stop(p: Procs, name: str) -> None:
    """SIGTERM ``name`` and wait until its process is gone."""
    pid = p.pids.pop(name)
    os.kill(pid, signal.SIGTERM)
    wait_until(lambda: not pid_alive(pid), 30, f"{name} to stop")


def damage(store: Path, number: str) -> None:
    """Flip a bit of account ``number`` wherever its packed string is in ``store``'s file
    (its record fails its checksum)."""
    path = store / "data.mdb"
    raw = bytearray(path.read_bytes())
    needle = bytes([0xA0 | len(number)]) + number.encode()
    at = raw.find(needle)
    assert at >= 0, f"{number} is not in {path}"
    while at >= 0:
        raw[at + len(needle) - 1] ^= 2
        at = raw.find(needle, at + 1)
    path.write_bytes(bytes(raw))


def holders(part: dict[str, Any]) -> list[str]:
    return [n for n, _ in part["current"] if n not in part["copying"]]


@nonstop.transactional
def transfer(tx: nonstop.Transaction, src: str, dst: str) -> None:
    a, b = (tx.get(Account, number=n, lock="write") for n in (src, dst))
    a.balance -= 1
    b.balance += 1


@pytest.mark.timeout(300)
def test_a_damaged_store_is_rebuilt_from_the_copies_and_the_last_copy_is_kept(
    tmp_path: Path,
) -> None:
    numbers = [f"S-{i}" for i in range(ACCOUNTS)]
    with replicated_bank(tmp_path, numbers) as bank:
        p, db = bank.p, bank.db
        on_b = accounts_on(bank, "B")
        assert on_b, "B acts for partitions holding accounts"
        data = p.nodes["B"].data
        store = data / "store"

        # B stops; writes go on without it (its copies fall behind: restored by D9).
        stop(p, "B")
        wait_until(lambda: served(p, "AC", replicas=False), 60, "A and C serving everything")
        rng = random.Random(5)
        for _ in range(10):
            transfer(db, *rng.sample(numbers, 2))
        before = read_all(db, numbers, 30)
        damage(store, on_b[0])

        # B starts on the damaged store: it repairs, and is restored.
        p.start("B")
        wait_until(lambda: restored(p, "B", "ABC"), 90, "B restored")
        log = (data / "node.log").read_text()
        lines = [x for x in log.splitlines() if "damaged store, rebuilding it" in x]
        assert len(lines) == 1, lines
        assert str(store / "data.mdb") in lines[0] and "fails its checksum" in lines[0]
        aside = list(data.glob("store.damaged-*"))
        assert len(aside) == 1 and (aside[0] / "data.mdb").exists(), "kept, never deleted"
        code, out, err = run_cli("partition", "list", "--json", "--node", p.address("C"))
        assert code == 0, err
        listed = [r for r in json.loads(out)["partitions"] if "B" in [n for n, _ in r["nodes"]]]
        assert listed and all("B" in holders(r) for r in listed), "B in sync again"
        assert read_all(db, numbers, 30) == before

        # Damage found at run time (a read fails its checksum): B stops serving its store
        # and marks it; its next start repairs it the same way.
        probe = wait_until(lambda: accounts_on(bank, "B"), 60, "B active again")[0]
        pid = p.pids.pop("B")
        damage(store, probe)
        with contextlib.suppress(errors.Error):
            balances(db, [probe])
        wait_until(lambda: not pid_alive(pid), 30, "B to stop serving its damaged store")
        stopped = [x for x in (data / "node.log").read_text().splitlines() if "stopped serv" in x]
        assert len(stopped) == 1 and str(store / "data.mdb") in stopped[0], stopped
        assert (store / "DAMAGED").exists(), "the next start knows"
        p.start("B")
        wait_until(lambda: restored(p, "B", "ABC"), 90, "B restored again")
        aside = list(data.glob("store.damaged-*"))
        assert len(aside) == 2 and any((a / "DAMAGED").exists() for a in aside)
        assert read_all(db, numbers, 30) == before

        # The rebuilt copies are real: A dies, B and C still serve every account.
        p.kill("A")
        wait_until(lambda: served(p, "BC", replicas=False), 60, "B and C serving everything")
        assert read_all(db, numbers, 30) == before

        # B now holds the only copy of the partitions it shared with A: never repaired.
        last = sorted(name for name, part in table(p, "B").items() if holders(part) == ["B"])
        assert last, "some partition has B as its only copy"
        stop(p, "B")
        damage(store, on_b[0])
        damaged = (store / "data.mdb").read_bytes()
        with pytest.raises(LocalError) as refused:
            p.start("B")
        line = str(refused.value)
        assert f"damaged store, refusing to serve it: {store / 'data.mdb'}" in line, line
        named = line.split("only in-sync copy of partitions ")[1].split(" (")[0].split(", ")
        assert named == last, line
        assert list(data.glob("store.damaged-*")) == aside, "nothing moved"
        assert (store / "data.mdb").read_bytes() == damaged
