"""The ``nonstop`` PySpark data source: batch reads, append/overwrite writes, a streaming sink.

Reads: one Spark partition per (node, reference range) from ``bulk.plan`` on
every up node, or per partition of the table under partition routing
(:mod:`nonstop.spark.read_plan`); each is read by ``bulk.scan`` — one read
snapshot on its node — as Arrow record batches that go to Spark untouched.

Writes: rows are cut into batches of ``batch`` rows per Spark partition and
each batch goes to the *home node* of its keys (a stable hash of the unique
key over the sorted node names), tagged ``<job>/<partition>/<batch>/<node>/<digest
of the rows>``.  The job id is drawn once on the driver, so a retried task sends
the same tags and its already-committed batches change nothing
(``bulk.upsert``); a retry whose input arrives in another order cuts other
batches, with other digests, which are applied again (an upsert by key: no
duplicates).  A task sends to the nodes at once, each node's batches in order
(:mod:`nonstop.spark.sender`).  ``overwrite`` stages everything invisibly, per task attempt
(``bulk.overwrite.part``), and swaps in the successful attempts' parts at job
commit: on a cluster in ONE distributed transaction over every node (``tx.overwrite``
then ``tx.commit``: two-phase commit), on a standalone bulk endpoint in one local
transaction (``bulk.overwrite.commit``); a failed job is aborted and leaves
nothing visible.

Under routing by partition (``[ha] data = "partitions"``) ``append`` writes
each batch as a transaction of the partitions its keys map to, on their active
nodes, replicated (:mod:`nonstop.spark.partition_writes`, data-path.md §6.5);
``overwrite`` stages each partition's rows on its active node and swaps every
partition at job commit in ONE distributed transaction whose write sets are
replicated (§6.6).

The streaming sink writes like ``append`` and records each micro-batch id
(``bulk.stream.commit`` on every node; under routing by partition in every
partition, replicated with its rows: §6.7); a replayed batch id is skipped.
"""

from __future__ import annotations

import hashlib
import logging
import secrets
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import pyarrow as pa
from pyspark import TaskContext
from pyspark.sql.datasource import (
    DataSource,
    DataSourceArrowWriter,
    DataSourceReader,
    DataSourceStreamArrowWriter,
    EqualTo,
    Filter,
    GreaterThan,
    GreaterThanOrEqual,
    In,
    LessThan,
    LessThanOrEqual,
    WriterCommitMessage,
)
from pyspark.sql.pandas.types import to_arrow_schema
from pyspark.sql.types import StructType

from nonstop.bulk.handlers import ROWS_PER_RANGE
from nonstop.bulk.keys import encode_keys
from nonstop.client.bulk import BulkClient
from nonstop.errors import Aborted, BadArgument, Retryable, Unavailable
from nonstop.model.codec import encode_key
from nonstop.spark.one_line import one_line
from nonstop.spark.partition_writes import PartitionWriter, ipc, routes_by_partition
from nonstop.spark.read_plan import (
    NodeRange,
    all_nodes,
    check_acting,
    plan_reads,
    type_schema,
    up_nodes,
)
from nonstop.spark.schema import Options, check_writable, columns, spark_schema, write_key
from nonstop.spark.sender import NodeSenders

log = logging.getLogger("nonstop.spark")

NAME = "nonstop"
SCAN_LIMIT = 4 * ROWS_PER_RANGE
"""Rows per scan reply; a range grown past it since planning is read in pages."""
_PUSHABLE = {
    EqualTo: "eq",
    GreaterThan: "gt",
    GreaterThanOrEqual: "ge",
    LessThan: "lt",
    LessThanOrEqual: "le",
    In: "in",
}
_FILTER_KINDS = frozenset({"bool", "int", "float", "str", "bytes", "datetime", "date", "ref"})
COMMIT_RETRIES = 10
"""Attempts of an overwrite's job commit that hit a lock conflict (a concurrent transaction)."""
PARTITION_COMMIT_RETRIES = 40
"""The same under routing by partition, a second apart: any move of the partition table
during the swap fences it (NotActive), and the table moves while nodes are overloaded."""
OUTCOME_WAIT = 60.0
"""How long a job commit whose reply was lost or undecided waits to learn its outcome."""
SWAP_TIMEOUT = 300.0
SWAP_SECONDS_PER_ROW = 0.002
"""An overwrite's job commit waits ``SWAP_TIMEOUT`` plus this per row swapped (old and
new) for the swap and its commit: the nodes keep answering meanwhile (they swap in
slices and report progress to the coordinator), so this only bounds a client whose
node vanished without closing the connection (data-path.md §6.2)."""


