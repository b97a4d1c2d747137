"""The sans-I/O lock manager (SPEC B3, B4): rule by rule, then against a naive reference model."""

from __future__ import annotations

from collections.abc import Hashable

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from nonstop.tx.locks import (
    DeadlockFound,
    Grant,
    Granted,
    LockManager,
    LockMode,
    Request,
    Waiting,
)

R = LockMode.READ
W = LockMode.WRITE


def waiting(outcome: object) -> int:
    assert isinstance(outcome, Waiting), outcome
    return outcome.ticket


def queue(m: LockManager, resource: Hashable) -> list[tuple[Hashable, LockMode]]:
    return [(r.txn, r.mode) for r in m.waiters(resource)]


def assert_real_cycle(m: LockManager, cycle: tuple[Hashable, ...], requester: Hashable) -> None:
    """Each txn in ``cycle`` waits for the next and the last for the first (requester included)."""
    graph = m.wait_for()
    assert cycle[0] == requester
    assert len(set(cycle)) == len(cycle)
    # The requester's refused request is not in the graph; the rest of the cycle is.
    for a, b in zip(cycle[1:], (*cycle[2:], cycle[0]), strict=True):
        assert b in graph[a], (a, b, graph)


# ------------------------------------------------------------ compatibility
def test_uncontended_and_shared_reads_are_granted() -> None:
    m = LockManager()
    assert m.acquire("t1", "x", R) == Granted()
    assert m.acquire("t2", "x", R) == Granted()
    assert m.holders("x") == {"t1": R, "t2": R}
    assert m.acquire("t3", "y", W) == Granted()
    assert m.holders("y") == {"t3": W}


def test_writer_excludes_readers_and_writers() -> None:
    m = LockManager()
    assert m.acquire("t1", "x", W) == Granted()
    waiting(m.acquire("t2", "x", R))
    waiting(m.acquire("t3", "x", W))
    assert m.holders("x") == {"t1": W}
    assert queue(m, "x") == [("t2", R), ("t3", W)]


def test_reader_blocks_writer() -> None:
    m = LockManager()
    m.acquire("t1", "x", R)
    waiting(m.acquire("t2", "x", W))
    assert m.mode_held("t2", "x") is None


# ------------------------------------------------------------- re-entrancy
@pytest.mark.parametrize(("first", "again"), [(R, R), (W, W), (W, R)])
def test_reentrant_requests_are_granted_at_once(first: LockMode, again: LockMode) -> None:
    m = LockManager()
    m.acquire("t1", "x", first)
    waiting(m.acquire("t2", "x", W))  # somebody queued does not matter to a holder
    assert m.acquire("t1", "x", again) == Granted()
    assert m.mode_held("t1", "x") == first  # never weakened
    assert queue(m, "x") == [("t2", W)]


# --------------------------------------------------------------- promotion
def test_sole_reader_is_promoted_at_once_even_with_waiters() -> None:
    m = LockManager()
    m.acquire("t1", "x", R)
    waiting(m.acquire("t2", "x", W))
    assert m.acquire("t1", "x", W) == Granted()
    assert m.holders("x") == {"t1": W}
    assert m.held_by("t1") == {"x": W}


def test_upgrade_waits_ahead_of_ordinary_waiters() -> None:
    m = LockManager()
    m.acquire("t1", "x", R)
    m.acquire("t2", "x", R)
    waiting(m.acquire("t3", "x", W))  # queued first
    ticket = waiting(m.acquire("t1", "x", W))  # upgrade jumps ahead of t3
    assert [(r.txn, r.upgrade) for r in m.waiters("x")] == [("t1", True), ("t3", False)]
    assert m.release_all("t2") == [Grant(ticket, "t1", "x", W)]
    assert m.holders("x") == {"t1": W}
    assert queue(m, "x") == [("t3", W)]


