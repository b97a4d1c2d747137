"""The partition harness: its judge on made-up endings, and the short campaign on real namespaces.

The short campaign (``short``: isolate the cluster-log leader, isolate a
participant mid-commit, a one-way cut, a flapping link, each for 3 s, under the
bank load) needs root, ``ip netns`` and ``nft``; where they are missing it is
skipped and says which.  CI runs as root and installs nftables (.ci/run).
Replay or vary a round with ``python -m tests.jepsen --seed N --scenario S``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.jepsen.bank import START_BALANCE, Ledger, Verdict, judge
from tests.jepsen.netns import unavailable

SEED = int(os.environ.get("NONSTOP_JEPSEN_SEED", "1"))


# ------------------------------------------------------------------ the judge
def ending(
    record_second: bool = True,
) -> tuple[Ledger, list[tuple[int, int, list[str]]], list[tuple[str, int, int, int]]]:
    """Two acknowledged transfers 1→2 (5) and 2→1 (3), one after the other, and the
    final state that matches them."""
    led = Ledger()
    for tid, src, dst, amount, before in (("t1", 1, 2, 5, (100, 100)), ("t2", 2, 1, 3, (95, 105))):
        logs = {1: [] if tid == "t1" else ["t1"], 2: [] if tid == "t1" else ["t1"]}
        bal = {1: before[0], 2: before[1]}
        h_la, h_bank = led.la.invoke(tid), led.bank.invoke(tid)
        led.la.complete(
            h_la,
            "ok",
            [
                ("r", src, logs[src]),
                ("r", dst, logs[dst]),
                ("append", src, tid),
                ("append", dst, tid),
            ],
        )
        reads = [("r", src, bal[src]), ("r", dst, bal[dst])]
        writes = [("w", src, bal[src] - amount), ("w", dst, bal[dst] + amount)]
        led.bank.complete(h_bank, "ok", [*reads, *writes])
        led.acked[tid] = (src, dst, amount)
    accounts = [(1, 98, ["t1", "t2"]), (2, 102, ["t1", "t2"])]
    transfers = [("t1", 1, 2, 5), ("t2", 2, 1, 3)] if record_second else [("t1", 1, 2, 5)]
    return led, accounts, transfers


def judged(led: Ledger, accounts: list, transfers: list) -> Verdict:  # type: ignore[type-arg]
    h_la, h_bank = led.la.invoke("final"), led.bank.invoke("final")
    led.la.complete(h_la, "ok", [("r", n, log) for n, _, log in accounts])
    led.bank.complete(h_bank, "ok", [("r", n, b) for n, b, _ in accounts])
    return judge(led, [1, 2], accounts, transfers)


def test_the_judge_passes_an_ending_that_matches() -> None:
    assert START_BALANCE == 100
    verdict = judged(*ending())
    assert verdict.ok, verdict.problems


def test_the_judge_finds_a_lost_acknowledged_transfer() -> None:
    led, accounts, transfers = ending(record_second=False)
    accounts = [(1, 95, ["t1"]), (2, 105, ["t1"])]  # t2 vanished entirely
    problems = judged(led, accounts, transfers).problems
    assert any("acknowledged transfers lost: ['t2']" in p for p in problems), problems
    assert any("history (list-append)" in p for p in problems), problems


def test_the_judge_finds_money_made_and_a_torn_transfer() -> None:
    led, accounts, transfers = ending()
    accounts = [(1, 98, ["t1", "t2"]), (2, 105, ["t1", "t2"])]  # t2's debit of 2 never happened
    problems = judged(led, accounts, transfers).problems
    assert any("total not conserved: 203 != 200" in p for p in problems), problems
    assert any("balances do not match" in p for p in problems), problems
    assert any("history (bank)" in p for p in problems), problems


def test_the_judge_finds_a_failed_transfer_that_committed_and_a_stranger() -> None:
    led, accounts, transfers = ending()
    led.failed["t2"] = led.acked.pop("t2")
    transfers = [*transfers, ("t9", 1, 2, 1)]
    problems = judged(led, accounts, transfers).problems
    assert any("transfers that failed are present: ['t2']" in p for p in problems), problems
    assert any("transfers nobody asked for: ['t9']" in p for p in problems), problems


# ------------------------------------------------------------------ real namespaces
def test_short_campaign_on_real_network_namespaces(tmp_path: Path) -> None:
    reason = unavailable()
    if reason is not None:
        pytest.skip(f"netns partition harness not run: {reason}")
    from tests.jepsen.scenarios import run_round

    result = run_round(tmp_path / "round", SEED, "short", fault_s=3.0)
    print(result.report())
    assert result.ok, (
        result.report() + f"\nreplay: python -m tests.jepsen --seed {SEED} --scenario short"
    )
    # The faults really cut the network: the others saw each isolated node Down.
    assert len(result.observed) == 2, result.report()
    for victim, seen in result.observed:
        assert seen and all(f"{victim} Down" in v for v in seen.values()), result.report()
    assert result.stats["acked"] > 0 and result.stats["audits"] > 0, result.report()
    assert result.seconds < 60, result.report()


@pytest.mark.long  # ~20 s of real processes: `make test-long`; `make jepsen` rotates it too
def test_a_delay_round_on_real_network_namespaces(tmp_path: Path) -> None:
    """Delay without netem (tests/jepsen/relay.py): seed 0 delays everything B sends by
    300 ms; the history is checked like every round's, and the delay took effect (the
    transfers acknowledged per second during it fell below the rate before it)."""
    reason = unavailable()
    if reason is not None:
        pytest.skip(f"netns partition harness not run: {reason}")
    from tests.jepsen.scenarios import run_round

    result = run_round(tmp_path / "round", 0, "delay", fault_s=3.0)
    print(result.report())
    assert result.ok, result.report() + "\nreplay: python -m tests.jepsen --seed 0 --scenario delay"
    (fault,) = result.faults
    assert "delay everything B sends by 300 ms" in fault["fault"], result.report()
    assert fault["rate"] < result.baseline, result.report()
    assert result.stats["acked"] > 0 and result.stats["audits"] > 0, result.report()
