"""SIGKILL during distributed transfers: the store and the 2PC machine never disagree.

A child process (tests/e2e/dtx_crash_worker.py) runs two-phase-commit transfers
between two real stores; the parent kills it at random moments, so kills land
around prepare commits and resolve commits alike.  After every kill, with the
stores reopened, for each store:

* its in-doubt set equals the machine's ``dtx/p/`` keys;
* an outcome tombstone exists only with its effect: ``commit`` -> the
  transfer's objects are there, ``abort`` -> they are not, in doubt -> not yet.

After the last round a clean restart settles everything; then both stores
hold exactly the same transfers, every transfer the client heard committed is
there, none it heard aborted, and the balances are what the transfers say.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from tests.bankmodel import Account, Transfer
from tests.conftest import ROOT, child_env

import nonstop
from nonstop.dataplane.participant import recovered_dtx_state
from nonstop.dtx.protocol import K_PREPARED, K_TOMB

RANDOM_ROUNDS = 4
# Self-inflicted kills at exact points: (node, point, nth commit of that kind).
TARGETED = [
    ("n2", "p-durable", 3),
    ("n2", "t-durable", 2),
    ("n1", "p-durable", 2),
    ("n1", "t-durable", 4),
    ("n2", "p-submit", 1),
    ("n2", "t-submit", 3),
    ("n1", "p-submit", 5),
    ("n1", "t-submit", 1),
]
ROUNDS = RANDOM_ROUNDS + len(TARGETED)


def _spawn(root: Path, *args: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "tests.e2e.dtx_crash_worker", str(root), *args],
        stdout=subprocess.PIPE,
        cwd=ROOT,
        env=child_env(),
    )


def _read_lines(
    child: subprocess.Popen[bytes], until: float, stop_after: float | None
) -> list[str]:
    """Lines of the child until it exits, or until ``stop_after`` s after its first gtid."""
    assert child.stdout is not None
    os.set_blocking(child.stdout.fileno(), False)
    buf = b""
    lines: list[str] = []
    first_g: float | None = None
    while time.monotonic() < until:
        chunk = child.stdout.read()
        if chunk:
            buf += chunk
            *done, buf = buf.split(b"\n")
            for line in done:
                lines.append(line.decode())
                if first_g is None and line.startswith(b"g "):
                    first_g = time.monotonic()
        if child.poll() is not None and not chunk:
            break
        if (
            stop_after is not None
            and first_g is not None
            and time.monotonic() - first_g >= stop_after
        ):
            break
        time.sleep(0.005)
    return lines


def _transfers(db: nonstop.Database) -> dict[str, tuple[str, int]]:
    with db.transaction(isolation="snapshot") as tx:
        return {t.tid: (t.src, t.amount) for t in tx.query(Transfer).all()}


def _check_store(path: Path, gtid_of: dict[str, str]) -> dict[str, tuple[str, int]]:
    """The invariants of one reopened store (module doc); returns its transfers."""
    with nonstop.open(path) as db:
        state = recovered_dtx_state(db)
        prepared = {k[len(K_PREPARED) :] for k in state if k.startswith(K_PREPARED)}
        tombs = {k[len(K_TOMB) :].decode(): v for k, v in state.items() if k.startswith(K_TOMB)}
        assert set(db.in_doubt()) == prepared, (db.in_doubt(), prepared)
        present = _transfers(db)
        tid_of = {g: t for t, g in gtid_of.items()}
        for gtid, outcome in tombs.items():
            assert gtid in tid_of, f"tombstone {gtid} of a gtid nobody recorded"
            assert (tid_of[gtid] in present) == (outcome == b"commit"), (gtid, outcome)
        for gtid in prepared:
            assert tid_of[gtid.decode()] not in present, f"{gtid!r} in doubt yet applied"
        return present


@pytest.mark.timeout(120)
def test_sigkill_around_prepare_and_resolve_never_splits_store_and_machine(
    tmp_path: Path,
) -> None:
    for node, number in (("n1", "A"), ("n2", "B")):
        with nonstop.open(tmp_path / node) as db, db.transaction() as tx:
            tx.create(Account, number=number, balance=1000)
    rng = random.Random(os.environ.get("NONSTOP_DTX_CRASH_SEED", "7"))
    gtid_of: dict[str, str] = {}
    told: dict[str, str] = {}
    kills_with_doubt = 0
    plan: list[tuple[str, str, int] | None] = [*TARGETED, *[None] * RANDOM_ROUNDS]
    rng.shuffle(plan)
    for round_no, target in enumerate(plan):
        args = [] if target is None else [target[0], target[1], str(target[2])]
        child = _spawn(tmp_path, "run", str(round_no), *args)
        try:
            if target is None:
                lines = _read_lines(child, time.monotonic() + 30, rng.uniform(0.05, 0.9))
                assert child.poll() is None, f"worker died: {lines[-5:]}"
                os.kill(child.pid, signal.SIGKILL)
            else:
                lines = _read_lines(child, time.monotonic() + 30, None)
            assert child.wait(10) == -signal.SIGKILL, lines[-5:]
        finally:
            child.kill()
            if child.stdout is not None:
                child.stdout.close()
        for line in lines:
            kind, *rest = line.split()
            if kind == "g":
                gtid_of[rest[0]] = rest[1]
            elif kind in ("c", "a"):
                told[rest[0]] = kind
        # (A targeted kill may hit the recovery of the previous round's in-doubt branches.)
        assert target is not None or any(line.startswith("g ") for line in lines)
        for node in ("n1", "n2"):
            _check_store(tmp_path / node, gtid_of)
        with nonstop.open(tmp_path / "n2") as db:
            kills_with_doubt += bool(db.in_doubt())
        if target is not None and target[1] == "p-durable":
            with nonstop.open(tmp_path / target[0]) as db:
                assert db.in_doubt(), f"killed with a prepare durable on {target[0]}"
        if target is not None and target[1] == "t-durable":
            with nonstop.open(tmp_path / target[0]) as db:
                assert any(k.startswith(K_TOMB) for k in recovered_dtx_state(db))
    settle = _spawn(tmp_path, "settle")
    try:
        lines = _read_lines(settle, time.monotonic() + 60, None)
        assert settle.wait(10) == 0 and lines[-1:] == ["settled"], lines
    finally:
        settle.kill()
        if settle.stdout is not None:
            settle.stdout.close()
    one = _check_store(tmp_path / "n1", gtid_of)
    two = _check_store(tmp_path / "n2", gtid_of)
    assert one == two  # atomic across the stores
    assert len(one) >= RANDOM_ROUNDS  # progress was made
    for tid, heard in told.items():
        assert (tid in one) == (heard == "c"), (tid, heard)
    a = 1000 + sum(-n if src == "A" else n for src, n in one.values())
    for node, number, expected in (("n1", "A", a), ("n2", "B", 2000 - a)):
        with nonstop.open(tmp_path / node) as db, db.transaction() as tx:
            assert tx.get(Account, number=number).balance == expected
            assert db.in_doubt() == []
    print(f"{len(one)} transfers committed; {kills_with_doubt}/{ROUNDS} kills left n2 in doubt")