def test_two_promoters_deadlock_and_the_second_is_the_victim() -> None:
    m = LockManager()
    m.acquire("t1", "x", R)
    m.acquire("t2", "x", R)
    ticket = waiting(m.acquire("t1", "x", W))
    outcome = m.acquire("t2", "x", W)
    assert outcome == DeadlockFound(("t2", "t1"))
    # The victim's request is not queued; its read lock stays until it rolls back.
    assert [r.txn for r in m.waiters("x")] == ["t1"]
    assert m.mode_held("t2", "x") == R
    assert m.release_all("t2") == [Grant(ticket, "t1", "x", W)]


def test_seed_figure_5_6_promotion_deadlock_across_two_objects() -> None:
    m = LockManager()
    m.acquire("t1", "o1", R)
    m.acquire("t2", "o2", R)
    ticket = waiting(m.acquire("t1", "o2", W))
    outcome = m.acquire("t2", "o1", W)
    assert isinstance(outcome, DeadlockFound)
    assert outcome.cycle == ("t2", "t1")
    assert m.release_all("t2") == [Grant(ticket, "t1", "o2", W)]
    assert m.held_by("t1") == {"o1": R, "o2": W}


def test_three_cycle_is_found_and_named() -> None:
    m = LockManager()
    for txn, res in (("t1", "a"), ("t2", "b"), ("t3", "c")):
        m.acquire(txn, res, W)
    waiting(m.acquire("t1", "b", R))
    waiting(m.acquire("t2", "c", R))
    outcome = m.acquire("t3", "a", R)
    assert isinstance(outcome, DeadlockFound)
    assert outcome.cycle == ("t3", "t1", "t2")
    assert_real_cycle(m, outcome.cycle, "t3")
    assert m.waiters("a") == []


def test_cycle_through_a_queued_waiter_not_only_holders() -> None:
    m = LockManager()
    m.acquire("t3", "w", W)
    m.acquire("t1", "x", R)
    waiting(m.acquire("t2", "x", W))  # t2 -> t1
    waiting(m.acquire("t3", "x", R))  # compatible with t1, but behind t2: t3 -> t2
    outcome = m.acquire("t1", "w", R)  # t1 -> t3 closes t1 -> t3 -> t2 -> t1
    assert isinstance(outcome, DeadlockFound)
    assert outcome.cycle == ("t1", "t3", "t2")
    assert_real_cycle(m, outcome.cycle, "t1")


def test_waiting_without_cycle_is_not_a_deadlock() -> None:
    m = LockManager()
    m.acquire("t1", "a", W)
    m.acquire("t2", "b", W)
    waiting(m.acquire("t1", "b", W))
    waiting(m.acquire("t3", "a", W))  # t3 -> t1 -> t2: a chain, no cycle
    assert m.wait_for() == {"t1": {"t2"}, "t3": {"t1"}}


# ------------------------------------------------------- FIFO, reader runs
def test_no_barging_reader_waits_behind_queued_writer() -> None:
    m = LockManager()
    m.acquire("t1", "x", R)
    waiting(m.acquire("t2", "x", W))
    waiting(m.acquire("t3", "x", R))  # compatible with t1, not with t2 ahead
    assert m.holders("x") == {"t1": R}
    assert m.wait_for() == {"t2": {"t1"}, "t3": {"t2"}}


def test_release_grants_a_run_of_readers_in_queue_order() -> None:
    m = LockManager()
    m.acquire("t1", "x", W)
    tickets = {t: waiting(m.acquire(t, "x", mode)) for t, mode in [("t2", R), ("t3", R)]}
    t4 = waiting(m.acquire("t4", "x", W))
    t5 = waiting(m.acquire("t5", "x", R))
    assert m.release_all("t1") == [
        Grant(tickets["t2"], "t2", "x", R),
        Grant(tickets["t3"], "t3", "x", R),
    ]
    assert m.release_all("t2") == []
    assert m.release_all("t3") == [Grant(t4, "t4", "x", W)]
    assert m.release_all("t4") == [Grant(t5, "t5", "x", R)]
    assert m.holders("x") == {"t5": R}