def _type_schema(opts: Options) -> dict[str, Any]:
    return type_schema(opts)


def digest(rows: bytes) -> str:
    """Part of a batch's tag: a retry whose input came in another order (after a
    shuffle, say) cuts different batches, which must not pass for the old ones."""
    return hashlib.blake2b(rows, digest_size=12).hexdigest()


def home(key_value: Any, n_nodes: int) -> int:
    """The index (in name order) of the node a key's object is written to."""
    if n_nodes == 1 or key_value is None:
        return 0
    try:
        return zlib.crc32(encode_key(key_value)) % n_nodes
    except (TypeError, ValueError):
        return 0  # the node reports what is wrong with the value


def homes_of(values: list[Any], n_nodes: int) -> list[int]:
    """``[home(v, n_nodes) for v in values]``, the keys encoded a column at a time
    (a Spark task computes one per row it writes)."""
    if n_nodes == 1:
        return [0] * len(values)
    if None in values:  # (home() sends a null key to node 0, which reports it)
        return [home(v, n_nodes) for v in values]
    try:
        kbs = encode_keys(values)
    except (TypeError, ValueError):  # (a bad value: home() sends it to node 0)
        return [home(v, n_nodes) for v in values]
    return [c % n_nodes for c in map(zlib.crc32, kbs)]


# -------------------------------------------------------------------- source
class NonstopDataSource(DataSource):
    """``spark.read.format("nonstop")`` / ``df.write.format("nonstop")``."""

    @classmethod
    def name(cls) -> str:
        return NAME

    def _opts(self) -> Options:
        return Options.parse(self.options)

    def _read_type(self, opts: Options) -> dict[str, Any]:
        """The type's ``bulk.schema`` as :meth:`schema` found it: Spark pickles this
        instance after calling it and hands it to the planner worker that makes the
        reader, which then asks no node again (a read's plan asks the nodes for the
        type's current version anyway: ``NodeRange.version``)."""
        found: dict[str, Any] | None = getattr(self, "_type_info", None)
        if found is None:
            found = self._type_info = _type_schema(opts)
        return found

    @one_line
    def schema(self) -> StructType:
        opts = self._opts()
        ts = self._read_type(opts)
        return spark_schema(ts, columns(opts, ts))

    @one_line
    def reader(self, schema: StructType) -> DataSourceReader:
        opts = self._opts()
        return NonstopReader(opts, self._read_type(opts), schema)

    @one_line
    def writer(self, schema: StructType, overwrite: bool) -> NonstopWriter:
        return NonstopWriter(self._opts(), schema, overwrite)

    @one_line
    def streamWriter(self, schema: StructType, overwrite: bool) -> NonstopStreamWriter:
        return NonstopStreamWriter(self._opts(), schema)


class NonstopFilteringDataSource(NonstopDataSource):
    """The same source with filter pushdown; registered when the session enables
    ``spark.sql.python.filterPushdown.enabled`` (Spark refuses a reader that
    implements ``pushFilters`` otherwise)."""

    @one_line
    def reader(self, schema: StructType) -> DataSourceReader:
        opts = self._opts()
        return NonstopFilteringReader(opts, self._read_type(opts), schema)


