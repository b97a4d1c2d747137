"""A node that replicates its partitions refuses bulk writes (node/main.py): they would
bypass the replication machine and be lost at a failover or restart (replication.md §10d)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from nonstop import errors
from nonstop.node.main import BULK_WRITES, refuse_unreplicated_bulk_writes


class _Service:
    def __init__(self) -> None:
        self.ran: list[str] = []

    async def _bulk(self, op: str, payload: dict[str, Any]) -> dict[str, Any]:
        self.ran.append(op)
        return {"r": op}


def test_bulk_writes_are_refused_and_reads_pass() -> None:
    service = _Service()
    refuse_unreplicated_bulk_writes(service)
    for op in sorted(BULK_WRITES):
        with pytest.raises(errors.BadArgument, match="not replicated"):
            asyncio.run(service._bulk(op, {}))
    assert asyncio.run(service._bulk("bulk.scan", {})) == {"r": "bulk.scan"}
    assert service.ran == ["bulk.scan"], "a refused write reached the store"
    # An overwrite's staging is invisible local records; its swap is a replicated
    # transaction (data-path.md §6.6): staging passes.
    assert asyncio.run(service._bulk("bulk.overwrite.part", {})) == {"r": "bulk.overwrite.part"}
