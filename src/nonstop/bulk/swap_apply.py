"""The bounded swap: an overwrite whose node memory is bounded per page, not per row.

The fast swap (:mod:`nonstop.bulk.fast_swap`) holds, until its commit ends, a lock,
raw operations and prepared bytes per object swapped: O(old + new).  For the
types it covers whose unique key is their own (no other type shares its index)
this swap instead (data-path.md §6.3):

1. takes the type's gate (:mod:`nonstop.tx.type_gate`) in WRITE: it waits for
   the transactions that touched the type, and none touches it until the swap
   has landed or is dropped — ONE lock instead of one per object and key value;
2. checks, before its transaction may vote, that no key value is in two chosen
   parts: the parts' key values go a chunk at a time into a scratch table of the
   job (``k/<job>/<key bytes>`` in the ``bulk`` database, written and dropped by
   commits of their own; a value already there is the duplicate).  No other type
   indexes those values (the key is the type's own) and every object of the type
   is deleted, so nothing else can hold them;
3. writes, in its transaction, only ``p/<job>`` (the pending swap: type, chosen
   parts, progress) and ``d/<job>``: the prepared record is a few hundred bytes;
4. once the transaction committed, applies the swap in a thread of its own
   (:class:`SwapGate`): the type's extent deleted a page per store commit, then
   the chosen parts created a page per commit, each create commit recording its
   progress in ``p/<job>``; the last commit drops ``p/<job>``, ``j/<job>`` and
   the staged parts.  Only then does the gate open.  An abort drops the gate:
   nothing was applied.

A node restarted in between (:func:`resume`) finds ``p/<job>`` and resumes at its
recorded progress (deleting what is left of the extent first, unless creation
began), or finds the swap's transaction in doubt: its prepared record holds the
gate's lock, and the gate is registered undecided until then.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
import weakref
from collections.abc import Generator, Iterator
from typing import TYPE_CHECKING, Any

from nonstop.bulk import fast as bulk_fast
from nonstop.bulk import fast_swap
from nonstop.bulk.keys import encode_keys
from nonstop.errors import DuplicateKey, LockTimeout
from nonstop.model.codec import pack, unpack
from nonstop.model.ref import location_prefix
from nonstop.runtime.thread_priority import lower_this_thread
from nonstop.store.group_commit import WriteSet
from nonstop.store.lmdb_store import count_key
from nonstop.tx.locks import LockMode
from nonstop.tx.type_gate import gate_resource

if TYPE_CHECKING:
    from nonstop.model.managed import KeyInfo, TypeInfo
    from nonstop.tx.database import Database
    from nonstop.tx.transaction import Transaction

log = logging.getLogger(__name__)

PAGE = 5000
"""Objects deleted or created per store commit when a swap applies (the memory bound)."""
SCRATCH_PAGE = 10_000
"""Key values checked (and scratch entries dropped) per store commit."""
NEED = "need"
"""Step: take a lock (``tx.need``), as in ``bulk.handlers``."""
COMMIT = "commit_raw"
"""Step: commit a write set of the job's own (its scratch) outside the transaction."""
Step = tuple[str, tuple[Any, ...], dict[str, Any]]
Steps = Generator[Step, Any, Any]


def bulk_db(store: Any) -> Any:
    """The ``bulk`` database (plain, registered with the store so that prepared
    records can name it)."""
    return store.index_db(b"bulk", unique=True)


def covered_key(info: TypeInfo) -> KeyInfo | None:
    """The unique key of a type this swap covers, or None: the fast swap's types whose
    unique key's index is their own."""
    key = fast_swap.covered_key(info)
    return key if key is not None and key.owner == info.name else None


def extent_refs(store: Any, rtxn: Any, type_name: str, lo: bytes | None) -> Iterator[bytes]:
    """References of one concrete type's extent from ``lo`` on, in order."""
    prefix = type_name.encode() + b"\x00"
    cur = rtxn.cursor(db=store.extents)
    if not cur.set_range(prefix + (lo or b"")):
        return
    plen = len(prefix)
    for key in cur.iternext(keys=True, values=False):
        if not key.startswith(prefix):
            return
        yield key[plen:]