# -------------------------------------------------------------------- reads
class NonstopReader(DataSourceReader):
    def __init__(self, opts: Options, type_schema: dict[str, Any], schema: StructType) -> None:
        self.opts = opts
        self.version = type_schema["version"]
        self.columns = list(schema.fieldNames())
        # Spark wants batches with exactly this Arrow schema (nullability included).
        self.arrow_schema = to_arrow_schema(schema, timezone="UTC")
        self.kinds = {n: f[0] for n, f in type_schema["fields"].items()}
        self.filters: list[list[Any]] = []

    def partitions(self) -> list[NodeRange]:
        return plan_reads(self.opts, self.opts.type)  # (at the type's version now)

    def read(self, partition: NodeRange) -> Iterator[pa.RecordBatch]:  # type: ignore[override]
        after = None
        version = self.version if partition.version is None else partition.version
        with BulkClient(
            partition.address, cluster=self.opts.cluster_id, credentials=self.opts.credentials
        ) as c:
            while True:
                reply = c.call(
                    "bulk.scan",
                    type=self.opts.type,
                    tv=version,
                    fields=self.columns,
                    lo=partition.lo,
                    hi=partition.hi,
                    after=after,
                    limit=SCAN_LIMIT,
                    filters=self.filters,
                    format="arrow",
                )
                if reply["n"]:
                    for b in pa.ipc.open_stream(reply["rows"]).read_all().to_batches():
                        yield pa.RecordBatch.from_arrays(b.columns, schema=self.arrow_schema)
                after = reply["next"]
                if after is None:
                    break
            check_acting(self.opts, partition, c)


class NonstopFilteringReader(NonstopReader):
    def pushFilters(self, filters: list[Filter]) -> Iterator[Filter]:
        """Take comparisons of one field with a constant (the node evaluates them exactly,
        NULL never matching); give back the rest for Spark to evaluate."""
        for f in filters:
            op = _PUSHABLE.get(type(f))
            attr: tuple[str, ...] = getattr(f, "attribute", ())
            if op is None or len(attr) != 1 or self.kinds.get(attr[0]) not in _FILTER_KINDS:
                yield f
                continue
            constant: Any = getattr(f, "value", None)
            value = list(constant) if op == "in" else constant
            self.filters.append([attr[0], op, value])


# ------------------------------------------------------------------- writes
@dataclass
class WriteStats(WriterCommitMessage):
    """What one task wrote (summed on the driver)."""

    partition: int = 0
    attempt: int = 0
    rows: int = 0
    inserted: int = 0
    updated: int = 0
    replayed: int = 0
    staged: list[list[str]] = field(default_factory=list)
    """An overwrite under routing by partition: ``[partition, tag]`` of each staged part."""


class _Router:
    """Cuts a task's Arrow stream into fixed-size batches and sends each to its home node.

    Fixed sizes make the batch numbers — and so the tags — the same on a retry
    of the task when its input comes in the same order.
    """

    def __init__(self, opts: Options, nodes: list[dict[str, Any]], key: str) -> None:
        self.opts = opts
        self.nodes = nodes
        self.key = key
        self.clients: dict[str, BulkClient] = {}
        self.stats = WriteStats()

    def client(self, node: dict[str, Any]) -> BulkClient:
        c = self.clients.get(node["name"])
        if c is None:
            c = self.clients[node["name"]] = BulkClient(
                node["address"], cluster=self.opts.cluster_id, credentials=self.opts.credentials
            )
        return c

    def chunks(self, batches: Iterator[pa.RecordBatch]) -> Iterator[pa.Table]:
        size = self.opts.batch_rows
        pending: list[pa.RecordBatch] = []
        count = 0
        for batch in batches:
            pending.append(batch)
            count += batch.num_rows
            while count >= size:
                table = pa.Table.from_batches(pending)
                yield table.slice(0, size)
                rest = table.slice(size)
                pending, count = rest.to_batches(), rest.num_rows
        if count:
            yield pa.Table.from_batches(pending)

    def split(self, table: pa.Table) -> Iterator[tuple[dict[str, Any], bytes]]:
        """(node, Arrow IPC rows) for every node that is home to some of the rows."""
        import pyarrow.compute as pc  # (here: ~0.1 s of CPU a read's workers need not pay)

        n = len(self.nodes)
        if n == 1:
            groups = {0: table}
        else:
            homes = pa.array(homes_of(table.column(self.key).to_pylist(), n))
            groups = {}
            for i in range(n):
                part = table.filter(pc.equal(homes, i))
                if part.num_rows:
                    groups[i] = part
        for i, part in groups.items():
            sink = pa.BufferOutputStream()
            with pa.ipc.new_stream(sink, part.schema) as out:
                for b in part.combine_chunks().to_batches():
                    out.write_batch(b)
            yield self.nodes[i], sink.getvalue().to_pybytes()

    def close(self) -> None:
        for c in self.clients.values():
            c.close()


