"""The node-wide budget of bytes held in incomplete frames (issue 11: bounded memory).

Every connection's frame decoder buffers the frame it is receiving until its
last byte arrives.  One connection can hold at most one frame (``max_frame_bytes``),
but many connections together could hold many: 60 connections that each
announce a 16 MiB frame and never send its last byte would pin ~1 GB.  The
decoders of one node therefore share one :class:`BufferBudget`: bytes of
incomplete frames above a small per-connection allowance are charged to it as
they arrive, and a connection whose next bytes would overrun it is closed.
"""

from __future__ import annotations

DEFAULT_BUFFER_BUDGET = 128 * 1024 * 1024
"""Default node-wide budget for bytes of incomplete frames (128 MiB: eight
maximum-size frames arriving at once)."""

FREE_BYTES = 64 * 1024
"""Bytes of an incomplete frame a connection may hold without charging the budget,
so that small requests (pings, status, ordinary transactions) keep flowing while
large frames use up the budget.  At most this much per connection, and the
number of connections is capped."""


class BufferBudget:
    """A counter of bytes in use against a limit; single-threaded (one event loop)."""

    __slots__ = ("limit", "peak", "used")

    def __init__(self, limit: int = DEFAULT_BUFFER_BUDGET) -> None:
        self.limit = limit
        self.used = 0
        self.peak = 0

    def take(self, n: int) -> bool:
        """Charge ``n`` bytes; False (and nothing charged) if that would exceed the limit."""
        if self.used + n > self.limit:
            return False
        self.used += n
        self.peak = max(self.peak, self.used)
        return True

    def give(self, n: int) -> None:
        """Return ``n`` bytes charged before."""
        self.used = max(0, self.used - n)


__all__ = ["DEFAULT_BUFFER_BUDGET", "FREE_BYTES", "BufferBudget"]
