"""Where a Spark read goes: the input splits of the ``nonstop`` data source.

Under node routing (``[ha] data = "nodes"``) every object lives
on the node whose store created it, so a read asks every node for ``bulk.plan``
and makes one split per (node, reference range).

Under partition routing (``[ha] data = "partitions"``, the default; ha.md section 9a) an
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

A plan runs in one of Spark's planner workers, a Python process per query
step: it asks each node what it needs over ONE connection (:class:`Connections`),
the first up node several things (members, routing, the type's version, its
ranges), and the nodes' ``bulk.plan`` at once, not one after the other.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import InputPartition

from nonstop.client.bulk import DEFAULT_TIMEOUT, BulkClient, cluster_nodes
from nonstop.errors import BadArgument, Error, Unavailable
from nonstop.model.ref import LOCATION_BYTES, REF_SIZE
from nonstop.spark.schema import Options

PARTITION_ROUTING = "partitions"
"""The ``routing`` a node's ``partition.objects`` reply names under partition routing."""
_LAST_LOCATION = (1 << (8 * LOCATION_BYTES)) - 1
ASK_TIMEOUT = 10.0
"""Seconds a planner waits for a node's answer about the cluster (not a scan or plan)."""


@dataclass
class NodeRange(InputPartition):
    """One Spark split: the reference range ``[lo, hi)`` read on one node.

    ``partition``/``epoch``: the partition whose whole range this is (partition
    routing), which the node must still act for at that epoch once read.
    ``version``: the type's version when planned (the scan sends it: a type
    changed since fails the task instead of reading other columns).
    """

    address: str
    node: str
    lo: bytes | None
    hi: bytes | None
    snapshot: int
    partition: str | None = None
    epoch: int | None = None
    version: int | None = None

    def __post_init__(self) -> None:
        super().__init__(None)


def client(opts: Options, address: str, timeout: float | None = None) -> BulkClient:
    if timeout is None:
        return BulkClient(address, cluster=opts.cluster_id, credentials=opts.credentials)
    return BulkClient(
        address, cluster=opts.cluster_id, credentials=opts.credentials, timeout=timeout
    )


class Connections:
    """The connections of one planning step, one per node address, opened on first use
    and closed together: a handshake per node, not one per question asked."""

    def __init__(self, opts: Options) -> None:
        self.opts = opts
        self._open: dict[str, BulkClient] = {}
        self._statuses: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()  # (bulk.plan is asked of the nodes from threads)

    def call(self, address: str, op: str, timeout: float = DEFAULT_TIMEOUT, **payload: Any) -> Any:
        with self._lock:
            c = self._open.get(address)
            if c is None:
                c = self._open[address] = client(self.opts, address)
        c.timeout = timeout  # (read at each call)
        return c.call(op, **payload)

    def status(self, address: str) -> dict[str, Any]:
        """The node's ``status``, asked once per planning step (members, partitions)."""
        if address not in self._statuses:
            self._statuses[address] = self.call(address, "status", ASK_TIMEOUT)
        return self._statuses[address]

    def close(self) -> None:
        with self._lock:
            opened, self._open = list(self._open.values()), {}
        for c in opened:
            c.close()

    def __enter__(self) -> Connections:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def members(
    opts: Options, nodes: list[dict[str, Any]], conns: Connections | None = None
) -> list[dict[str, Any]]:
    """``nodes`` less those that are not members of the cluster any more (a node that
    left: its peers still know it, as down).  The membership is the cluster log's
    (``status``); a standalone endpoint (no ``status``) keeps every node."""
    for node in nodes:
        if not node.get("up", True):
            continue
        try:
            if conns is not None:
                names = conns.status(node["address"]).get("members")
            else:
                with client(opts, node["address"], timeout=ASK_TIMEOUT) as c:
                    names = c.call("status").get("members")
        except Error:
            continue
        if isinstance(names, list) and names:
            return [n for n in nodes if n["name"] in names]
        return nodes
    return nodes


def all_nodes(opts: Options, conns: Connections | None = None) -> list[dict[str, Any]]:
    """The cluster's member nodes (up or not), in name order."""
    found = cluster_nodes(opts.cluster, cluster=opts.cluster_id, credentials=opts.credentials)
    return members(opts, found, conns)


def type_schema(opts: Options, conns: Connections | None = None) -> dict[str, Any]:
    """``bulk.schema`` of the type, from the first member node that is up."""
    if conns is None:
        with Connections(opts) as own:
            return type_schema(opts, own)
    up = [n for n in all_nodes(opts, conns) if n.get("up", True)]
    if not up:
        raise Unavailable(f"no node of the cluster at {opts.cluster} is up")
    return conns.call(up[0]["address"], "bulk.schema", ASK_TIMEOUT, type=opts.type)  # type: ignore[no-any-return]


def up_nodes(
    opts: Options, only: list[str] | None = None, nodes: list[dict[str, Any]] | None = None
) -> list[dict[str, Any]]:
    """Every node of the cluster (or the ones named in ``only``), in name order;
    Unavailable if one is down.  ``nodes``: the cluster's nodes if already asked.

    A node-routed read that skipped a down node would silently miss its objects,
    and a write must send each key to its home among *all* nodes, so both need
    every node.
    """
    if nodes is None:
        nodes = all_nodes(opts)
    if only:
        missing = set(only) - {n["name"] for n in nodes}
        if missing:
            raise BadArgument(f"no node(s) {', '.join(sorted(missing))} in the cluster")
        nodes = [n for n in nodes if n["name"] in only]
    return _all_up(opts, nodes)


