"""Managed types (A1), field checking, references (C1) and the key/state codecs."""

from __future__ import annotations

import datetime as dt
import decimal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import nonstop
from nonstop import Managed, key
from nonstop.model.codec import MAX_KEY_BYTES, encode_key, pack, unpack
from nonstop.model.managed import type_info
from nonstop.model.ref import Ref


class Gadget(Managed, name="test_model.Gadget", version=3):
    serial: str = key(unique=True)
    weight: float = 0.0
    blob: bytes = b""
    tags: list = nonstop.field(default_factory=list)
    meta: dict = nonstop.field(default_factory=dict)
    price: decimal.Decimal = decimal.Decimal("0")
    made: dt.datetime | None = None
    note: str | None = None
    flag: bool = False


class Widget(Gadget, name="test_model.Widget"):
    size: int = key(ordered=True, default=0)


# ------------------------------------------------------------ declarations
def test_type_info_resolves_fields_keys_version_and_inheritance() -> None:
    info = type_info(Widget)
    assert info.name == "test_model.Widget"
    assert info.version == 1
    assert type_info(Gadget).version == 3
    assert list(info.fields)[:2] == ["serial", "weight"]
    assert "size" in info.fields and "size" in info.keys
    # The inherited key is declared (and indexed) by the supertype.
    assert info.keys["serial"].owner == "test_model.Gadget"
    assert info.keys["serial"].options.unique
    assert not info.keys["serial"].options.mutable
    assert [f.name for f in info.required] == ["serial"]
    assert type_info(Gadget) in [t for t in type_info(Gadget).concrete_types()]
    assert info in type_info(Gadget).concrete_types()


def test_default_stored_name_is_module_and_qualname() -> None:
    class Local(Managed):
        x: int = 0

    assert Local.__nonstop_name__ == f"{__name__}.{Local.__qualname__}"


def test_handles_are_not_constructed_directly() -> None:
    with pytest.raises(TypeError, match=r"tx\.create\(Gadget"):
        Gadget()


@pytest.mark.parametrize(
    ("make", "message"),
    [
        (lambda: type("Bad1", (Managed,), {"__annotations__": {"x": set}}), "unsupported field"),
        (
            lambda: type(
                "Bad2", (Managed,), {"__annotations__": {"x": list}, "x": key(unique=True)}
            ),
            "cannot be a key",
        ),
        (
            lambda: type("Bad3", (Managed,), {"__annotations__": {"x": int | str}}),
            "only `X | None`",
        ),
        (lambda: type("Bad4", (Managed,), {"__annotations__": {"x": int}, "x": "no"}), "x takes"),
    ],
)
def test_bad_declarations_raise_schema_or_field_errors(make: Any, message: str) -> None:
    cls = make()
    with pytest.raises((nonstop.SchemaError, nonstop.FieldError), match=message):
        type_info(cls)


def test_bad_version_is_a_schema_error() -> None:
    with pytest.raises(nonstop.SchemaError, match="version must be a positive int"):

        class Bad(Managed, version=0):
            x: int = 0


def test_field_checks_and_coercions(db: nonstop.Database) -> None:
    with db.transaction() as tx:
        g = tx.create(Gadget, serial="g1", weight=2, blob=bytearray(b"ab"), price=5)
        assert g.weight == 2.0 and isinstance(g.weight, float)
        assert g.blob == b"ab" and isinstance(g.blob, bytes)
        assert g.price == decimal.Decimal(5)
        assert g.note is None and g.tags == [] and g.meta == {}
        g.tags = ("a", "b")
        assert g.tags == ["a", "b"]
        with pytest.raises(nonstop.FieldError, match=r"Gadget\.flag takes bool"):
            g.flag = 1
        with pytest.raises(nonstop.FieldError, match="may not be None"):
            g.weight = None
        with pytest.raises(nonstop.FieldError, match="has no field 'colour'"):
            g.colour = "red"  # type: ignore[attr-defined]


