"""``pack_sliced`` packs a large prepared record byte for byte as ``pack`` does."""

from __future__ import annotations

import datetime
from typing import Any

from nonstop.model.codec import SLICE_ITEMS, pack, pack_sliced, unpack
from nonstop.model.ref import Ref


def test_a_map_of_long_lists_packs_as_one_pack_call_would() -> None:
    n = SLICE_ITEMS * 2 + 7  # three slices, the last one short
    record: dict[str, Any] = {
        "ops": [[i % 2 == 0, b"objects", i.to_bytes(20, "big"), None] for i in range(n)],
        "deltas": {b"t\x00": -3},
        "unique": {b"ix:t.k": True},
        "locks": [["o", i.to_bytes(20, "big")] for i in range(SLICE_ITEMS + 1)],
        "short": [Ref(bytes(20)), datetime.date(2026, 11, 27)],  # (the codec's own types)
        "empty": [],
    }
    packed = pack_sliced(record)
    assert packed == pack(record)
    last = [(n - 1) % 2 == 0, b"objects", (n - 1).to_bytes(20, "big"), None]
    assert unpack(packed)["ops"][n - 1] == last
    assert pack_sliced({}) == pack({})
