"""The frame codec (C7): round trips, arbitrary chunking, and fuzzed garbage."""

from __future__ import annotations

import struct

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nonstop.net.frames import (
    FrameDecoder,
    FrameError,
    FrameTooLarge,
    MalformedFrame,
    decode_body,
    encode,
)

values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=50)
    | st.binary(max_size=50),
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=10), children, max_size=5)
    ),
    max_leaves=20,
)


@given(st.lists(values, max_size=8), st.data())
@settings(max_examples=200, deadline=None)
def test_round_trip_with_any_chunking(items: list[object], data: st.DataObject) -> None:
    stream = b"".join(encode(v) for v in items)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=10)))
    decoder = FrameDecoder()
    out: list[object] = []
    prev = 0
    for cut in [*cuts, len(stream)]:
        out.extend(decoder.feed(stream[prev:cut]))
        prev = cut
    assert out == items
    assert decoder.buffered == 0


@given(st.binary(max_size=2000))
@settings(max_examples=500, deadline=None)
def test_garbage_only_raises_frame_errors(garbage: bytes) -> None:
    decoder = FrameDecoder(max_frame=1024)
    try:
        decoder.feed(garbage)
    except FrameError:
        # Once failed, the decoder stays failed: the connection must be closed.
        with pytest.raises(FrameError):
            decoder.feed(b"")


@given(st.binary(max_size=300))
@settings(max_examples=300, deadline=None)
def test_framed_garbage_bodies(body: bytes) -> None:
    """A correct length prefix around junk is either a value or MalformedFrame."""
    decoder = FrameDecoder()
    try:
        decoder.feed(struct.pack(">I", len(body)) + body)
    except MalformedFrame:
        pass


def test_oversized_header_rejected_before_body() -> None:
    decoder = FrameDecoder(max_frame=1000)
    with pytest.raises(FrameTooLarge) as info:
        decoder.feed(struct.pack(">I", 1001))
    assert info.value.size == 1001 and info.value.limit == 1000


def test_encode_refuses_oversized_value() -> None:
    with pytest.raises(FrameTooLarge):
        encode(b"x" * 2000, max_frame=1024)


def test_encode_refuses_unpackable_value() -> None:
    with pytest.raises(MalformedFrame):
        encode(object())


def test_two_values_in_one_body_is_malformed() -> None:
    with pytest.raises(MalformedFrame):
        decode_body(msgpack.packb(1) + msgpack.packb(2))


def test_empty_body_is_malformed() -> None:
    with pytest.raises(MalformedFrame):
        FrameDecoder().feed(struct.pack(">I", 0))


# ------------------------------------------------------- the buffer budget
def test_incomplete_frames_are_charged_to_the_shared_budget() -> None:
    from nonstop.net.budget import BufferBudget
    from nonstop.net.frames import BufferBudgetExceeded

    budget = BufferBudget(limit=300_000)
    a = FrameDecoder(max_frame=1 << 20, budget=budget, free_bytes=1000)
    b = FrameDecoder(max_frame=1 << 20, budget=budget, free_bytes=1000)
    frame = encode(b"x" * 200_000)
    assert a.feed(frame[:150_000]) == []
    assert budget.used == 150_000 - 1000  # the free allowance is not charged
    with pytest.raises(BufferBudgetExceeded, match="buffer budget"):
        b.feed(frame[:190_000])  # 189,000 more would overrun 300,000
    assert budget.used == 149_000  # the refused decoder charged nothing
    assert a.feed(frame[150_000:]) == [b"x" * 200_000]
    assert budget.used == 0  # a completed frame gives its bytes back
    a.feed(frame[:50_000])
    assert budget.used == 49_000
    a.release()  # the connection closes
    assert budget.used == 0 and budget.peak == 149_000


def test_announced_size_is_checked_before_the_body_is_buffered() -> None:
    decoder = FrameDecoder(max_frame=1024)
    with pytest.raises(FrameTooLarge):
        decoder.feed(struct.pack(">I", 1025))
    assert decoder.buffered == 0


def test_frame_limit_can_be_raised_between_frames() -> None:
    decoder = FrameDecoder(max_frame=64)
    assert decoder.feed(encode("hello")) == ["hello"]
    decoder.max_frame = 1 << 20  # the handshake is done
    assert decoder.feed(encode("y" * 1000)) == ["y" * 1000]
    assert decoder.head[:4] == struct.pack(">I", 6)  # the stream's first bytes are kept
