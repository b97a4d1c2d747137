"""The partition table under the nemesis (ha.md section 11): many seeds, mutants caught.

Every seed runs 3-5 HA cluster nodes (cluster log + partition table + promoter
+ restorer) through crashes, pauses, partitions both ways and one way, loss,
duplication and reordering, then heals, and checks: tables identical at the
same log index, one (active, current) per (partition, epoch), epochs never
going back within a node's life, and every partition Active again with every
listed node back in sync after the heal; and at no instant two nodes that may
acknowledge for one partition (liveness leases, ha.md section 8).  ``make sim`` runs more seeds.
"""

from __future__ import annotations

import os

import pytest

from nonstop.sim.partitions_campaign import CAMPAIGN, main
from nonstop.sim.runner import MutantOptions

SEEDS = int(os.environ.get("NONSTOP_PARTITION_SEEDS", "50"))
"""50 in ``make test``; ``make test-long`` runs 300 and ``make sim`` runs the campaign's
``SEEDS`` (1,000 by default)."""


@pytest.mark.timeout(300)
def test_partition_campaign_finds_no_violation(run_clean) -> None:
    outcomes = run_clean(CAMPAIGN, range(SEEDS), MutantOptions())
    failovers = sum(dict(o.counters)["failovers"] for o in outcomes)
    restores = sum(dict(o.counters)["restores"] for o in outcomes)
    # The runs exercised what they check: failovers and restores, many of them.
    assert failovers > SEEDS and restores > SEEDS


@pytest.mark.timeout(120)
@pytest.mark.parametrize(
    ("mutant", "invariant"),
    [
        ("no_epoch_bump", "one-active"),
        ("local_promotion", "table"),
        ("no_lease_wait", "one-acting"),
    ],
)
def test_broken_variants_are_caught(mutant: str, invariant: str) -> None:
    outcomes = CAMPAIGN.run(range(20), MutantOptions(mutant), jobs=1)
    caught = [o for o in outcomes if not o.ok]
    assert len(caught) >= 3, f"mutant {mutant} caught in only {len(caught)} of 20 seeds"
    assert any(invariant in v for o in caught for v in o.violations)


@pytest.mark.timeout(60)
def test_a_change_of_hands_hidden_in_a_snapshot_is_waited_out() -> None:
    # Issue 14 (session 11): a node that installs a snapshot goes on acting for the
    # partitions that did not change hands inside it (ha.md section 8).  The mutant that
    # goes on acting for every partition is rare to catch: 1 seed of 800 from 0, seed 192
    # since handovers end the lease wait early (session 12; seed 29 before).
    (broken,) = CAMPAIGN.run([192], MutantOptions("snapshot_keeps_acting"), jobs=1)
    assert not broken.ok
    assert any("one-acting" in v for v in broken.violations)
    (fixed,) = CAMPAIGN.run([192], MutantOptions(None), jobs=1)
    assert fixed.ok, fixed.violations


@pytest.mark.timeout(60)
def test_replay_explains_one_seed(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["--seed", "5", "--verbose"]) == 0
    out = capsys.readouterr().out
    assert "pt.changed" in out and "seed 5: ok" in out