def keys_with(store: Any, prefix: bytes, limit: int | None = None) -> list[bytes]:
    """Keys of the ``bulk`` database that start with ``prefix`` (the first ``limit``)."""
    out: list[bytes] = []
    bulk = bulk_db(store)  # (before the read: a read snapshot cannot see a newer database)
    with store.read() as rtxn:
        cur = rtxn.cursor(db=bulk)
        if cur.set_range(prefix):
            for k in cur.iternext(keys=True, values=False):
                if not k.startswith(prefix) or len(out) == limit:
                    break
                out.append(bytes(k))
    return out


def part_columns(part: dict[str, Any]) -> tuple[list[str], list[list[Any]]]:
    """A staged part's column names and columns (parts staged as rows by an older
    version are turned into columns)."""
    if "cols" in part:
        return part["names"], part["cols"]
    rows: list[dict[str, Any]] = part["rows"]
    names = list(rows[0]) if rows else []
    return names, [[row[n] for row in rows] for n in names]


def _pending_slot(job: str) -> bytes:
    return b"p/" + job.encode()


def _scratch(job: str) -> bytes:
    return b"k/" + job.encode() + b"/"


# ----------------------------------------------------------- the transaction
def g_swap(tx: Transaction, info: TypeInfo, key: KeyInfo, job: str, parts: list[bytes]) -> Steps:
    """Steps of the swap's transaction (module doc, 1-3); returns (deleted, inserted).
    The caller holds the job's lock and found it not done."""
    name = info.name
    yield (NEED, (gate_resource(name), LockMode.WRITE), {})
    engine = tx.engine
    store = engine.store
    other = engine.gates.get(name)
    if other is not None and other.closed():
        raise LockTimeout(f"an earlier overwrite of {name} is still being applied; retry")
    inserted = yield from _g_check_keys(store, info, key, job, parts)
    deleted = store.count(name)  # (the gate is held: nothing changes the extent)
    gate = SwapGate(tx.db, name, job, tx.id)
    engine.gates[name] = gate
    tx.on_commit(gate.start)
    tx.on_rollback(gate.drop)
    record = {"type": name, "parts": parts, "at": None}
    tx.write_raw([(True, bulk_db(store), _pending_slot(job), pack(record))])
    return deleted, inserted


def _g_check_keys(
    store: Any, info: TypeInfo, key: KeyInfo, job: str, parts: list[bytes]
) -> Generator[Step, Any, int]:
    """No key value in two chosen parts (a part has none twice: checked when staged),
    checked a chunk at a time through the job's scratch table; returns the rows."""
    bulk = bulk_db(store)
    scratch = _scratch(job)
    yield from _g_drop_scratch(store, job)  # (left by an attempt that stopped)
    rows = 0
    for slot in parts:
        raw = _get(store, bulk, slot)
        if raw is None:  # (the job's lock is held: its parts cannot go away)
            raise DuplicateKey(f"staged part {slot!r} of {job!r} is gone")
        names, cols = part_columns(unpack(raw))
        if not cols:
            continue
        kcol = cols[names.index(key.field)]
        rows += len(kcol)
        del cols
        for lo in range(0, len(kcol), SCRATCH_PAGE):
            values = kcol[lo : lo + SCRATCH_PAGE]
            slots = [scratch + kb for kb in encode_keys(values)]
            with store.read() as rtxn:
                get = rtxn.get
                again = [i for i, s in enumerate(slots) if get(s, db=bulk) is not None]
            if again:
                yield from _g_drop_scratch(store, job)
                shown = ", ".join(repr(values[i]) for i in again)[:200]
                raise DuplicateKey(f"{info.name}.{key.field} = {shown} appears in two parts")
            yield (COMMIT, (WriteSet([(True, bulk, s, b"") for s in slots]),), {})
    yield from _g_drop_scratch(store, job)
    return rows


def _g_drop_scratch(store: Any, job: str) -> Steps:
    bulk = bulk_db(store)
    while page := keys_with(store, _scratch(job), SCRATCH_PAGE):
        yield (COMMIT, (WriteSet([(False, bulk, k, None) for k in page]),), {})


