"""Where a Spark read goes: the input splits of the ``nonstop`` data source.

Under node routing (``[ha] data = "nodes"``, the default) every object lives
on the node whose store created it, so a read asks every node for ``bulk.plan``
and makes one split per (node, reference range).

Under partition routing (``[ha] data = "partitions"``, ha.md section 9a) an
object lives in a partition, and a partition's objects are one reference range
(its 8-byte location is the references' prefix), held by the partition's
*active* node.  A read then makes ONE split per partition of the current
partition table, sent to its active node, and checks after reading that the
node still acts for it at the epoch planned (else the task fails, naming the
partition: a read is never silently short).  Objects that still carry a node's
own location (written by a Spark load, ``bulk.upsert``, which creates in the
store's own location, or before the switch) are read by extra splits over
that node's own location range, only on the nodes that hold some.

Option ``nodes`` keeps node splits (an audit of what those nodes hold).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import InputPartition

from nonstop.client.bulk import BulkClient, cluster_nodes
from nonstop.errors import BadArgument, Error, Unavailable
from nonstop.model.ref import LOCATION_BYTES, REF_SIZE
from nonstop.spark.schema import Options

PARTITION_ROUTING = "partitions"
"""The ``routing`` a node's ``partition.objects`` reply names under partition routing."""
_LAST_LOCATION = (1 << (8 * LOCATION_BYTES)) - 1


@dataclass
class NodeRange(InputPartition):
    """One Spark split: the reference range ``[lo, hi)`` read on one node.

    ``partition``/``epoch``: the partition whose whole range this is (partition
    routing), which the node must still act for at that epoch once read.
    """

    address: str
    node: str
    lo: bytes | None
    hi: bytes | None
    snapshot: int
    partition: str | None = None
    epoch: int | None = None

    def __post_init__(self) -> None:
        super().__init__(None)


def client(opts: Options, address: str, timeout: float | None = None) -> BulkClient:
    if timeout is None:
        return BulkClient(address, cluster=opts.cluster_id, credentials=opts.credentials)
    return BulkClient(
        address, cluster=opts.cluster_id, credentials=opts.credentials, timeout=timeout
    )


