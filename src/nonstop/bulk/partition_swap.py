"""An overwrite's swap under routing by partition (data-path.md §6.6).

Under node routing a swap deletes a node's whole extent of the type and
creates the staged rows in the node's own location (``handlers._g_swap``, or
the bounded swap of ``swap_apply``, applied after the commit): none of it is
replicated.  Under routing by partition each active node's branch of the
job's ONE distributed transaction swaps exactly the partitions it acts for,
with ordinary transaction entries -- deletes under write locks, creates with
``create_in(location, epoch)`` -- so that the prepared write set of each
partition reaches its sync replicas through the replication machine like any
transaction's, and a promoted replica serves the new set.

* :func:`check_staged_part` -- ``bulk.overwrite.part`` with ``partition``: every
  row's key must map to that partition (the binding's mapper);
* :func:`overwrite_partitions_branch` -- ``branch.overwrite`` with
  ``partitions: [[location, epoch, [tags]], ...]``: the swap of those
  partitions (and of this node's own location) in the branch's transaction.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from nonstop.bulk import swap_apply
from nonstop.bulk.handlers import (
    SWAP_PAGE,
    BulkContext,
    Steps,
    finish_swap,
    g_delete_objects,
    job_id,
    run_steps_sliced,
)
from nonstop.bulk.partitioned import ROUTING_OFF, partitions_of
from nonstop.errors import Aborted, BadArgument, DuplicateKey, FieldError
from nonstop.model.codec import unpack
from nonstop.model.ref import location_prefix
from nonstop.tx import gc_hold
from nonstop.tx.locks import LockMode

if TYPE_CHECKING:
    from nonstop.model.managed import KeyInfo, TypeInfo
    from nonstop.tx.async_transaction import AsyncTransaction
    from nonstop.tx.database import Database
    from nonstop.tx.transaction import Transaction

_NEED = "need"


def check_staged_part(
    ctx: BulkContext,
    info: TypeInfo,
    key: KeyInfo,
    cols: list[list[Any]],
    names: list[str],
    partition: Any,
) -> None:
    """Every staged row's key maps to ``partition`` (so a swap creates it where a
    ``tx.create`` of the same key would)."""
    if ctx.placement is None:
        raise BadArgument(ROUTING_OFF)
    if not isinstance(partition, str) or not partition:
        raise BadArgument("'partition' must name the partition the part's rows map to")
    if not cols:
        return
    values = cols[names.index(key.field)]
    for i, name in enumerate(partitions_of(ctx.placement, info.name, values)):
        if name != partition:
            raise FieldError(
                f"row {i}: key {values[i]!r:.60} of {info.name} maps to partition {name}, "
                f"not {partition}: stage it there"
            )


def groups_arg(value: Any) -> list[tuple[int, int, list[str]]]:
    """``partitions`` of ``branch.overwrite``: ``[[location, epoch, [tag, ...]], ...]``."""
    if not isinstance(value, list):
        raise BadArgument("'partitions' must be a list of [location, epoch, [tags]]")
    out = []
    for g in value:
        if not (isinstance(g, list | tuple) and len(g) == 3 and isinstance(g[2], list)):
            raise BadArgument("each of 'partitions' is [location, epoch, [tags]]")
        location, epoch, tags = g
        if not isinstance(location, int) or not isinstance(epoch, int):
            raise BadArgument("a partition's location and epoch are integers")
        if not all(isinstance(t, str) and t for t in tags):
            raise BadArgument("a partition's tags are non-empty strings")
        location_prefix(location)  # (checked: a 64-bit location code)
        out.append((location, epoch, list(tags)))
    return out


async def overwrite_partitions_branch(
    tx: AsyncTransaction, info: TypeInfo, payload: dict[str, Any]
) -> dict[str, Any]:
    """``branch.overwrite`` under routing by partition (module doc).  Nothing is committed
    here: the session's two-phase commit makes every partition's swap visible at once,
    or none, and replicates each branch's write set at prepare."""
    job = job_id(payload)
    groups = groups_arg(payload.get("partitions"))
    # One entry per object swapped until the commit ends: the cyclic GC stays off
    # meanwhile (tx/gc_hold.py, as for the swap under node routing), and comes back
    # once the finished transaction dropped its entries (release_soon).
    gc_hold.hold()
    tx.on_commit(gc_hold.release_soon)
    tx.on_rollback(gc_hold.release_soon)
    return await run_steps_sliced(tx, g_swap_partitions(tx, info, job, groups))  # type: ignore[no-any-return]


