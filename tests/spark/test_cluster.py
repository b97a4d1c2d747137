"""The data source against a real 3-node cluster (node processes with the data service)."""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pytest

from nonstop.admin.owned import OwnedCluster
from nonstop.bulk.handlers import decode_rows
from nonstop.client.bulk import BulkClient, cluster_nodes
from nonstop.errors import Error, Retryable, Unavailable
from nonstop.model.codec import pack
from nonstop.spark.schema import Options
from nonstop.spark.source import NonstopWriter, WriteStats, commit_outcome, home
from tests.spark.conftest import ROOT, wait_until

# Routing by node, no longer the default: `make test-long` runs this module; `make test`
# runs the same guarantees under routing by partition (test_partition_overwrite.py,
# test_partition_writes.py) and the by-node swaps in process (test_bounded_swap.py).
pytestmark = pytest.mark.long

ITEM = "pipe.Item"
PLAIN = "pipe.Plain"
MODEL = "tests.spark.model"


def both_swaps(default: str) -> pytest.MarkDecorator:
    """Failure tests run on both swaps: Item has a reference (an entry per object swapped),
    Plain does not (bulk/swap_apply.py: memory bounded per page).  The ``default`` one
    runs in ``make test``, the other in ``make test-long`` (marked ``long``): each
    failure test takes one swap in the
    default suite, and the two tests take different ones, so both swaps meet a failure
    there at half the cost."""
    params = [
        pytest.param(kind, id=name, marks=() if kind == default else pytest.mark.long)
        for kind, name in ((ITEM, "per-object-swap"), (PLAIN, "bounded-swap"))
    ]
    return pytest.mark.parametrize("kind", params)