def test_state_round_trips_through_the_store(db: nonstop.Database) -> None:
    when = dt.datetime(2024, 2, 29, 12, 30, 1, 123456, tzinfo=dt.timezone(dt.timedelta(hours=2)))
    with db.transaction() as tx:
        tx.create(
            Widget,
            serial="w1",
            weight=1.5,
            blob=b"\x00\xff",
            tags=[1, "two", [3.0]],
            meta={"k": {"n": None}},
            price=decimal.Decimal("12.3400"),
            made=when,
            note="n",
            flag=True,
            size=7,
        )
    with db.transaction() as tx:
        w = tx.get(Gadget, serial="w1")
        assert isinstance(w, Widget)
        assert (w.weight, w.blob, w.tags, w.meta) == (
            1.5,
            b"\x00\xff",
            [1, "two", [3.0]],
            {"k": {"n": None}},
        )
        assert str(w.price) == "12.3400"
        assert w.made == when and w.made.utcoffset() == dt.timedelta(hours=2)
        assert (w.note, w.flag, w.size) == ("n", True, 7)


# ------------------------------------------------------------ references
def test_ref_layout_text_round_trip_and_immutability() -> None:
    r = Ref.make(0xABC, 1_700_000_000, 42)
    assert (r.location, r.timestamp, r.counter) == (0xABC, 1_700_000_000, 42)
    assert Ref.parse(str(r)) == r
    assert hash(Ref.parse(str(r))) == hash(r)
    assert Ref.make(1, 1, 1) < Ref.make(1, 1, 2) < Ref.make(1, 2, 0) < Ref.make(2, 0, 0)
    with pytest.raises(AttributeError):
        r.raw = b"x" * 20  # type: ignore[misc]
    with pytest.raises(ValueError, match="20 bytes"):
        Ref(b"short")
    with pytest.raises(ValueError, match="not a nonstop reference"):
        Ref.parse("garbage")


# ----------------------------------------------------------------- codecs
_naive = st.datetimes(min_value=dt.datetime(1, 1, 2), max_value=dt.datetime(9999, 12, 30))
_aware = st.datetimes(
    min_value=dt.datetime(1, 1, 2),
    max_value=dt.datetime(9999, 12, 30),
    timezones=st.sampled_from(
        [
            dt.UTC,
            dt.timezone(dt.timedelta(hours=5, minutes=30)),
            dt.timezone(-dt.timedelta(hours=8)),
        ]
    ),
)
_KEY_DOMAINS = {
    "int": st.integers(min_value=-(2**63), max_value=2**63 - 1),
    "float": st.floats(allow_nan=False),
    "str": st.text(max_size=40),
    "bytes": st.binary(max_size=40),
    "naive datetime": _naive,
    "aware datetime": _aware,
    "date": st.dates(),
    "bool": st.booleans(),
}


@pytest.mark.parametrize("domain", list(_KEY_DOMAINS))
def test_encode_key_preserves_order(domain: str) -> None:
    strategy = _KEY_DOMAINS[domain]

    @settings(max_examples=300, deadline=None)
    @given(strategy, strategy)
    def check(a: Any, b: Any) -> None:
        ka, kb = encode_key(a), encode_key(b)
        assert (ka < kb) == (a < b), (a, b)
        assert (ka == kb) == (a == b), (a, b)

    check()


@pytest.mark.parametrize("a", [-0.0, 0.0])
@pytest.mark.parametrize("b", [-0.0, 0.0])
def test_signed_zeros_are_one_key(a: float, b: float) -> None:
    # -0.0 == 0.0 in Python, so a unique float key must treat them as one value.
    assert encode_key(a) == encode_key(b)


def test_encode_key_edges() -> None:
    assert encode_key("a") < encode_key("a\x00") < encode_key("a\x00\x00") < encode_key("a\x01")
    assert encode_key(b"") < encode_key(b"\x00") < encode_key(b"\x00\xff") < encode_key(b"\x01")
    assert (
        encode_key(float("-inf"))
        < encode_key(-1e308)
        < encode_key(1e308)
        < encode_key(float("inf"))
    )
    with pytest.raises(nonstop.KeyTooLong, match="64-bit"):
        encode_key(2**63)
    with pytest.raises(nonstop.KeyTooLong, match=f"limit is {MAX_KEY_BYTES}"):
        encode_key("x" * (MAX_KEY_BYTES + 1))
    with pytest.raises(TypeError, match="cannot be a key"):
        encode_key(decimal.Decimal(1))


_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=False)
    | st.text(max_size=20)
    | st.binary(max_size=20)
    | _naive
    | _aware
    | st.dates()
    | st.decimals(allow_nan=False, allow_infinity=False)
    | st.binary(min_size=20, max_size=20).map(Ref),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=5), children, max_size=4)
    ),
    max_leaves=12,
)


@settings(max_examples=300, deadline=None)
@given(_values)
def test_pack_round_trips(value: Any) -> None:
    assert unpack(pack(value)) == value
