"""Every error nonstop raises on purpose.  All derive from :class:`nonstop.Error`.

Errors a transaction runner replays transparently derive from :class:`Retryable`.
"""

from __future__ import annotations


class Error(Exception):
    """Base class of every nonstop error."""


# ----------------------------------------------------------- transactions
class Retryable(Error):
    """The transaction was rolled back and may simply be run again."""


class Deadlock(Retryable):
    """This transaction was chosen as the victim of a deadlock and rolled back (B4)."""


class LockTimeout(Retryable):
    """A lock could not be obtained within the lock-wait timeout (distributed deadlock, B4)."""


class Conflict(Retryable):
    """The object changed under this transaction (a state conflict, B7); rolled back."""


class BranchRolledBack(Retryable):
    """A participant node already rolled back its part of this transaction (it idled past
    ``branch_idle``, or the coordinator looked down); the transaction was rolled back."""


class NotActive(Retryable):
    """The node asked does not act for the partition (at the epoch) the transaction touched
    there: the partition failed over or moved (ha.md, routing by partition).  The
    transaction was rolled back; run again, it is routed to the partition's active node."""


class NotCommitted(Retryable):
    """The transaction did not commit and never will.  Its commit's reply was lost with
    the node that coordinated it, and the request's outcome was then *settled* at its
    home: the active node of the home object's partition recorded "not committed" for the
    request id (replicated like a commit), so no attempt of that id can commit after it
    (docs/design/requests.md section 3).  Nothing of it is anywhere: run it again
    (``@nonstop.transactional`` does)."""


class TooManyRetries(Error):
    """A transactional function was replayed ``max_retries`` times without committing."""


class Abort(Error):
    """Raise inside a transaction to roll it back; re-raised to the caller."""


class TransactionClosed(Error):
    """The transaction already committed or rolled back; it cannot be used any more."""


class ObjectNotInTransaction(Error):
    """A managed object was touched outside the transaction it was obtained in."""


# ------------------------------------------------------------ data model
class SchemaError(Error):
    """A managed type is declared wrongly (bad field type, bad key declaration)."""


class FieldError(Error, AttributeError):
    """Unknown field, wrong value type, or a required field left out."""


class ImmutableKey(Error):
    """An immutable key field was assigned after the object was created (A4)."""


class DuplicateKey(Error):
    """A unique key value is already taken; nothing was written (A4)."""


class NotFound(Error, LookupError):
    """No object matches the lookup."""


class Deleted(Error):
    """The object was deleted; it can no longer be read or written."""


class UnknownType(Error):
    """A stored object's type is not known to this process (import its module)."""


class TypeVersionMismatch(Error):
    """The store holds a newer version of a managed type than this process defines (E1)."""


class KeyTooLong(Error):
    """An encoded key value exceeds the store's key size limit."""


class TooLarge(Error):
    """A value, a write set, a request or a reply exceeds a size limit (not retryable).

    The message names the limit and the size: ``max_frame_bytes`` (the largest
    frame a node accepts or sends) for requests and replies.
    """

    def __init__(self, message: str, size: int | None = None, limit: int | None = None) -> None:
        super().__init__(message)
        self.size = size
        self.limit = limit


class RequestExpired(Error):
    """A retried request is older than the results kept for its client (H1): outcome unknown."""


class BadArgument(Error, TypeError):
    """An argument cannot be stored (for example an asynchronous method argument)."""


# ----------------------------------------------------------------- store
class StoreError(Error):
    """The store cannot be opened or used."""


class StoreLocked(StoreError):
    """The store directory is already open in another process."""


class IncompatibleStore(StoreError):
    """The directory holds a store of another format or of another cluster."""


class CorruptStore(StoreError):
    """The store's files are damaged."""


class CorruptRecord(CorruptStore):
    """A stored record fails its checksum: the message names the file, the database and the
    key; nothing of the damaged record is returned (never wrong content, never NotFound)."""

    def __init__(self, message: str, *, path: str = "", database: str = "", key: bytes = b""):
        super().__init__(message)
        self.path = path
        self.database = database
        self.key = key


class DatabaseClosed(StoreError):
    """The database was closed."""


# --------------------------------------------------------------- cluster
class ClusterError(Error):
    """A cluster-level failure."""


class Unavailable(ClusterError):
    """No reachable node could serve the request."""


class TransactionLost(Unavailable, Retryable):
    """A node the transaction ran on failed before its commit: the node the client is
    attached to (its connection lost, or no answer to an operation within ``op_timeout``)
    or a node holding a part of it (seen Down by the node coordinating it).  The
    transaction was rolled back: nothing of it committed, and nothing can (only its commit
    could, and it was never sent or never started).  An :class:`Unavailable` that
    ``@nonstop.transactional`` replays: the next attempt goes to the next known node, or
    to the partition's new active node once the takeover is done."""


class NoLeader(Unavailable):
    """The cluster log has no leader now (an election is in progress): a change that goes
    through the log was not made.  Retry in a moment (the CLI, the admin API and the
    console retry a few times by themselves)."""


class QuorumLost(ClusterError):
    """The node is Disabled: it does not have quorum and refuses work (D16)."""


class NotLeader(ClusterError):
    """The node asked does not lead the cluster log; ``leader`` names the one that does."""

    def __init__(self, message: str, leader: str | None = None) -> None:
        super().__init__(message)
        self.leader = leader


class ProtocolError(ClusterError):
    """A peer spoke a protocol version or framing this node does not support (C7/E4)."""


class AuthenticationFailed(ProtocolError):
    """A node refused the connection: no credential, an unknown user, a wrong password or
    a wrong cluster secret (the message says which, as far as the node tells)."""


class NotAuthorized(ClusterError):
    """The authenticated user's roles do not allow this operation (the message names the
    user, the operation and the roles that would); nothing was done."""


class NotRemote(Error):
    """A method not marked ``@nonstop.remote`` was called on an object mastered on another node."""


class Aborted(ClusterError):
    """A distributed transaction was rolled back by its commit protocol (a participant refused)."""