# ----------------------------------------------------- cancel, release_all
def test_cancel_unblocks_readers_queued_behind_the_cancelled_writer() -> None:
    m = LockManager()
    m.acquire("t1", "x", R)
    t2 = waiting(m.acquire("t2", "x", W))
    t3 = waiting(m.acquire("t3", "x", R))
    assert m.cancel(t2) == [Grant(t3, "t3", "x", R)]
    assert m.holders("x") == {"t1": R, "t3": R}
    assert m.cancel(t2) == []  # idempotent
    assert m.cancel(t3) == []  # already granted: ignored
    assert m.holders("x") == {"t1": R, "t3": R}


def test_cancelled_upgrade_keeps_the_read_lock() -> None:
    m = LockManager()
    m.acquire("t1", "x", R)
    m.acquire("t2", "x", R)
    up = waiting(m.acquire("t1", "x", W))
    t3 = waiting(m.acquire("t3", "x", R))  # behind the upgrade
    assert m.cancel(up) == [Grant(t3, "t3", "x", R)]
    assert m.holders("x") == {"t1": R, "t2": R, "t3": R}


def test_release_all_drops_queued_requests_and_frees_idle_locks() -> None:
    m = LockManager()
    m.acquire("t1", "x", W)
    m.acquire("t1", "y", R)
    waiting(m.acquire("t2", "x", R))
    assert [r.txn for r in m.pending("t2")] == ["t2"]
    assert m.release_all("t2") == []
    assert m.waiters("x") == []
    assert m.pending("t2") == []
    assert m.release_all("t1") == []
    assert m.resources() == []
    assert m.held_by("t1") == {}
    assert m.release_all("never-seen") == []


def test_release_all_grants_across_resources() -> None:
    m = LockManager()
    m.acquire("t1", "x", W)
    m.acquire("t1", "y", W)
    a = waiting(m.acquire("t2", "x", W))
    b = waiting(m.acquire("t3", "y", R))
    grants = m.release_all("t1")
    assert sorted(grants, key=lambda g: g.ticket) == [
        Grant(a, "t2", "x", W),
        Grant(b, "t3", "y", R),
    ]
    assert m.held_by("t2") == {"x": W}
    assert m.held_by("t3") == {"y": R}


# ------------------------------------------------------------- try_acquire
def test_try_acquire_grants_or_leaves_no_trace() -> None:
    m = LockManager()
    assert m.try_acquire("t1", "x", R)
    assert m.try_acquire("t1", "x", W)  # sole holder promotes
    assert not m.try_acquire("t2", "x", R)
    assert m.waiters("x") == []
    assert m.held_by("t2") == {}
    m.release_all("t1")
    m.acquire("t1", "x", R)
    waiting(m.acquire("t2", "x", W))
    assert not m.try_acquire("t3", "x", R)  # no barging past t2
    assert queue(m, "x") == [("t2", W)]
    assert m.try_acquire("t1", "x", R)  # re-entrant


def test_second_wait_on_same_resource_is_refused() -> None:
    m = LockManager()
    m.acquire("t1", "x", W)
    waiting(m.acquire("t2", "x", R))
    with pytest.raises(ValueError, match="already waits"):
        m.acquire("t2", "x", W)
    assert queue(m, "x") == [("t2", R)]


def test_a_txn_may_wait_on_two_resources_at_once() -> None:
    m = LockManager()
    m.acquire("t1", "x", W)
    m.acquire("t1", "y", W)
    waiting(m.acquire("t2", "x", R))
    waiting(m.acquire("t2", "y", R))
    assert {r.resource for r in m.pending("t2")} == {"x", "y"}
    assert len(m.release_all("t1")) == 2


