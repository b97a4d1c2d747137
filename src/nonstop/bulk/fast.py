"""The bulk upsert's fast path: one batch's write set built directly (data-path.md §6.2).

The general path (``bulk._apply_upsert``) makes a transaction :class:`Entry` per
row, which costs ~15 µs of Python per row.  This one builds the records, index
operations and count change of the whole batch in a few loops and appends them
to the transaction's raw operations, so the batch still commits as ONE ordinary
transaction (with its tag record) and releases its locks after the commit.

Guarantees, as the general path:

* Serializable against concurrent transactions: before anything is decided the
  batch holds a WRITE lock on every object it updates (its reference) and on
  every key value it creates (``(index, key bytes)``, the lock a create's
  claim takes), all taken in one lock-table call (waits, deadlock detection and the
  lock timeout only for those not free).  With the locks held, the index is
  read again when anything committed since the first read, until stable.
* Bad input raises before the commit: nothing of the batch is written.

It applies only to types it covers exactly (:func:`covers`): one concrete type,
whose only unique key is the upsert key, without references (they need a read
lock on the object named) and without ``on_update`` triggers (the only way an
upsert runs application code or queues asynchronous methods).  Other types
take the general path.
"""

from __future__ import annotations

from itertools import repeat
from typing import TYPE_CHECKING, Any

from nonstop.bulk.keys import encode_keys
from nonstop.errors import Conflict, DuplicateKey, FieldError, ImmutableKey, TypeVersionMismatch
from nonstop.model.codec import encode_key, pack, pack_each
from nonstop.model.ref import location_prefix
from nonstop.store.lmdb_store import count_key
from nonstop.store.records import pack_record, seal
from nonstop.tx.locks import LockMode

if TYPE_CHECKING:
    from nonstop.model.managed import KeyInfo, TypeInfo
    from nonstop.tx.transaction import Transaction

_WRITE = LockMode.WRITE


def covers(info: TypeInfo, key: KeyInfo) -> bool:
    """Can the fast path write this type's batches (see the module docstring)?"""
    concrete = info.concrete_types()
    uniques = [k for k in info.keys.values() if k.options.unique]
    return (
        len(concrete) == 1
        and concrete[0] is info
        and not info.has_on_update
        and not info.ref_fields
        and uniques == [key]
    )


def _read(store: Any, index: Any, kbs: list[bytes]) -> tuple[list[Any], list[Any]]:
    """Each key value's object reference and record, from ONE read snapshot."""
    objects = store.objects
    with store.read() as rtxn:
        get = rtxn.get
        refs = [get(kb, db=index) for kb in kbs]
        raws = [None if r is None else get(r, db=objects) for r in refs]
    return refs, raws


def _lock(tx: Transaction, resources: list[Any]) -> None:
    # The free ones in one lock-table call; wait for those held by others (deadlock
    # detection, lock timeout).
    tx.drive(tx.need_all(resources, _WRITE))


def upsert(
    tx: Transaction,
    info: TypeInfo,
    key: KeyInfo,
    names: list[str],
    cols: list[list[Any]],
    kbs: list[bytes],
) -> tuple[int, int]:
    """Insert or update the batch's rows (validated columns ``names``/``cols``, the key
    column among them, no duplicate key; ``kbs`` its encoded values) in ``tx``; returns
    (inserted, updated)."""
    store = tx.engine.store
    index = store.index_db(key.db_name, unique=True)
    kcol = cols[names.index(key.field)]
    slot_db = key.db_name
    # Read where every key value is, lock exactly that (the object, or the absent value),
    # and trust the read if nothing committed meanwhile (commit_seq is bumped before a
    # committer releases its locks); else read again under the locks until stable.
    seq = store.commit_seq
    refs, raws = _read(store, index, kbs)
    _lock(tx, [(slot_db, kb) if r is None else r for kb, r in zip(kbs, refs, strict=True)])
    for _ in range(100):
        if store.commit_seq == seq:
            break
        seq = store.commit_seq
        now, raws = _read(store, index, kbs)
        moved = [i for i, r in enumerate(now) if r != refs[i]]
        refs = now
        if not moved:
            break
        _lock(tx, [(slot_db, kbs[i]) if now[i] is None else now[i] for i in moved])
    else:
        raise Conflict(f"{info.name}: the batch's key values kept changing under its locks")

    fields = info.fields
    rows = list(zip(*cols, strict=True))
    created = [i for i, r in enumerate(refs) if r is None]
    ops: list[Any] = []
    removals: list[Any] = []
    counts = None
    if created:
        create_ops(tx.engine.store, info, names, cols, created, kbs, index, ops)
        # (a bulk write creates in the store's own location, as create does)
        own = location_prefix(store.location)
        counts = {count_key(info.name.encode(), own): len(created)}
    updated = 0
    if len(created) < len(rows):
        pos = {n: i for i, n in enumerate(names)}
        key_dbs = {
            n: store.index_db(k.db_name, unique=k.options.unique)
            for n, k in info.keys.items()
            if n in pos and n != key.field
        }
        immutable = {n for n in key_dbs if not fields[n].key.mutable}  # type: ignore[union-attr]
        name_b, tv = info.name, info.version
        objects = store.objects
        for i, ref in enumerate(refs):
            if ref is None:
                continue
            tname, tver, version, state = store.record(raws[i], ref)
            if tname != name_b:  # a sibling type's object shares the key's index
                raise DuplicateKey(f"{key.owner}.{key.field} = {kcol[i]!r} is already taken")
            if tver > tv:
                raise TypeVersionMismatch(
                    f"the store holds {tname} version {tver}; this process defines version {tv}"
                )
            if len(state) != len(fields) or tver != tv:  # transparent type change (E3)
                state = {n: state[n] if n in state else f.make_default() for n, f in fields.items()}
            row = rows[i]
            changed = [
                (n, v)
                for n, v in zip(names, row, strict=True)
                if not (state[n] == v and type(state[n]) is type(v))
            ]
            if not changed:
                continue
            for n, v in changed:
                if n in key_dbs:
                    if n in immutable:
                        raise ImmutableKey(
                            f"{info.name}.{n} is an immutable key; it cannot change after create"
                        )
                    # Non-unique index (the only unique key is the upsert key).
                    removals.append((False, key_dbs[n], encode_key(state[n]), ref))
                    ops.append((True, key_dbs[n], encode_key(v), ref))
                state[n] = v
            ops.append((True, objects, ref, _record(info, version + 1, state)))
            updated += 1
    tx.write_raw(removals + ops, counts=counts, first=True)  # before the tag record
    return len(created), updated