def _all_up(opts: Options, nodes: list[dict[str, Any]]) -> list[dict[str, Any]]:
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


def plan_reads(opts: Options, type_name: str, version: int | None = None) -> list[NodeRange]:
    """The splits of a read of ``type_name`` (module doc), each naming the type's
    ``version`` (None: the version the first up node has now)."""
    with Connections(opts) as conns:
        nodes = all_nodes(opts, conns)
        up = [n for n in nodes if n.get("up", True)]
        if not up:
            raise Unavailable(f"no node of the cluster at {opts.cluster} is up")
        first = up[0]["address"]
        if version is None:
            version = int(conns.call(first, "bulk.schema", ASK_TIMEOUT, type=type_name)["version"])
        if opts.nodes:
            chosen = up_nodes(opts, opts.nodes, nodes)
            return _node_splits(conns, chosen, type_name, version)
        if _routing(conns, first) != PARTITION_ROUTING:
            return _node_splits(conns, up_nodes(opts, nodes=nodes), type_name, version)
        partitions = conns.status(first).get("partitions") or []
        splits, missing = _partition_splits(up, partitions, version)
        down = _down(nodes)
        if missing:  # (a node down matters when it leaves a partition without its node)
            # A down node may hold objects in its own location (a load before partitions):
            # not readable either, so it is named with the partitions it leaves without one.
            raise Unavailable(
                f"cannot read {type_name} from the cluster at {opts.cluster} now: "
                + "; ".join(
                    (
                        [f"partition(s) {', '.join(missing)} have no active node up"]
                        if missing
                        else []
                    )
                    + ([f"node(s) {', '.join(down)} are down"] if down else [])
                )
            )
        return splits + _own_location_splits(conns, up, type_name, version)


def _routing(conns: Connections, address: str) -> str:
    """How the cluster routes (``partition.objects``); a standalone bulk endpoint,
    which has no such op, routes by node."""
    try:
        return str(conns.call(address, "partition.objects", ASK_TIMEOUT).get("routing", "nodes"))
    except BadArgument:
        return "nodes"


def _on_each(nodes: list[dict[str, Any]], ask: Any) -> list[Any]:
    """``[ask(node) for node in nodes]``, the nodes asked at once (each plans its own
    ranges: a read's plan waits for the slowest node, not for their sum)."""
    if len(nodes) <= 1:
        return [ask(n) for n in nodes]
    with ThreadPoolExecutor(len(nodes)) as pool:
        return list(pool.map(ask, nodes))


def _node_splits(
    conns: Connections, nodes: list[dict[str, Any]], type_name: str, version: int
) -> list[NodeRange]:
    def plan(node: dict[str, Any]) -> Any:
        splits = conns.opts.splits
        return conns.call(node["address"], "bulk.plan", type=type_name, tv=version, splits=splits)

    parts = []
    for node, plan_ in zip(nodes, _on_each(nodes, plan), strict=True):
        for lo, hi in plan_["ranges"]:
            parts.append(
                NodeRange(node["address"], node["name"], lo, hi, plan_["snapshot"], version=version)
            )
    return parts


def _partition_splits(
    nodes: list[dict[str, Any]], partitions: list[dict[str, Any]], version: int | None = None
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
            NodeRange(
                address[active], active, lo, hi, 0, str(part["name"]), int(part["epoch"]), version
            )
        )
    return parts, missing


def _own_location_splits(
    conns: Connections, nodes: list[dict[str, Any]], type_name: str, version: int
) -> list[NodeRange]:
    """Splits over each node's own location range, on the nodes that hold objects there
    (one probe each; then the node's ``bulk.plan`` ranges, cut to that range)."""

    def own(node: dict[str, Any]) -> list[NodeRange]:
        location = node.get("location")
        if location is None:
            return []
        own_lo, own_hi = location_range(int(location))
        address = node["address"]
        probe = conns.call(
            address,
            "bulk.scan",
            type=type_name,
            tv=version,
            fields=[],
            lo=own_lo,
            hi=own_hi,
            limit=1,
        )
        if not probe["n"]:
            return []
        plan = conns.call(
            address, "bulk.plan", type=type_name, tv=version, splits=conns.opts.splits
        )
        parts = []
        for lo, hi in plan["ranges"]:
            cut = _intersect((lo, hi), (own_lo, own_hi))
            if cut is not None:
                parts.append(
                    NodeRange(address, node["name"], *cut, plan["snapshot"], version=version)
                )
        return parts

    return [split for found in _on_each(nodes, own) for split in found]


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


def check_acting(opts: Options, split: NodeRange, conn: BulkClient | None = None) -> None:
    """After a partition's split was read: its node must still act for the partition at
    the epoch planned, else what was read may be short (the partition moved).
    ``conn``: the open connection the split was read on, if any."""
    if split.partition is None:
        return
    if conn is not None:
        status = conn.call("status")
    else:
        with client(opts, split.address, timeout=ASK_TIMEOUT) as c:
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