def test_fast_paths_never_search_the_wait_for_graph(monkeypatch: pytest.MonkeyPatch) -> None:
    m = LockManager()

    def boom(*_: object) -> None:
        raise AssertionError("cycle search on a path that does not wait")

    monkeypatch.setattr(LockManager, "_cycle_through", boom)
    for res in range(5):
        assert m.acquire("t1", res, R) == Granted()
        assert m.acquire("t1", res, W) == Granted()
        assert m.acquire("t1", res, R) == Granted()
        assert m.acquire("t2", res + 10, R) == Granted()
        assert m.acquire("t3", res + 10, R) == Granted()
    assert m.release_all("t1") == []
    assert m.release_all("t2") == []
    assert m.release_all("t3") == []
    assert m.resources() == []


# ===================================================== reference model
class Model:
    """The rules written the slow, obvious way: recompute everything from scratch."""

    def __init__(self) -> None:
        self.holders: dict[int, dict[int, LockMode]] = {}
        self.queue: dict[int, list[Request]] = {}

    @staticmethod
    def clash(a: LockMode, b: LockMode) -> bool:
        return a is W or b is W

    def blockers(self, req: Request) -> set[int]:
        out = {
            h
            for h, m in self.holders.get(req.resource, {}).items()
            if h != req.txn and self.clash(req.mode, m)
        }
        for ahead in self.queue.get(req.resource, []):
            if ahead is req:
                break
            if ahead.txn != req.txn and self.clash(req.mode, ahead.mode):
                out.add(ahead.txn)
        return out

    def graph(self) -> dict[Hashable, set[Hashable]]:
        g: dict[Hashable, set[Hashable]] = {}
        for q in self.queue.values():
            for req in q:
                g.setdefault(req.txn, set()).update(self.blockers(req))
        return g

    @staticmethod
    def acyclic(g: dict[Hashable, set[Hashable]]) -> bool:
        g = {k: set(v) for k, v in g.items()}
        while True:
            sinks = [n for n, succ in g.items() if not (succ & g.keys())]
            if not sinks:
                return not g
            for n in sinks:
                del g[n]

    def grantable_now(self, txn: int, res: int, mode: LockMode) -> bool:
        holders = self.holders.get(res, {})
        held = holders.get(txn)
        if held is not None and held >= mode:
            return True
        if held is not None:
            return set(holders) == {txn}
        return all(not self.clash(mode, m) for h, m in holders.items() if h != txn) and all(
            not self.clash(mode, q.mode) for q in self.queue.get(res, [])
        )

    def grant(self, txn: int, res: int, mode: LockMode) -> None:
        self.holders.setdefault(res, {})[txn] = mode

    def settle(self) -> set[Grant]:
        granted: set[Grant] = set()
        for res, q in self.queue.items():
            while q:
                head = q[0]
                holders = self.holders.get(res, {})
                if any(self.clash(head.mode, m) for h, m in holders.items() if h != head.txn):
                    break
                q.pop(0)
                self.grant(head.txn, res, head.mode)
                granted.add(Grant(head.ticket, head.txn, res, head.mode))
        return granted


txns = st.integers(0, 4)
resources = st.integers(0, 2)
modes = st.sampled_from(LockMode)


class LockMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.real = LockManager()
        self.model = Model()

    @rule(txn=txns, res=resources, mode=modes)
    def acquire(self, txn: int, res: int, mode: LockMode) -> None:
        model = self.model
        q = model.queue.setdefault(res, [])
        held = model.holders.get(res, {}).get(txn)
        if (held is None or held < mode) and any(r.txn == txn for r in q):
            with pytest.raises(ValueError):
                self.real.acquire(txn, res, mode)
            return
        expect_now = model.grantable_now(txn, res, mode)
        outcome = self.real.acquire(txn, res, mode)
        if expect_now:
            assert outcome == Granted()
            model.grant(txn, res, max(mode, held or mode))
            return
        assert not isinstance(outcome, Granted)
        ticket = outcome.ticket if isinstance(outcome, Waiting) else -1
        req = Request(ticket, txn, res, mode, held is not None)
        if req.upgrade:
            q.insert(0, req)
        else:
            q.append(req)
        graph = model.graph()
        if model.acyclic(graph):
            assert isinstance(outcome, Waiting), outcome
        else:
            q.remove(req)
            assert isinstance(outcome, DeadlockFound), outcome
            cycle = outcome.cycle
            assert cycle[0] == txn
            for a, b in zip(cycle, (*cycle[1:], cycle[0]), strict=True):
                assert b in graph[a]

    @rule(txn=txns, res=resources, mode=modes)
    def try_acquire(self, txn: int, res: int, mode: LockMode) -> None:
        expect = self.model.grantable_now(txn, res, mode)
        assert self.real.try_acquire(txn, res, mode) is expect
        if expect:
            held = self.model.holders.get(res, {}).get(txn)
            self.model.grant(txn, res, max(mode, held or mode))

    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        tickets = [r.ticket for q in self.model.queue.values() for r in q]
        ticket = data.draw(st.sampled_from([*tickets, 10**6]))  # 10**6: never issued
        for q in self.model.queue.values():
            q[:] = [r for r in q if r.ticket != ticket]
        expect = self.model.settle()
        assert set(self.real.cancel(ticket)) == expect

    @rule(txn=txns)
    def release_all(self, txn: int) -> None:
        for h in self.model.holders.values():
            h.pop(txn, None)
        for q in self.model.queue.values():
            q[:] = [r for r in q if r.txn != txn]
        expect = self.model.settle()
        grants = self.real.release_all(txn)
        assert len(grants) == len(set(grants))
        assert set(grants) == expect

    # ------------------------------------------------------------ invariants
    @invariant()
    def matches_model(self) -> None:
        for res in range(3):
            assert self.real.holders(res) == self.model.holders.get(res, {})
            assert self.real.waiters(res) == self.model.queue.get(res, [])

    @invariant()
    def writer_is_alone(self) -> None:
        for res in self.real.resources():
            holders = self.real.holders(res)
            assert W not in holders.values() or len(holders) == 1

    @invariant()
    def every_waiter_is_blocked(self) -> None:
        """No lost wake-up: a waiter compatible with holders and everyone ahead was granted."""
        for res in self.real.resources():
            holders = self.real.holders(res)
            ahead: list[Request] = []
            for req in self.real.waiters(res):
                blocked = any(
                    h != req.txn and Model.clash(req.mode, m) for h, m in holders.items()
                ) or any(a.txn != req.txn and Model.clash(req.mode, a.mode) for a in ahead)
                assert blocked, (req, holders, ahead)
                ahead.append(req)

    @invariant()
    def wait_for_graph_is_acyclic_and_right(self) -> None:
        graph = self.real.wait_for()
        assert Model.acyclic(graph)
        assert graph == self.model.graph()

    @invariant()
    def held_by_mirrors_holders(self) -> None:
        for txn in range(5):
            for res, mode in self.real.held_by(txn).items():
                assert self.real.holders(res)[txn] == mode
                assert self.real.mode_held(txn, res) == mode
        for res in self.real.resources():
            assert self.real.holders(res) or self.real.waiters(res)  # no idle lock kept


LockMachine.TestCase.settings = settings(
    max_examples=250,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestLockMachine = LockMachine.TestCase


def test_try_acquire_many_takes_the_free_ones_and_names_the_rest() -> None:
    m = LockManager()
    assert m.acquire("other", "w", W) is not None and m.acquire("other", "r", R) is not None
    assert m.acquire("me", "mine", R) is not None
    busy = m.try_acquire_many("me", ["a", "w", "r", "mine", "b", "a"], W)
    # "w" and "r" are held by another; "mine" is mine alone (an upgrade); "a" twice is fine.
    assert busy == ["w", "r"]
    assert m.held_by("me") == {"mine": W, "a": W, "b": W}
    assert m.holders("w") == {"other": W}
    assert m.try_acquire_many("x", [], W) == [] and m.held_by("x") == {}
    m.release_all("me")
    assert m.held_by("me") == {} and m.holders("a") == {}
    assert m.try_acquire_many("other", ["a"], R) == [] and m.holders("a") == {"other": R}
