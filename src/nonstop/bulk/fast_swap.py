"""An overwrite's swap without a transaction entry per object (data-path.md §6.2).

The general swap (``bulk.handlers._g_swap``'s per-object path) loads every old
object into the transaction (``by_ref`` + ``delete``) and creates every new one
with ``create``: an :class:`Entry`, its state dict and handle per object, about
2.2 KB of node memory and ~60 µs of CPU per object swapped.  This path builds
the store operations of a page of old objects, or of one staged part of new
ones, in a few loops and hands them to the transaction as raw operations
(``tx.write_raw``), as the bulk upsert's fast path does (:mod:`nonstop.bulk.fast`).
The swap still commits as ONE transaction (locally, or as one branch of a
two-phase commit), so what a reader sees is unchanged:

* every old object is deleted under a WRITE lock on its reference, and every
  unique key value it gives up or a new object takes is WRITE-locked
  (``(index, key bytes)``, the lock a create's claim takes) — the locks the
  per-object path takes, taken a page at a time in ONE lock-table call each;
* a record is read only once its lock is held (a concurrent writer commits
  before it releases its lock), so nothing deleted is stale;
* a new key value that the committed index gives to an object this swap does
  not delete (a phantom created meanwhile, or another type's object sharing
  the index) is a :class:`~nonstop.errors.DuplicateKey`: nothing is swapped.

It covers (:func:`covered_key`) a type with one concrete type, no delete trigger,
no reference fields (a reference needs a read lock on the object it names),
and exactly one unique key (the one the rows were staged by).  Other types
take the per-object path; those whose unique key's index is their own take the
bounded swap (:mod:`nonstop.bulk.swap_apply`), which builds its pages with
:func:`delete_ops` and ``bulk.fast.create_ops`` too.

What is still per object until the commit ends here (and so O(old + new), see
data-path.md §6.3): the raw operations and the prepared record that holds them,
the locks, and the new key values seen (for the duplicate check across parts).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Generator
from itertools import repeat
from typing import TYPE_CHECKING, Any

from nonstop.bulk import fast as bulk_fast
from nonstop.bulk import records as bulk_records
from nonstop.bulk.keys import encode_keys
from nonstop.errors import DuplicateKey, TypeVersionMismatch
from nonstop.model.ref import location_prefix
from nonstop.store.lmdb_store import count_key
from nonstop.tx.locks import LockMode

if TYPE_CHECKING:
    from nonstop.model.managed import KeyInfo, TypeInfo
    from nonstop.tx.transaction import Transaction

NEED_ALL = "need_all"
"""Step: lock every resource of a list in one mode (``tx.need_all``)."""
Step = tuple[str, tuple[Any, ...], dict[str, Any]]
Steps = Generator[Step, Any, Any]
_WRITE = LockMode.WRITE


def covered_key(info: TypeInfo) -> KeyInfo | None:
    """The unique key this path swaps the type by, or None if it does not cover the
    type (see the module docstring): the per-object path swaps it."""
    concrete = info.concrete_types()
    uniques = [k for k in info.keys.values() if k.options.unique]
    if len(concrete) != 1 or concrete[0] is not info or len(uniques) != 1:
        return None
    if info.has_on_delete or info.ref_fields:
        return None
    return uniques[0]


def g_delete_page(tx: Transaction, info: TypeInfo, refs: list[bytes]) -> Steps:
    """Steps deleting the objects ``refs`` (a page of the type's extent); returns how
    many were there to delete (one deleted meanwhile is skipped)."""
    yield (NEED_ALL, (refs, _WRITE), {})
    store = tx.engine.store
    # (the records are read after the locks: nothing in them can change any more)
    removal = delete_ops(store, info, refs)
    if removal is None:  # (all deleted by transactions that committed meanwhile)
        return 0
    ops, counts, slots = removal
    if slots:
        yield (NEED_ALL, (slots, _WRITE), {})  # given up: a creator waits for us
    tx.write_raw(ops, counts=counts)
    return -sum(counts.values())


def delete_ops(
    store: Any, info: TypeInfo, refs: list[bytes]
) -> tuple[list[Any], dict[bytes, int], list[Any]] | None:
    """The store operations deleting the objects ``refs`` of ``info`` that exist (their
    records, extent entries, every index entry), the count changes, and the unique
    ``(index, key bytes)`` slots they give up; None if none of them exists."""
    objects = store.objects
    with store.read() as rtxn:
        get = rtxn.get
        raws = [get(r, db=objects) for r in refs]
    present = [(r, raw) for r, raw in zip(refs, raws, strict=True) if raw is not None]
    if not present:
        return None
    refs = [r for r, _ in present]
    recs = bulk_records.decode_all(store, [raw for _, raw in present], refs)
    newest = max(rec[1] for rec in recs)
    if newest > info.version:
        raise TypeVersionMismatch(
            f"the store holds {info.name} version {newest}; this process defines "
            f"version {info.version}"
        )
    states = [rec[3] for rec in recs]
    # Column by column: the objects, their extent entries, every index entry.
    removals: list[Any] = []
    slots: list[Any] = []
    for name, key in info.keys.items():
        db = store.index_db(key.db_name, unique=key.options.unique)
        default = info.fields[name].make_default()
        col = [st.get(name, default) for st in states]  # (an older type version: default)
        if key.options.unique:
            kbs = encode_keys([v for v in col if v is not None])  # (None is not indexed)
            removals.extend(zip(repeat(False), repeat(db), kbs, repeat(None)))
            slots.extend(zip(repeat(key.db_name), kbs))
        else:
            removals.extend(zip(repeat(False), repeat(db), encode_keys(col), refs))
    prefix = info.name.encode() + b"\x00"
    removals.extend(zip(repeat(False), repeat(objects), refs, repeat(None)))
    removals.extend(
        zip(repeat(False), repeat(store.extents), [prefix + r for r in refs], repeat(None))
    )
    # Counts are kept per (type, location): the old objects may sit in several.
    per_location = Counter(count_key(info.name.encode(), r) for r in refs)
    return removals, {k: -n for k, n in per_location.items()}, slots


def g_create_part(
    tx: Transaction,
    info: TypeInfo,
    key: KeyInfo,
    names: list[str],
    cols: list[list[Any]],
    seen: set[bytes],
) -> Steps:
    """Steps creating one staged part's objects (validated columns ``names``/``cols``,
    no duplicate key within the part); ``seen``: the key values earlier parts took
    (a value again is a DuplicateKey).  Must follow the deletion of the old objects:
    a key value still indexed then belongs to an object this swap does not delete."""
    if not cols or not cols[0]:
        return 0
    kcol = cols[names.index(key.field)]
    kbs = encode_keys(kcol)
    again = seen.intersection(kbs)
    if again:
        shown = _shown(kcol, kbs, again)
        raise DuplicateKey(f"{info.name}.{key.field} = {shown} appears in two parts")
    seen.update(kbs)
    yield (NEED_ALL, ([(key.db_name, kb) for kb in kbs], _WRITE), {})
    store = tx.engine.store
    index = store.index_db(key.db_name, unique=True)
    locks, me = tx.engine.locks, tx.id
    with store.read() as rtxn:
        get = rtxn.get
        held = [(kb, bytes(r)) for kb in kbs if (r := get(kb, db=index)) is not None]
    # Taken by an object this swap deletes: it holds that object's WRITE lock.
    taken = [kb for kb, r in held if locks.mode_held(me, r) != _WRITE]
    if taken:
        shown = _shown(kcol, kbs, set(taken))
        raise DuplicateKey(f"{info.name}.{key.field} = {shown} is already taken")
    ops: list[Any] = []
    bulk_fast.create_ops(tx.engine.store, info, names, cols, list(range(len(kbs))), kbs, index, ops)
    # (a bulk write creates in the store's own location, as create does)
    own = location_prefix(store.location)
    tx.write_raw(ops, counts={count_key(info.name.encode(), own): len(kbs)})
    return len(kbs)


def _shown(values: list[Any], kbs: list[bytes], which: set[bytes]) -> str:
    """The first few of ``values`` whose encoded key is in ``which`` (an error message)."""
    return ", ".join(repr(v) for v, kb in zip(values, kbs, strict=True) if kb in which)[:200]
