"""A configuration type for the configuration tests (loaded by nodes with ``--app``).

``rates``: exchange rates; the audit vetoes a non-positive rate, and refuses to
deactivate or remove a version named ``pinned``.  The notifier records what it
saw in :data:`SEEN` and logs it (logger ``tests.configmodel``: the cluster tests
read what a node's notifier heard from its log).
"""

from __future__ import annotations

import logging

from pydantic import BaseModel, ConfigDict

from nonstop.configuration import Change, Veto, config_type


class Rates(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    eur: float
    usd: float = 1.0
    note: str = ""


rates = config_type("rates", Rates)
SEEN: list[tuple[str, str, str]] = []


@rates.audit
def positive_rates(change: Change) -> None:
    audited = change.kind in ("load", "activate", "replace")
    if audited and isinstance(change.data, Rates) and change.data.eur <= 0:
        raise Veto(f"eur must be positive, got {change.data.eur}")
    if change.kind in ("deactivate", "remove") and change.version == "pinned":
        raise Veto("the pinned version stays")


@rates.notifier
def remember(change: Change) -> None:
    SEEN.append((change.kind, change.name, change.version))
    logging.getLogger(__name__).info(
        "rates notifier: %s %s %s", change.kind, change.name, change.version
    )
