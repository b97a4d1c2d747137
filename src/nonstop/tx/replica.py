"""Write sets given verbatim: a replica applies what its active node committed (ha.md §5, §7).

The replication machine's driver hands a replica the write set of a committed
(or prepared) transaction of a partition, and a restore copy hands a returning
node batches of a partition's objects.  Both are **plain data**, a list of
records that msgpack carries as is:

=====================================================  ===========================================
record                                                 meaning
=====================================================  ===========================================
``["c", ref, type, version, state]``                   the object ``ref`` (20 bytes) of managed
                                                       type ``type`` (its stored name) exists
                                                       with the complete ``state`` at
                                                       ``version`` (>= 1): created if absent,
                                                       replaced if held at a lower version
``["u", ref, type, version, changes]``                 the fields in ``changes`` changed and the
                                                       object is now at ``version``
``["d", ref, type]``                                   the object ``ref`` was deleted
=====================================================  ===========================================

``state`` and ``changes`` are ``{field: value}`` packed with
:func:`nonstop.model.codec.pack` (bytes), as objects travel on the wire
(:mod:`nonstop.model.wire`), so references, datetimes and decimals survive.

Applying (:func:`g_apply`, one transaction: all records or none):

* **Verbatim**: no trigger runs (the active node ran them; their effects are
  records of the same write set), the records' references are kept.
* **Idempotent**: a ``c`` or ``u`` whose version the store already holds (or
  passed) changes nothing, a ``d`` of an absent object changes nothing; so
  applying one write set twice changes nothing the second time.
* **In order** (ha.md I4): a ``u`` must be the object's next version (its
  version now + 1) or already applied; a gap (the replica missed a write) or a
  ``u`` of an absent object is refused with :class:`ReplicaGap` — the replica
  must be resynchronized, never patched.
* **Indexes** are maintained from the old and new values; a unique value held
  by another object is :class:`~nonstop.errors.DuplicateKey` (with keys mapped
  to partitions it cannot happen, guarantees.md "Unique keys").
* **Counters**: the highest counter of each (location, epoch) among the
  records' references is recorded in ``seqs`` with the objects, so a promoted
  replica never hands out a reference it applied (belt and braces: by I1 it
  creates at a later epoch anyway).
* **Bad input** (not a list, an unknown kind, a reference that is not 20
  bytes, a version that is not a positive int, state that does not decode to
  a map, an unknown field or type, a value a field does not take) raises
  :class:`~nonstop.errors.BadArgument` / ``FieldError`` / ``UnknownType`` naming
  the record's index, and nothing is applied.

:func:`write_set_records` makes the records of a transaction on its active node.
:func:`copy_batch` reads a partition's objects as ``c`` records, in reference
order with a resume key: a restore copy is ``copy_batch`` on the active node
and :func:`apply_write_set` on the returning one.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from nonstop.errors import BadArgument, DuplicateKey, Error, FieldError, UnknownType
from nonstop.model.codec import encode_key, pack, unpack
from nonstop.model.entry import CLEAN, CREATED, CREATED_DELETED, DELETED, DIRTY
from nonstop.model.managed import TypeInfo
from nonstop.model.ref import REF_SIZE, Ref, split_sequence
from nonstop.tx.entries import READ, WRITE, Entry, Isolation, Op

if TYPE_CHECKING:
    from nonstop.tx.database import Database
    from nonstop.tx.engine import Engine
    from nonstop.tx.transaction import Transaction

KINDS = ("c", "u", "d")


class ReplicaGap(Error):
    """A replica record does not follow what the store holds (a missed write): resynchronize."""


@dataclass(slots=True)
class Record:
    """One checked record of a write set (module doc)."""

    index: int
    kind: str
    ref: bytes
    type_name: str
    version: int
    values: dict[str, Any]


@dataclass(slots=True)
class Applied:
    """What applying a write set did, record by record."""

    created: int = 0
    updated: int = 0
    deleted: int = 0
    unchanged: int = 0
    counters: dict[tuple[int, int], int] = field(default_factory=dict)


def parse_write_set(records: Any) -> list[Record]:
    """Check the shape of every record before anything is applied (module doc)."""
    if not isinstance(records, list | tuple):
        raise BadArgument(f"a write set is a list of records, got {type(records).__name__}")
    return [_parse(i, r) for i, r in enumerate(records)]


def _parse(i: int, record: Any) -> Record:
    where = f"write set record {i}"
    if not isinstance(record, list | tuple) or not record:
        raise BadArgument(f"{where} is not a list: {record!r:.80}")
    kind = record[0]
    if kind not in KINDS:
        raise BadArgument(f"{where}: unknown kind {kind!r:.20} (one of c, u, d)")
    expected = 3 if kind == "d" else 5
    if len(record) != expected:
        raise BadArgument(f"{where}: a {kind!r} record has {expected} items, got {len(record)}")
    ref, type_name = record[1], record[2]
    if not isinstance(ref, bytes) or len(ref) != REF_SIZE:
        raise BadArgument(f"{where}: a reference is {REF_SIZE} bytes, got {ref!r:.60}")
    if not isinstance(type_name, str) or not type_name:
        raise BadArgument(f"{where}: a type name is a non-empty str, got {type_name!r:.60}")
    if kind == "d":
        return Record(i, kind, ref, type_name, 0, {})
    version, packed = record[3], record[4]
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise BadArgument(f"{where}: a version is an int >= 1, got {version!r:.40}")
    if not isinstance(packed, bytes):
        raise BadArgument(f"{where}: state is packed bytes, got {type(packed).__name__}")
    try:
        values = unpack(packed)
    except Exception as exc:
        raise BadArgument(f"{where}: state does not decode: {exc}") from None
    if not isinstance(values, dict) or not all(isinstance(k, str) for k in values):
        raise BadArgument(f"{where}: state is a map of field names, got {values!r:.60}")
    return Record(i, kind, ref, type_name, version, values)


def g_apply(tx: Transaction, records: list[Record], *, catching_up: bool = False) -> Op:
    """Generator op: apply checked ``records`` in ``tx`` (module doc); returns :class:`Applied`.

    Takes a write lock on every object named and on each (location, epoch)
    counter it records.  ``tx`` must be fresh and be used for nothing else: the
    caller commits it (all records) or rolls it back (none).

    ``catching_up``: the store is a restore target still being copied (ha.md §7):
    a ``u`` record that carries the object's complete state (as
    :func:`write_set_records` makes them) is applied as a whole-state put to an
    object the copy has not brought yet or brought at an older version, instead
    of being refused as a gap.
    """
    engine = tx.engine
    done = Applied()
    touched: dict[bytes, Entry] = {}  # entries this write set changed, for the unique claims
    for rec in records:
        info = _type(engine, rec)
        earlier = tx.entry(rec.ref)
        if earlier is not None and earlier.status >= DELETED:
            raise BadArgument(
                f"write set record {rec.index}: object {Ref(rec.ref)} was deleted by an "
                "earlier record of the same write set"
            )
        whole = catching_up and rec.kind == "u" and rec.values.keys() >= info.fields.keys()
        e = yield from tx.g_load(rec.ref, WRITE)
        if e is None:
            if rec.kind == "d":
                done.unchanged += 1  # already deleted
            elif rec.kind == "u" and not whole:
                raise ReplicaGap(
                    f"write set record {rec.index}: update of object {Ref(rec.ref)}, which "
                    "this store does not hold (resynchronize the replica)"
                )
            else:
                touched[rec.ref] = _create(tx, info, rec)
                done.created += 1
            continue
        if e.info is not info:
            raise BadArgument(
                f"write set record {rec.index}: object {Ref(rec.ref)} is a {e.info.name}, "
                f"not a {info.name}"
            )
        if rec.kind == "d":
            e.status = CREATED_DELETED if e.status == CREATED else DELETED
            done.deleted += 1
            touched[rec.ref] = e
            continue
        now = e.version if e.status == CLEAN else e.version + 1  # (a change writes version + 1)
        if rec.version <= now:
            done.unchanged += 1  # already applied
            continue
        if rec.kind == "u" and rec.version != now + 1 and not whole:
            raise ReplicaGap(
                f"write set record {rec.index}: object {Ref(rec.ref)} is at version {now}, "
                f"the record makes it version {rec.version}: a write is missing "
                "(resynchronize the replica)"
            )
        _change(e, info, rec)
        e.version = rec.version - 1
        done.updated += 1
        touched[rec.ref] = e
    yield from _claims(tx, touched)
    yield from _counters(tx, records, done)
    return done


def _type(engine: Engine, rec: Record) -> TypeInfo:
    try:
        return engine.type_by_name(rec.type_name)
    except UnknownType as exc:
        raise UnknownType(f"write set record {rec.index}: {exc}") from None


def _create(tx: Transaction, info: TypeInfo, rec: Record) -> Entry:
    """The entry of a ``c`` record's object, absent here (g_load holds its write lock)."""
    e = Entry(
        tx, rec.ref, info, _checked(info, rec, complete=True), rec.version - 1, WRITE, CREATED
    )
    e.triggered = True
    tx.entry_map()[rec.ref] = e
    return e


