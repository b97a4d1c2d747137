"""The data path proven in simulation: the bank through the real data-plane machine, under faults.

Every seed runs 3 or 5 nodes -- cluster layer, two-phase commit with the
decision in the Raft log, the real :class:`~nonstop.dataplane.machine.DataPlane`
and a simulated store -- with clients running transfers as interactive
transactions (``tx.get`` with locks, write sets, ``tx.commit`` with a request id,
``request.result`` after a lost reply) through crashes (and crashes at a commit's
delicate steps), pauses, partitions, message loss, duplication, reordering and
disks that lose unsynced writes; then checks strict serializability and the
bank invariant on the recorded history, exactly-once, atomicity, conservation,
durability and liveness after the heal (``nonstop.sim.scenarios.dataplane``).
``python -m nonstop.sim.dataplane_campaign --seeds N`` runs more seeds.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import replace

import pytest

from nonstop.dataplane.machine import DataPlane
from nonstop.sim.dataplane_campaign import CAMPAIGN, DataPlaneOptions, main
from nonstop.sim.history import Recorder
from nonstop.sim.scenarios.dataplane import (
    INITIAL,
    FinalAudit,
    Ledger,
    ScenarioConfig,
    check_final,
    partitioned_config,
    run_seed,
)
from nonstop.sim.scenarios.dataplane_crashes import STEPS
from nonstop.sim.scenarios.dataplane_mutants import (
    MUTANTS,
    PARTITION_MUTANTS,
    SNAPSHOT_MUTANTS,
)
from nonstop.sim.scenarios.dataplane_node import SimDataNode

SEEDS = int(os.environ.get("NONSTOP_DATAPLANE_SEEDS", "50"))
"""50 in ``make test``; ``make test-long`` runs 300 and ``make sim`` runs the campaign's
``SEEDS`` (1,000 by default)."""
PARTITIONED_SEEDS = int(os.environ.get("NONSTOP_DATAPLANE_PARTITION_SEEDS", "20"))
"""20 in ``make test``, 100 in ``make test-long``."""
"""Seeds of the partitioned variant here (``make sim`` runs the campaign's 300+)."""


@pytest.mark.timeout(300)
def test_seeds_of_transfers_through_the_data_plane_keep_every_invariant(run_clean) -> None:
    started = time.perf_counter()
    outcomes = run_clean(CAMPAIGN, range(SEEDS), DataPlaneOptions())
    elapsed = time.perf_counter() - started
    # The runs did real work, and the hard paths happened.
    sums = CAMPAIGN.totals(outcomes)
    assert sums["acked"] > SEEDS * 5 and sums["failed"] > 0 and sums["audits"] > 0
    assert sum(o.events for o in outcomes) > SEEDS * 1000
    assert sums["cpu_us"] < SEEDS * 300_000  # the budget: 0.3 s of CPU per seed
    print(f"\n{SEEDS} seeds in {elapsed:.1f}s; {sums}")


def test_a_seed_runs_the_real_data_plane_and_exercises_commits_of_every_kind() -> None:
    result, sim = run_seed(3)
    assert result.ok, result.violations
    machine = sim.machine("n1")
    assert isinstance(machine, SimDataNode) and type(machine.dataplane) is DataPlane
    counts = result.stats["counts"]
    assert result.stats["acked"] > 5 and counts["transfers"] > result.stats["acked"]
    # Both kinds of commit ran: two-phase (the coordinator's stats) and local ones.
    two_phase = sum(sim.machine(n).dataplane.stats["two_phase"] for n in result.nodes)
    assert two_phase > 0
    assert any(op == "append" for t in result.history for op, _, _ in t.ops)


def test_every_crash_step_fires_and_the_run_stays_correct() -> None:
    fired: dict[str, int] = dict.fromkeys(STEPS[1:], 0)
    for seed in range(40):
        result, _ = run_seed(seed)
        assert result.ok, (seed, result.violations[:3])
        if result.stats["crash_fired"] is not None:
            fired[result.stats["step"]] += 1
    assert all(fired.values()), fired


def test_a_seed_replays_identically() -> None:
    config = replace(ScenarioConfig(), digest=True)
    a, sim_a = run_seed(17, config)
    b, sim_b = run_seed(17, config)
    assert sim_a.trace_digest == sim_b.trace_digest
    assert a.stats["events"] == b.stats["events"] > 1000
    _, sim_c = run_seed(18, config)
    assert sim_c.trace_digest != sim_a.trace_digest


def test_a_seed_replays_identically_in_other_processes_whatever_the_hash_seed() -> None:
    code = (
        "from dataclasses import replace\n"
        "from nonstop.sim.scenarios.dataplane import ScenarioConfig, run_seed\n"
        "print(run_seed(5, replace(ScenarioConfig(), digest=True))[1].trace_digest)"
    )
    digests = set()
    for hash_seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        out = subprocess.run(
            [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120
        )
        assert out.returncode == 0, out.stderr
        digests.add(out.stdout.strip())
    assert len(digests) == 1


@pytest.mark.parametrize("mutant", sorted(MUTANTS))
def test_a_broken_node_is_caught_within_a_few_seeds(mutant: str) -> None:
    """The checks are not vacuous: each deliberately broken variant fails a seed soon."""
    config = replace(ScenarioConfig(), node_class=MUTANTS[mutant])
    for seed in range(60):
        result, _ = run_seed(seed, config)
        if not result.ok:
            print(f"\n{mutant}: caught at seed {seed}: {result.violations[0]}")
            return
    pytest.fail(f"{mutant} was not caught in 60 seeds")


def test_no_branch_outlives_its_session_after_the_heal() -> None:
    """Issue 14: a partition (an end that never reached its node) or a paused node (the
    first op it was sent reaches it on resume, after its coordinator gave up) left a
    branch open past its session on the data plane before the fix, caught by
    ``branch-outlives-session`` (the mutant ``end-branches-once`` is that code).  The
    first two seeds where the mutant leaves such a branch are clean with the fix, and
    the fix's orphan rollbacks ran there.  (Seeds are searched, not fixed: a change of
    the schedule elsewhere, e.g. wound-wait, moves where the fault lands.)"""
    config = replace(ScenarioConfig(), node_class=MUTANTS["end-branches-once"])
    caught: list[int] = []
    for seed in range(80):
        before, _ = run_seed(seed, config)
        if "branch-outlives-session" in {v.invariant for v in before.violations}:
            caught.append(seed)
            if len(caught) == 2:
                break
    assert len(caught) == 2, f"the mutant left a branch open on {caught} only, in 80 seeds"
    for seed in caught:
        result, sim = run_seed(seed)
        assert result.ok, (seed, result.violations[:3])
        assert sum(sim.machine(n).dataplane.stats["orphan_rollbacks"] for n in result.nodes) > 0


def test_the_final_checks_flag_lost_duplicated_and_partial_transfers() -> None:
    """``check_final`` on hand-made audits: each kind of damage is named."""
    numbers = [1, 2]
    clock = lambda: 0.0  # noqa: E731
    ledger = Ledger(Recorder(clock), Recorder(clock), acked={"t1", "t2"}, failed={"t3"})

    def audit(transfers: list[dict[str, object]], b1: int, b2: int, log1: list[str]) -> FinalAudit:
        accounts = {
            1: {"number": 1, "balance": b1, "log": log1},
            2: {"number": 2, "balance": b2, "log": list(log1)},
        }
        return FinalAudit(accounts, transfers, committed=True)

    def found(a: FinalAudit) -> set[str]:
        seen: list[str] = []
        check_final(ledger, a, numbers, 2 * INITIAL, lambda kind, _: seen.append(kind))
        return set(seen)

    t1 = {"tid": "t1", "src": 1, "dst": 2, "amount": 5}
    t2 = {"tid": "t2", "src": 2, "dst": 1, "amount": 5}
    t3 = {"tid": "t3", "src": 1, "dst": 2, "amount": 1}
    assert found(audit([t1, t2], INITIAL, INITIAL, ["t1", "t2"])) == set()
    assert found(audit([t1], INITIAL - 5, INITIAL + 5, ["t1"])) == {"acked-lost"}
    assert "exactly-once" in found(audit([t1, t1, t2], INITIAL - 5, INITIAL + 5, ["t1", "t2"]))
    assert "aborted-but-present" in found(
        audit([t1, t2, t3], INITIAL - 1, INITIAL + 1, ["t1", "t2", "t3"])
    )
    assert found(audit([t1, t2], INITIAL, INITIAL, ["t1"])) == {"atomicity"}
    assert found(audit([t1, t2], INITIAL + 1, INITIAL, ["t1", "t2"])) >= {
        "atomicity",
        "conservation",
    }


def test_cli_replays_one_seed(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--seed", "2"]) == 0
    assert "seed 2: ok" in capsys.readouterr().out
    assert main(["--seed", "0", "--mutant", "ack-before-decision"]) == 1


# ------------------------------------------------------------ routing by partition
@pytest.mark.timeout(300)
def test_partitioned_seeds_keep_every_invariant(run_clean) -> None:
    """HA cluster nodes, two partitions per node with one copy (replicas = 0), the full
    nemesis: the same checks, plus ack-acting (dataplane_partitions)."""
    outcomes = run_clean(CAMPAIGN, range(PARTITIONED_SEEDS), DataPlaneOptions(partitions=True))
    sums = CAMPAIGN.totals(outcomes)
    assert sums["acked"] > PARTITIONED_SEEDS * 5 and sums["audits"] > 0


def test_a_partitioned_seed_places_objects_in_partitions() -> None:
    from nonstop.ha.partition_table import partition_location
    from nonstop.sim.scenarios.dataplane_store import TRANSFER

    result, sim = run_seed(3, partitioned_config())
    assert result.ok, result.violations
    assert result.stats["acked"] > 5
    placed = 0
    for name in result.nodes:
        machine = sim.machine(name)
        assert isinstance(machine, SimDataNode) and machine.dataplane.config.placement
        held = {
            partition_location(p)
            for p, part in machine.node.cluster.partition_table.partitions.items()
            if part.active == name
        }
        for ref, obj in machine.store.objects.items():
            # Every object -- loaded accounts and created transfers -- is named by a
            # partition this node holds, never by the node's own location.
            assert int.from_bytes(ref[:8], "big") in held, (name, ref.hex())
            placed += obj.type == TRANSFER
    assert placed >= result.stats["acked"]


@pytest.mark.parametrize("mutant", sorted(PARTITION_MUTANTS))
def test_a_node_acknowledging_for_a_partition_it_does_not_act_for_is_caught(mutant: str) -> None:
    config = replace(partitioned_config(), node_class=PARTITION_MUTANTS[mutant])
    for seed in range(20):
        result, _ = run_seed(seed, config)
        if not result.ok:
            assert any(v.invariant == "ack-acting" for v in result.violations)
            return
    pytest.fail(f"{mutant} was not caught in 20 seeds")


# -------------------------------------------------- a snapshot is a snapshot (issue 10)
def _snapshot_heavy(node_class: type[SimDataNode] = SimDataNode) -> ScenarioConfig:
    """Half the transactions are audits, nine in ten of them ``snapshot`` sums."""
    return replace(ScenarioConfig(), audit_share=0.5, snapshot_audits=0.9, node_class=node_class)


def test_snapshot_sums_are_the_total_under_faults() -> None:
    """No read skew in snapshot mode: every committed snapshot sum over every account is
    the conserved total (``bank-wrong-total`` otherwise), while cross-node transfers
    commit, through crashes, partitions and lost messages (snapshot_cut.py)."""
    snapshots = 0
    for seed in range(8):
        result, _ = run_seed(seed, _snapshot_heavy())
        assert result.ok, [str(v) for v in result.violations[:3]]
        snapshots += result.stats["counts"].get("snapshot_audits", 0)
    assert snapshots >= 50


@pytest.mark.parametrize("mutant", sorted(SNAPSHOT_MUTANTS))
def test_a_broken_snapshot_is_caught_within_a_few_seeds(mutant: str) -> None:
    """Reading the latest state instead of the view, or a cut that never finds a
    straddling commit, gives a torn sum the bank check reports within a few seeds."""
    for seed in range(20):
        result, _ = run_seed(seed, _snapshot_heavy(SNAPSHOT_MUTANTS[mutant]))
        if "bank-wrong-total" in {v.invariant for v in result.violations}:
            return
    pytest.fail(f"{mutant} was not caught in 20 seeds")
