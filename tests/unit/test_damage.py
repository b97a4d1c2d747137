"""Damage is detected, reported and contained (issue 14): checksums, verification, scrub.

Real files, real damage: a flipped bit in a record, random bytes over a B-tree
page, a truncated cluster log.  Each is detected with a message naming the file
and where; nothing wrong is returned (never wrong content, never NotFound).
"""

from __future__ import annotations

import json
import os
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tests.bankmodel import Account, open_accounts

import nonstop
from nonstop.admin.scrub import scrub
from nonstop.errors import CorruptRecord, CorruptStore, IncompatibleStore
from nonstop.model.codec import pack
from nonstop.node.datadir import DataDir
from nonstop.runtime.storage import ClusterStore
from nonstop.store.verify import verify, verify_isolated

N = 300
PAGE = 4096


def numbers() -> list[str]:
    return [f"ACC-{i:05d}" for i in range(N)]


@pytest.fixture
def store(tmp_path: Path) -> Path:
    path = tmp_path / "store"
    with nonstop.open(path) as db, db.transaction() as tx:
        open_accounts(tx, numbers())
    return path


def poke(path: Path, offset: int, data: bytes) -> None:
    with open(path / "data.mdb", "r+b") as f:
        f.seek(offset)
        f.write(data)


def offset_of(path: Path, needle: bytes) -> int:
    return (path / "data.mdb").read_bytes().index(needle)


def flip_bit(path: Path, offset: int, bit: int = 2) -> None:
    raw = (path / "data.mdb").read_bytes()
    poke(path, offset, bytes([raw[offset] ^ (1 << bit)]))


# ------------------------------------------------------------------ records
def test_flipped_bit_in_a_record_is_an_error_naming_file_database_and_key(store: Path) -> None:
    flip_bit(store, offset_of(store, b"owner-ACC-00017") + 9)
    with nonstop.open(store) as db:
        with db.transaction() as tx:
            assert tx.get(Account, number="ACC-00016").owner == "owner-ACC-00016"
        with pytest.raises(CorruptRecord) as info, db.transaction() as tx:
            tx.get(Account, number="ACC-00017")
        err = info.value
        assert str(store / "data.mdb") in str(err) and "'objects'" in str(err)
        assert err.database == "objects" and len(err.key) == 20 and err.key.hex() in str(err)
        # a query over the damaged object fails too: no wrong content, no silent skip
        with pytest.raises(CorruptRecord), db.transaction() as tx:
            list(tx.query(Account))
    report = verify(str(store))
    assert not report.ok and report.complete
    assert report.problems == [
        f"{store / 'data.mdb'}: database 'objects', key {err.key.hex()} fails its checksum"
    ]


@pytest.mark.parametrize("bit", range(8))
def test_every_bit_of_a_field_byte_is_caught(store: Path, bit: int) -> None:
    flip_bit(store, offset_of(store, b"owner-ACC-00123") + 6, bit)
    with nonstop.open(store) as db, pytest.raises(CorruptRecord), db.transaction() as tx:
        tx.get(Account, number="ACC-00123")


def test_intact_store_verifies_clean_and_the_budget_is_reported(store: Path) -> None:
    report = verify_isolated(str(store))
    assert report.ok and report.complete and report.kind == "object"
    assert report.records >= 3 * N  # objects, extents, index entries
    partial = verify(str(store), records=10)
    assert partial.ok and not partial.complete
    assert "budget reached" in partial.summary()


# ------------------------------------------------------------ B-tree pages
def scribbled_copies(store: Path, tmp: Path, seeds: range) -> list[Path]:
    """Copies of ``store`` with random bytes over the leaf page of a record."""
    leaf = offset_of(store, b"owner-ACC-00150") // PAGE * PAGE
    out = []
    for seed in seeds:
        rng = random.Random(seed)
        copy = tmp / f"scribbled-{seed}"
        shutil.copytree(store, copy)
        start = rng.randrange(0, PAGE - 512)
        poke(copy, leaf + start, rng.randbytes(rng.choice([16, 64, 512])))
        out.append(copy)
    return out