@pytest.fixture(scope="module")
def three_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OwnedCluster]:
    """One cluster for the module's tests (starting one costs seconds): ``cluster``
    hands it to each test as a fresh one."""
    env = {"PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    # Routing by node (each node's store, the by-node overwrite swap of bulk/swap_apply.py,
    # a node down refuses): overwrite by partition: tests/spark/test_partition_overwrite.py.
    nodes = {"ha": {"data": "nodes"}}
    folder = tmp_path_factory.mktemp("spark-cluster") / "c"
    oc = OwnedCluster(folder, 3, apps=[MODEL], options=nodes, env=env)
    try:
        oc.start_all(timeout=60)
        yield oc
    finally:
        oc.close()


@pytest.fixture
def cluster(three_nodes: OwnedCluster, spark: Any) -> OwnedCluster:
    """The module's cluster as a new one would be: every node up and Active, and no
    Item or Plain object on any node (an overwrite with nothing empties a type; the
    tests kill nodes and restart them, and one that failed may have left one down)."""
    for name in three_nodes.names:
        if name not in three_nodes.alive():
            three_nodes.start(name)
    three_nodes.wait_active()
    addresses = ",".join(three_nodes.addresses)
    for kind in (ITEM, PLAIN):
        spark.createDataFrame([], "sku string, qty long").write.format("nonstop").option(
            "cluster", addresses
        ).option("type", kind).mode("overwrite").save()
        assert all(not skus_on(a, kind) for a in three_nodes.addresses), kind
    return three_nodes


def read(spark: Any, addresses: str, **options: str) -> Any:
    r = spark.read.format("nonstop").option("cluster", addresses).option("type", ITEM)
    for k, v in options.items():
        r = r.option(k, v)
    return r.load()


def test_spark_on_a_three_node_cluster(spark: Any, cluster: OwnedCluster) -> None:
    addresses = ",".join(cluster.addresses)
    nodes = cluster_nodes(addresses)
    assert [n["name"] for n in nodes] == ["A", "B", "C"] and all(n["up"] for n in nodes)
    rows = [(f"c{i:05}", i) for i in range(3000)]
    df = spark.createDataFrame(rows, "sku string, qty long").repartition(3)
    df.write.format("nonstop").option("cluster", addresses).option("type", ITEM).mode(
        "append"
    ).save()
    held = {}
    for n in nodes:
        with BulkClient(n["address"]) as c:
            held[n["name"]] = c.call("bulk.plan", type=ITEM)["count"]
    assert sum(held.values()) == 3000 and min(held.values()) > 500  # spread by key
    back = read(spark, addresses, splits="2")
    assert back.rdd.getNumPartitions() == 6
    assert sorted((r.sku, r.qty) for r in back.select("sku", "qty").collect()) == rows
    assert read(spark, addresses, nodes="B").count() == held["B"]
    # Overwrite: one distributed transaction swaps every node's staged parts in.
    new = spark.createDataFrame([(f"n{i}", 1) for i in range(900)], "sku string, qty long")
    new.write.format("nonstop").option("cluster", addresses).option("type", ITEM).mode(
        "overwrite"
    ).save()
    assert sorted(r.sku for r in read(spark, addresses).collect()) == sorted(
        f"n{i}" for i in range(900)
    )
    after = {}
    for n in nodes:
        with BulkClient(n["address"]) as c:
            after[n["name"]] = c.call("bulk.plan", type=ITEM)["count"]
    # A node down: reads and writes refuse (its objects would be missed), naming it.
    cluster.kill("C")
    survivor = cluster.address("A")

    def c_down() -> bool:
        return any(n["name"] == "C" and not n["up"] for n in cluster_nodes(survivor))

    assert wait_until(c_down, 15)
    with pytest.raises(Exception, match=r"C of the cluster .* down"):
        read(spark, survivor).count()
    more = spark.createDataFrame([("late", 1)], "sku string, qty long")
    with pytest.raises(Exception, match=r"C of the cluster .* down"):
        more.write.format("nonstop").option("cluster", survivor).option("type", ITEM).mode(
            "append"
        ).save()
    assert read(spark, survivor, nodes="A,B").count() == after["A"] + after["B"]
    cluster.restart("C")
    assert read(spark, addresses).count() == 900


def skus_on(address: str, kind: str = ITEM) -> set[str]:
    """The skus of the objects of type ``kind`` one node holds (its own snapshot)."""
    with BulkClient(address) as c:
        reply = c.call("bulk.scan", type=kind, fields=["sku"], format="columns")
    return set(decode_rows(reply["rows"], "columns")["sku"])


def arrow_rows(skus: list[str]) -> bytes:
    table = pa.table({"sku": skus, "qty": [1] * len(skus)})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as out:
        out.write_table(table)
    return sink.getvalue().to_pybytes()  # type: ignore[no-any-return]


def held(nodes: list[dict[str, Any]], kind: str = ITEM) -> dict[str, set[str]]:
    return {n["name"]: skus_on(n["address"], kind) for n in nodes}


def settles(nodes: list[dict[str, Any]], want: dict[str, set[str]], kind: str = ITEM) -> bool:
    """Whether every node's snapshot shows ``want`` soon: phase two of a distributed
    commit lands on the nodes a few ms apart (lock-free snapshot reads may lag)."""
    return wait_until(lambda: held(nodes, kind) == want, 10)


def locked_read(address: str, keys: list[str]) -> set[str]:
    """One serializable transaction reading ``keys`` by key with read locks: the found ones."""
    with BulkClient(address, timeout=30) as c:
        sid = c.call("tx.begin", iso="serializable")["s"]
        found = set()
        for k in keys:
            if c.call("tx.get", s=sid, type=ITEM, key=pack({"sku": k}), lock="read")["o"]:
                found.add(k)
        c.call("tx.commit", s=sid)
    return found


def test_overwrite_is_one_transaction_across_the_nodes(spark: Any, cluster: OwnedCluster) -> None:
    addresses = ",".join(cluster.addresses)
    nodes = cluster_nodes(addresses)
    names = [n["name"] for n in nodes]
    old = [f"o{i:04}" for i in range(600)]
    frame = "sku string, qty long"
    spark.createDataFrame([(k, 1) for k in old], frame).write.format("nonstop").option(
        "cluster", addresses
    ).option("type", ITEM).mode("append").save()
    before = {n["name"]: skus_on(n["address"]) for n in nodes}
    assert set().union(*before.values()) == set(old) and all(before.values())

    # Staged on every node, then C is killed before the job commit.
    opts = Options.parse({"cluster": addresses, "type": ITEM})
    writer = NonstopWriter(opts, spark.createDataFrame([], frame).schema, True)
    for i, n in enumerate(nodes):
        rows = arrow_rows([f"x{i}-{j}" for j in range(50)])
        with BulkClient(n["address"]) as c:
            common = {"type": ITEM, "tv": writer.version, "key": writer.key, "format": "arrow"}
            c.call(
                "bulk.overwrite.part", job=writer.job, tag=f"0/0/0/{n['name']}", rows=rows, **common
            )
    cluster.kill("C")
    survivor = cluster.address("A")
    assert wait_until(lambda: not {n["name"]: n["up"] for n in cluster_nodes(survivor)}["C"], 15)
    with pytest.raises(Unavailable, match=r"node\(s\) C of the cluster are down: an overwrite"):
        writer.commit([WriteStats(partition=0, attempt=0)])
    writer.abort([WriteStats(partition=0, attempt=0)])  # drops A's and B's parts; C is down
    for n in nodes[:2]:  # nothing of the new set anywhere, the old set intact
        assert skus_on(n["address"]) == before[n["name"]]
    cluster.restart("C")
    assert wait_until(lambda: all(n["up"] for n in cluster_nodes(survivor)), 30)
    assert {n["name"]: skus_on(n["address"]) for n in nodes} == before

    # A successful overwrite, watched by a locking reader: old set or new, never a mix.
    new = [f"n{i:04}" for i in range(450)]
    by_node = {name: ([], []) for name in names}
    for k in old:
        by_node[names[home(k, 3)]][0].append(k)
    for k in new:
        by_node[names[home(k, 3)]][1].append(k)
    # Two old and two new keys of every node, read in node order (the swap's order).
    sample = [k for name in names for group in by_node[name] for k in group[:2]]
    seen: list[set[str]] = []
    retried: list[Error] = []
    stop = threading.Event()

    def reader() -> None:
        while not stop.is_set():
            try:
                seen.append(locked_read(cluster.address("A"), sample))
            except (Retryable, Unavailable) as exc:  # a lock wait given up: read again
                retried.append(exc)

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    try:
        spark.createDataFrame([(k, 2) for k in new], frame).repartition(2).write.format(
            "nonstop"
        ).option("cluster", addresses).option("type", ITEM).mode("overwrite").save()
        assert wait_until(lambda: bool(seen) and seen[-1] != {k for k in sample if k[0] == "o"}, 10)
    finally:
        stop.set()
        thread.join(60)
    olds, news = {k for k in sample if k[0] == "o"}, {k for k in sample if k[0] == "n"}
    assert seen and all(s in (olds, news) for s in seen), [s for s in seen if s not in (olds, news)]
    assert seen[0] == olds and seen[-1] == news, (seen[0], seen[-1], retried)
    # Every node holds exactly its share of the new set (each key at its home).
    assert settles(nodes, {name: set(by_node[name][1]) for name in names}), held(nodes)


@both_swaps(default=PLAIN)
def test_overwrite_failing_on_the_last_node_changes_no_node(
    spark: Any, cluster: OwnedCluster, kind: str
) -> None:
    addresses = ",".join(cluster.addresses)
    nodes = cluster_nodes(addresses)
    frame = "sku string, qty long"
    spark.createDataFrame([(f"o{i}", 1) for i in range(90)], frame).write.format("nonstop").option(
        "cluster", addresses
    ).option("type", kind).mode("append").save()
    before = {n["name"]: skus_on(n["address"], kind) for n in nodes}
    opts = Options.parse({"cluster": addresses, "type": kind})
    writer = NonstopWriter(opts, spark.createDataFrame([], frame).schema, True)

    def stage(node: dict[str, Any], tag: str, skus: list[str]) -> None:
        with BulkClient(node["address"]) as c:
            common = {"type": kind, "tv": writer.version, "key": writer.key, "format": "arrow"}
            c.call("bulk.overwrite.part", job=writer.job, tag=tag, rows=arrow_rows(skus), **common)

    stage(nodes[0], "0/0/0/A", ["a1", "a2"])
    stage(nodes[1], "0/0/0/B", ["b1"])
    # C (swapped last) holds one key in two parts: its swap fails after A's and B's ran.
    stage(nodes[2], "0/0/0/C", ["dup"])
    stage(nodes[2], "1/0/0/C", ["dup"])
    done = [WriteStats(partition=0, attempt=0), WriteStats(partition=1, attempt=0)]
    with pytest.raises(Error, match=r"dup.*in two parts|in two parts.*dup"):
        writer.commit(done)
    assert {n["name"]: skus_on(n["address"], kind) for n in nodes} == before
    # Only the first attempt's parts: the swap commits on every node; a replay of the
    # job commit (its reply lost, say) changes nothing.
    writer.commit(done[:1])
    want = {"A": {"a1", "a2"}, "B": {"b1"}, "C": {"dup"}}
    assert settles(nodes, want, kind), held(nodes, kind)
    with BulkClient(nodes[1]["address"]) as c:
        sid = c.call("tx.begin")["s"]
        again = c.call("tx.overwrite", s=sid, type=kind, job=writer.job, parts=["0/0/"])
        c.call("tx.commit", s=sid)
    assert again == {"deleted": 90, "inserted": 4, "replayed": True}  # the recorded result
    writer.commit(done[:1])
    assert held(nodes, kind) == want
    with BulkClient(nodes[0]["address"]) as c:  # a job that was never staged
        sid = c.call("tx.begin")["s"]
        with pytest.raises(Error, match="no staged overwrite"):
            c.call("tx.overwrite", s=sid, type=kind, job="nosuchjob", parts=None)


@both_swaps(default=ITEM)
def test_a_node_killed_between_the_swap_and_the_commit_swaps_nothing(
    spark: Any, cluster: OwnedCluster, kind: str
) -> None:
    addresses = ",".join(cluster.addresses)
    nodes = cluster_nodes(addresses)
    frame = "sku string, qty long"
    spark.createDataFrame([(f"o{i}", 1) for i in range(60)], frame).write.format("nonstop").option(
        "cluster", addresses
    ).option("type", kind).mode("append").save()
    before = held(nodes, kind)
    opts = Options.parse({"cluster": addresses, "type": kind})
    writer = NonstopWriter(opts, spark.createDataFrame([], frame).schema, True)
    for n in nodes:
        with BulkClient(n["address"]) as c:
            c.call(
                "bulk.overwrite.part",
                job=writer.job,
                tag=f"0/0/0/{n['name']}",
                rows=arrow_rows([f"new-{n['name']}"]),
                type=kind,
                key=writer.key,
                format="arrow",
            )
    args = {"type": kind, "job": writer.job, "parts": ["0/0/"]}
    # Its own request id per swap: the variants share the module's cluster, whose nodes
    # answer a request id they have seen with the outcome they recorded for it.
    kill_req = [f"t-kill-{kind}", 1]
    with BulkClient(cluster.address("A")) as c:
        sid = c.call("tx.begin")["s"]
        assert c.call("tx.overwrite", s=sid, **args)["inserted"] == 3  # swapped, uncommitted
        cluster.kill("C")
        assert wait_until(lambda: not {n["name"]: n["up"] for n in cluster_nodes(c.address)}["C"])
        with pytest.raises(Unavailable, match=r"\bC\b"):
            c.call("tx.commit", s=sid, req=kill_req)
    # What the writer asks after a commit error: this one did not commit.
    assert commit_outcome(cluster.address("A"), "", kill_req, wait=10) is False
    with pytest.raises(Unavailable, match="not decided"):  # a node that cannot answer
        commit_outcome(cluster.address("C"), "", kill_req, wait=0.5)
    assert held(nodes[:2], kind) == {n: before[n] for n in ("A", "B")}  # rolled back there
    cluster.restart("C")
    assert wait_until(lambda: all(n["up"] for n in cluster_nodes(addresses)), 30)
    assert held(nodes, kind) == before  # C's swap was never prepared: gone with the process
    # The staged parts are still there: the job commit now succeeds everywhere.
    writer.commit([WriteStats(partition=0, attempt=0)])
    assert settles(nodes, {n["name"]: {f"new-{n['name']}"} for n in nodes}, kind), held(nodes, kind)
    req = [f"spark-overwrite-{writer.job}", 0]  # the writer's request id of that commit
    assert commit_outcome(cluster.address("A"), "", req, wait=10) is True
