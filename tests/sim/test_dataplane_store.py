"""The simulated store of the data-plane scenario: locks, commits, two-phase commit, recovery."""

from __future__ import annotations

from typing import Any

from nonstop.dataplane.events import Exec
from nonstop.dtx.protocol import Ready, Refused
from nonstop.model import codec
from nonstop.model.ref import Ref
from nonstop.model.wire import write_out
from nonstop.runtime.interface import Persist, SetTimer
from nonstop.sim.scenarios.dataplane_store import (
    ACCOUNT,
    K_OBJ,
    TRANSFER,
    SimDataStore,
    StoreConfig,
)

LOC = 0x1234


def account_disk(*numbers: int, balance: int = 100) -> dict[bytes, bytes]:
    return {
        K_OBJ + Ref.make(LOC, 7, n).raw: codec.pack(
            [ACCOUNT, 1, {"number": n, "balance": balance, "log": []}]
        )
        for n in numbers
    }


def new_store(disk: dict[bytes, bytes] | None = None) -> SimDataStore:
    return SimDataStore("n1", LOC, 7, disk if disk is not None else account_disk(1, 2))


class Driver:
    """Runs Execs on a store and collects replies by corr."""

    def __init__(self, store: SimDataStore) -> None:
        self.store = store
        self.corr = 0
        self.replies: dict[int, dict[str, Any]] = {}
        self.persists: list[Persist] = []
        self.timers: list[SetTimer] = []

    def run(
        self,
        bid: str | None,
        op: str,
        iso: str | None = "serializable",
        writes: list[Any] | None = None,
        **fields: Any,
    ) -> int:
        self.corr += 1
        self.store.execute(0.0, Exec(self.corr, bid, op, fields, iso, writes))
        self.collect()
        return self.corr

    def collect(self) -> None:
        for done in self.store.take_done():
            self.replies[done.corr] = done.reply
        for action in self.store.take_actions():
            if isinstance(action, Persist):
                self.persists.append(action)
            elif isinstance(action, SetTimer):
                self.timers.append(action)

    def sync(self) -> None:
        """Every Persist so far is durable."""
        persists, self.persists = self.persists, []
        for p in persists:
            self.store.persisted(0.0, p.token)
        self.collect()

    def get(self, bid: str, number: int, lock: str = "write", **extra: Any) -> int:
        key = codec.pack({"number": number})
        return self.run(bid, "branch.get", type=ACCOUNT, tv=1, key=key, lock=lock, **extra)


def obj_of(reply: dict[str, Any]) -> tuple[bytes, int, dict[str, Any]]:
    ref, _, version, state = reply["o"]
    return ref, version, codec.unpack(state)


def test_a_get_finds_the_account_and_a_probe_locks_nothing_when_absent() -> None:
    d = Driver(new_store())
    c = d.get("n1.1", 1)
    ref, version, state = obj_of(d.replies[c])
    assert (version, state["balance"]) == (1, 100)
    assert d.store.locks.mode_held("n1.1", ("o", ref)) is not None
    c = d.get("n1.1", 9, if_found=True)
    assert d.replies[c] == {"o": None}
    assert ("k", ACCOUNT, "number", 9) not in d.store.locks.held_by("n1.1")


def test_a_conflicting_lock_waits_until_the_holder_ends() -> None:
    d = Driver(new_store())
    d.get("n1.1", 1)
    waiting = d.get("n2.1", 1)
    assert waiting not in d.replies
    d.store.end(0.0, "n1.1")
    d.collect()
    assert d.replies[waiting]["o"] is not None


def test_a_lock_wait_past_its_deadline_is_a_lock_timeout_and_dooms_the_branch() -> None:
    store = SimDataStore("n1", LOC, 7, account_disk(1), StoreConfig(lock_wait=0.25))
    d = Driver(store)
    d.get("n1.1", 1)
    waiting = d.get("n2.1", 1)
    assert [t.delay for t in d.timers] == [0.25]
    store.timer(0.25, d.timers[0].name)
    d.collect()
    assert d.replies[waiting]["error"] == "LockTimeout"
    later = d.get("n2.1", 1)
    assert d.replies[later]["error"] == "LockTimeout"  # doomed until ended


def test_a_deadlock_victim_gets_deadlock() -> None:
    d = Driver(new_store())
    d.get("a.1", 1)
    d.get("b.1", 2)
    d.get("a.1", 2)  # waits for b
    victim = d.get("b.1", 1)  # would close the cycle
    assert d.replies[victim]["error"] == "Deadlock"


def test_a_local_commit_is_visible_and_unlocked_only_once_durable() -> None:
    store = new_store()
    d = Driver(store)
    ref, version, _ = obj_of(d.replies[d.get("n1.1", 1)])
    w = write_out(ref, ACCOUNT, version, {"balance": 60, "log": ["t1"]})
    commit = d.run("n1.1", "branch.commit", writes=[w])
    assert commit not in d.replies and store.objects[ref].state["balance"] == 100
    reader = d.get("n2.1", 1, lock="read")
    assert reader not in d.replies
    (persist,) = d.persists
    d.sync()
    assert d.replies[commit] == {}
    assert obj_of(d.replies[reader])[1:] == (2, {"number": 1, "balance": 60, "log": ["t1"]})
    rebuilt = SimDataStore("n1", LOC, 7, {**account_disk(1, 2), **dict(persist.writes)})
    assert rebuilt.snapshot() == store.snapshot()