def members(opts: Options, nodes: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``nodes`` less those that are not members of the cluster any more (a node that
    left: its peers still know it, as down).  The membership is the cluster log's
    (``status``); a standalone endpoint (no ``status``) keeps every node."""
    for node in nodes:
        if not node.get("up", True):
            continue
        try:
            with client(opts, node["address"], timeout=10) as c:
                names = c.call("status").get("members")
        except Error:
            continue
        if isinstance(names, list) and names:
            return [n for n in nodes if n["name"] in names]
        return nodes
    return nodes


def all_nodes(opts: Options) -> list[dict[str, Any]]:
    """The cluster's member nodes (up or not), in name order."""
    found = cluster_nodes(opts.cluster, cluster=opts.cluster_id, credentials=opts.credentials)
    return members(opts, found)


def up_nodes(opts: Options, only: list[str] | None = None) -> list[dict[str, Any]]:
    """Every node of the cluster (or the ones named in ``only``), in name order;
    Unavailable if one is down.

    A node-routed read that skipped a down node would silently miss its objects,
    and a write must send each key to its home among *all* nodes, so both need
    every node.
    """
    nodes = all_nodes(opts)
    if only:
        missing = set(only) - {n["name"] for n in nodes}
        if missing:
            raise BadArgument(f"no node(s) {', '.join(sorted(missing))} in the cluster")
        nodes = [n for n in nodes if n["name"] in only]
    down = _down(nodes)
    if down:
        raise Unavailable(
            f"node(s) {', '.join(down)} of the cluster at {opts.cluster} are down: the "
            "objects they master cannot be read or written now"
        )
    if not nodes:
        raise Unavailable(f"no node of the cluster at {opts.cluster} is up")
    return nodes


def _down(nodes: list[dict[str, Any]]) -> list[str]:
    return [str(n["name"]) for n in nodes if not n.get("up", True)]


def location_range(location: int) -> tuple[bytes, bytes | None]:
    """``[lo, hi)`` of every reference whose location is ``location``."""
    lo = location.to_bytes(LOCATION_BYTES, "big") + bytes(REF_SIZE - LOCATION_BYTES)
    if location == _LAST_LOCATION:
        return lo, None
    return lo, (location + 1).to_bytes(LOCATION_BYTES, "big") + bytes(REF_SIZE - LOCATION_BYTES)


def plan_reads(opts: Options, type_name: str, version: int) -> list[NodeRange]:
    """The splits of a read of ``type_name`` (module doc)."""
    if opts.nodes:
        return _node_splits(opts, up_nodes(opts, opts.nodes), type_name, version)
    nodes = all_nodes(opts)
    up = [n for n in nodes if n.get("up", True)]
    if not up:
        raise Unavailable(f"no node of the cluster at {opts.cluster} is up")
    with client(opts, up[0]["address"], timeout=10) as c:
        routing = _routing(c)
        status = c.call("status") if routing == PARTITION_ROUTING else {}
    if routing != PARTITION_ROUTING:
        return _node_splits(opts, up_nodes(opts), type_name, version)
    splits, missing = _partition_splits(up, status.get("partitions") or [])
    down = _down(nodes)
    if missing:  # (a node down matters when it leaves a partition without its node)
        # A down node may hold objects in its own location (a Spark load's): not
        # readable either, so it is named with the partitions it leaves without a node.
        raise Unavailable(
            f"cannot read {type_name} from the cluster at {opts.cluster} now: "
            + "; ".join(
                ([f"partition(s) {', '.join(missing)} have no active node up"] if missing else [])
                + ([f"node(s) {', '.join(down)} are down"] if down else [])
            )
        )
    return splits + _own_location_splits(opts, up, type_name, version)


def _routing(c: BulkClient) -> str:
    """How the cluster routes (``partition.objects``); a standalone bulk endpoint,
    which has no such op, routes by node."""
    try:
        return str(c.call("partition.objects").get("routing", "nodes"))
    except BadArgument:
        return "nodes"


def _node_splits(
    opts: Options, nodes: list[dict[str, Any]], type_name: str, version: int
) -> list[NodeRange]:
    parts = []
    for node in nodes:
        with client(opts, node["address"]) as c:
            plan = c.call("bulk.plan", type=type_name, tv=version, splits=opts.splits)
        for lo, hi in plan["ranges"]:
            parts.append(NodeRange(node["address"], node["name"], lo, hi, plan["snapshot"]))
    return parts


def _partition_splits(
    nodes: list[dict[str, Any]], partitions: list[dict[str, Any]]
) -> tuple[list[NodeRange], list[str]]:
    """One split per partition of the table, on its active node; and the partitions
    without an active node among ``nodes`` (their objects cannot be read now)."""
    address = {n["name"]: n["address"] for n in nodes}
    parts, missing = [], []
    for part in sorted(partitions, key=lambda p: str(p["name"])):
        active = part.get("active")
        if not isinstance(active, str) or active not in address:
            missing.append(f"{part['name']} (epoch {part.get('epoch')}, {part.get('state')})")
            continue
        lo, hi = location_range(int(part["location"]))
        parts.append(
            NodeRange(address[active], active, lo, hi, 0, str(part["name"]), int(part["epoch"]))
        )
    return parts, missing


def _own_location_splits(
    opts: Options, nodes: list[dict[str, Any]], type_name: str, version: int
) -> list[NodeRange]:
    """Splits over each node's own location range, on the nodes that hold objects there
    (one probe each; then the node's ``bulk.plan`` ranges, cut to that range)."""
    parts = []
    for node in nodes:
        location = node.get("location")
        if location is None:
            continue
        own_lo, own_hi = location_range(int(location))
        with client(opts, node["address"]) as c:
            probe = c.call(
                "bulk.scan", type=type_name, tv=version, fields=[], lo=own_lo, hi=own_hi, limit=1
            )
            if not probe["n"]:
                continue
            plan = c.call("bulk.plan", type=type_name, tv=version, splits=opts.splits)
        for lo, hi in plan["ranges"]:
            cut = _intersect((lo, hi), (own_lo, own_hi))
            if cut is not None:
                parts.append(NodeRange(node["address"], node["name"], *cut, plan["snapshot"]))
    return parts


def _intersect(
    a: tuple[bytes | None, bytes | None], b: tuple[bytes | None, bytes | None]
) -> tuple[bytes | None, bytes | None] | None:
    """The intersection of two ``[lo, hi)`` ranges (None: open), or None if empty."""
    los = [x for x in (a[0], b[0]) if x is not None]
    his = [x for x in (a[1], b[1]) if x is not None]
    lo = max(los) if los else None
    hi = min(his) if his else None
    if lo is not None and hi is not None and lo >= hi:
        return None
    return lo, hi


def check_acting(opts: Options, split: NodeRange) -> None:
    """After a partition's split was read: its node must still act for the partition at
    the epoch planned, else what was read may be short (the partition moved)."""
    if split.partition is None:
        return
    with client(opts, split.address, timeout=10) as c:
        status = c.call("status")
    epochs = {p["name"]: p.get("epoch") for p in status.get("partitions") or []}
    if split.partition in (status.get("acting") or []) and epochs.get(split.partition) == (
        split.epoch
    ):
        return
    raise Unavailable(
        f"partition {split.partition} moved off node {split.node} (planned at epoch "
        f"{split.epoch}, now {epochs.get(split.partition)}) while Spark read it: run the "
        "read again"
    )
