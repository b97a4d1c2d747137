"""Length-prefixed msgpack frames: the only byte format nonstop puts on a socket (C7).

A frame is a 4-byte big-endian unsigned length followed by that many bytes of
one msgpack value.  msgpack is platform independent (fixed byte order, no
Python pickles), so nodes on different machines and Python versions agree on
the bytes.  The length prefix lets a reader reject a frame that is too large
*before* buffering it: a peer (or a port scanner) cannot make a node allocate
gigabytes by announcing a huge length.

Every error this module raises is a :class:`FrameError` (a
:class:`nonstop.errors.ProtocolError`); the caller logs the reason and closes the
connection, and the node keeps serving everybody else.
"""

from __future__ import annotations

import struct
from typing import Any

import msgpack

from nonstop.errors import ProtocolError

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


def decode_body(body: bytes) -> Any:
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

    It raises only :class:`FrameTooLarge` (as soon as the header announces too
    big a body, before buffering it) or :class:`MalformedFrame`.  After an
    error the decoder is poisoned: the stream has lost its framing and the
    connection must be closed.
    """

    def __init__(self, max_frame: int = DEFAULT_MAX_FRAME) -> None:
        self.max_frame = max_frame
        self._buf = bytearray()
        self._failed: FrameError | None = None

    def feed(self, data: bytes) -> list[Any]:
        """Add ``data`` and return every value completed by it, in order."""
        if self._failed is not None:
            raise self._failed
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
                body = bytes(self._buf[HEADER.size : end])
                del self._buf[:end]
                out.append(decode_body(body))
        except FrameError as exc:
            self._failed = exc
            self._buf.clear()
            raise
        return out

    @property
    def buffered(self) -> int:
        """Bytes received but not yet part of a whole frame."""
        return len(self._buf)