def create_ops(
    store: Any,
    info: TypeInfo,
    names: list[str],
    cols: list[list[Any]],
    created: list[int],
    kbs: list[bytes],
    index: Any,
    ops: list[Any],
) -> None:
    """Records, extent entries and index entries of the batch's new objects (in ``store``)."""
    fields = info.fields
    given = dict(zip(names, cols, strict=True))
    missing = [f.name for f in info.required if f.name not in given]
    if missing:
        raise FieldError(f"{info.name} needs a value for {', '.join(map(repr, missing))}")
    whole = len(created) == len(kbs)
    # The records, packed column by column: msgpack of [name, type version, 1, {field:
    # value}] is a fixed head, then each field's packed name and packed value in field
    # order — the same bytes as packing the dict, with no dict and no Python per row.
    fvalues: dict[str, list[Any] | None] = {}  # field -> its values (None: a constant)
    seq: list[Any] = [repeat(_head(info))]
    try:
        for n, f in fields.items():
            col = given.get(n)
            if col is None and f.default_factory is not None:
                col = [f.default_factory() for _ in created]
            elif col is not None and not whole:
                col = [col[i] for i in created]
            fvalues[n] = col
            seq.append(repeat(pack(n)))
            seq.append(repeat(pack(f.make_default())) if col is None else map(pack_each, col))
        # (zip not strict: the constant columns repeat without end)
        records = list(map(seal, map(b"".join, zip(*seq, strict=False))))
    except (TypeError, ValueError, OverflowError):
        fnames = list(fields)
        for i in created:  # find the row and say which field (FieldError)
            row = {n: (given[n][i] if n in given else fields[n].make_default()) for n in fnames}
            pack_record(info, 1, row)
        raise
    new_refs = store.new_refs(len(records))
    prefix = info.name.encode() + b"\x00"
    ops.extend(zip(repeat(True), repeat(store.objects), new_refs, records))
    ops.extend(
        zip(repeat(True), repeat(store.extents), [prefix + r for r in new_refs], repeat(b""))
    )
    ckbs = kbs if whole else [kbs[i] for i in created]
    ops.extend(zip(repeat(True), repeat(index), ckbs, new_refs))
    for n, k in info.keys.items():
        if k.options.unique:
            continue  # the upsert key, above (covers(): the only unique one)
        db = store.index_db(k.db_name, unique=False)
        col = fvalues[n]
        if col is not None:
            kbs_n = encode_keys(col)
            ops.extend(zip(repeat(True), repeat(db), kbs_n, new_refs, strict=False))
        else:  # a constant default
            kb = encode_key(fields[n].make_default())
            ops.extend((True, db, kb, r) for r in new_refs)


def _head(info: TypeInfo) -> bytes:
    """A new record's bytes before its first field: array of 4, name, type version,
    object version 1, the header of a map of every field."""
    n = len(info.fields)
    fixed = pack([info.name, info.version, 1])[1:]  # (a 3-item array's header is 1 byte)
    return b"\x94" + fixed + (bytes([0x80 | n]) if n < 16 else b"\xde" + n.to_bytes(2, "big"))


def _record(info: TypeInfo, version: int, state: dict[str, Any]) -> bytes:
    return _record_list([info.name, info.version, version, state], info)


def _record_list(rec: list[Any], info: TypeInfo) -> bytes:
    try:
        return seal(pack(rec))
    except (TypeError, ValueError, OverflowError):
        return pack_record(info, rec[2], rec[3])  # raises FieldError naming the field
