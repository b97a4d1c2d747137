"""The LMDB store and the group committer: references, format, counts, group commit, full disk."""

from __future__ import annotations

import shutil
import tempfile
import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule
from tests.bankmodel import Account, Transfer, account_numbers, open_accounts
from tests.conftest import run_threads

import nonstop
from nonstop.model.codec import unpack
from nonstop.store.lmdb_store import COUNTER_BLOCK, FORMAT_NAME, FORMAT_VERSION


def refs_of(db: nonstop.Database, n: int) -> list[bytes]:
    return [db.engine.store.new_ref() for _ in range(n)]


def test_format_marker_location_and_timestamp_persist(store_dir: Path) -> None:
    with nonstop.open(store_dir) as db:
        loc, ts = db.location, db.engine.store.timestamp
        with db.engine.store.read() as rtxn:
            assert unpack(rtxn.get(b"format", db=db.engine.store.meta)) == [
                FORMAT_NAME,
                FORMAT_VERSION,
            ]
    with nonstop.open(store_dir) as db:
        assert (db.location, db.engine.store.timestamp) == (loc, ts)


def test_references_are_unique_and_never_reused_after_reopen(store_dir: Path) -> None:
    with nonstop.open(store_dir) as db:
        first = refs_of(db, 10)
        with db.transaction() as tx:
            a = tx.create(Account, number="x")
            ra = tx.ref(a)
    assert len(set(first)) == 10 and first == sorted(first)
    with nonstop.open(store_dir) as db:
        again = refs_of(db, 10)
        # A reopen (or crash) skips the rest of the reserved block: never a reused reference.
        assert min(again) > max([*first, ra.raw])
        assert nonstop.Ref(again[0]).counter > COUNTER_BLOCK
        assert all(nonstop.Ref(r).location == db.location for r in again)
        with db.transaction() as tx:
            assert tx.by_ref(ra).number == "x"  # type: ignore[union-attr]


def test_reference_counter_crosses_reserved_blocks(store_dir: Path) -> None:
    with nonstop.open(store_dir, durability="none") as db:
        refs = refs_of(db, COUNTER_BLOCK + 5)
        assert len(set(refs)) == len(refs)
        assert refs == sorted(refs)


def test_concurrent_new_refs_are_distinct(db: nonstop.Database) -> None:
    out = run_threads(4, lambda _: refs_of(db, 2000))
    flat = [r for chunk in out for r in chunk]
    assert len(set(flat)) == len(flat)


def test_extent_counts_are_maintained_by_commits_and_deletes(db: nonstop.Database) -> None:
    open_accounts(db, account_numbers(5))
    assert db.engine.store.count("bank.Account") == 5
    with db.transaction() as tx:
        tx.delete(tx.get(Account, number="A000"))
        tx.create(Account, number="new1")
        tx.create(Account, number="new2")
        assert tx.count(Account) == 6
        assert db.engine.store.count("bank.Account") == 5  # nothing visible before commit
    assert db.engine.store.count("bank.Account") == 6
    with db.transaction() as tx:
        assert tx.count(Account) == 6 == len(tx.extent(Account))
        assert tx.count(Transfer) == 0


def test_group_commit_shares_transactions_and_every_commit_is_visible_on_return(
    db: nonstop.Database,
) -> None:
    n_threads, per_thread = 8, 25
    gate = threading.Barrier(n_threads)

    def work(i: int) -> None:
        gate.wait()
        for j in range(per_thread):
            with db.transaction() as tx:
                tx.create(Transfer, tid=f"{i}-{j}", amount=j)
            # commit returned: the write is in the store for any new reader
            with db.transaction() as tx:
                assert tx.find(Transfer, tid=f"{i}-{j}", lock="none") is not None

    run_threads(n_threads, work)
    stats = db.stats()
    assert stats["commits"] >= n_threads * per_thread
    assert stats["largest_group"] > 1, stats
    assert stats["commit_groups"] < stats["commits"], stats
    with db.transaction() as tx:
        assert tx.count(Transfer) == n_threads * per_thread


def test_a_write_set_too_big_for_the_store_fails_alone(tmp_path: Path) -> None:
    db = nonstop.open(tmp_path / "small", map_size=2 << 20, durability="none")
    try:
        small_ok: list[bool] = []
        gate = threading.Barrier(5)

        def big(_: int) -> None:
            gate.wait()
            with pytest.raises(nonstop.StoreError, match="store is full"), db.transaction() as tx:
                for i in range(40):
                    tx.create(Transfer, tid=f"big-{i}", src="x" * 100_000)

        def small(i: int) -> None:
            gate.wait()
            with db.transaction() as tx:
                tx.create(Transfer, tid=f"small-{i}")
            small_ok.append(True)

        run_threads(5, lambda i: big(i) if i == 0 else small(i))
        assert len(small_ok) == 4
        with db.transaction() as tx:
            assert tx.count(Transfer) == 4
            assert tx.find(Transfer, tid="big-0") is None
            # the store still works after the failure
            tx.create(Transfer, tid="after")
        with db.transaction() as tx:
            assert tx.count(Transfer) == 5
    finally:
        db.close()


