"""The bank load of a partition round, its history, and the checks at the end.

Client threads run from the host (the bridge's ``.1``) against every node,
each with its own blocking handle; every transaction is recorded twice, the
way the simulator's data-path scenario records it
(:mod:`nonstop.sim.scenarios.dataplane`):

* a **list-append** history: a transfer reads both accounts' ``log`` and
  appends its id to each; an audit reads every log.  Checked by
  :func:`nonstop.sim.history.check_list_append` with real-time and per-client
  order (strict serializability);
* a **bank** history: the balances read and written; every audit reads all of
  them, so :func:`nonstop.sim.history.check_bank` checks that each snapshot
  sums to the total.

Outcomes: ``ok`` when the commit returned; ``fail`` when the transaction is
known not to have committed -- an error raised before the commit was sent
(the body failed, nothing was committed), or a commit refused with a definite
abort; ``info`` (unknown) otherwise.  The client itself asks the node for the
outcome of a commit whose reply was lost (``request.result``); what it still
cannot tell stays unknown and is resolved at the end from the ``Transfer``
records, which commit in the same transaction.  After an unknown outcome the
client continues under a new process id (its old transaction may still be in
flight).

At the end (:func:`final_check`), after the faults healed and the cluster is
Active again, one transaction reads every account and every transfer record,
and the round fails on: a total not conserved; an acknowledged transfer
missing, or recorded twice; a failed one present; an unknown one twice; a
transfer nobody asked for; balances or logs that do not match the records
(atomicity); any anomaly the history checker finds.
"""

from __future__ import annotations

import random
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import nonstop
from nonstop.errors import Abort, Aborted, Error, Retryable
from nonstop.sim.history import Recorder, check_bank, check_list_append
from tests.jepsen.app import Account, Transfer

START_BALANCE = 100
PER_NODE = 4
DEFINITE = (Retryable, Aborted, Abort)
"""Commit errors after which the transaction is known rolled back (data-path.md §5)."""
CLIENT_OPTIONS: dict[str, Any] = {"timeout": 2.0, "op_timeout": 8.0}
"""Short waits: a client whose node is cut off gives up and moves on in seconds."""


def numbers_of(names: list[str], node: str) -> list[int]:
    base = names.index(node) * 100
    return [base + i for i in range(PER_NODE)]


@dataclass
class Ledger:
    """What the clients did and were told."""

    la: Recorder = field(default_factory=Recorder)
    bank: Recorder = field(default_factory=Recorder)
    acked: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    failed: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    unknown: dict[str, tuple[int, int, int]] = field(default_factory=dict)
    errors: Counter[str] = field(default_factory=Counter)
    ack_times: list[float] = field(default_factory=list)
    audits: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)


