"""The PersistRouter both runtimes share: routing by prefix, group commit, order, failure.

Driven by hand: ``defer`` collects the flush the router asks for (a loop turn),
persisters record their write sets and complete them when the test says so.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest

from nonstop.runtime.interface import Persist
from nonstop.runtime.persist import Done, PersistRouteError, PersistRouter, Write, writes_of
from nonstop.runtime.storage import ClusterStore, StoreWriter


class FakePersister:
    """Records write sets; :meth:`complete` finishes one (in any order the test likes)."""

    def __init__(self) -> None:
        self.sets: list[list[Write]] = []
        self.dones: list[Done] = []

    def persist(self, batch: Sequence[Persist], done: Done) -> None:
        self.sets.append(writes_of(batch))
        self.dones.append(done)

    def complete(self, index: int, exc: BaseException | None = None) -> None:
        self.dones[index](exc)


class RaisingPersister:
    def persist(self, batch: Sequence[Persist], done: Done) -> None:
        raise OSError("no space left")


class Harness:
    def __init__(self, *, deferred: bool = True) -> None:
        self.default = FakePersister()
        self.durable: list[int] = []
        self.failures: list[BaseException] = []
        self.turns: list[Callable[[], None]] = []
        self.stats = collections.Counter[str]()
        self.router = PersistRouter(
            self.default,
            on_durable=self.durable.extend,
            on_failed=self.failures.append,
            defer=self.turns.append if deferred else None,
            stats=self.stats,
        )

    def end_turn(self) -> None:
        turns = list(self.turns)
        self.turns.clear()
        for fn in turns:
            fn()


def p(token: int, *keys: bytes) -> Persist:
    return Persist(token, tuple((k, b"v%d" % token) for k in keys))


def test_one_turns_persists_are_one_write_set_in_order_acknowledged_once_durable() -> None:
    h = Harness()
    h.router.add(p(1, b"raft/a"))
    h.router.add(p(2, b"raft/b", b"raft/c"))
    h.router.add(p(3, b"raft/a"))  # a key again: fine for a persister without distinct_keys
    assert h.default.sets == [] and len(h.turns) == 1  # one flush asked for, at the turn's end
    h.end_turn()
    assert h.default.sets == [
        [(b"raft/a", b"v1"), (b"raft/b", b"v2"), (b"raft/c", b"v2"), (b"raft/a", b"v3")]
    ]
    assert h.durable == []  # nothing is acknowledged before it is durable
    h.default.complete(0)
    assert h.durable == [1, 2, 3]
    assert h.stats["persists"] == 3 and h.stats["store_commits"] == 1


def test_tokens_are_reported_in_order_even_if_write_sets_complete_out_of_order() -> None:
    h = Harness()
    for token in (1, 2, 3):
        h.router.add(p(token, b"k%d" % token))
        h.end_turn()
    assert len(h.default.sets) == 3
    h.default.complete(2)
    h.default.complete(1)
    assert h.durable == []  # write set 0 is not durable: nothing after it is reported
    h.default.complete(0)
    assert h.durable == [1, 2, 3]


def test_a_serial_persister_gets_what_waited_and_the_reactions_in_its_next_write_set() -> None:
    default = FakePersister()
    turns: list[Callable[[], None]] = []
    durable: list[int] = []
    router: PersistRouter

    def on_durable(tokens: list[int]) -> None:
        durable.extend(tokens)
        if tokens == [1]:
            router.add(p(4, b"raft/reaction"))  # the machine answers the Persisted at once

    router = PersistRouter(
        default, on_durable=on_durable, on_failed=pytest.fail, defer=turns.append, serial=True
    )

    def end_turn() -> None:
        while turns:
            turns.pop(0)()

    router.add(p(1, b"raft/a"))
    end_turn()
    router.add(p(2, b"raft/b"))  # while the first write set is in flight
    end_turn()
    router.add(p(3, b"raft/c"))
    end_turn()
    assert default.sets == [[(b"raft/a", b"v1")]]  # held, not a second write set
    default.complete(0)
    assert durable == [1]
    end_turn()
    assert default.sets[1] == [(b"raft/b", b"v2"), (b"raft/c", b"v3"), (b"raft/reaction", b"v4")]
    default.complete(1)
    assert durable == [1, 2, 3, 4] and router.idle()


def test_a_stop_hands_over_what_a_serial_persister_holds() -> None:
    h = Harness()
    router = PersistRouter(
        h.default,
        on_durable=h.durable.extend,
        on_failed=pytest.fail,
        defer=h.turns.append,
        serial=True,
    )
    router.add(p(1, b"a"))
    h.end_turn()
    router.add(p(2, b"b"))
    assert not router.idle()
    router.flush(everything=True)
    assert h.default.sets == [[(b"a", b"v1")], [(b"b", b"v2")]]
    h.default.complete(1)
    h.default.complete(0)
    assert h.durable == [1, 2]


def test_prefixes_go_to_their_persister_longest_prefix_first() -> None:
    h = Harness()
    dtx, coord = FakePersister(), FakePersister()
    h.router.route(b"dtx/", dtx, label="dtx")
    h.router.route(b"dtx/c/", coord, label="coord")
    h.router.add(p(1, b"raft/x"))
    h.router.add(p(2, b"dtx/p/g1", b"dtx/t/g1"))
    h.router.add(p(3, b"dtx/c/g2"))
    h.end_turn()
    assert h.default.sets == [[(b"raft/x", b"v1")]]
    assert dtx.sets == [[(b"dtx/p/g1", b"v2"), (b"dtx/t/g1", b"v2")]]
    assert coord.sets == [[(b"dtx/c/g2", b"v3")]]
    # Across persisters there is no order: each reports when its own write is durable.
    dtx.complete(0)
    coord.complete(0)
    assert h.durable == [2, 3]
    h.default.complete(0)
    assert h.durable == [2, 3, 1]
    assert h.stats["dtx_persists"] == 1 and h.stats["coord_store_commits"] == 1


def test_distinct_keys_splits_a_turn_where_a_key_repeats() -> None:
    h = Harness()
    dtx = FakePersister()
    h.router.route(b"dtx/", dtx, label="dtx", distinct_keys=True)
    h.router.add(p(1, b"dtx/c/a"))
    h.router.add(p(2, b"dtx/p/a", b"dtx/seq"))
    h.router.add(p(3, b"dtx/c/a"))  # written again: a new write set
    h.router.add(p(4, b"dtx/t/b"))
    h.end_turn()
    assert dtx.sets == [
        [(b"dtx/c/a", b"v1"), (b"dtx/p/a", b"v2"), (b"dtx/seq", b"v2")],
        [(b"dtx/c/a", b"v3"), (b"dtx/t/b", b"v4")],
    ]
    dtx.complete(1)
    assert h.durable == []
    dtx.complete(0)
    assert h.durable == [1, 2, 3, 4]
    assert h.stats["dtx_persists"] == 4 and h.stats["dtx_store_commits"] == 2


def test_a_persist_spanning_two_persisters_is_refused_and_nothing_more_is_acknowledged() -> None:
    h = Harness()
    dtx = FakePersister()
    h.router.route(b"dtx/", dtx, label="dtx")
    h.router.add(p(1, b"raft/a"))
    h.router.add(p(2, b"raft/b", b"dtx/p/g"))  # cannot be atomic across two stores
    assert len(h.failures) == 1 and isinstance(h.failures[0], PersistRouteError)
    assert "two stores" in str(h.failures[0])
    h.end_turn()
    h.default.complete(0)
    assert h.durable == []  # fail-stop: not even the earlier, durable write is reported
    assert dtx.sets == []


def test_a_failed_write_set_stops_all_acknowledgements_and_is_reported_once() -> None:
    h = Harness()
    dtx = FakePersister()
    h.router.route(b"dtx/", dtx, label="dtx")
    h.router.add(p(1, b"raft/a"))
    h.router.add(p(2, b"dtx/t/g"))
    h.end_turn()
    h.router.add(p(3, b"raft/b"))
    h.end_turn()
    error = OSError("disk gone")
    h.default.complete(0, error)
    h.default.complete(1, OSError("again"))
    dtx.complete(0)
    assert h.failures == [error]
    assert h.durable == []


def test_a_persister_that_raises_is_a_failed_write() -> None:
    h = Harness(deferred=False)
    h.router.route(b"dtx/", RaisingPersister(), label="dtx")
    h.router.add(p(1, b"dtx/p/g"))
    assert len(h.failures) == 1 and isinstance(h.failures[0], OSError)


def test_without_defer_each_persist_is_handed_over_at_once() -> None:
    h = Harness(deferred=False)
    h.router.add(p(1, b"a"))
    h.router.add(p(2, b"b"))
    assert h.default.sets == [[(b"a", b"v1")], [(b"b", b"v2")]]
    h.default.complete(0)
    assert h.durable == [1]


def test_after_a_reset_completions_of_the_old_incarnation_are_ignored() -> None:
    h = Harness(deferred=False)
    h.router.add(p(1, b"a"))
    h.router.reset()  # a crash
    h.default.complete(0)
    assert h.durable == [] and h.router.idle()
    h.router.add(p(2, b"b"))
    h.default.complete(1)
    assert h.durable == [2]


def test_completions_from_another_thread_come_back_through_post() -> None:
    posted: list[Callable[[], None]] = []
    durable: list[int] = []
    default = FakePersister()
    router = PersistRouter(
        default, on_durable=durable.extend, on_failed=pytest.fail, post=posted.append
    )
    router.add(p(1, b"a"))
    t = threading.Thread(target=default.complete, args=(0,))
    t.start()
    t.join()
    assert durable == [] and len(posted) == 1  # nothing ran on the persister's thread
    posted[0]()
    assert durable == [1]


def test_a_route_needs_a_prefix_of_its_own() -> None:
    h = Harness()
    h.router.route(b"dtx/", FakePersister(), label="dtx")
    with pytest.raises(ValueError):
        h.router.route(b"dtx/", FakePersister(), label="again")
    with pytest.raises(ValueError):
        h.router.route(b"", FakePersister(), label="all")


# ------------------------------------------------- the real default persister
class GatedStore(ClusterStore):
    """A cluster store whose first commit waits for the test (an fsync in flight)."""

    def __init__(self, path: str) -> None:
        super().__init__(path, sync=False)
        self.gate = threading.Event()
        self.entered = threading.Event()
        self.commits: list[list[Write]] = []

    def commit(self, writes: object) -> int:
        batch = list(writes)  # type: ignore[call-overload]
        self.entered.set()
        if not self.commits:
            self.gate.wait(10)
        self.commits.append(batch)
        return super().commit(batch)


def test_the_store_writer_puts_what_arrives_during_a_commit_into_the_next_one(
    tmp_path: Path,
) -> None:
    store = GatedStore(str(tmp_path / "c"))
    writer = StoreWriter(store)
    done: list[tuple[int, BaseException | None]] = []
    lock = threading.Lock()

    def finished(i: int) -> Done:
        def cb(exc: BaseException | None) -> None:
            with lock:
                done.append((i, exc))

        return cb

    writer.persist([Persist(1, ((b"a", b"1"),))], finished(1))
    assert store.entered.wait(5)
    for i in (2, 3, 4):  # while the first commit is in flight
        writer.persist([Persist(i, ((b"k%d" % i, b"x"),))], finished(i))
    store.gate.set()
    writer.close()
    assert store.commits == [[(b"a", b"1")], [(b"k2", b"x"), (b"k3", b"x"), (b"k4", b"x")]]
    assert done == [(1, None), (2, None), (3, None), (4, None)]
    assert writer.stats["commits"] == 2
    assert store.recovered() == {b"a": b"1", b"k2": b"x", b"k3": b"x", b"k4": b"x"}
    store.close()


def test_a_failed_store_commit_is_reported_to_every_write_set_in_it(tmp_path: Path) -> None:
    class BrokenStore(ClusterStore):
        def commit(self, writes: object) -> int:
            raise OSError("disk gone")

    store = BrokenStore(str(tmp_path / "c"), sync=False)
    writer = StoreWriter(store)
    errors: list[BaseException | None] = []
    writer.persist([Persist(1, ((b"a", b"1"),)), Persist(2, ((b"b", b"2"),))], errors.append)
    writer.close()
    assert len(errors) == 1 and isinstance(errors[0], OSError)
    assert writer.stats["commits"] == 0
    store.close()


def test_a_bounded_serial_route_hands_its_backlog_a_bounded_write_set_at_a_time() -> None:
    """``max_writes``: what piled up while a write set was in flight goes in write sets of at
    most that many writes (a Persist is never cut; one larger than the bound goes alone),
    each after the one before is durable -- while the other routes go on meanwhile."""
    h = Harness()
    rep = FakePersister()
    h.router.route(b"rep/", rep, label="rep", serial=True, max_writes=4)
    h.router.add(p(1, b"rep/a", b"rep/b", b"rep/c"))
    h.router.add(p(2, b"rep/d", b"rep/e"))  # 5 writes with the first: over the bound
    h.router.add(p(3, b"rep/f"))
    h.router.add(p(4, b"rep/g", b"rep/h", b"rep/i", b"rep/j", b"rep/k"))  # larger than it
    h.router.add(p(5, b"raft/log"))
    h.end_turn()
    assert [len(s) for s in rep.sets] == [3]
    assert h.default.sets == [[(b"raft/log", b"v5")]]  # not behind the replicas' backlog
    h.default.complete(0)
    assert h.durable == [5]
    rep.complete(0)
    h.end_turn()
    assert [len(s) for s in rep.sets] == [3, 3]  # tokens 2 and 3: 3 writes, 4 more would not fit
    rep.complete(1)
    h.end_turn()
    assert [len(s) for s in rep.sets] == [3, 3, 5]  # token 4 alone, larger than the bound
    rep.complete(2)
    h.end_turn()
    assert h.durable == [5, 1, 2, 3, 4] and h.router.idle()
    assert h.stats["rep_store_commits"] == 3


def test_a_stop_hands_over_a_bounded_route_s_whole_backlog() -> None:
    h = Harness()
    rep = FakePersister()
    h.router.route(b"rep/", rep, label="rep", serial=True, max_writes=1)
    for token in (1, 2, 3):
        h.router.add(p(token, b"rep/%d" % token))
    h.end_turn()
    h.router.flush(everything=True)
    assert [len(s) for s in rep.sets] == [1, 2]


def test_a_bound_needs_a_serial_route() -> None:
    h = Harness()
    with pytest.raises(ValueError):
        h.router.route(b"rep/", FakePersister(), label="rep", max_writes=10)
    with pytest.raises(ValueError):
        h.router.route(b"rep/", FakePersister(), label="rep", serial=True, max_writes=0)


def test_a_bounded_route_to_the_default_persister_shares_its_turns() -> None:
    """The node's use (``node/machine.py``): the replicas' data on a bounded route of its
    own to the cluster store's one writer.  A turn's small write sets of both routes are
    handed together (the writer commits what is queued as one: one fsync); a backlog of
    the bounded route never holds the other route's next write set back."""
    h = Harness()
    h.router.route(b"rep/", h.default, label="rep", serial=True, max_writes=2)
    h.router.add(p(1, b"raft/a"))
    h.router.add(p(2, b"rep/a"))
    h.end_turn()
    assert h.default.sets == [[(b"raft/a", b"v1")], [(b"rep/a", b"v2")]]  # the same turn
    h.router.add(p(3, b"rep/b", b"rep/c"))
    h.router.add(p(4, b"rep/d", b"rep/e"))
    h.end_turn()  # rep/ is serial: both wait for token 2's write set
    h.default.complete(1)
    h.end_turn()
    assert h.default.sets[2:] == [[(b"rep/b", b"v3"), (b"rep/c", b"v3")]]  # one bound's worth
    h.router.add(p(5, b"raft/b"))
    h.end_turn()
    assert h.default.sets[3:] == [[(b"raft/b", b"v5")]]  # not behind token 4
