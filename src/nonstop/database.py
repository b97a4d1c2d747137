"""``nonstop.database``: where :class:`Database` and :func:`open` were first defined.

They live in :mod:`nonstop.tx.database` (next to the transactions they hand
out, so that ``nonstop.tx`` does not import back up into the root package);
this module keeps the old import path working.
"""

from nonstop.tx.database import (
    DEFAULT_LOCK_TIMEOUT,
    DURABILITY_MODES,
    Database,
    InDoubt,
    TransactionContext,
    open,
)

__all__ = [
    "DEFAULT_LOCK_TIMEOUT",
    "DURABILITY_MODES",
    "Database",
    "InDoubt",
    "TransactionContext",
    "open",
]
