"""A read-only or full data folder (issue 14): one line at start, a clean fail-stop at run time.

Real file systems: a small tmpfs this test mounts itself (``mount -t tmpfs``),
remounted read-only or filled up.  As root, ``chmod`` does not stop writes, so
it would prove nothing.  A read-only remount *at run time* cannot be made here:
the kernel refuses it (EBUSY) while the store holds its files open for writing,
so only a file system's own ``errors=remount-ro`` produces it; a write then fails
with EROFS through the same path as the full disk below (the commit raises
``StoreError``, nothing is acknowledged), which is what the run-time tests show.
Where mounting is not allowed (not root, no ``CAP_SYS_ADMIN``) the tests skip,
saying so.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from tests.bankmodel import open_accounts

import nonstop
from nonstop import Managed, key
from nonstop.errors import StoreError
from nonstop.runtime.interface import Persist
from nonstop.runtime.storage import ClusterStore, StoreWriter
from nonstop.store.verify import verify_isolated

pytestmark = pytest.mark.timeout(120)


def mount(point: Path, *options: str) -> None:
    subprocess.run(["mount", *options, point], check=True, capture_output=True)


@pytest.fixture
def small_fs(tmp_path: Path) -> Iterator[Path]:
    """A 16 MiB tmpfs of our own, unmounted afterwards."""
    point = tmp_path / "fs"
    point.mkdir()
    try:
        mount(point, "-t", "tmpfs", "-o", "size=16m", "tmpfs")
    except (subprocess.CalledProcessError, FileNotFoundError) as exc:
        pytest.skip(f"cannot mount a tmpfs here (needs root / CAP_SYS_ADMIN): {exc}")
    try:
        yield point
    finally:
        subprocess.run(["umount", "-l", point], check=False, capture_output=True)


def read_only(point: Path) -> None:
    mount(point, "-o", "remount,ro")


def fill(point: Path) -> None:
    """Fill the file system until it refuses (ENOSPC)."""
    with open(point / "filler", "wb") as f, contextlib.suppress(OSError):
        while True:
            f.write(b"\0" * (1 << 16))
            f.flush()


def start_node(data: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            *(sys.executable, "-m", "nonstop.admin.cli", "node", "start", "--name", "A"),
            *("--data", str(data), "--listen", "127.0.0.1:1", "--members", "A"),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )


def make_node_dir(data: Path) -> None:
    with nonstop.open(data / "store") as db, db.transaction() as tx:
        open_accounts(tx, ["A-1", "A-2"])
    ClusterStore(str(data / "cluster"), sync=False).close()


def test_read_only_data_folder_at_start_is_one_line(small_fs: Path) -> None:
    data = small_fs / "node"
    make_node_dir(data)
    read_only(small_fs)
    proc = start_node(data)
    assert proc.returncode == 1
    assert proc.stderr == (
        f"nonstop: error: data directory {data} is not writable: Read-only file system\n"
    )
    # the scrub still reads a read-only copy (without LMDB's lock file)
    assert verify_isolated(str(data / "store")).ok


def test_full_data_folder_at_start_is_one_line(small_fs: Path) -> None:
    data = small_fs / "node"
    make_node_dir(data)
    fill(small_fs)
    proc = start_node(data)
    assert proc.returncode == 1
    assert proc.stderr.count("\n") == 1
    assert proc.stderr.startswith(f"nonstop: error: data directory {data}")
    assert proc.stderr.endswith("is not writable: No space left on device\n")


class Blob(Managed, name="test_data_folder.Blob"):
    number: str = key(unique=True)
    data: str = ""


def committed_until_refused(db: nonstop.Database, prefix: str) -> list[str]:
    """Create accounts one commit each until the store refuses one; the acknowledged."""
    acked: list[str] = []
    for i in range(1_000_000):
        number = f"{prefix}-{i:07d}"
        try:
            with db.transaction() as tx:
                tx.create(Blob, number=number, data="x" * 2000)
        except StoreError as exc:
            assert "commit failed in the store" in str(exc) or "full" in str(exc)
            return acked
        acked.append(number)
    raise AssertionError("the file system never filled up")


def test_full_disk_at_run_time_fails_stop_and_keeps_every_acknowledged_commit(
    small_fs: Path,
) -> None:
    path = small_fs / "store"
    db = nonstop.open(path)
    acked = committed_until_refused(db, "F")
    assert len(acked) > 100
    with pytest.raises(StoreError), db.transaction() as tx:  # still refused: nothing half done
        tx.create(Blob, number="after", data="x" * 2000)
    db.close()
    with nonstop.open(path) as db, db.transaction() as tx:
        assert sorted(b.number for b in tx.query(Blob)) == acked
    assert verify_isolated(str(path)).ok


def test_cluster_log_write_on_a_full_disk_is_never_acknowledged(small_fs: Path) -> None:
    cs = ClusterStore(str(small_fs / "cluster"))
    writer = StoreWriter(cs)
    results: list[BaseException | None] = []
    done = threading.Event()

    def persist(i: int) -> None:
        writes = ((f"raft/{i:08d}".encode(), b"e" * 50_000),)
        writer.persist([Persist(writes=writes, token=i)], lambda e: (results.append(e), done.set()))
        done.wait(10)
        done.clear()

    i = 0
    while not results or results[-1] is None:
        persist(i)
        i += 1
        assert i < 10_000
    assert results[-1] is not None
    writer.close()
    cs.close()
    # every acknowledged write is there after reopening (the disk still full)
    cs = ClusterStore(str(small_fs / "cluster"))
    assert len(cs.recovered()) == i - 1
    cs.close()