def _get(store: Any, db: Any, key: bytes) -> bytes | None:
    with store.read() as rtxn:
        raw = rtxn.get(key, db=db)
        return None if raw is None else bytes(raw)


# ------------------------------------------------------------- applying it
class SwapGate:
    """Keeps a swapped type closed until its swap landed (``nonstop.tx.type_gate.Gate``).

    *Undecided* (no applier yet): the swap's transaction ``owner`` (its id in the
    lock table; a transaction recovered in doubt: the :class:`InDoubt`'s) has not
    ended.  Once it no longer holds the gate's lock it has ended: ``p/<job>``
    committed means apply, else the gate is dropped.
    """

    def __init__(self, db: Database, type_name: str, job: str, owner: object = None) -> None:
        self.db = db
        self.type_name = type_name
        self.job = job
        self.owner = owner
        self.error: BaseException | None = None
        self._mutex = threading.Lock()
        self._thread: threading.Thread | None = None
        self._done = threading.Event()
        """Set once the swap landed or was dropped: the type is open."""
        self._ended = threading.Event()
        """Set once nothing runs any more: open, or the applier failed (:attr:`error`)."""

    def closed(self) -> bool:
        if self._done.is_set():
            return False
        if self._thread is None:
            engine = self.db.engine
            if engine.locks.mode_held(self.owner, gate_resource(self.type_name)) is not None:
                return True  # undecided: its transaction still holds the type
            store = engine.store
            if _get(store, bulk_db(store), _pending_slot(self.job)) is None:
                self.drop()
                return False
            self.start()
        return True

    def start(self) -> None:
        """The swap committed: apply it (once), in a thread of its own."""
        with self._mutex:
            if self._thread is None and not self._done.is_set():
                self._thread = threading.Thread(
                    target=self._run, name=f"swap-{self.job}", daemon=True
                )
                self._thread.start()

    def drop(self) -> None:
        """The swap's transaction rolled back: nothing to apply, the type opens."""
        with self._mutex:
            if self._thread is None:
                self._open()

    def wait(self, timeout: float) -> bool:
        """Block until the swap landed, was dropped or failed (at most ``timeout`` s)."""
        return self._ended.wait(timeout)

    def _open(self) -> None:
        gates = self.db.engine.gates
        if gates.get(self.type_name) is self:
            del gates[self.type_name]
        self._done.set()
        self._ended.set()

    def _run(self) -> None:
        lower_this_thread()  # bulk: the node's event loop goes first (runtime/thread_priority)
        try:
            apply(self.db, self.job)
        except BaseException as exc:  # the type stays closed; a restart resumes
            self.error = exc
            log.exception("overwrite %s of %s: applying the swap failed", self.job, self.type_name)
            self._ended.set()
            return
        with self._mutex:
            self._open()


def apply(db: Database, job: str) -> None:
    """Apply the committed swap ``p/<job>`` from its recorded progress (module doc, 4)."""
    engine = db.engine
    store = engine.store
    bulk = bulk_db(store)
    pslot = _pending_slot(job)
    raw = _get(store, bulk, pslot)
    if raw is None:
        return
    rec = unpack(raw)
    info = engine.type_by_name(rec["type"])
    key = covered_key(info)
    if key is None:
        raise DuplicateKey(f"overwrite {job!r}: {info.name} is no longer swappable in pages")
    parts: list[bytes] = rec["parts"]
    commit = engine.committer.commit
    at = rec["at"]
    if at is None:  # deleting: whatever is left of the extent
        while page := _first_refs(store, info.name):
            removal = fast_swap.delete_ops(store, info, page)
            if removal is not None:
                commit(WriteSet(removal[0], removal[1]))
            del removal, page  # (one page alive at a time: the bound)
        at = [0, 0]
    index = store.index_db(key.db_name, unique=True)
    own = count_key(info.name.encode(), location_prefix(store.location))
    for i in range(at[0], len(parts)):
        part = _get(store, bulk, parts[i])
        if part is None:
            raise DuplicateKey(f"overwrite {job!r}: staged part {parts[i]!r} is gone")
        names, cols = part_columns(unpack(part))
        n = len(cols[0]) if cols else 0
        for lo in range(at[1] if i == at[0] else 0, n, PAGE):
            chunk = [c[lo : lo + PAGE] for c in cols]
            kbs = encode_keys(chunk[names.index(key.field)])
            ops: list[Any] = []
            rows = list(range(len(kbs)))
            bulk_fast.create_ops(store, info, names, chunk, rows, kbs, index, ops)
            ops.append((True, bulk, pslot, pack({**rec, "at": [i, lo + len(kbs)]})))
            commit(WriteSet(ops, {own: len(kbs)}))
            del ops, chunk, kbs  # (one page alive at a time: the bound)
        del cols
    staged = keys_with(store, b"o/" + job.encode() + b"/")
    done: list[tuple[bool, Any, bytes, bytes | None]] = [(False, bulk, s, None) for s in staged]
    done += [(False, bulk, b"j/" + job.encode(), None), (False, bulk, pslot, None)]
    commit(WriteSet(done))