class BankLoad:
    """``clients`` threads of transfers (and a share of audits) until :meth:`stop`."""

    def __init__(
        self,
        addresses: list[str],
        names: list[str],
        clients: int = 4,
        seed: int = 0,
        audit_share: float = 0.1,
    ) -> None:
        self.addresses = addresses
        self.names = names
        self.numbers = [n for node in names for n in numbers_of(names, node)]
        self.total = START_BALANCE * len(self.numbers)
        self.ledger = Ledger()
        self.clients = clients
        self.seed = seed
        self.audit_share = audit_share
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self.crashes: list[str] = []

    # ------------------------------------------------------------ set up
    def open_accounts(self, timeout: float = 30.0) -> None:
        """Each node's accounts, mastered there (on a healthy cluster, before faults).

        Run again on a retryable error, as a user's ``@transactional`` would: every
        partition is served when the cluster starts, but the node the client asks may
        not have applied the partition table's last entry yet (``NotActive``)."""
        deadline = time.monotonic() + timeout
        with nonstop.connect(self.addresses, **CLIENT_OPTIONS) as client:
            for node in self.names:
                while True:
                    try:
                        with client.transaction() as tx:
                            for n in numbers_of(self.names, node):
                                tx.create(Account, node=node, number=n, balance=START_BALANCE)
                        break
                    except nonstop.Retryable:
                        if time.monotonic() > deadline:
                            raise
                        time.sleep(0.1)

    # ------------------------------------------------------------ running
    def start(self) -> BankLoad:
        for i in range(self.clients):
            t = threading.Thread(target=self._client, args=(i,), name=f"bank-{i}", daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def stop(self, timeout: float = 60.0) -> list[str]:
        """Stop the clients; returns the names of those that did not finish in time."""
        self._stop.set()
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(timeout=max(0.0, deadline - time.monotonic()))
        return [t.name for t in self._threads if t.is_alive()]

    def _client(self, i: int) -> None:
        rng = random.Random(self.seed * 1000 + i)
        k = i % len(self.addresses)
        # The rotation is this run's own spread of clients (seeded): pinned, not H5's.
        order = self.addresses[k:] + self.addresses[:k]
        client = nonstop.connect(order, balance="first", **CLIENT_OPTIONS)
        state = {"epoch": 0, "seq": 0}
        try:
            while not self._stop.is_set():
                if rng.random() < self.audit_share:
                    self._audit(client, i, state)
                else:
                    self._transfer(client, i, state, rng)
        except Exception as exc:  # not an answer of the cluster: the harness is wrong
            self.crashes.append(f"client {i}: {exc!r}")
            raise
        finally:
            client.close()

    def _process(self, i: int, state: dict[str, int]) -> str:
        return f"c{i}.{state['epoch']}"

    def _transfer(
        self, client: nonstop.Client, i: int, state: dict[str, int], rng: random.Random
    ) -> None:
        led = self.ledger
        state["seq"] += 1
        tid = f"c{i}-{state['seq']}"
        src, dst = rng.sample(self.numbers, 2)
        amount = rng.randint(1, 10)
        move = (src, dst, amount)
        process = self._process(i, state)
        h_la, h_bank = led.la.invoke(process), led.bank.invoke(process)
        reads_la: list[tuple[Any, ...]] = []
        reads_bank: list[tuple[Any, ...]] = []
        committing = False
        try:
            with client.transaction() as tx:
                first, second = sorted((src, dst))
                got = {
                    first: tx.get(Account, number=first, lock="write"),
                    second: tx.get(Account, number=second, lock="write"),
                }
                a, b = got[src], got[dst]
                reads_la = [("r", src, list(a.log)), ("r", dst, list(b.log))]
                reads_bank = [("r", src, a.balance), ("r", dst, b.balance)]
                if a.balance < amount:
                    raise Abort("insufficient funds")
                new_a, new_b = a.balance - amount, b.balance + amount
                a.balance, b.balance = new_a, new_b
                a.log = [*a.log, tid]
                b.log = [*b.log, tid]
                tx.create(Transfer, tid=tid, src=src, dst=dst, amount=amount)
                committing = True
        except Error as exc:
            kind = type(exc).__name__
            writes_la = [("append", src, tid), ("append", dst, tid)]
            writes_bank = (
                [("w", src, reads_bank[0][2] - amount), ("w", dst, reads_bank[1][2] + amount)]
                if reads_bank
                else []
            )
            with led.lock:
                led.errors[f"{'commit' if committing else 'body'}:{kind}"] += 1
                if not committing or isinstance(exc, DEFINITE):
                    led.failed[tid] = move
                    led.la.complete(h_la, "fail", reads_la)
                    led.bank.complete(h_bank, "fail", reads_bank)
                else:
                    led.unknown[tid] = move
                    led.la.complete(h_la, "info", [*reads_la, *writes_la])
                    led.bank.complete(h_bank, "info", [*reads_bank, *writes_bank])
                    state["epoch"] += 1
            if not committing or not isinstance(exc, DEFINITE):
                self._stop.wait(0.05)  # a node is down or cut off: do not spin
            return
        with led.lock:
            led.acked[tid] = move
            led.ack_times.append(time.monotonic())
            led.la.complete(h_la, "ok", [*reads_la, ("append", src, tid), ("append", dst, tid)])
            led.bank.complete(h_bank, "ok", [*reads_bank, ("w", src, new_a), ("w", dst, new_b)])

    def _audit(self, client: nonstop.Client, i: int, state: dict[str, int]) -> None:
        led = self.ledger
        process = self._process(i, state)
        h_la, h_bank = led.la.invoke(process), led.bank.invoke(process)
        try:
            with client.transaction() as tx:
                seen = [
                    (a.number, a.balance, list(a.log))
                    for a in tx.query(Account).audit("fail_if_down").all()
                ]
        except Error as exc:
            with led.lock:
                led.errors[f"audit:{type(exc).__name__}"] += 1
                led.la.complete(h_la, "fail", [])
                led.bank.complete(h_bank, "fail", [])
            self._stop.wait(0.05)
            return
        with led.lock:
            led.audits += 1
            led.la.complete(h_la, "ok", [("r", n, log) for n, _, log in seen])
            led.bank.complete(h_bank, "ok", [("r", n, bal) for n, bal, _ in seen])


# ------------------------------------------------------------------ the end
@dataclass
class Verdict:
    problems: list[str]
    stats: dict[str, Any]

    @property
    def ok(self) -> bool:
        return not self.problems


def read_all(addresses: list[str], timeout: float = 60.0) -> tuple[list[Any], list[Any]]:
    """Every account and every transfer record in one transaction, retried until the
    cluster answers it (an in-doubt branch holds its locks until it is resolved)."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with nonstop.connect(addresses, **CLIENT_OPTIONS) as client, client.transaction() as tx:
                accounts = [
                    (a.number, a.balance, list(a.log))
                    for a in tx.query(Account).audit("fail_if_down").all()
                ]
                transfers = [
                    (t.tid, t.src, t.dst, t.amount)
                    for t in tx.query(Transfer).audit("fail_if_down").all()
                ]
            return accounts, transfers
        except Error:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.3)


SLOW_READ_S = 10.0
"""The final read runs on a healed, Active cluster with the load stopped: waiting longer
than this means some transaction still held its locks well after the heal."""


def final_check(load: BankLoad, timeout: float = 60.0) -> Verdict:
    """Read everything after the heal and judge the round (module docstring)."""
    led = load.ledger
    problems: list[str] = [f"a client thread crashed: {c}" for c in load.crashes]
    t0 = time.monotonic()
    final_la, final_bank = led.la.invoke("final"), led.bank.invoke("final")
    try:
        accounts, transfers = read_all(load.addresses, timeout)
    except Error as exc:
        counts = {
            "acked": len(led.acked),
            "failed": len(led.failed),
            "unknown": len(led.unknown),
            "errors": dict(led.errors.most_common(8)),
        }
        return Verdict(
            [*problems, f"stuck: the final read did not commit within {timeout:.0f}s ({exc!r})"],
            counts,
        )
    led.la.complete(final_la, "ok", [("r", n, log) for n, _, log in accounts])
    led.bank.complete(final_bank, "ok", [("r", n, bal) for n, bal, _ in accounts])
    verdict = judge(led, load.numbers, accounts, transfers)
    verdict.problems[:0] = problems
    took = time.monotonic() - t0
    verdict.stats["final_read_s"] = round(took, 2)
    if took > SLOW_READ_S:
        verdict.problems.append(
            f"locks held after the heal: the final read waited {took:.0f}s "
            "(lock waits of 5 s each) on a healed, idle cluster"
        )
    return verdict


def judge(
    led: Ledger,
    numbers: list[int],
    accounts: list[tuple[int, int, list[str]]],
    transfers: list[tuple[str, int, int, int]],
) -> Verdict:
    """The checks on the final state (``accounts``: number, balance, log; ``transfers``:
    tid, src, dst, amount) and on the histories (which end with the final read)."""
    problems: list[str] = []
    total = START_BALANCE * len(numbers)
    balances = {n: bal for n, bal, _ in accounts}
    logs = {n: log for n, _, log in accounts}
    if sorted(balances) != sorted(numbers):
        problems.append(f"accounts: expected {len(numbers)}, read {sorted(balances)}")
    if sum(balances.values()) != total:
        problems.append(f"total not conserved: {sum(balances.values())} != {total}")
    counts = Counter(t[0] for t in transfers)
    twice = sorted(tid for tid, c in counts.items() if c > 1)
    if twice:
        problems.append(f"transfers recorded twice: {twice[:5]}")
    missing = sorted(set(led.acked) - set(counts))
    if missing:
        problems.append(f"acknowledged transfers lost: {missing[:5]} ({len(missing)})")
    present_failed = sorted(set(led.failed) & set(counts))
    if present_failed:
        problems.append(f"transfers that failed are present: {present_failed[:5]}")
    strangers = sorted(set(counts) - set(led.acked) - set(led.unknown) - set(led.failed))
    if strangers:
        problems.append(f"transfers nobody asked for: {strangers[:5]}")
    expected = dict.fromkeys(numbers, START_BALANCE)
    touched: dict[int, set[str]] = {n: set() for n in numbers}
    for tid, src, dst, amount in transfers:
        asked = led.acked.get(tid) or led.unknown.get(tid) or led.failed.get(tid)
        if asked is not None and asked != (src, dst, amount):
            problems.append(f"transfer {tid} recorded as {(src, dst, amount)}, asked {asked}")
        if src in expected and dst in expected:
            expected[src] -= amount
            expected[dst] += amount
            touched[src].add(tid)
            touched[dst].add(tid)
    if balances and balances != expected:
        wrong = {
            n: (balances.get(n), expected[n]) for n in expected if balances.get(n) != expected[n]
        }
        problems.append(f"balances do not match the transfer records: {wrong}")
    for n, log in logs.items():
        if len(log) != len(set(log)) or set(log) != touched.get(n, set()):
            extra = sorted(set(log) - touched.get(n, set()))[:3]
            lacking = sorted(touched.get(n, set()) - set(log))[:3]
            problems.append(f"account {n}: log != its transfers (extra {extra}, missing {lacking})")
    resolved_committed = sorted(set(led.unknown) & set(counts))

    la = check_list_append(led.la.history(), realtime=True, process=True)
    if not la.valid:
        problems.append(f"history (list-append): {la.report(limit=2)}")
    bank = check_bank(led.bank.history(), total=total, accounts=numbers)
    if not bank.valid:
        problems.append(f"history (bank): {bank.report(limit=2)}")
    stats = {
        "acked": len(led.acked),
        "failed": len(led.failed),
        "unknown": len(led.unknown),
        "unknown_committed": len(resolved_committed),
        "audits": led.audits,
        "recorded": len(transfers),
        "history": la.stats.get("txns", len(led.la.history())),
        "errors": dict(led.errors.most_common(6)),
    }
    return Verdict(problems, stats)
