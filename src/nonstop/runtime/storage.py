"""The node's cluster state on disk: one LMDB environment in ``DATA/cluster``.

Two sub-databases:

* ``state`` — exactly the keys protocol machines write with ``Persist``; its
  whole content is handed back to the machine as ``recovered`` at start;
* ``meta``  — the node's identity (cluster id, name, location code, store
  timestamp) written once when the data directory is created, so a restart
  cannot silently become another node or join another cluster.

It is kept apart from the object store (``DATA/store``) so that the cluster log's
fsyncs (group committed here) never wait behind bulk object writes, and the
other way round.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from typing import Any

import lmdb
import msgpack

DEFAULT_MAP_SIZE = 1 << 30


class ClusterStore:
    """A thin, blocking wrapper; the runtime calls :meth:`commit` from an executor."""

    def __init__(self, path: str, *, map_size: int = DEFAULT_MAP_SIZE, sync: bool = True) -> None:
        os.makedirs(path, exist_ok=True)
        # sync=True: every write transaction's commit is an fsync (the group
        # commit makes that affordable); metasync too, so a crash never loses
        # the newest commit's meta page.
        self.env = lmdb.open(
            path,
            map_size=map_size,
            max_dbs=4,
            sync=sync,
            metasync=sync,
            subdir=True,
            lock=True,
        )
        self._state = self.env.open_db(b"state")
        self._meta = self.env.open_db(b"meta")

    # ----------------------------------------------------------- identity
    def read_meta(self) -> dict[str, Any]:
        with self.env.begin(db=self._meta) as txn:
            return {k.decode(): msgpack.unpackb(v, raw=False) for k, v in txn.cursor()}

    def write_meta(self, values: dict[str, Any]) -> None:
        with self.env.begin(write=True, db=self._meta) as txn:
            for k, v in values.items():
                txn.put(k.encode(), msgpack.packb(v, use_bin_type=True))

    # -------------------------------------------------------------- state
    def recovered(self) -> dict[bytes, bytes]:
        """Every durable key/value the machines persisted."""
        with self.env.begin(db=self._state) as txn:
            return {bytes(k): bytes(v) for k, v in txn.cursor()}

    def commit(self, writes: Iterable[tuple[bytes, bytes | None]]) -> int:
        """Apply ``writes`` in order in one write transaction (one fsync); return the count."""
        n = 0
        with self.env.begin(write=True, db=self._state) as txn:
            for key, value in writes:
                if value is None:
                    txn.delete(key)
                else:
                    txn.put(key, value)
                n += 1
        return n

    def close(self) -> None:
        self.env.close()