def _change(e: Entry, info: TypeInfo, rec: Record) -> None:
    """Apply a ``c`` (whole state) or ``u`` (changed fields) record to an existing entry."""
    values = _checked(info, rec, complete=rec.kind == "c")
    if e.status != CREATED and e.orig is None:
        e.orig = {name: e.state[name] for name in info.keys}  # (every key: old index entries)
    e.state.update(values)
    if e.status == CLEAN:
        e.status = DIRTY
    e.triggered = True  # no update trigger: the active node ran it


def _checked(info: TypeInfo, rec: Record, *, complete: bool) -> dict[str, Any]:
    """The record's values, each checked as its field takes it; a complete state gets the
    defaults of fields it lacks (a newer type version here, E3)."""
    fields = info.fields
    unknown = [n for n in rec.values if n not in fields]
    if unknown:
        raise FieldError(
            f"write set record {rec.index}: {info.name} has no field(s) "
            f"{', '.join(map(repr, unknown))}"
        )
    out: dict[str, Any] = {}
    for name, f in fields.items():
        if name not in rec.values:
            if complete:
                out[name] = f.make_default()
            continue
        value = rec.values[name]
        if f.kind == "ref":
            if value is not None and not isinstance(value, Ref):
                raise FieldError(
                    f"write set record {rec.index}: {info.name}.{name} takes a reference, "
                    f"got {type(value).__name__}"
                )
            out[name] = value
        else:
            try:
                out[name] = f.check(info.name, value)
            except FieldError as exc:
                raise FieldError(f"write set record {rec.index}: {exc}") from None
    return out


