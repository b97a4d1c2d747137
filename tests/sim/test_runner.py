"""The campaign loop every campaign shares (nonstop.sim.runner.Campaign), on a made-up campaign.

The real campaigns' own tests run their seeds; these pin what the loop adds
around them: an exception is that seed's failure, failures print with the
command that replays them, the exit status, and the replay commands the
Makefile's and the docs' users type.
"""

from __future__ import annotations

import argparse

import pytest

from nonstop.sim import (
    campaign,
    dataplane_campaign,
    dtx_campaign,
    partitions_campaign,
    replication_campaign,
)
from nonstop.sim.checker import OnlineChecker
from nonstop.sim.runner import Campaign, MutantCampaign, MutantOptions, SeedOutcome


class Odd(Campaign[int]):
    """Seeds divisible by ``options`` fail, seed 13 raises; nothing else happens."""

    module = "tests.sim.odd"
    counters = ("double",)

    def add_options(self, parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--every", type=int, default=5)

    def options(self, args: argparse.Namespace) -> int:
        return int(args.every)

    def replay_options(self, options: int) -> str:
        return f" --every {options}"

    def run_seed(self, seed: int, options: int) -> SeedOutcome:
        if seed == 13:
            raise RuntimeError("boom")
        ok = seed % options != 0
        violations = () if ok else (f"t=0 divisible: {seed}",)
        return SeedOutcome(
            seed, ok, f"seed {seed}", violations, 10, counters=(("double", 2 * seed),)
        )

    def explain(self, seed: int, options: int, full_trace: bool) -> bool:
        return seed % options != 0


def test_a_campaign_or_checker_without_its_own_parts_cannot_be_built() -> None:
    # The hooks every campaign and online checker must have are abstract: leaving one
    # out fails at construction, not when a run first calls it.
    class NoExplain(Campaign[int]):
        module = "tests.sim.none"

        def options(self, args: argparse.Namespace) -> int:
            return 0

        def run_seed(self, seed: int, options: int) -> SeedOutcome:
            return SeedOutcome(seed, True, "", (), 0)

    for cls in (NoExplain, MutantCampaign, OnlineChecker):
        with pytest.raises(TypeError, match="abstract"):
            cls()  # type: ignore[abstract]


def test_outcomes_come_back_by_seed_and_an_exception_is_that_seeds_failure() -> None:
    outcomes = Odd().run(range(10, 16), 5, jobs=2)
    assert [o.seed for o in outcomes] == list(range(10, 16))
    assert [o.seed for o in outcomes if not o.ok] == [10, 13, 15]
    raised = next(o for o in outcomes if o.seed == 13)
    assert raised.summary == "seed 13: EXCEPTION" and "boom" in raised.violations[0]
    assert Odd().totals(outcomes) == {"double": 2 * sum(range(10, 16)) - 26}


def test_main_prints_each_failure_with_its_replay_command_and_exits_one(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert Odd().main(["--seeds", "4", "--start", "1", "--every", "3", "--jobs", "1"], None) == 1
    out = capsys.readouterr().out
    assert (
        "FAIL seed 3: t=0 divisible: 3\n"
        "  replay: python -m tests.sim.odd --seed 3 --every 3 --verbose" in out
    )
    assert out.splitlines()[-1].startswith("4 seeds, 1 failed, 40 events, ")
    assert Odd().main(["--seed", "4", "--every", "3"], None) == 0
    assert capsys.readouterr().out == "seed 4\n"


def test_the_replay_commands_keep_their_form() -> None:
    assert campaign.CAMPAIGN.replay_command(7, None) == (
        "python -m nonstop.sim.campaign --seed 7 --verbose"
    )
    assert (
        dtx_campaign.CAMPAIGN.replay_command(
            7, dtx_campaign.DtxOptions("after_propose", clustered=True)
        )
        == "python -m nonstop.sim.dtx_campaign --seed 7 --step after_propose --clustered --verbose"
    )
    assert dataplane_campaign.CAMPAIGN.replay_command(
        7, dataplane_campaign.DataPlaneOptions("ack_before_replica", True, 1)
    ) == (
        "python -m nonstop.sim.dataplane_campaign --seed 7 --mutant ack_before_replica "
        "--partitions --replicas 1 --verbose"
    )
    assert partitions_campaign.CAMPAIGN.replay_command(7, MutantOptions("no_epoch_bump")) == (
        "python -m nonstop.sim.partitions_campaign --seed 7 --mutant no_epoch_bump --verbose"
    )
    assert replication_campaign.CAMPAIGN.replay_command(7, MutantOptions()) == (
        "python -m nonstop.sim.replication_campaign --seed 7 --verbose"
    )
