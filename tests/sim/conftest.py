"""What the simulation tests share: running a campaign's seeds and failing with replay commands."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import pytest

from nonstop.sim.runner import Campaign, SeedOutcome


def run_clean_seeds(
    campaign: Campaign[Any], seeds: Sequence[int], options: Any
) -> list[SeedOutcome]:
    """``seeds`` of ``campaign`` on 2 workers, all passed (else: the failures, replay commands)."""
    outcomes = campaign.run(seeds, options, jobs=2)
    failures = [o for o in outcomes if not o.ok]
    report = "\n".join(campaign.failure_text(o, options) for o in failures[:20])
    assert [o.seed for o in outcomes] == list(seeds)
    assert not failures, f"{len(failures)} of {len(outcomes)} seeds failed:\n{report}"
    return outcomes


@pytest.fixture
def run_clean() -> Callable[[Campaign[Any], Sequence[int], Any], list[SeedOutcome]]:
    """The test's way to run seeds that must all pass (:func:`run_clean_seeds`)."""
    return run_clean_seeds
