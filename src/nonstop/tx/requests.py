"""Exactly-once requests (H1): a retried request returns the first execution's result.

Every client request carries a unique id: ``(client id, sequence number)``,
sequence numbers increasing per client.  :func:`run_request` runs the request's
transaction *and records its result in that same transaction*, in the store's
``results`` database.  A retry — after a timeout, a lost reply or a reconnect —
finds the recorded result and returns it without running anything: the commit
and its "done" mark are one atomic write, so there is no window in which the
effects are durable but the mark is not.

The log is bounded per client: it keeps the results of the client's last
``window`` sequence numbers (default 1,024).  A client never has more than
``window`` requests outstanding, so every retry it can make is still covered.
A request whose sequence number fell out of the window raises
:class:`~nonstop.errors.RequestExpired` — it is never executed a second time
(the effects may or may not be there; the client must treat it as an unknown
outcome and reconcile).  Results are msgpack values: return plain data.

Layout: ``results`` key = client id (UTF-8) + 0x00 + 8-byte sequence → msgpack
``[ok, value]``; the key ``client id + 0x00 + "low"`` holds the lowest sequence
still guaranteed.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Generator, Iterator
from typing import TYPE_CHECKING, Any, TypeVar, cast

from nonstop.errors import BadArgument, RequestExpired
from nonstop.model.codec import pack, unpack
from nonstop.store.group_commit import Op as StoreOp
from nonstop.tx.locks import LockMode

if TYPE_CHECKING:
    from nonstop.tx.database import Database
    from nonstop.tx.transaction import Transaction

T = TypeVar("T")
DEFAULT_WINDOW = 1024
_SEQ = struct.Struct(">Q")
_LOW = b"low"


def _prefix(client: str) -> bytes:
    if not client or "\x00" in client:
        raise BadArgument("a client id is a non-empty string without NUL characters")
    return client.encode() + b"\x00"


def run_request(
    db: Database,
    client: str,
    seq: int,
    fn: Callable[..., T],
    *args: Any,
    window: int = DEFAULT_WINDOW,
    isolation: str = "serializable",
    **kwargs: Any,
) -> T:
    """Run ``fn(tx, *args, **kwargs)`` once for request ``(client, seq)``; replay-safe.

    Replayed on deadlock like ``@transactional``.  If ``fn`` raises
    :class:`~nonstop.errors.Abort` the abort is recorded too, so a retry raises the
    same ``Abort`` again instead of running.  Other exceptions are not recorded
    (nothing committed, so running again is correct).
    """
    from nonstop.errors import Abort
    from nonstop.tx.runner import run_with_retries

    if not isinstance(seq, int) or seq < 0:
        raise BadArgument("a request sequence number is an int >= 0")
    if window < 1:
        raise BadArgument("window must be >= 1")
    _key(client, seq)  # a bad id fails before any transaction starts

    def body(tx: Transaction) -> tuple[bool, Any]:
        found = tx.drive(g_claim_request(tx, client, seq, window))
        if found is not None:
            return cast(tuple[bool, Any], found)
        try:
            value = fn(tx, *args, **kwargs)
            outcome: tuple[bool, Any] = (True, value)
        except Abort as exc:
            tx.discard_changes()
            outcome = (False, str(exc))
        tx.drive(g_record_result(tx, client, seq, outcome[0], outcome[1], window))
        return outcome

    ok, value = run_with_retries(db, body, isolation=isolation)
    if not ok:
        raise Abort(value)
    return value  # type: ignore[no-any-return]


def _key(client: str, seq: int) -> tuple[bytes, bytes]:
    if not isinstance(seq, int) or isinstance(seq, bool) or seq < 0:
        raise BadArgument("a request sequence number is an int >= 0")
    prefix = _prefix(client)
    return prefix, prefix + _SEQ.pack(seq)


def g_claim_request(
    tx: Transaction, client: str, seq: int, window: int = DEFAULT_WINDOW
) -> Generator[tuple[Any, Any], None, tuple[bool, Any] | None]:
    """Generator op: lock request ``(client, seq)`` in ``tx``; its recorded ``(ok, value)`` or None.

    Drive it with ``tx.drive`` (threads) or ``await tx.adrive`` (asyncio).  The
    slot is locked *before* the result is looked for, so two concurrent retries
    cannot both find nothing and both run.  ``RequestExpired`` below the window.
    """
    if window < 1:
        raise BadArgument("window must be >= 1")
    prefix, key = _key(client, seq)
    store = tx.engine.store
    results = store.results
    yield from tx.need((b"request", key), LockMode.WRITE)
    with store.read() as rtxn:  # one snapshot for both reads
        raw = rtxn.get(key, db=results)
        low_raw = None if raw is not None else rtxn.get(prefix + _LOW, db=results)
    if raw is not None:
        ok, value = unpack(bytes(raw))
        return bool(ok), value
    low = 0 if low_raw is None else _SEQ.unpack(bytes(low_raw))[0]
    if seq < low:
        raise RequestExpired(
            f"request {seq} of client {client!r} is older than the {window} results "
            f"kept (oldest kept: {low}); its outcome is no longer known here"
        )
    return None


def g_record_result(
    tx: Transaction, client: str, seq: int, ok: bool, value: Any, window: int = DEFAULT_WINDOW
) -> Generator[tuple[Any, Any], None, None]:
    """Generator op: write ``(ok, value)`` as the result of ``(client, seq)`` in ``tx``'s commit.

    Call after :func:`g_claim_request` found nothing, in the same transaction:
    the result becomes durable exactly when (and only if) ``tx`` commits.  It
    also slides the client's window, dropping results that fell out of it.
    """
    prefix, key = _key(client, seq)
    engine = tx.engine
    results = engine.store.results
    try:
        record = pack([ok, value])
    except TypeError as exc:
        raise BadArgument(f"the result of request {seq} cannot be stored: {exc}") from None
    tx.write_raw([(True, results, key, record)])
    low_raw = engine.get_raw(results, prefix + _LOW)
    low = 0 if low_raw is None else _SEQ.unpack(low_raw)[0]
    new_low = seq + 1 - window
    if new_low > low:
        # Concurrent requests of one client may both slide the window: serialize
        # the update and never move the mark backwards.
        yield from tx.need((b"request-low", prefix), LockMode.WRITE)
        low_raw = engine.get_raw(results, prefix + _LOW)
        low = 0 if low_raw is None else _SEQ.unpack(low_raw)[0]
    if new_low > low:
        ops: list[StoreOp] = [(True, results, prefix + _LOW, _SEQ.pack(new_low))]
        stale = prefix + _SEQ.pack(new_low)
        with engine.store.read() as rtxn:
            cur = rtxn.cursor(db=results)
            if cur.set_range(prefix + _SEQ.pack(low)):
                for old in cast(Iterator[bytes], cur.iternext(values=False)):
                    if old >= stale or not old.startswith(prefix) or old == prefix + _LOW:
                        break
                    ops.append((False, results, old, None))
        tx.write_raw(ops)


def g_lookup_request(
    tx: Transaction, client: str, seq: int
) -> Generator[tuple[Any, Any], None, tuple[bool, Any] | None]:
    """Generator op: request ``(client, seq)``'s recorded ``(ok, value)`` or None, read once
    its slot is read-locked in ``tx`` (an attempt that claimed it is waited for)."""
    _, key = _key(client, seq)
    yield from tx.need((b"request", key), LockMode.READ)
    raw = tx.engine.get_raw(tx.engine.store.results, key)
    if raw is None:
        return None
    ok, value = unpack(bytes(raw))
    return bool(ok), value


def result_records(tx: Transaction) -> list[list[Any]]:
    """What ``tx`` writes to the ``results`` database, as replication records
    ``["r", key, value or None]`` (None: deleted): a request's record and its window
    mark travel with the transaction's write sets (docs/design/requests.md)."""
    results = tx.engine.store.results
    return [
        ["r", bytes(key), None if not is_put or value is None else bytes(value)]
        for is_put, db, key, value in tx._raw_ops
        if db is results
    ]


def lookup_result(db: Database, client: str, seq: int) -> tuple[bool, Any] | None:
    """The recorded ``(ok, value)`` of request ``(client, seq)``, or None (no lock taken)."""
    _, key = _key(client, seq)
    raw = db.engine.get_raw(db.engine.store.results, key)
    if raw is None:
        return None
    ok, value = unpack(bytes(raw))
    return bool(ok), value


__all__ = [
    "DEFAULT_WINDOW",
    "g_claim_request",
    "g_lookup_request",
    "g_record_result",
    "lookup_result",
    "result_records",
    "run_request",
]
