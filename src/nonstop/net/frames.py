"""Length-prefixed msgpack frames: the only byte format nonstop puts on a socket (C7).

A frame is a 4-byte big-endian unsigned length followed by that many bytes of
one msgpack value.  msgpack is platform independent (fixed byte order, no
Python pickles), so nodes on different machines and Python versions agree on
the bytes.  The length prefix lets a reader reject a frame that is too large
*before* buffering it: a peer (or a port scanner) cannot make a node allocate
gigabytes by announcing a huge length.  A frame's buffer grows as its bytes
arrive (never to the announced size up front), and the bytes of incomplete
frames are charged to the node's :class:`~nonstop.net.budget.BufferBudget`,
so many connections together cannot pin more than that budget either.

Every error this module raises is a :class:`FrameError` (a
:class:`nonstop.errors.ProtocolError`); the caller logs the reason and closes the
connection, and the node keeps serving everybody else.
"""

from __future__ import annotations

import struct
from typing import Any

import msgpack

from nonstop.errors import ProtocolError
from nonstop.net.budget import FREE_BYTES, BufferBudget

HEADER = struct.Struct(">I")
"""The 4-byte big-endian length prefix."""

DEFAULT_MAX_FRAME = 16 * 1024 * 1024
"""Default largest frame body (16 MiB); configurable per node (``max_frame_bytes``)."""


class FrameError(ProtocolError):
    """A frame could not be read: the connection it came on must be closed."""


class FrameTooLarge(FrameError):
    """A frame announced (or would have) a body larger than the maximum frame size."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"frame of {size} bytes exceeds the maximum of {limit} bytes")
        self.size = size
        self.limit = limit


class BufferBudgetExceeded(FrameError):
    """Buffering more of an incomplete frame would overrun the node-wide budget."""

    def __init__(self, buffered: int, budget: BufferBudget) -> None:
        super().__init__(
            f"{buffered} bytes of an incomplete frame would overrun the node's buffer budget "
            f"({budget.used} of {budget.limit} bytes in use: buffer_budget_bytes)"
        )
        self.buffered = buffered


class MalformedFrame(FrameError):
    """A frame body is not one valid msgpack value."""


def encode(value: Any, max_frame: int = DEFAULT_MAX_FRAME) -> bytes:
    """Encode ``value`` as one frame; :class:`FrameTooLarge` if its body exceeds ``max_frame``.

    Raising on the sending side keeps a node from emitting a frame its peer is
    bound to reject (and drop the connection over).
    """
    try:
        body = msgpack.packb(value, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as exc:
        raise MalformedFrame(f"value cannot be encoded as msgpack: {exc}") from exc
    if len(body) > max_frame:
        raise FrameTooLarge(len(body), max_frame)
    return HEADER.pack(len(body)) + body


def decode_body(body: bytes | memoryview) -> Any:
    """Decode one frame body; :class:`MalformedFrame` unless it is exactly one msgpack value."""
    try:
        return msgpack.unpackb(body, raw=False, strict_map_key=False, use_list=True)
    except msgpack.ExtraData as exc:
        raise MalformedFrame("frame body holds more than one msgpack value") from exc
    except (ValueError, TypeError, msgpack.UnpackException, RecursionError) as exc:
        # ValueError covers msgpack's FormatError/StackError/OutOfData and bad UTF-8.
        raise MalformedFrame(f"frame body is not valid msgpack: {exc!r}"[:200]) from exc


class FrameDecoder:
    """Incremental decoder: feed it bytes as they arrive, get whole values out.

    It raises :class:`FrameTooLarge` (as soon as the header announces too big
    a body, before buffering it), :class:`BufferBudgetExceeded` (the bytes of
    the incomplete frame, beyond :data:`~nonstop.net.budget.FREE_BYTES`, do not
    fit in the shared ``budget``) or :class:`MalformedFrame`.  After an error
    the decoder is poisoned: the stream has lost its framing and the
    connection must be closed.  :meth:`release` returns what it charged to the
    budget; the connection calls it when it closes.
    """

    def __init__(
        self,
        max_frame: int = DEFAULT_MAX_FRAME,
        budget: BufferBudget | None = None,
        free_bytes: int = FREE_BYTES,
    ) -> None:
        self.max_frame = max_frame
        """The largest body accepted; may change between frames (raised after a handshake)."""
        self.budget = budget
        self.free_bytes = free_bytes
        self.head = b""
        """The first bytes of the stream (up to 5): enough to tell a TLS record (``0x16 0x03``)."""
        self._buf = bytearray()
        self._charged = 0
        self._failed: FrameError | None = None

    def feed(self, data: bytes) -> list[Any]:
        """Add ``data`` and return every value completed by it, in order."""
        if self._failed is not None:
            raise self._failed
        if len(self.head) < 5:
            self.head = (self.head + data)[:5]
        self._buf += data
        out: list[Any] = []
        try:
            while len(self._buf) >= HEADER.size:
                (size,) = HEADER.unpack_from(self._buf)
                if size > self.max_frame:
                    raise FrameTooLarge(size, self.max_frame)
                end = HEADER.size + size
                if len(self._buf) < end:
                    break
                out.append(self._decode_first(end))
            self._charge()
        except FrameError as exc:
            self._failed = exc
            self._buf.clear()
            self.release()
            raise
        return out

    def _decode_first(self, end: int) -> Any:
        """Decode the frame ending at ``end`` in place (no copy of its body) and drop it."""
        view = memoryview(self._buf)
        try:
            body = view[HEADER.size : end]
            try:
                value = decode_body(body)
            finally:
                body.release()
        finally:
            view.release()
        del self._buf[:end]
        return value

    def _charge(self) -> None:
        """Bring the budget's charge in line with the bytes buffered now."""
        if self.budget is None:
            return
        wanted = max(0, len(self._buf) - self.free_bytes)
        if wanted > self._charged:
            if not self.budget.take(wanted - self._charged):
                raise BufferBudgetExceeded(len(self._buf), self.budget)
            self._charged = wanted
        elif wanted < self._charged:
            self.budget.give(self._charged - wanted)
            self._charged = wanted

    def release(self) -> None:
        """Give back every byte charged to the budget (the connection is closing)."""
        if self.budget is not None and self._charged:
            self.budget.give(self._charged)
        self._charged = 0
        self._buf = bytearray()

    @property
    def buffered(self) -> int:
        """Bytes received but not yet part of a whole frame."""
        return len(self._buf)
