"""Where a Spark write goes under routing by partition (``[ha] data = "partitions"``).

Under node routing a task sends each batch to the home node of its keys
(``source._Router``: a hash over the node names) as ``bulk.upsert``, a local
store transaction there.  Under routing by partition an object belongs to the
partition its unique key maps to, and is written as a transaction of that
partition on its active node, so that it is replicated (data-path.md §6.5):

1. **plan**: the partition table (``status``: each partition's active node and
   epoch) and the nodes' addresses, fetched once and again after a refusal;
2. **route**: ``bulk.route`` maps the batch's key column with the type's
   binding (the node's mapper: the client never guesses it) to partitions;
3. **send**: the rows of each active node's partitions go to that node as one
   session: ``tx.upsert`` (``here``: refused with ``NotActive`` unless the node
   acts for every partition of them at the epoch of its table) then
   ``tx.commit`` (replicated before it answers).  The nodes of a batch are
   written at once, one thread each; the task's batches one after the other
   (so a later row of a key lands after an earlier one).

A refusal (``NotActive``), a node lost (``Unavailable``) or a conflict
(``Retryable``) sends the whole batch again after a fresh plan: an upsert by
key applied twice changes nothing the second time, so a part that did commit
before the failure is harmless to send again.

A streaming sink's chunk is written the same way with ``stream`` (its micro-batch
and a tag the same on a replay): each partition records the tag with the rows and
skips a chunk it has, or a micro-batch committed there; the driver's commit marks
the micro-batch in every partition (:meth:`PartitionWriter.commit_stream`,
data-path.md §6.7).

An overwrite stages its rows the same way (:meth:`PartitionWriter.stage`: each
partition's rows on its active node, as ``bulk.overwrite.part``); the job commit
swaps every partition in one distributed transaction (data-path.md §6.6).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pyarrow as pa

from nonstop.client.bulk import BulkClient
from nonstop.errors import BadArgument, Retryable, Unavailable
from nonstop.spark.schema import Options

PARTITION_ROUTING = "partitions"
ATTEMPTS = 40
"""Times a batch is planned and sent again (NotActive, a node lost, a conflict)."""
MAX_PAUSE = 1.0
"""Longest pause between two attempts, in seconds (takeovers take about one)."""


def routes_by_partition(opts: Options, nodes: list[dict[str, Any]]) -> bool:
    """Does the cluster route by partition (``partition.objects`` of the first node that
    answers; a standalone bulk endpoint has no such op and routes by node)?"""
    last: Exception | None = None
    for node in nodes:
        if not node.get("up", True):
            continue
        try:
            with _client(opts, node["address"], 10) as c:
                return str(c.call("partition.objects").get("routing")) == PARTITION_ROUTING
        except BadArgument:
            return False
        except Unavailable as exc:
            last = exc
    raise Unavailable(f"no node of the cluster at {opts.cluster} answers: {last}")


def _holders(part: dict[str, Any]) -> list[str]:
    """The nodes that hold or may act for a partition: its ``current`` copies and its
    priority list (a status entry of the partition table)."""
    out: list[str] = []
    for entry in [*(part.get("current") or []), *(part.get("nodes") or [])]:
        node = entry[0] if isinstance(entry, list | tuple) and entry else entry
        if isinstance(node, str) and node not in out:
            out.append(node)
    return out


def _client(opts: Options, address: str, timeout: float | None = None) -> BulkClient:
    if timeout is None:
        return BulkClient(address, cluster=opts.cluster_id, credentials=opts.credentials)
    return BulkClient(
        address, cluster=opts.cluster_id, credentials=opts.credentials, timeout=timeout
    )


def ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as out:
        for b in table.combine_chunks().to_batches():
            out.write_batch(b)
    return sink.getvalue().to_pybytes()  # type: ignore[no-any-return]


class PartitionWriter:
    """One Spark task's writes under routing by partition (module doc)."""

    def __init__(self, opts: Options, nodes: list[dict[str, Any]], key: str, version: int):
        self.opts = opts
        self.key = key
        self.version = version
        self.addresses = {n["name"]: n["address"] for n in nodes}
        self.active: dict[str, str] | None = None  # partition -> active node (the plan)
        self.up: list[str] = []  # the nodes up at the plan, in name order
        self.clients: dict[str, BulkClient] = {}
        self.pool: ThreadPoolExecutor | None = None
        self.inserted = self.updated = self.replayed = self.attempts = 0
        self.staged: dict[str, str] = {}  # an overwrite's staged parts: tag -> partition
        self.holders: dict[str, list[str]] = {}  # partition -> nodes that may act for it
        self.last_error: BaseException | None = None

    # ------------------------------------------------------------------ plan
    def _plan(self) -> dict[str, str]:
        from nonstop.client.bulk import cluster_nodes

        found = cluster_nodes(
            self.opts.cluster, cluster=self.opts.cluster_id, credentials=self.opts.credentials
        )
        self.addresses.update({n["name"]: n["address"] for n in found})
        self.up = sorted(str(n["name"]) for n in found if n.get("up", True))
        last: Exception | None = None
        for node in found:
            if not node.get("up", True):
                continue
            try:
                with _client(self.opts, node["address"], 10) as c:
                    status = c.call("status")
            except Unavailable as exc:
                last = exc
                continue
            parts = status.get("partitions") or []
            self.holders = {str(p["name"]): _holders(p) for p in parts}
            return {
                str(p["name"]): str(p["active"]) for p in parts if isinstance(p.get("active"), str)
            }
        raise Unavailable(f"no node of the cluster at {self.opts.cluster} answers: {last}")

    def _client(self, node: str) -> BulkClient:
        c = self.clients.get(node)
        if c is None:
            address = self.addresses.get(node)
            if address is None:
                raise Unavailable(f"node {node} is not among the cluster's nodes")
            c = self.clients[node] = _client(self.opts, address)
        return c

    def _drop(self, node: str) -> None:
        """Close a node's connection: its session, if an op failed in it, rolls back."""
        c = self.clients.pop(node, None)
        if c is not None:
            c.close()

    # ----------------------------------------------------------------- write
    def write(self, table: pa.Table, stream: list[Any] | None = None) -> None:
        """Write one batch (module doc); raises what is not retryable, or the last
        failure after :data:`ATTEMPTS`.  ``stream``: ``[stream id, micro-batch id, chunk
        tag]`` of a streaming sink's chunk -- each partition takes it once (a partition
        that has it, or has the micro-batch committed, skips it: data-path.md §6.7)."""
        self._retrying(lambda active: self._write_once(table, active, stream))

    def commit_stream(self, stream: str, batch: int) -> None:
        """Mark micro-batch ``batch`` of ``stream`` committed in every partition, in ONE
        transaction (``tx.stream.commit``, data-path.md §6.7), coordinated by a node up
        at the plan; again after a refusal, a lost node or a conflict (the mark never
        moves back: a commit applied twice changes nothing the second time)."""
        self._retrying(lambda active: self._commit_stream_once(stream, batch))

    def _commit_stream_once(self, stream: str, batch: int) -> None:
        if not self.up:
            raise Unavailable("no node of the cluster is up")
        node = self.up[0]
        c = self._client(node)
        try:
            reply = c.call("tx.stream.commit", begin="serializable", stream=stream, batch=batch)
            c.call("tx.commit", s=reply["s"])
        except BaseException:
            self._drop(node)  # (an open session rolls back with its connection)
            raise

    def stage(self, table: pa.Table, job: str, where: str) -> None:
        """Stage one batch of an overwrite (data-path.md §6.6): each partition's rows on
        the partition's active node, invisibly, tagged ``<where><partition>``; a
        refusal or a lost node plans again and stages the batch again under the same
        tags (a part staged again replaces itself).  :attr:`staged` collects
        ``tag -> partition`` for the job commit."""
        self._retrying(lambda active: self._stage_once(table, active, job, where))

    def _stage_once(self, table: pa.Table, active: dict[str, str], job: str, where: str) -> None:
        route = self._route(table, active)
        names = route["partitions"]
        rows_of: dict[str, list[int]] = {}
        for i, which in enumerate(route["of"]):
            rows_of.setdefault(names[which], []).append(i)
        for name, rows in sorted(rows_of.items()):
            node = active.get(name)
            if node is None:
                raise Unavailable(f"partition {name} has no active node now")
            tag = f"{where}{name}"
            part = {
                "job": job,
                "tag": tag,
                "partition": name,
                "type": self.opts.type,
                "tv": self.version,
                "key": self.key,
                "rows": ipc(table.take(pa.array(rows, type=pa.int64()))),
                "format": "arrow",
            }
            self._stage_on(node, part)
            # Also on the partition's other holders that are up (its replicas, its
            # preferred node): a takeover or a handover before the job commit then
            # finds the part on the new active node.  Best effort: the swap checks
            # that its active node holds every part (data-path.md §6.6).
            for other in self.holders.get(name, []):
                if other != node and other in self.up:
                    try:
                        self._stage_on(other, part)
                    except (Retryable, Unavailable):
                        continue
            self.staged[tag] = name

    def _stage_on(self, node: str, part: dict[str, Any]) -> None:
        c = self._client(node)
        try:
            c.call("bulk.overwrite.part", **part)
        except Unavailable:
            self._drop(node)
            raise

    def _retrying(self, once: Callable[[dict[str, str]], None]) -> None:
        for attempt in range(ATTEMPTS):
            try:
                if self.active is None:
                    self.active = self._plan()
                once(self.active)
                return
            except (Retryable, Unavailable) as exc:
                self.attempts += 1
                self.last_error = exc
                self.active = None
                for node in list(self.clients):
                    self._drop(node)
                if attempt == ATTEMPTS - 1:
                    raise type(exc)(f"{exc} (after {ATTEMPTS} attempts of one batch)") from exc
                time.sleep(min(MAX_PAUSE, 0.05 * 2**attempt))

    def _write_once(
        self, table: pa.Table, active: dict[str, str], stream: list[Any] | None = None
    ) -> None:
        route = self._route(table, active)
        of = route["of"]
        names = route["partitions"]
        rows_of: dict[str, list[int]] = {}
        for i, which in enumerate(of):
            node = active.get(names[which])
            if node is None:
                raise Unavailable(f"partition {names[which]} has no active node now")
            rows_of.setdefault(node, []).append(i)
        sends = {
            node: ipc(table.take(pa.array(rows, type=pa.int64()))) for node, rows in rows_of.items()
        }
        if len(sends) == 1:
            ((node, rows),) = sends.items()
            self._add(self._send(node, rows, stream))
            return
        if self.pool is None:
            self.pool = ThreadPoolExecutor(max(2, len(self.addresses)), "nonstop-write")
        futures = [self.pool.submit(self._send, node, rows, stream) for node, rows in sends.items()]
        failure: BaseException | None = None
        for f in futures:
            try:
                self._add(f.result())
            except BaseException as exc:
                failure = failure or exc
        if failure is not None:
            raise failure

    def _route(self, table: pa.Table, active: dict[str, str]) -> dict[str, Any]:
        """``bulk.route`` of the batch's key column, asked of a node that was up at the
        plan (any node maps alike: the bindings are the cluster's configuration)."""
        if not active or not self.up:
            raise Unavailable("no partition has an active node now")
        node = self.up[0]
        rows = ipc(table.select([self.key]))
        c = self._client(node)
        try:
            reply: dict[str, Any] = c.call(
                "bulk.route",
                type=self.opts.type,
                tv=self.version,
                key=self.key,
                rows=rows,
                format="arrow",
            )
        except Unavailable:
            self._drop(node)
            raise
        return reply

    def _send(self, node: str, rows: bytes, stream: list[Any] | None = None) -> dict[str, Any]:
        c = self._client(node)
        extra = {} if stream is None else {"stream": stream}
        try:
            reply: dict[str, Any] = c.call(
                "tx.upsert",
                begin="serializable",
                here=True,
                type=self.opts.type,
                tv=self.version,
                key=self.key,
                rows=rows,
                format="arrow",
                **extra,
            )
            c.call("tx.commit", s=reply["s"])
        except BaseException:
            self._drop(node)  # (an open session rolls back with its connection)
            raise
        return reply

    def _add(self, reply: dict[str, Any]) -> None:
        self.inserted += int(reply.get("inserted", 0))
        self.updated += int(reply.get("updated", 0))
        self.replayed += int(reply.get("replayed", 0))

    def close(self) -> None:
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
        for node in list(self.clients):
            self._drop(node)