def test_a_stale_write_is_a_conflict() -> None:
    d = Driver(new_store())
    ref, version, _ = obj_of(d.replies[d.get("n1.1", 1)])
    stale = write_out(ref, ACCOUNT, version - 1, {"balance": 1})
    c = d.run("n1.1", "branch.write", writes=[stale])
    assert d.replies[c]["error"] == "Conflict"


def test_create_checks_the_unique_key_and_query_sees_the_branch_own_creates() -> None:
    d = Driver(new_store())
    st = codec.pack({"tid": "t1", "src": 1, "dst": 2, "amount": 5})
    c = d.run("n1.1", "branch.create", type=TRANSFER, tv=1, st=st)
    assert d.replies[c]["o"][2] == 0
    again = d.run("n1.1", "branch.create", type=TRANSFER, tv=1, st=st)
    assert d.replies[again]["error"] == "DuplicateKey"
    q = d.run("n1.1", "branch.query", type=TRANSFER, tv=1, lock="read")
    assert len(d.replies[q]["os"]) == 1
    other = d.run("n2.1", "branch.query", type=TRANSFER, tv=1, lock="read")
    assert d.replies[other]["os"] == []
    n = d.run("n1.1", "branch.count", type=TRANSFER, tv=1)
    assert d.replies[n] == {"n": 1}
    wrong = d.run("n1.1", "branch.count", type=TRANSFER, tv=2)
    assert d.replies[wrong]["error"] == "TypeVersionMismatch"


def test_request_results_are_recorded_under_a_lock_with_the_commit_and_only_once() -> None:
    d = Driver(new_store())
    assert d.replies[d.run("n1.1", "request.record", req=["c1", 1])] == {}
    rival = d.run("n1.2", "branch.commit", req=["c1", 1])
    assert rival not in d.replies  # the slot is locked until the first one ends
    d.run("n1.1", "branch.commit")
    d.sync()
    assert d.replies[rival] == {"done": [True, None]}  # the retry commits nothing
    look = d.run(None, "request.lookup", iso=None, req=["c1", 1])
    assert d.replies[look] == {"found": [True, None], "in_doubt": False}
    fields = {"req": ["c1", 2], "error": "Aborted", "message": "no"}
    abort = d.run(None, "request.abort", iso=None, **fields)
    d.sync()
    assert abort in d.replies
    look = d.run(None, "request.lookup", iso=None, req=["c1", 2])
    assert d.replies[look] == {"found": [False, ["Aborted", "no"]], "in_doubt": False}


def test_two_phase_commit_takes_the_branch_prepares_commits_and_recovers() -> None:
    store = new_store()
    d = Driver(store)
    taken: list[str] = []
    store.rm.take_branch = lambda bid: taken.append(bid) or True
    ref, version, _ = obj_of(d.replies[d.get("n2.5", 1)])
    w = write_out(ref, ACCOUNT, version, {"balance": 70})
    ops = [["b", "n2.5"], ["w", *w]]
    assert store.rm.check_ops(ops) is None
    (ready,) = store.rm.open("n2.9", ops)
    assert isinstance(ready, Ready) and taken == ["n2.5"]
    assert store.in_doubt() == 1
    late = d.get("n2.5", 2)  # the data plane's branch is gone
    assert d.replies[late]["error"] == "BranchRolledBack"
    # A crash now: the prepared record brings the branch back with its locks.
    disk = account_disk(1, 2)
    again = new_store(disk)
    again.rm.recover("n2.9", ready.record)
    assert again.locks.mode_held("n2.5", ("o", ref)) is not None
    writes, _ = again.rm.finish("n2.9", True)
    assert again.objects[ref].state["balance"] == 70 and again.objects[ref].version == 2
    assert again.locks.held_by("n2.5") == {}
    assert new_store({**disk, **dict(writes)}).snapshot() == again.snapshot()


def test_a_prepare_waits_for_locks_and_is_refused_when_its_branch_is_gone() -> None:
    store = new_store()
    d = Driver(store)
    store.rm.take_branch = lambda bid: bid != "n3.1"
    ref, version, _ = obj_of(d.replies[d.get("n2.5", 1, lock="read")])
    d.get("n1.7", 1, lock="read")  # a second reader: the prepare's write lock must wait
    w = write_out(ref, ACCOUNT, version, {"balance": 1})
    assert store.rm.open("n2.9", [["b", "n2.5"], ["w", *w]]) == []
    store.end(0.0, "n1.7")
    (ready,) = store.take_progress()
    assert isinstance(ready, Ready)
    (refused,) = store.rm.open("n3.4", [["b", "n3.1"]])
    assert isinstance(refused, Refused) and refused.reason == "branch gone"
