"""The recent two-phase-commit branches of one store, in the order they became visible.

A snapshot transaction on a cluster reads each node's store through one read
view (``Transaction.committed``).  Views opened on several nodes form a
consistent cut only if no distributed commit is visible in one of them and not
in another; ``nonstop.dataplane.snapshot_cut`` checks that with this journal
(docs/design/snapshot-stamps.md).  For each branch of a distributed
transaction (named by its gtid) it records *after* the store made it visible:

* ``prepared`` — its prepared record is durable (before the node votes yes);
* ``applied`` — its commit's effects are durable and visible (phase two).

Each note gets the next value of one counter.  A note is made after the store
commit it describes, so a view opened after reading the counter as ``c``
contains every branch noted at ``<= c``; one noted later may or may not be in it.

Entries are dropped ``keep`` seconds after they were noted; the cut check
refuses to decide (and retries) when it ran longer than a fraction of that,
so it never needs a dropped entry.  Memory: about 100 bytes per distributed
commit in the last ``keep`` seconds.  Thread-safe (notes come from the store's
writer thread, questions from the event loop).  Sans clock: callers pass ``now``.
"""

from __future__ import annotations

import threading
from collections import deque

KEEP_SECONDS = 10.0
"""How long a note is kept (``nonstop.dataplane.snapshot_cut.MAX_CUT_SECONDS`` is less)."""


class CommitJournal:
    """Counter-stamped notes of prepared and applied two-phase branches (module doc)."""

    def __init__(self, keep: float = KEEP_SECONDS) -> None:
        self.keep = keep
        self.counter = 0
        """The last stamp handed out (read it before and after opening a view)."""
        self._lock = threading.Lock()
        self._prepared: deque[tuple[int, float, str]] = deque()
        self._applied: dict[str, int] = {}
        self._applied_order: deque[tuple[int, float, str]] = deque()
        self._dropped = 0
        """The highest stamp of a ``prepared`` note dropped (0: none)."""

    def note_prepared(self, gtid: str, now: float) -> None:
        """The prepared record of ``gtid`` is durable here."""
        with self._lock:
            self.counter += 1
            self._prepared.append((self.counter, now, gtid))
            self._expire(now)

    def note_applied(self, gtid: str, now: float) -> None:
        """The commit of ``gtid`` is durable and visible here."""
        with self._lock:
            self.counter += 1
            self._applied[gtid] = self.counter
            self._applied_order.append((self.counter, now, gtid))
            self._expire(now)

    def prepared_since(self, stamp: int, now: float) -> list[str] | None:
        """The gtids whose prepare was noted after ``stamp``; None if some were dropped."""
        with self._lock:
            self._expire(now)
            if self._dropped > stamp:
                return None
            out: list[str] = []
            for s, _, gtid in reversed(self._prepared):
                if s <= stamp:
                    break
                out.append(gtid)
            return out

    def applied_stamp(self, gtid: str) -> int | None:
        """The stamp of ``gtid``'s ``applied`` note, if it is still kept."""
        with self._lock:
            return self._applied.get(gtid)

    def _expire(self, now: float) -> None:
        horizon = now - self.keep
        prepared = self._prepared
        while prepared and prepared[0][1] < horizon:
            self._dropped = prepared.popleft()[0]
        applied = self._applied_order
        while applied and applied[0][1] < horizon:
            _, _, gtid = applied.popleft()
            self._applied.pop(gtid, None)


__all__ = ["KEEP_SECONDS", "CommitJournal"]