def g_swap_partitions(
    tx: Transaction | AsyncTransaction,
    info: TypeInfo,
    job: str,
    groups: list[tuple[int, int, list[str]]],
) -> Steps:
    """Steps of one node's swap (module doc): lock the job, replay its recorded result
    if done here, check every expected part is staged here, delete the type's objects
    of the partitions (and of the own location), create the parts' rows in their
    partitions, drop the job's staged parts and record the result."""
    db = tx.db
    bulk = swap_apply.bulk_db(db.engine.store)
    jslot, dslot = b"j/" + job.encode(), b"d/" + job.encode()
    yield (_NEED, (("bulk", jslot), LockMode.WRITE), {})
    store = db.engine.store
    with store.read() as rtxn:
        done = rtxn.get(dslot, db=bulk)
    if done is not None:
        return {**unpack(bytes(done)), "replayed": True}
    prefix = f"o/{job}/".encode()
    staged = swap_apply.keys_with(store, prefix)
    have = set(staged)
    for location, epoch, tags in groups:
        missing = [t for t in tags if prefix + t.encode() not in have]
        if missing:
            raise Aborted(
                f"overwrite {job!r}: {len(missing)} staged part(s) of the partition at location "
                f"{location:016x} (epoch {epoch}) are not on its active node, e.g. {missing[0]!r}: "
                "the partition moved after its rows were staged (a failover during the job); "
                "nothing was swapped: run the job again"
            )
    prefixes = [location_prefix(loc) for loc, _, _ in groups]
    prefixes.append(location_prefix(store.location))  # (objects from before partitions)
    deleted = 0
    for name in sorted(t.name for t in info.concrete_types()):
        for loc in prefixes:
            for page in _location_pages(db, name, loc):
                deleted += yield from g_delete_objects(page)
    inserted = 0
    for location, epoch, tags in groups:
        for tag in tags:
            raw = db.engine.get_raw(bulk, prefix + tag.encode())
            if raw is None:  # (the job's lock is held: its parts cannot go away)
                raise Aborted(f"overwrite {job!r}: staged part {tag!r} is gone")
            names, cols = swap_apply.part_columns(unpack(raw))
            for values in zip(*cols, strict=True):
                row = dict(zip(names, values, strict=True))
                try:
                    yield ("create_in", (info.cls, location, epoch), row)
                except DuplicateKey as exc:
                    raise DuplicateKey(f"overwrite {job!r}: {exc} (twice in the rows)") from None
                inserted += 1
    return finish_swap(tx, bulk, staged, jslot, dslot, deleted, inserted)


def _location_pages(db: Database, type_name: str, loc: bytes) -> Iterator[list[bytes]]:
    """The references of one concrete type's extent that start with ``loc`` (one
    location), :data:`SWAP_PAGE` at a time, each page from a fresh snapshot."""
    store = db.engine.store
    lo = loc
    while True:
        with store.read() as rtxn:
            refs = swap_apply.extent_refs(store, rtxn, type_name, lo)
            page = [bytes(r) for r in itertools.islice(refs, SWAP_PAGE) if r.startswith(loc)]
        if not page:
            return
        yield page
        if len(page) < SWAP_PAGE:
            return
        lo = page[-1] + b"\x00"


__all__ = ["check_staged_part", "g_swap_partitions", "groups_arg", "overwrite_partitions_branch"]
