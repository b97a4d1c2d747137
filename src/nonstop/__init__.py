"""nonstop: a highly available, transactional object store for Python.

Start here:

* :func:`open` — an embedded single-node database (``nonstop.tx.database``);
* :func:`connect` / :func:`connect_async` — a handle on a running cluster
  (status and administration from any node, with fail-over; ``nonstop.client``);
* :class:`Managed`, :func:`key`, :func:`field` — declaring managed types (``nonstop.model``);
* ``db.transaction()`` — transactions, sync and async (``nonstop.tx``);
* :func:`transactional` — run a function as a transaction, replayed on deadlock;
* :func:`asynchronous` — methods that run after commit, exactly once;
* :func:`remote` — methods that run on the object's node when called through a client;
* ``nonstop.errors`` — every error nonstop raises on purpose.
"""

from nonstop.client import AsyncClient, Client, connect, connect_async
from nonstop.errors import (
    Abort,
    Aborted,
    BadArgument,
    Conflict,
    CorruptStore,
    DatabaseClosed,
    Deadlock,
    Deleted,
    DuplicateKey,
    Error,
    FieldError,
    ImmutableKey,
    IncompatibleStore,
    KeyTooLong,
    LockTimeout,
    NotActive,
    NotFound,
    NotRemote,
    ObjectNotInTransaction,
    RequestExpired,
    Retryable,
    SchemaError,
    StoreError,
    StoreLocked,
    TooLarge,
    TooManyRetries,
    TransactionClosed,
    TypeVersionMismatch,
    Unavailable,
    UnknownType,
)
from nonstop.model.fields import field, key
from nonstop.model.managed import Managed
from nonstop.model.ref import Ref
from nonstop.model.remote import remote
from nonstop.tx.async_transaction import AsyncTransaction
from nonstop.tx.asyncmethods import asynchronous
from nonstop.tx.database import Database, open
from nonstop.tx.requests import run_request
from nonstop.tx.runner import transactional
from nonstop.tx.transaction import Transaction, transaction_of

__version__ = "0.1.0"

__all__ = [
    "Abort",
    "Aborted",
    "AsyncClient",
    "AsyncTransaction",
    "BadArgument",
    "Client",
    "Conflict",
    "CorruptStore",
    "Database",
    "DatabaseClosed",
    "Deadlock",
    "Deleted",
    "DuplicateKey",
    "Error",
    "FieldError",
    "ImmutableKey",
    "IncompatibleStore",
    "KeyTooLong",
    "LockTimeout",
    "Managed",
    "NotActive",
    "NotFound",
    "NotRemote",
    "ObjectNotInTransaction",
    "Ref",
    "RequestExpired",
    "Retryable",
    "SchemaError",
    "StoreError",
    "StoreLocked",
    "TooLarge",
    "TooManyRetries",
    "Transaction",
    "TransactionClosed",
    "TypeVersionMismatch",
    "Unavailable",
    "UnknownType",
    "asynchronous",
    "connect",
    "connect_async",
    "field",
    "key",
    "open",
    "remote",
    "run_request",
    "transaction_of",
    "transactional",
]
