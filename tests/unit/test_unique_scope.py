"""Unique keys with partitions (tx/unique_scope.py): a binding that could put one unique value
in two partitions is refused at bind time, naming the type and the key."""

from __future__ import annotations

import pytest
from tests.bankmodel import Account, Transfer

from nonstop import Managed, key
from nonstop.errors import SchemaError
from nonstop.model.managed import type_info
from nonstop.tx.unique_scope import check_unique_scope, unique_key_names


class TwoUnique(Managed, name="test.scope.TwoUnique"):
    code: str = key(unique=True)
    email: str = key(unique=True)


class Plain(Managed, name="test.scope.Plain"):
    owner: str = key(default="")


class Child(Account, name="test.scope.Child"):
    note: str = ""


@pytest.mark.parametrize("cls", [Account, Transfer, Child])
def test_one_unique_key_under_hash_or_own_mapper_is_accepted(cls: type[Managed]) -> None:
    check_unique_scope(type_info(cls), "hash", 16)
    check_unique_scope(type_info(cls), "app.mappers:ByNumber", 16)


def test_round_robin_with_a_unique_key_is_refused_naming_type_and_key() -> None:
    with pytest.raises(
        SchemaError, match=r"bank\.Account has the unique key bank\.Account\.number"
    ):
        check_unique_scope(type_info(Account), "round_robin", 16)
    with pytest.raises(SchemaError, match=r"test\.scope\.Child has the unique key .*number"):
        check_unique_scope(type_info(Child), "round_robin", 3)  # (inherited key)


def test_two_unique_keys_are_refused_when_partitioned() -> None:
    with pytest.raises(SchemaError, match=r"2 unique keys \(code, email\)"):
        check_unique_scope(type_info(TwoUnique), "hash", 16)


def test_always_accepted_without_unique_keys_or_with_one_partition() -> None:
    check_unique_scope(type_info(Plain), "round_robin", 16)
    check_unique_scope(type_info(TwoUnique), "round_robin", 1)
    assert unique_key_names(type_info(TwoUnique)) == ["code", "email"]
    assert unique_key_names(type_info(Plain)) == []