class NonstopWriter(DataSourceArrowWriter):
    """``mode("append")``: upsert; ``mode("overwrite")``: staged, swapped at job commit."""

    def __init__(self, opts: Options, schema: StructType, overwrite: bool) -> None:
        self.opts = opts
        self.overwrite = overwrite
        ts = _type_schema(opts)
        self.version = ts["version"]
        self.old_count = int(ts.get("count") or 0)
        self.key = write_key(opts, ts)
        check_writable(ts, schema, self.key)
        # Under routing by partition a batch is a transaction of its partitions
        # (partition_writes.py): no node needs to be up but the partitions' active ones.
        self.partitioned = routes_by_partition(opts, all_nodes(opts))
        self.nodes = all_nodes(opts) if self.partitioned else up_nodes(opts)
        self.job = secrets.token_hex(8)
        if overwrite and not self.partitioned:  # (by partition: with the first part)
            for node in self.nodes:
                with BulkClient(
                    node["address"], cluster=opts.cluster_id, credentials=opts.credentials
                ) as c:
                    c.call("bulk.overwrite.begin", type=opts.type, tv=self.version, job=self.job)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriteStats:
        ctx = TaskContext.get()
        assert ctx is not None
        pid, attempt = ctx.partitionId(), ctx.attemptNumber()
        if self.partitioned:
            return self._write_partitioned(iterator, pid, attempt)
        router = _Router(self.opts, self.nodes, self.key)
        stats = router.stats
        stats.partition, stats.attempt = pid, attempt
        senders = NodeSenders()  # the nodes commit at once; each in the task's order
        try:
            for seq, table in enumerate(router.chunks(iterator)):
                stats.rows += table.num_rows
                for node, rows in router.split(table):
                    if self.overwrite:  # staged per attempt: only the successful one counts
                        where = f"{pid}/{attempt}/{seq}/{node['name']}"
                    else:  # the same tag on a retry: its committed batches are skipped
                        where = f"{pid}/{seq}/{node['name']}/{digest(rows)}"
                    c = router.client(node)  # (made here: each is used by one sender only)
                    senders.submit(node["name"], partial(self._send, c, rows, where))
            senders.finish()
        finally:
            senders.close()
            router.close()
        for r in senders.results:
            if r is not None:
                stats.inserted += r["inserted"]
                stats.updated += r["updated"]
                stats.replayed += int(r["replayed"])
        return stats

    def _write_partitioned(
        self, iterator: Iterator[pa.RecordBatch], pid: int, attempt: int
    ) -> WriteStats:
        """A task's writes under routing by partition: each batch a transaction of its
        partitions on their active nodes, replicated (partition_writes.py)."""
        stats = WriteStats(partition=pid, attempt=attempt)
        writer = PartitionWriter(self.opts, self.nodes, self.key, self.version)
        try:
            for seq, table in enumerate(_Router(self.opts, self.nodes, self.key).chunks(iterator)):
                stats.rows += table.num_rows
                if self.overwrite:  # staged per attempt: only the successful one counts
                    writer.stage(table, self.job, f"{pid}/{attempt}/{seq}/")
                else:
                    writer.write(table)
        finally:
            writer.close()
        stats.inserted, stats.updated = writer.inserted, writer.updated
        stats.staged = [[name, tag] for tag, name in sorted(writer.staged.items())]
        return stats

    def _send(self, c: BulkClient, rows: bytes, where: str) -> dict[str, Any] | None:
        common = {"type": self.opts.type, "tv": self.version, "rows": rows, "format": "arrow"}
        if self.overwrite:
            c.call("bulk.overwrite.part", job=self.job, tag=where, key=self.key, **common)
            return None
        reply: dict[str, Any] = c.call(
            "bulk.upsert", tag=f"{self.job}/{where}", key=self.key, **common
        )
        return reply

    @one_line
    def commit(self, messages: list[WriteStats | None]) -> None:  # type: ignore[override]
        if self.partitioned and not self.overwrite:
            return  # every batch committed as it went (no tags to forget)
        if self.partitioned:  # every partition swapped in one transaction (§6.6)
            staged: dict[str, list[str]] = {}
            for m in messages:
                for name, tag in m.staged if m is not None else ():
                    staged.setdefault(name, []).append(tag)
            rows = sum(m.rows for m in messages if m is not None)
            timeout = SWAP_TIMEOUT + SWAP_SECONDS_PER_ROW * (self.old_count + rows)
            self._swap_everywhere(None, timeout, staged)
            return
        if self.overwrite:
            parts = [f"{m.partition}/{m.attempt}/" for m in messages if m is not None]
            rows = sum(m.rows for m in messages if m is not None)
            if all(n.get("transactions", True) for n in self.nodes):
                timeout = SWAP_TIMEOUT + SWAP_SECONDS_PER_ROW * (self.old_count + rows)
                self._swap_everywhere(parts, timeout)
                self._wait_landed(timeout)
                return
            for node in self.nodes:  # standalone bulk endpoints: one swap each
                with BulkClient(
                    node["address"], cluster=self.opts.cluster_id, credentials=self.opts.credentials
                ) as c:
                    c.call("bulk.overwrite.commit", type=self.opts.type, job=self.job, parts=parts)
            return
        for node in self.nodes:
            with BulkClient(
                node["address"], cluster=self.opts.cluster_id, credentials=self.opts.credentials
            ) as c:
                c.call("bulk.forget", prefix=f"{self.job}/")

    def _swap_everywhere(
        self, parts: list[str] | None, timeout: float, staged: dict[str, list[str]] | None = None
    ) -> None:
        """The overwrite's job commit on a cluster: ONE transaction swaps every node's
        staged parts in (``tx.overwrite``), and its commit (two-phase) makes them
        visible on all nodes or on none.  Any error is raised: Spark then aborts
        the job, which drops the staged parts.  A commit that met a conflicting
        transaction is replayed (each node's done record makes a replay of a job
        that did commit change nothing)."""
        args: dict[str, Any] = {"type": self.opts.type, "tv": self.version, "job": self.job}
        if staged is None:
            args["parts"] = parts
        else:  # routing by partition: the parts each partition takes (§6.6)
            args["staged"] = staged
        cid = self.opts.cluster_id
        # By partition, a takeover or a dropped replica anywhere moves an epoch and
        # fences the whole swap (NotActive): on a loaded machine the table moves often,
        # so the swap is tried for longer, a second apart.
        retries = PARTITION_COMMIT_RETRIES if self.partitioned else COMMIT_RETRIES
        for attempt in range(retries):
            req = [f"spark-overwrite-{self.job}", attempt]
            address = self._session_address()
            try:
                with BulkClient(
                    address, cluster=cid, timeout=timeout, credentials=self.opts.credentials
                ) as c:
                    sid = c.call("tx.begin")["s"]
                    c.call("tx.overwrite", s=sid, **args)
                    try:  # (closing the connection rolls an unfinished session back)
                        c.call("tx.commit", s=sid, req=req)
                    except Aborted as exc:
                        if not self.partitioned:
                            raise
                        # The decision was abort (a participant's prepare refused: its
                        # partition moved, a replica dropped): nothing swapped; again.
                        raise Retryable(f"the swap's commit aborted: {exc}") from exc
                    except Unavailable:
                        # Undecided, or the reply was lost: the commit may still have
                        # happened; aborting the job then would be wrong.  Ask (H1).
                        wait = OUTCOME_WAIT + timeout - SWAP_TIMEOUT
                        if commit_outcome(address, cid, req, wait, self.opts.credentials):
                            return
                        raise
                return
            except Retryable as exc:
                if attempt == retries - 1:
                    raise
                log.warning("overwrite of %s, swap attempt %d: %s", self.opts.type, attempt, exc)
                time.sleep(1.0 if self.partitioned else min(1.0, 0.05 * 2**attempt))
            except Unavailable as exc:
                log.warning("overwrite of %s, swap attempt %d: %s", self.opts.type, attempt, exc)
                # Nothing swapped (the session is gone), or a commit that did not
                # commit: a node seen down for a moment (a loaded machine) or a reply
                # lost on a dropped connection.  Again, if every node is up a moment
                # later (a node really down fails the job, naming it); a replay of a
                # swap that did commit meanwhile changes nothing (its done record).
                # By partition only the active nodes must be up: a takeover under way
                # (the table changes) is waited out, then the swap is tried again.
                time.sleep(1.0)
                if attempt == retries - 1 or not (self.partitioned or self._all_up()):
                    raise

    def _session_address(self) -> str:
        """The node that coordinates the job commit: the first node up (by partition a
        node may be down while its partitions are served by their replicas)."""
        if not self.partitioned:
            return str(self.nodes[0]["address"])
        try:
            nodes = all_nodes(self.opts)
        except Unavailable:
            nodes = self.nodes
        return str(next((n for n in nodes if n.get("up", True)), nodes[0])["address"])

    def _wait_landed(self, timeout: float) -> None:
        """Return once every node holds the new set: a swap is applied on each node
        after its commit, a page per store commit, its type closed to transactions
        meanwhile (data-path.md §6.3); a bulk read of the type waits for that."""
        for node in self.nodes:
            with BulkClient(
                node["address"],
                cluster=self.opts.cluster_id,
                timeout=timeout,
                credentials=self.opts.credentials,
            ) as c:
                c.call("bulk.schema", type=self.opts.type)

    def _all_up(self) -> bool:
        try:
            nodes = all_nodes(self.opts)
        except Unavailable:
            return False
        return all(n.get("up", True) for n in nodes)

    def abort(self, messages: list[WriteStats | None]) -> None:  # type: ignore[override]
        if self.partitioned and not self.overwrite:
            return  # (committed batches stay: an append is not atomic, as under nodes)
        for node in self.nodes:
            if not node.get("up", True):
                continue  # its staged rows stay invisible; bulk.overwrite.abort drops them later
            try:
                with BulkClient(
                    node["address"], cluster=self.opts.cluster_id, credentials=self.opts.credentials
                ) as c:
                    if self.overwrite:
                        c.call("bulk.overwrite.abort", job=self.job)
                    else:
                        c.call("bulk.forget", prefix=f"{self.job}/")
            except Unavailable:
                continue  # its staged rows stay invisible; bulk.overwrite.abort drops them later