def test_schema_is_stored_and_a_newer_stored_version_is_refused(store_dir: Path) -> None:
    from nonstop.model.codec import pack

    with nonstop.open(store_dir) as db:
        open_accounts(db, ["s1"])
        with db.engine.store.read() as rtxn:
            schema = unpack(rtxn.get(b"bank.Account", db=db.engine.store.types))
        assert schema["version"] == 1 and "balance" in schema["fields"]
        assert schema["keys"]["number"][1] is True  # unique
        with db.engine.store.env.begin(write=True) as wtxn:
            wtxn.put(b"bank.Account", pack({**schema, "version": 9}), db=db.engine.store.types)
    with (
        nonstop.open(store_dir) as db,
        pytest.raises(nonstop.TypeVersionMismatch, match="version 9"),
        db.transaction() as tx,
    ):
        tx.find(Account, number="s1")


def test_open_options_are_checked(store_dir: Path) -> None:
    with pytest.raises(nonstop.BadArgument, match="durability"):
        nonstop.open(store_dir, durability="sometimes")
    with pytest.raises(nonstop.BadArgument, match="async_workers"):
        nonstop.open(store_dir, async_workers=0)
    db = nonstop.open(store_dir)
    with pytest.raises(nonstop.BadArgument, match="isolation"):
        db.transaction("chaos")
    db.close()
    db.close()  # idempotent
    assert db.closed and "closed" in repr(db)


# ------------------------------------------- random histories vs a dict model
class StoreVsDict(RuleBasedStateMachine):
    """Random transactions (create/update/delete, commit or rollback, reopen) vs a dict."""

    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="nonstop-model-")
        self.db = nonstop.open(self.dir, durability="none")
        self.model: dict[str, tuple[str, int]] = {}

    @rule(
        ops=st.lists(
            st.tuples(
                st.sampled_from(["create", "balance", "owner", "delete"]),
                st.sampled_from([f"N{i}" for i in range(6)]),
                st.integers(0, 4),
            ),
            max_size=6,
        ),
        commit=st.booleans(),
    )
    def transaction(self, ops: list[tuple[str, str, int]], commit: bool) -> None:
        work = dict(self.model)
        tx = self.db.transaction().__enter__()
        for kind, number, v in ops:
            obj = tx.find(Account, number=number)
            assert (obj is not None) == (number in work)
            if kind == "create":
                if number in work:
                    with pytest.raises(nonstop.DuplicateKey):
                        tx.create(Account, number=number, owner=f"o{v}", balance=v)
                else:
                    tx.create(Account, number=number, owner=f"o{v}", balance=v)
                    work[number] = (f"o{v}", v)
            elif obj is None:
                continue
            elif kind == "balance":
                obj.balance = v
                work[number] = (work[number][0], v)
            elif kind == "owner":
                obj.owner = f"o{v}"
                work[number] = (f"o{v}", work[number][1])
            else:
                tx.delete(obj)
                del work[number]
        assert self.view(tx) == work  # read your own writes
        if commit:
            tx.commit()
            self.model = work
        else:
            tx.rollback()

    @rule()
    def reopen(self) -> None:
        self.db.close()
        self.db = nonstop.open(self.dir, durability="none")

    @staticmethod
    def view(tx: nonstop.Transaction) -> dict[str, tuple[str, int]]:
        got = {a.number: (a.owner, a.balance) for a in tx.extent(Account)}
        assert tx.count(Account) == len(got)
        ordered = [a.owner for a in tx.query(Account).order_by("owner").all()]
        assert ordered == sorted(o for o, _ in got.values())
        for owner in {o for o, _ in got.values()}:
            found = {a.number for a in tx.query(Account).where(owner=owner).all()}
            assert found == {n for n, (o, _) in got.items() if o == owner}
        return got

    @invariant()
    def store_matches_model(self) -> None:
        with self.db.transaction() as tx:
            assert self.view(tx) == self.model

    def teardown(self) -> None:
        self.db.close()
        shutil.rmtree(self.dir, ignore_errors=True)


TestStoreVsDict = StoreVsDict.TestCase
TestStoreVsDict.settings = settings(
    max_examples=40, stateful_step_count=12, deadline=None, suppress_health_check=list(HealthCheck)
)