def _claims(tx: Transaction, touched: dict[bytes, Entry]) -> Op:
    """Claim the unique values the write set gives its objects, once every record is in (a
    value one object gave up in this write set may be taken by another in any order)."""
    for e in touched.values():
        if e.status >= DELETED:
            for name, key in e.info.keys.items():
                old = e.orig.get(name) if e.orig else e.state[name]
                if key.options.unique and old is not None:
                    yield from tx.need((key.db_name, encode_key(old)), WRITE)
            continue
        for name, key in e.info.keys.items():
            if not key.options.unique:
                continue
            new = e.state[name]
            old = e.orig.get(name) if e.orig is not None else None
            if e.status == CREATED or new != old:  # (a DIRTY entry has orig)
                try:
                    yield from tx.g_claim(key, new, e.ref)
                except DuplicateKey as exc:
                    raise DuplicateKey(f"write set of a replica: {exc}") from None
            if old is not None and new != old:
                yield from tx.need((key.db_name, encode_key(old)), WRITE)


def _counters(tx: Transaction, records: list[Record], done: Applied) -> Op:
    """Record the highest counter of each (location, epoch) of the records' references."""
    highest: dict[tuple[int, int], int] = {}
    for rec in records:
        if rec.kind == "d":
            continue
        location = int.from_bytes(rec.ref[:8], "big")
        epoch, counter = split_sequence(int.from_bytes(rec.ref[12:], "big"))
        if counter > highest.get((location, epoch), 0):
            highest[(location, epoch)] = counter
    store = tx.engine.store
    for (location, epoch), counter in highest.items():
        yield from tx.need(("seqs", location, epoch), WRITE)
        with store.read() as rtxn:
            floor = store.counter_floor(rtxn, location, epoch)
        if counter > floor:
            tx.write_raw([store.seq_op(location, epoch, counter)])
            done.counters[(location, epoch)] = counter
        store.note_counter(location, epoch, counter)


def apply_write_set(
    db: Database,
    records: Any,
    *,
    catching_up: bool = False,
    lock_timeout: float | None = 30.0,
) -> Applied:
    """Apply a write set (module doc) in one transaction of its own and commit it durably."""
    checked = parse_write_set(records)
    with db.transaction(isolation=Isolation.SERIALIZABLE.value, lock_timeout=lock_timeout) as tx:
        return tx.drive(g_apply(tx, checked, catching_up=catching_up))  # type: ignore[no-any-return]


