"""A damaged object store rebuilt from the partitions' copies at start (issue 14).

replication.md §11 is the design.  In short: when the start check finds
``DATA/store`` damaged, ``DATA/cluster`` healthy, and the node routes by
partition with replication, the node keeps the damaged store aside
(``DATA/store.damaged-<UTC time>``; nothing is deleted), starts with an empty
store, and each partition's objects reach the new store the way they reach a
restarted node's: from the node's copy of the partition (``rep/`` keys of
``DATA/cluster``, restored from a healthy copy by D9 whenever it is behind or
diverged) when the node starts acting for it, and nothing of the partition is
served before that load completed (``ReplicatedClusterNode.ready``).

:func:`decide` is the rule, without I/O: it answers :class:`Start`,
:class:`Refuse` (the one line) or :class:`Repair` (the one line to log).
:func:`check_data_dir` runs the start check, reads what the rule needs and carries
the answer out.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

from nonstop.net import plain
from nonstop.node.datadir import Damage, DataDir

log = logging.getLogger("nonstop.node")

REFUSED = "damaged store, refusing to serve it"
"""The start of every refusal line (operations.md "Damaged, read-only or full data
directories"); unchanged from before the repair existed."""
COORDINATOR_KEY = b"dtx/seq"
"""The two-phase coordinator's next sequence (``dtx.protocol.K_SEQ``), kept in the object
store: a new store must not hand out a transaction id this node used before."""


@dataclass(frozen=True, slots=True)
class Start:
    """Nothing damaged: start as usual."""


@dataclass(frozen=True, slots=True)
class Refuse:
    """Do not start; ``line`` is the one-line error (stderr and the log)."""

    line: str


@dataclass(frozen=True, slots=True)
class Repair:
    """Move the object store aside and start with an empty one; ``problem`` is what the
    check found (named in the one line the repair logs)."""

    problem: str


Decision = Start | Refuse | Repair


def decide(
    damage: Damage,
    *,
    repairable: bool,
    partitions_known: bool,
    only_here: list[str],
) -> Decision:
    """The rule (replication.md §11, invariants R1-R4).

    ``repairable``: the node routes by partition, its partitions replicate and
    ``ha.repair_store`` is on.  ``partitions_known``: the partition table the node's
    cluster log last knew has partitions.  ``only_here``: the partitions of that table
    whose only in-sync copy is this node's (read only when the rule needs them).
    """
    if damage.cluster is not None:  # the node's copies and its place in the cluster: no
        return Refuse(f"{REFUSED}: {damage.cluster}")
    if damage.store is None:
        return Start()
    if not repairable:
        return Refuse(f"{REFUSED}: {damage.store}")
    if not partitions_known:
        return Refuse(
            f"{REFUSED}: {damage.store}; not repaired: the cluster log of this node knows "
            "no partition to rebuild it from"
        )
    if only_here:
        return Refuse(
            f"{REFUSED}: {damage.store}; not repaired: this node holds the only in-sync copy "
            f"of partitions {', '.join(only_here)} (restore DATA/store from a backup)"
        )
    return Repair(damage.store)


def aside_path(datadir: DataDir, now: float) -> Path:
    """``DATA/store.damaged-<UTC time>`` (a suffix when that name is taken)."""
    stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(now))
    path = datadir.path / f"store.damaged-{stamp}"
    n = 1
    while path.exists():
        n += 1
        path = datadir.path / f"store.damaged-{stamp}.{n}"
    return path


def check_data_dir(datadir: DataDir, *, repairable: bool, node: str) -> str | None:
    """The start check of ``datadir`` (writable, structure and checksums), with the repair
    of a damaged object store when :func:`decide` allows it; None to start, else the
    one-line refusal."""
    problem = datadir.check_writable()
    if problem is not None:
        return problem
    damage = datadir.damage()
    if damage.store is None or damage.cluster is not None or not repairable:
        decision = decide(damage, repairable=repairable, partitions_known=True, only_here=[])
    else:
        known = _known_partitions(datadir, node)
        decision = decide(
            damage,
            repairable=True,
            partitions_known=known is not None,
            only_here=[] if known is None else known[0],
        )
        if isinstance(decision, Repair):
            assert known is not None
            return repair(datadir, decision, known[1])
    return decision.line if isinstance(decision, Refuse) else None


def _known_partitions(datadir: DataDir, node: str) -> tuple[list[str], int | None] | None:
    """The partitions whose only in-sync copy is ``node``'s in the table its cluster log
    last knew, and the node's location code; None when that log knows no partition, cannot
    be read, or is another node's (then nothing is repaired)."""
    from nonstop.node.known_table import known_table, only_copies
    from nonstop.runtime.storage import ClusterStore

    try:
        cluster = ClusterStore(str(datadir.cluster_path))
        try:
            table = known_table(cluster.recovered())
            meta = cluster.read_meta()
        finally:
            cluster.close()
    except Exception:  # an unreadable log: the node refuses, as without the repair
        log.exception("reading the partition table of %s", datadir.cluster_path)
        return None
    if not table.partitions or meta.get("name") != node:
        return None  # (another node's directory: the identity check refuses it next)
    location = meta.get("location")
    return only_copies(table, node), None if location is None else int(location)


def repair(datadir: DataDir, decision: Repair, location: int | None) -> str | None:
    """Carry out ``decision``: the store moves aside, an empty one takes its place with a
    coordinator sequence no earlier transaction of this node used; the one line is logged.
    None, or the refusal line when the move itself fails (nothing was changed then)."""
    aside = aside_path(datadir, time.time())
    try:
        os.rename(datadir.store_path, aside)
        _sync_dir(datadir.path)
    except OSError as exc:
        return f"{REFUSED}: {decision.problem}; not repaired: cannot move it aside: {exc.strerror}"
    seed_new_store(datadir.store_path, location)
    log.warning(
        "damaged store, rebuilding it from the partitions' copies: %s; the damaged store is "
        "kept in %s",
        decision.problem,
        aside,
    )
    return None


def seed_new_store(path: Path, location: int | None) -> None:
    """Create the empty store at ``path`` with the node's location and a coordinator
    sequence above any this node used: the microseconds since the epoch (a node never ran
    a million distributed commits a second, so no id repeats across repairs either)."""
    from nonstop.store.lmdb_store import Store

    store = Store(path, location=location)
    try:
        with store.env.begin(write=True) as txn:
            txn.put(COORDINATOR_KEY, plain.pack(time.time_ns() // 1000), db=store.dtx)
    finally:
        store.close()


def _sync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


__all__ = [
    "COORDINATOR_KEY",
    "Decision",
    "Refuse",
    "Repair",
    "Start",
    "aside_path",
    "check_data_dir",
    "decide",
    "repair",
    "seed_new_store",
]