def test_a_newer_type_version_reads_old_objects_transparently(store_dir: Path) -> None:
    class V1(nonstop.Managed, name="test_store.Evolving", version=1):
        code: str = nonstop.key(unique=True)
        old: int = 0

    with nonstop.open(store_dir) as db, db.transaction() as tx:
        tx.create(V1, code="a", old=3)

    class V2(nonstop.Managed, name="test_store.Evolving", version=2):
        code: str = nonstop.key(unique=True)
        added: int = 5

    with nonstop.open(store_dir) as db:
        with db.transaction() as tx:
            a = tx.get(V2, code="a")
            assert a.added == 5  # new field: its default
            assert not hasattr(type(a), "old")
            a.added = 6
        with db.transaction() as tx:
            assert tx.get(V2, code="a").added == 6
            assert tx.count(V2) == 1

    class V1Again(nonstop.Managed, name="test_store.Evolving", version=1):
        code: str = nonstop.key(unique=True)

    with (
        nonstop.open(store_dir) as db,
        pytest.raises(nonstop.TypeVersionMismatch, match="version 2"),
        db.transaction() as tx,
    ):
        tx.get(V1Again, code="a")


class Rec(nonstop.Managed, name="test_store.Rec"):
    number: str = nonstop.key(unique=True)
    slot: int = nonstop.key(unique=True, mutable=True)
    owner: str = nonstop.key(ordered=True, mutable=True, default="")


class UniqueKeysVsDict(RuleBasedStateMachine):
    """Random moves of a mutable unique key (and creates/deletes) vs a dict, with rollbacks."""

    def __init__(self) -> None:
        super().__init__()
        self.dir = tempfile.mkdtemp(prefix="nonstop-ukeys-")
        self.db = nonstop.open(self.dir, durability="none")
        self.model: dict[str, tuple[int, str]] = {}

    @rule(
        ops=st.lists(
            st.tuples(
                st.sampled_from(["create", "slot", "slot", "owner", "delete"]),
                st.sampled_from(["R0", "R1", "R2"]),
                st.integers(0, 3),
            ),
            max_size=8,
        ),
        commit=st.booleans(),
        preload=st.permutations(["R0", "R1", "R2"]),
    )
    def transaction(
        self, ops: list[tuple[str, str, int]], commit: bool, preload: list[str]
    ) -> None:
        work = dict(self.model)
        tx = self.db.transaction().__enter__()
        for number in preload:  # the order objects enter the transaction varies too
            tx.find(Rec, number=number)
        for kind, number, v in ops:
            holder = next((n for n, (s, _) in work.items() if s == v), None)
            obj = tx.find(Rec, number=number)
            assert (obj is not None) == (number in work)
            if kind == "create":
                if number in work or holder is not None:
                    with pytest.raises(nonstop.DuplicateKey):
                        tx.create(Rec, number=number, slot=v, owner=f"o{v}")
                else:
                    tx.create(Rec, number=number, slot=v, owner=f"o{v}")
                    work[number] = (v, f"o{v}")
            elif obj is None:
                continue
            elif kind == "slot":
                if holder is not None and holder != number:
                    with pytest.raises(nonstop.DuplicateKey):
                        obj.slot = v
                else:
                    obj.slot = v
                    work[number] = (v, work[number][1])
            elif kind == "owner":
                obj.owner = f"o{v}"
                work[number] = (work[number][0], f"o{v}")
            else:
                tx.delete(obj)
                del work[number]
        assert self.view(tx) == work
        if commit:
            tx.commit()
            self.model = work
        else:
            tx.rollback()

    @rule()
    def reopen(self) -> None:
        self.db.close()
        self.db = nonstop.open(self.dir, durability="none")

    @staticmethod
    def view(tx: nonstop.Transaction) -> dict[str, tuple[int, str]]:
        got = {r.number: (r.slot, r.owner) for r in tx.extent(Rec)}
        assert tx.count(Rec) == len(got)
        for v in range(5):
            found = tx.find(Rec, slot=v)
            owners = [n for n, (s, _) in got.items() if s == v]
            assert (found.number if found is not None else None) == (owners[0] if owners else None)
        ordered = [r.owner for r in tx.query(Rec).order_by("owner").all()]
        assert ordered == sorted(o for _, o in got.values())
        return got

    @invariant()
    def store_matches_model(self) -> None:
        with self.db.transaction() as tx:
            assert self.view(tx) == self.model

    def teardown(self) -> None:
        self.db.close()
        shutil.rmtree(self.dir, ignore_errors=True)


TestUniqueKeysVsDict = UniqueKeysVsDict.TestCase
TestUniqueKeysVsDict.settings = settings(
    max_examples=60, stateful_step_count=10, deadline=None, suppress_health_check=list(HealthCheck)
)