def test_random_bytes_on_a_btree_page_fail_verification(store: Path, tmp_path: Path) -> None:
    for copy in scribbled_copies(store, tmp_path, range(12)):
        report = verify_isolated(str(copy))
        assert not report.ok, copy
        assert report.problems[0].startswith(str(copy / "data.mdb")), report.problems


def test_scribbled_page_header_fails_verification(store: Path, tmp_path: Path) -> None:
    leaf = offset_of(store, b"owner-ACC-00150") // PAGE * PAGE
    copy = tmp_path / "header"
    shutil.copytree(store, copy)
    poke(copy, leaf, random.Random(7).randbytes(16))
    report = verify_isolated(str(copy))
    assert not report.ok
    assert "damaged" in report.problems[0] and str(copy / "data.mdb") in report.problems[0]


def test_truncated_store_is_a_one_line_error_not_sigbus(store: Path) -> None:
    size = (store / "data.mdb").stat().st_size
    os.truncate(store / "data.mdb", size // 2)
    report = verify_isolated(str(store))
    assert report.problems and "truncated" in report.problems[0]
    with pytest.raises(CorruptStore, match="truncated"):
        nonstop.open(store)


def test_format_1_store_with_data_is_refused_in_one_line(store: Path) -> None:
    import lmdb

    env = lmdb.open(str(store), max_dbs=16)
    with env.begin(write=True) as txn:
        txn.put(b"format", pack(["nonstop-store", 1]), db=env.open_db(b"meta", txn=txn))
    env.close()
    with pytest.raises(IncompatibleStore, match="store format 1 \\(records without checksums\\)"):
        nonstop.open(store)


# ------------------------------------------------------------- cluster log
@pytest.fixture
def cluster(tmp_path: Path) -> Path:
    path = tmp_path / "cluster"
    cs = ClusterStore(str(path), sync=False)
    cs.write_meta({"name": "A", "cluster": "c"})
    cs.commit([(f"raft/log/{i:08d}".encode(), b"entry-%d" % i * 20) for i in range(200)])
    cs.close()
    return path


def test_cluster_log_values_are_checksummed(cluster: Path) -> None:
    cs = ClusterStore(str(cluster), sync=False)
    assert cs.recovered()[b"raft/log/00000007"] == b"entry-7" * 20
    cs.close()
    flip_bit(cluster, offset_of(cluster, b"entry-42entry-42") + 3)
    cs = ClusterStore(str(cluster), sync=False)
    with pytest.raises(CorruptStore, match="database 'state', key b'raft/log/00000042'"):
        cs.recovered()
    cs.close()
    assert "'state', key " in verify_isolated(str(cluster)).problems[0]


def test_truncated_cluster_log_is_one_line_not_sigbus(cluster: Path) -> None:
    os.truncate(cluster / "data.mdb", (cluster / "data.mdb").stat().st_size - PAGE)
    with pytest.raises(CorruptStore, match="truncated"):
        ClusterStore(str(cluster), sync=False)
    os.truncate(cluster / "data.mdb", 100)
    with pytest.raises(CorruptStore, match="truncated"):
        ClusterStore(str(cluster), sync=False)


# ------------------------------------------------------------ node start
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


def node_dir(tmp_path: Path) -> Path:
    data = tmp_path / "node"
    with nonstop.open(data / "store") as db, db.transaction() as tx:
        open_accounts(tx, numbers())
    cs = ClusterStore(str(data / "cluster"), sync=False)
    cs.commit([(f"raft/log/{i:08d}".encode(), b"entry-%d" % i * 20) for i in range(200)])
    cs.close()
    return data


@pytest.mark.timeout(120)
def test_node_refuses_a_damaged_store_and_cluster_log_in_one_line(tmp_path: Path) -> None:
    data = node_dir(tmp_path)
    flip_bit(data / "store", offset_of(data / "store", b"owner-ACC-00017") + 9)
    proc = start_node(data)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("nonstop: error: damaged")
    assert f"{data / 'store' / 'data.mdb'}: database 'objects', key " in proc.stderr

    shutil.rmtree(data / "store")
    os.truncate(data / "cluster" / "data.mdb", 3 * PAGE)
    proc = start_node(data)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.count("\n") == 1 and "truncated" in proc.stderr
    assert str(data / "cluster" / "data.mdb") in proc.stderr


@pytest.mark.timeout(120)
def test_scrub_command_reports_every_damaged_record(tmp_path: Path) -> None:
    data = node_dir(tmp_path)
    ok = subprocess.run(
        [sys.executable, "-m", "nonstop.admin.cli", "store", "verify", str(data), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert ok.returncode == 0, ok.stderr
    assert [r["kind"] for r in json.loads(ok.stdout)] == ["cluster", "object"]
    for n in ("00017", "00018"):
        flip_bit(data / "store", offset_of(data / "store", b"owner-ACC-" + n.encode()) + 9)
    reports = scrub(str(data))
    assert [r.ok for r in reports] == [True, False]
    assert len(reports[1].problems) == 2
    bad = subprocess.run(
        [sys.executable, "-m", "nonstop.admin.cli", "store", "verify", str(data / "store")],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert bad.returncode == 1 and bad.stderr.count("fails its checksum") == 2


def test_datadir_verify_names_the_file(tmp_path: Path) -> None:
    data = node_dir(tmp_path)
    assert DataDir(data).verify() is None
    flip_bit(data / "cluster", offset_of(data / "cluster", b"entry-9entry-9") + 2)
    problem = DataDir(data).verify()
    assert problem is not None and str(data / "cluster" / "data.mdb") in problem


def test_scrub_cross_checks_indexes_and_counts(store: Path) -> None:
    import lmdb

    from nonstop.model.codec import encode_key

    assert all(r.ok for r in scrub(str(store)))
    env = lmdb.open(str(store), max_dbs=64)
    with env.begin(write=True) as txn:
        index = env.open_db(b"ix:bank.Account:number", txn=txn)
        other = txn.get(encode_key("ACC-00018"), db=index)
        txn.put(encode_key("ACC-00017"), other, db=index)  # a valid-looking wrong reference
        # counts are per (type, location): every account is in the store's own location
        counts = env.open_db(b"counts", txn=txn)
        ((key, _),) = list(txn.cursor(db=counts))
        txn.put(key, (N + 1).to_bytes(8, "big"), db=counts)
        txn.put(b"bank.Account\x00" + bytes(8), (7).to_bytes(8, "big"), db=counts)
    env.close()
    assert verify(str(store)).ok  # the start check's walk: structure and checksums only
    (report,) = scrub(str(store))
    assert len(report.problems) == 3, report.problems
    assert f"does not match object {other.hex()}'s 'number'" in report.problems[0]
    location = key[-8:].hex()
    assert f"bank.Account @ location {location} counts {N + 1}, its extent holds {N}" in (
        report.problems[1] + report.problems[2]
    )
    assert f"bank.Account @ location {bytes(8).hex()} counts 7, its extent holds 0" in (
        report.problems[1] + report.problems[2]
    )


def test_damage_in_the_databases_without_checksums_is_one_line_each(store: Path) -> None:
    # seqs, counts, index, types: no CRC (fixed forms, cross-checked by the scrub);
    # a record of the wrong form is named by the start check's walk (issue 14).
    import lmdb

    from nonstop.model.codec import encode_key

    assert verify(str(store)).ok
    env = lmdb.open(str(store), max_dbs=64)
    with env.begin(write=True) as txn:
        seqs = env.open_db(b"seqs", txn=txn)
        ((seq_key, _),) = list(txn.cursor(db=seqs))
        txn.put(seq_key, b"\x01\x02\x03", db=seqs)  # a counter of 3 bytes
        counts = env.open_db(b"counts", txn=txn)
        ((count_key, _),) = list(txn.cursor(db=counts))
        txn.put(count_key, b"\x00" * 9, db=counts)
        index = env.open_db(b"ix:bank.Account:number", txn=txn)
        txn.put(encode_key("ACC-00017"), b"\xff" * 7, db=index)
        types = env.open_db(b"types", txn=txn)
        ((type_key, _),) = list(txn.cursor(db=types))
        txn.put(type_key, b"\xc1garbage", db=types)
    env.close()
    report = verify(str(store))
    text = "\n".join(report.problems)
    assert len(report.problems) == 4, report.problems
    assert f"database 'seqs', key {seq_key.hex()}: a value of 3 bytes, not 8" in text
    assert f"database 'counts', key {count_key.hex()}: a value of 9 bytes, not 8" in text
    assert "database 'ix:bank.Account:number'" in text and "7 bytes is no reference" in text
    assert f"database 'types', key {type_key.hex()}: a value that does not decode" in text
    assert all("\n" not in line and str(store) in line for line in report.problems)


def test_damaged_prepared_record_is_an_error_at_recovery(tmp_path: Path) -> None:
    path = tmp_path / "store"
    with nonstop.open(path) as db:
        with db.transaction() as tx:
            open_accounts(tx, ["P-1"])
        with db.transaction() as tx:
            tx.get(Account, number="P-1", lock="write").owner = "prepared-owner-value"
            assert tx.prepare(b"gtid-1") is True
        assert db.in_doubt() == [b"gtid-1"]  # closed in doubt: no phase two
    flip_bit(path, offset_of(path, b"prepared-owner-value") + 4)
    with pytest.raises(CorruptRecord, match="database 'prepared', key 677469642d31"):
        nonstop.open(path)


@pytest.mark.timeout(120)
def test_background_scrub_reports_damage_found_while_running(tmp_path: Path) -> None:
    import asyncio

    from nonstop.node.main import background_scrub

    data = node_dir(tmp_path)
    found: list[str] = []

    async def scrub_for(seconds: float) -> None:
        task = asyncio.ensure_future(background_scrub(DataDir(data), 0.05, found.append))
        await asyncio.wait([task], timeout=seconds)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(scrub_for(3.0))
    assert found == []  # intact: it keeps scrubbing, reports nothing
    flip_bit(data / "store", offset_of(data / "store", b"owner-ACC-00017") + 9)
    asyncio.run(scrub_for(30.0))
    assert len(found) == 1
    assert found[0].startswith(f"{data / 'store' / 'data.mdb'}: database 'objects', key ")


def test_damaged_record_is_logged_once_and_reported_to_listeners(
    store: Path, caplog: pytest.LogCaptureFixture
) -> None:
    from nonstop.store.records import on_corrupt

    flip_bit(store, offset_of(store, b"owner-ACC-00042") + 9)
    heard: list[CorruptRecord] = []
    remove = on_corrupt(heard.append)
    try:
        with nonstop.open(store) as db, caplog.at_level("ERROR", logger="nonstop.store"):
            for _ in range(2):
                with pytest.raises(CorruptRecord), db.transaction() as tx:
                    tx.get(Account, number="ACC-00042")
    finally:
        remove()
    assert len(heard) == 2 and heard[0].database == "objects"
    logged = [r.getMessage() for r in caplog.records if r.name == "nonstop.store"]
    assert len(logged) == 1 and str(store / "data.mdb") in logged[0]


@pytest.mark.timeout(120)
def test_node_refuses_a_store_with_random_bytes_on_a_btree_page(tmp_path: Path) -> None:
    data = node_dir(tmp_path)
    store = data / "store"
    leaf = offset_of(store, b"owner-ACC-00150") // PAGE * PAGE
    poke(store, leaf + 100, random.Random(3).randbytes(512))
    proc = start_node(data)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.count("\n") == 1
    assert proc.stderr.startswith(
        f"nonstop: error: damaged store, refusing to serve it: {store / 'data.mdb'}"
    )
