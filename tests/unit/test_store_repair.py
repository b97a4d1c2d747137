"""A damaged object store is rebuilt from the partitions' copies, or refused (issue 14).

The rule (``store_repair.decide``, sans-I/O) case by case; the partition table a
stopped node's cluster log last knew (``known_table``: snapshot + entries after
it); and the start check on real files: a damaged store moves aside and an empty
one takes its place, unless this node holds the only in-sync copy of a partition
(then nothing moves).  The real-cluster proof is
``tests/cluster/test_store_repair.py`` (``long``).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import msgpack
import pytest
from tests.bankmodel import open_accounts

import nonstop
from nonstop.cluster.raft import K_CMD, KEY_SNAPSHOT, log_key
from nonstop.ha.partition_table import Partition, PartitionTable, drop_entry
from nonstop.net import plain
from nonstop.node.datadir import Damage, DataDir
from nonstop.node.known_table import known_table, only_copies
from nonstop.node.store_repair import (
    COORDINATOR_KEY,
    REFUSED,
    Refuse,
    Repair,
    Start,
    check_data_dir,
    decide,
)
from nonstop.runtime.storage import ClusterStore
from nonstop.store.lmdb_store import Store

STORE_BAD = "/d/A/store/data.mdb: database 'objects', key 41 fails its checksum"
CLUSTER_BAD = "/d/A/cluster/data.mdb is truncated"
LOCATION = 0x1234


# ------------------------------------------------------------------- the rule
def test_nothing_damaged_starts() -> None:
    assert decide(Damage(), repairable=True, partitions_known=True, only_here=[]) == Start()


def test_a_damaged_cluster_log_is_refused_even_when_repairable() -> None:
    got = decide(
        Damage(cluster=CLUSTER_BAD, store=STORE_BAD),
        repairable=True,
        partitions_known=True,
        only_here=[],
    )
    assert got == Refuse(f"{REFUSED}: {CLUSTER_BAD}")


def test_a_damaged_store_is_refused_as_before_when_not_repairable() -> None:
    # Routing by node, no replication, or ha.repair_store = false: the old one line.
    got = decide(Damage(store=STORE_BAD), repairable=False, partitions_known=True, only_here=[])
    assert got == Refuse(f"{REFUSED}: {STORE_BAD}")


def test_a_damaged_store_is_repaired_when_every_partition_has_another_copy() -> None:
    got = decide(Damage(store=STORE_BAD), repairable=True, partitions_known=True, only_here=[])
    assert got == Repair(STORE_BAD)


def test_the_last_copy_is_never_repaired_and_the_line_names_the_partitions() -> None:
    got = decide(
        Damage(store=STORE_BAD), repairable=True, partitions_known=True, only_here=["p03", "p11"]
    )
    assert isinstance(got, Refuse)
    assert got.line.startswith(f"{REFUSED}: {STORE_BAD}; not repaired: ")
    assert "only in-sync copy of partitions p03, p11" in got.line and "\n" not in got.line


def test_no_known_partition_is_not_repaired() -> None:
    got = decide(Damage(store=STORE_BAD), repairable=True, partitions_known=False, only_here=[])
    assert isinstance(got, Refuse) and "knows no partition" in got.line


# ------------------------------------------------------- the table last known
def part(name: str, active: str, current: list[str], copying: list[str] | None = None) -> Partition:
    return Partition(
        name=name,
        policy="default",
        nodes=[["A", "sync"], ["B", "sync"], ["C", "sync"]],
        current=current,
        copying=copying or [],
        active=active,
        epoch=3,
        state="Active",
    )


def raft_keys(parts: list[Partition], entries: list[dict[str, object]]) -> dict[bytes, bytes]:
    """A cluster log's durable keys: a snapshot at index 10 holding ``parts``, then
    ``entries`` as commands 11, 12, ..."""
    table = PartitionTable(members=list, live=list)
    table.partitions = {p.name: p for p in parts}
    state = msgpack.packb({"digest": b"", "views": [], "pt": table.snapshot()})
    keys = {KEY_SNAPSHOT: plain.pack({"index": 10, "term": 2, "state": state})}
    for i, entry in enumerate(entries):
        keys[log_key(11 + i)] = plain.pack([2, K_CMD, entry])
    keys[log_key(11 + len(entries))] = plain.pack([2, "n", None])
    return keys


def test_the_known_table_is_the_snapshot_and_the_entries_after_it() -> None:
    parts = [part("p1", "A", ["A", "B"]), part("p2", "B", ["B", "C"]), part("p3", "C", ["C", "A"])]
    table = known_table(raft_keys(parts, [drop_entry("p2", 3, "C")]))
    assert table.partitions["p2"].current == ["B"], "the drop after the snapshot is applied"
    assert only_copies(table, "B") == ["p2"]
    assert only_copies(table, "A") == []


def test_a_copying_replica_is_no_copy_and_a_lone_active_is_the_last() -> None:
    parts = [part("p1", "A", ["A", "B"], copying=["B"]), part("p2", "C", ["C", "A"])]
    table = known_table(raft_keys(parts, []))
    assert only_copies(table, "A") == ["p1"], "B, still copying, does not count"
    assert only_copies(table, "B") == []


# ------------------------------------------------------- the start check, files
def make_node(tmp_path: Path, parts: list[Partition]) -> DataDir:
    data = tmp_path / "A"
    cluster = ClusterStore(str(data / "cluster"), sync=False)
    cluster.write_meta({"cluster": "c", "name": "A", "location": LOCATION, "timestamp": 1})
    cluster.commit(list(raft_keys(parts, []).items()))
    cluster.close()
    with nonstop.open(data / "store") as db, db.transaction() as tx:
        open_accounts(tx, [f"ACC-{i:03d}" for i in range(40)])
    return DataDir(data)


def flip_a_record_bit(store: Path) -> None:
    raw = bytearray((store / "data.mdb").read_bytes())
    at = raw.index(b"owner-ACC-017") + 9
    raw[at] ^= 4
    (store / "data.mdb").write_bytes(bytes(raw))


def test_a_damaged_store_moves_aside_and_an_empty_one_takes_its_place(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    datadir = make_node(tmp_path, [part("p1", "A", ["A", "B"]), part("p2", "B", ["B", "A"])])
    flip_a_record_bit(datadir.store_path)
    damaged = (datadir.store_path / "data.mdb").read_bytes()
    before = time.time_ns() // 1000
    cluster_before = (datadir.cluster_path / "data.mdb").read_bytes()
    with caplog.at_level(logging.WARNING, logger="nonstop.node"):
        assert check_data_dir(datadir, repairable=True, node="A") is None
    # R1: the copies, their heads and the in-sync status (DATA/cluster) are not touched.
    assert (datadir.cluster_path / "data.mdb").read_bytes() == cluster_before
    aside = list(datadir.path.glob("store.damaged-*"))
    assert len(aside) == 1, "the damaged store is kept, never deleted"
    assert (aside[0] / "data.mdb").read_bytes() == damaged
    lines = [r.getMessage() for r in caplog.records if "damaged store" in r.getMessage()]
    assert len(lines) == 1 and "\n" not in lines[0]
    assert str(datadir.store_path / "data.mdb") in lines[0] and str(aside[0]) in lines[0]
    # The new store: empty, this node's location, a coordinator sequence never used.
    store = Store(datadir.store_path)
    try:
        with store.env.begin() as txn:
            assert txn.stat(store.objects)["entries"] == 0
            seq = plain.unpack(bytes(txn.get(COORDINATOR_KEY, db=store.dtx)))
        assert store.location == LOCATION
    finally:
        store.close()
    assert seq >= before
    assert check_data_dir(datadir, repairable=True, node="A") is None, "it starts as usual now"


def test_the_last_copy_moves_nothing(tmp_path: Path) -> None:
    datadir = make_node(tmp_path, [part("p1", "A", ["A"]), part("p2", "B", ["B", "A"])])
    flip_a_record_bit(datadir.store_path)
    damaged = (datadir.store_path / "data.mdb").read_bytes()
    line = check_data_dir(datadir, repairable=True, node="A")
    assert line is not None and line.startswith(f"{REFUSED}: {datadir.store_path / 'data.mdb'}")
    assert "only in-sync copy of partitions p1 " in line
    assert not list(datadir.path.glob("store.damaged-*"))
    assert (datadir.store_path / "data.mdb").read_bytes() == damaged
    off = check_data_dir(datadir, repairable=False, node="A")
    assert off is not None and "not repaired" not in off, "self-repair off: as before"
    other = check_data_dir(datadir, repairable=True, node="B")
    assert other is not None and "not repaired" in other, "another node's directory"
    assert (datadir.store_path / "data.mdb").read_bytes() == damaged


def test_damage_found_at_run_time_is_remembered_for_the_next_start(tmp_path: Path) -> None:
    datadir = make_node(tmp_path, [part("p1", "A", ["A", "B"])])
    problem = f"damaged record in {datadir.store_path / 'data.mdb'}: database 'objects', key 41"
    datadir.mark_damage(problem)
    assert datadir.damage() == Damage(store=problem), "the intact walk does not clear it"
    datadir.mark_damage(f"{datadir.cluster_path / 'data.mdb'}: database 'state', key 72")
    assert datadir.marked_damage() == problem, "cluster damage is not marked in the store"
    assert check_data_dir(datadir, repairable=True, node="A") is None
    assert datadir.damage() == Damage(), "the mark went aside with the store"
