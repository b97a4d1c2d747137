"""Size limits of the data path: refuse early with ``TooLarge``, never time out later.

A frame over ``max_frame_bytes`` is refused by whoever would send it (and would
be by whoever receives it).  A node's message to a peer carrying writes (a
branch op's ``w``, a two-phase commit's prepare) that is over the limit would
never arrive: the commit would end as a participant's missing vote after
``vote_timeout``.  The coordinator counts the bytes of the writes it is about
to ship to a node and refuses at once, naming the limit and the size.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from nonstop import errors

MESSAGE_MARGIN = 64 * 1024
"""Room left in a frame for everything but the writes (ids, op fields, framing)."""


def write_bytes(write: Any) -> int:
    """The bytes a write (``[ref, type, version, packed state]``) takes on the wire, about."""
    if not isinstance(write, list | tuple):
        return 0
    return sum(len(part) if isinstance(part, bytes | str) else 9 for part in write)


def check_writes(node: str, writes: Iterable[Any], max_message: int) -> None:
    """``TooLarge`` if ``writes`` cannot travel to ``node`` in one message."""
    size = sum(write_bytes(w) for w in writes)
    limit = max_message - MESSAGE_MARGIN
    if size > limit:
        raise errors.TooLarge(
            f"the writes for node {node} take {size:,} bytes, over the limit of {limit:,} "
            f"bytes (max_frame_bytes {max_message:,} less {MESSAGE_MARGIN:,} for the "
            "message): commit them in several transactions",
            size,
            limit,
        )


__all__ = ["MESSAGE_MARGIN", "check_writes", "write_bytes"]