async def apply_write_set_async(
    db: Database,
    records: Any,
    *,
    catching_up: bool = False,
    lock_timeout: float | None = 30.0,
) -> Applied:
    """:func:`apply_write_set` for asyncio: waits for locks and the commit without a thread."""
    checked = parse_write_set(records)
    async with db.transaction(
        isolation=Isolation.SERIALIZABLE.value, lock_timeout=lock_timeout
    ) as tx:
        op = g_apply(tx, checked, catching_up=catching_up)
        return await tx.adrive(op)  # type: ignore[no-any-return]


def write_set_records(tx: Transaction) -> list[list[Any]]:
    """The records of what ``tx`` writes to objects, for its replicas: call it once the
    transaction's write set is final — from an ``on_prepare`` notifier, or after
    ``prepare_write_set`` — and before it finishes.

    A new object is a ``c`` record, a changed one a ``u`` record carrying its whole
    state (the transaction does not track which fields changed; the whole state is
    as idempotent and a few bytes longer), a deleted one a ``d`` record.
    """
    return entry_records(tx.entries())


def entry_records(entries: Iterable[Any]) -> list[list[Any]]:
    """:func:`write_set_records` of some of a transaction's entries (a slice of them: a
    caller on an event loop makes the records of a large write set slice by slice)."""
    out: list[list[Any]] = []
    for e in entries:
        status = e.status
        if status == CREATED:
            out.append(["c", e.ref, e.info.name, e.version + 1, pack(e.state)])
        elif status == DIRTY:
            out.append(["u", e.ref, e.info.name, e.version + 1, pack(e.state)])
        elif status == DELETED:
            out.append(["d", e.ref, e.info.name])
    return out


def copy_batch(
    engine: Engine, location: int, after: bytes | None = None, limit: int = 1000
) -> tuple[list[list[Any]], bytes | None]:
    """Up to ``limit`` objects of ``location`` as ``c`` records, in reference order after the
    reference ``after``: ``(records, resume)``, ``resume`` None once the location is done.

    One LMDB snapshot per batch, no locks: a consistent read of committed state
    (a Spark split, a count, a check).  A restore copy under traffic uses
    :func:`g_copy_batch`.
    """
    store = engine.store
    with store.read() as rtxn:
        found, resume = store.scan_location(rtxn, location, after, limit)
    return [["c", ref, rec[0], rec[2], pack(rec[3])] for ref, rec in found], resume


def g_copy_batch(
    tx: Transaction, location: int, after: bytes | None = None, limit: int = 1000
) -> Op:
    """Generator op: :func:`copy_batch` for a restore copy while traffic runs (ha.md §7).

    Read-locks the batch's objects in ``tx`` and reads them again under the
    locks; the caller keeps ``tx`` open until the target applied the records
    durably, then ends it.  So a write of one of them either committed before
    the read (the record has it) or waits for the batch and reaches the target
    after it, as a replica write set (the target applies those with
    ``catching_up``: a write to an object the copy has not brought yet is a
    whole-state ``u``).  A delete can never be overtaken by an older copy.
    Returns ``(records, resume)``.
    """
    store = tx.engine.store
    with store.read() as rtxn:
        found, resume = store.scan_location(rtxn, location, after, limit)
    refs = [ref for ref, _ in found]
    yield from tx.need_all(refs, READ)  # type: ignore[arg-type]
    out: list[list[Any]] = []
    with store.read() as rtxn:
        for ref in refs:
            raw = rtxn.get(ref, db=store.objects)
            if raw is not None:  # (deleted between the scan and the lock: not copied)
                rec = store.record(raw, ref)
                out.append(["c", ref, rec[0], rec[2], pack(rec[3])])
    return out, resume


def iter_location(engine: Engine, location: int, batch: int = 1000) -> Iterator[list[list[Any]]]:
    """Every object of ``location`` as batches of ``c`` records (:func:`copy_batch` in a loop)."""
    after: bytes | None = None
    while True:
        records, after = copy_batch(engine, location, after, batch)
        if records:
            yield records
        if after is None:
            return


__all__ = [
    "KINDS",
    "Applied",
    "Record",
    "ReplicaGap",
    "apply_write_set",
    "apply_write_set_async",
    "copy_batch",
    "g_apply",
    "g_copy_batch",
    "iter_location",
    "parse_write_set",
    "write_set_records",
]
