"""Key encoding a column at a time gives exactly ``encode_key``'s bytes and errors."""

from __future__ import annotations

from typing import Any

import pytest

from nonstop.bulk.keys import encode_keys
from nonstop.errors import FieldError, KeyTooLong
from nonstop.model.codec import encode_key

COLUMNS: list[list[Any]] = [
    [0, 1, -1, 2**63 - 1, -(2**63), 12345678901234],
    ["", "a", "a\x00b", "\x00", "é日本", "x" * 400],
    [True, False, 1, "a", None, 2.5, b"\x00b"],  # mixed: encode_key per value
    [None, 3],
    [],
]


@pytest.mark.parametrize("column", COLUMNS)
def test_same_bytes_as_encode_key(column: list[Any]) -> None:
    assert encode_keys(column) == [encode_key(v) for v in column]


@pytest.mark.parametrize(
    ("column", "error"),
    [
        ([1, 2**63], KeyTooLong),
        ([-(2**63) - 1], KeyTooLong),
        (["y" * 500], KeyTooLong),
        (["ok", "\ud800"], FieldError),
    ],
)
def test_same_errors_as_encode_key(column: list[Any], error: type[Exception]) -> None:
    with pytest.raises(error):
        encode_keys(column)


def _outcome(fn: Any) -> Any:
    try:
        return fn()
    except Exception as exc:
        return type(exc)


@pytest.mark.parametrize("column", [*COLUMNS, [2**70, 1], ["\ud800"], [b"x", 3]])
@pytest.mark.parametrize("n_nodes", [1, 2, 3, 5])
def test_a_writer_sends_each_key_to_the_same_home_as_before(
    column: list[Any], n_nodes: int
) -> None:
    """The Spark writer's homes, a column at a time, are home() of each key (an object
    loaded before must be found at the same node), errors included."""
    from nonstop.spark.source import home, homes_of

    assert _outcome(lambda: homes_of(column, n_nodes)) == _outcome(
        lambda: [home(v, n_nodes) for v in column]
    )