def _first_refs(store: Any, type_name: str) -> list[bytes]:
    with store.read() as rtxn:
        return [bytes(r) for r in itertools.islice(extent_refs(store, rtxn, type_name, None), PAGE)]


# ------------------------------------------------------------- readers, restart
def wait_open(db: Database, info: TypeInfo, timeout: float = 600.0) -> None:
    """Block (a worker thread: bulk reads and writes) until no swap holds a concrete
    type of ``info`` closed; LockTimeout after ``timeout`` s."""
    engine = db.engine
    deadline = time.monotonic() + timeout
    for t in info.concrete_types():
        while (gate := engine.gates.get(t.name)) is not None:
            owner = engine.new_transaction_id()
            free = engine.locks.try_acquire(owner, gate_resource(t.name), LockMode.READ)
            engine.locks.release_all(owner)
            if free and not gate.closed():
                break
            if isinstance(gate, SwapGate) and gate.error is not None:
                raise LockTimeout(
                    f"{t.name}: applying overwrite {gate.job} failed ({gate.error}); "
                    "the node resumes it when it restarts"
                )
            left = deadline - time.monotonic()
            if left <= 0:
                raise LockTimeout(f"{t.name} is being overwritten (a bulk swap); retry")
            if isinstance(gate, SwapGate):
                gate.wait(min(left, 0.05))
            else:
                time.sleep(min(left, 0.05))


def wait_applied(db: Database, type_name: str, timeout: float = 3600.0) -> None:
    """Block until the swap of ``type_name`` that just committed has landed."""
    gate = db.engine.gates.get(type_name)
    if isinstance(gate, SwapGate) and gate.closed() and not gate.wait(timeout):
        raise LockTimeout(f"the overwrite of {type_name} is still being applied")
    if isinstance(gate, SwapGate) and gate.error is not None:
        raise gate.error


_resumed: weakref.WeakSet[Any] = weakref.WeakSet()
"""Engines :func:`resume` ran for."""


def resume(db: Database) -> None:
    """At start: swaps committed but not applied resume; swaps in doubt keep their
    type closed until their outcome (module doc).  Idempotent."""
    engine = db.engine
    if engine in _resumed:
        return
    _resumed.add(engine)
    store = engine.store
    bulk = bulk_db(store)
    for slot in keys_with(store, b"p/"):
        job = slot[2:].decode()
        raw = _get(store, bulk, slot)
        if raw is None:
            continue
        name = unpack(raw)["type"]
        if name not in engine.gates:
            gate = SwapGate(db, name, job)
            engine.gates[name] = gate
            gate.start()
    for gtid in engine.prepared.gtids():
        doubt = engine.prepared.get(gtid)
        ws = getattr(doubt, "ws", None)
        for is_put, target, k, value in ws.ops if ws is not None else ():
            if is_put and target is bulk and k.startswith(b"p/") and value is not None:
                name = unpack(value)["type"]
                owner = getattr(doubt, "id", None)
                engine.gates.setdefault(name, SwapGate(db, name, k[2:].decode(), owner))


__all__ = [
    "PAGE",
    "SwapGate",
    "apply",
    "covered_key",
    "g_swap",
    "resume",
    "wait_applied",
    "wait_open",
]