def commit_outcome(
    address: str,
    cluster_id: str,
    req: list[Any],
    wait: float = OUTCOME_WAIT,
    credentials: str | None = None,
) -> bool:
    """Whether the commit of request ``req`` on the node at ``address`` committed
    (``request.result``); waits while it is undecided.  Unavailable when the node
    cannot say within ``wait`` seconds: the outcome is then unknown."""
    deadline = time.monotonic() + wait
    last: Any = None
    while time.monotonic() < deadline:
        try:
            with BulkClient(address, cluster=cluster_id, timeout=10, credentials=credentials) as c:
                last = c.call("request.result", req=req)
        except Unavailable as exc:
            last = exc
        else:
            if last["state"] in ("committed", "aborted", "unknown"):
                return bool(last["state"] == "committed")  # unknown: nothing recorded it
        time.sleep(0.2)
    raise Unavailable(
        f"the overwrite's commit on {address} is not decided after {wait:.0f}s ({last}): "
        "it may still commit; run the job again (a committed job replays as done)"
    )


class NonstopStreamWriter(DataSourceStreamArrowWriter):
    """Exactly once per micro-batch: the batch id is recorded at commit; a batch id at
    or below it is skipped, and retried tasks replay tagged batches.  Under node routing
    the records are each node's (``bulk.stream.*``, tags on ``bulk.upsert``); under
    routing by partition they are each partition's, replicated with its rows
    (data-path.md §6.7)."""

    def __init__(self, opts: Options, schema: StructType) -> None:
        self.opts = opts
        self.stream = opts.stream or opts.type
        ts = _type_schema(opts)
        self.version = ts["version"]
        self.old_count = int(ts.get("count") or 0)
        self.key = write_key(opts, ts)
        check_writable(ts, schema, self.key)
        self.partitioned = routes_by_partition(opts, all_nodes(opts))
        # Under routing by partition only the partitions' active nodes need to be up.
        self.nodes = all_nodes(opts) if self.partitioned else up_nodes(opts)

    def write(self, iterator: Iterator[pa.RecordBatch]) -> WriteStats:
        ctx = TaskContext.get()
        assert ctx is not None
        batch_id = int(ctx.getLocalProperty("streaming.sql.batchId") or -1)
        if self.partitioned:
            return self.write_partitioned(iterator, batch_id, ctx.partitionId())
        pid = ctx.partitionId()
        router = _Router(self.opts, self.nodes, self.key)
        try:
            done = {
                n["name"]: router.client(n).call("bulk.stream.last", stream=self.stream)["batch"]
                for n in self.nodes
            }
            for seq, table in enumerate(router.chunks(iterator)):
                router.stats.rows += table.num_rows
                for node, rows in router.split(table):
                    last = done[node["name"]]
                    if last is not None and batch_id <= last:
                        router.stats.replayed += 1
                        continue
                    r = router.client(node).call(
                        "bulk.upsert",
                        type=self.opts.type,
                        tv=self.version,
                        rows=rows,
                        format="arrow",
                        key=self.key,
                        tag=f"s:{self.stream}/{batch_id}/{pid}/{seq}/{digest(rows)}",
                    )
                    router.stats.inserted += r["inserted"]
                    router.stats.updated += r["updated"]
                    router.stats.replayed += int(r["replayed"])
        finally:
            router.close()
        return router.stats

    def write_partitioned(
        self, iterator: Iterator[pa.RecordBatch], batch_id: int, pid: int
    ) -> WriteStats:
        """A task's micro-batch rows under routing by partition: each chunk a transaction
        of its partitions on their active nodes, tagged ``<task>/<chunk>/<digest>``; a
        partition that has the tag, or the micro-batch committed, skips its rows
        (data-path.md §6.7)."""
        if batch_id < 0:
            raise BadArgument("a streaming sink's task runs without a micro-batch id")
        stats = WriteStats(partition=pid)
        writer = PartitionWriter(self.opts, self.nodes, self.key, self.version)
        try:
            for seq, table in enumerate(_Router(self.opts, self.nodes, self.key).chunks(iterator)):
                stats.rows += table.num_rows
                tag = f"{pid}/{seq}/{digest(ipc(table))}"
                writer.write(table, stream=[self.stream, batch_id, tag])
        finally:
            writer.close()
        stats.inserted, stats.updated = writer.inserted, writer.updated
        stats.replayed = writer.replayed
        return stats

    def commit(self, messages: list[WriteStats | None], batchId: int) -> None:  # type: ignore[override]
        if self.partitioned:  # every partition's mark, in one transaction (§6.7)
            writer = PartitionWriter(self.opts, self.nodes, self.key, self.version)
            try:
                writer.commit_stream(self.stream, batchId)
            finally:
                writer.close()
            return
        for node in self.nodes:
            with BulkClient(
                node["address"], cluster=self.opts.cluster_id, credentials=self.opts.credentials
            ) as c:
                c.call("bulk.stream.commit", stream=self.stream, batch=batchId)
                c.call("bulk.forget", prefix=f"s:{self.stream}/{batchId}/")

    def abort(self, messages: list[WriteStats | None], batchId: int) -> None:  # type: ignore[override]
        # Nothing to undo: the batch's committed parts are tagged, and Spark runs the
        # same batch id again; its replay skips them.
        return
