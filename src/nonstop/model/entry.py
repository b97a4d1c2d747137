"""What a transaction knows of each object it touched: lock and status codes.

Shared by embedded transactions (:mod:`nonstop.tx.transaction`) and remote ones
(:mod:`nonstop.client.remote`): one definition, small ints for the hot path.
"""

from __future__ import annotations

CLEAN, DIRTY, CREATED, DELETED, CREATED_DELETED = range(5)
"""An entry's status: read only, written, created here, deleted, created then deleted.
``status >= DELETED`` means the object is gone for this transaction."""

__all__ = ["CLEAN", "CREATED", "CREATED_DELETED", "DELETED", "DIRTY"]
