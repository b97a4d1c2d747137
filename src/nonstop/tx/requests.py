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
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from nonstop.errors import BadArgument, RequestExpired
from nonstop.model.codec import pack, unpack

if TYPE_CHECKING:
    from nonstop.database import Database
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
    prefix = _prefix(client)
    results = db._store.results
    key = prefix + _SEQ.pack(seq)

    def body(tx: Transaction) -> tuple[bool, Any]:
        # Lock the request's slot *before* looking for its result, so that two
        # concurrent retries cannot both find nothing and both run.
        tx._lock_blocking((b"request", key), _write_mode())
        raw = tx._raw_get(results, key)
        if raw is not None:
            ok, value = unpack(raw)
            return ok, value
        low_raw = tx._raw_get(results, prefix + _LOW)
        low = 0 if low_raw is None else _SEQ.unpack(low_raw)[0]
        if seq < low:
            raise RequestExpired(
                f"request {seq} of client {client!r} is older than the {window} results "
                f"kept (oldest kept: {low}); its outcome is no longer known here"
            )
        try:
            value = fn(tx, *args, **kwargs)
            outcome = (True, value)
        except Abort as exc:
            tx._discard_changes()
            outcome = (False, str(exc))
        try:
            record = pack(list(outcome))
        except TypeError as exc:
            raise BadArgument(f"the result of request {seq} cannot be stored: {exc}") from None
        tx._raw_ops.append((True, results, key, record))
        new_low = seq + 1 - window
        if new_low > low:
            # Concurrent requests of one client may both slide the window: serialize
            # the update and never move the mark backwards.
            tx._lock_blocking((b"request-low", prefix), _write_mode())
            low_raw = tx._raw_get(results, prefix + _LOW)
            low = 0 if low_raw is None else _SEQ.unpack(low_raw)[0]
        if new_low > low:
            tx._raw_ops.append((True, results, prefix + _LOW, _SEQ.pack(new_low)))
            stale = prefix + _SEQ.pack(new_low)
            with db._store.read() as rtxn:
                cur = rtxn.cursor(db=results)
                if cur.set_range(prefix + _SEQ.pack(low)):
                    for old in cur.iternext(values=False):
                        if old >= stale or not old.startswith(prefix) or old == prefix + _LOW:
                            break
                        tx._raw_ops.append((False, results, old, None))
        return outcome

    ok, value = run_with_retries(db, body, isolation=isolation)
    if not ok:
        raise Abort(value)
    return value  # type: ignore[no-any-return]


def _write_mode() -> Any:
    from nonstop.tx.locks import LockMode

    return LockMode.WRITE


__all__ = ["DEFAULT_WINDOW", "run_request"]
