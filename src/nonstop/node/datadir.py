"""A node's data directory: identity, pid file, and where each part lives.

Layout::

    DATA/cluster/    LMDB: the cluster's durable state (Raft log, views) + identity
    DATA/store/      the object store (``nonstop.open``), when available
    DATA/node.pid    "pid listen-address" while the node runs
    DATA/node.json   the effective configuration of the last start
    DATA/node.log    the log when the node runs detached

The identity (cluster id, node name, location code, store timestamp — C1) is
written once, at the first start, and checked at every later one: a data
directory cannot silently change clusters or become another node.
"""

from __future__ import annotations

import contextlib
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from nonstop.net.handshake import location_code
from nonstop.node.config import DEFAULT_CLUSTER, ConfigError, NodeConfig
from nonstop.runtime.storage import ClusterStore
from nonstop.store.verify import verify_isolated

START_VERIFY_SECONDS = 2.0
"""Time budget of the structure and checksum walk of each LMDB file at start (the
rest is checked by ``nonstop store verify``): a start stays quick on a big store."""


@dataclass(frozen=True, slots=True)
class Damage:
    """What the start check found wrong with each part of a data directory (one line each)."""

    cluster: str | None = None
    store: str | None = None


@dataclass(frozen=True, slots=True)
class Identity:
    """Who this node is, for ever (C1)."""

    cluster: str
    name: str
    location: int
    timestamp: int


class DataDir:
    """Paths and checks for one data directory."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path).resolve()

    @property
    def cluster_path(self) -> Path:
        return self.path / "cluster"

    @property
    def store_path(self) -> Path:
        return self.path / "store"

    @property
    def pid_path(self) -> Path:
        return self.path / "node.pid"

    @property
    def log_path(self) -> Path:
        return self.path / "node.log"

    @property
    def config_path(self) -> Path:
        return self.path / "node.json"

    # ------------------------------------------------------------ identity
    def _check_routing(self, store: ClusterStore, meta: dict[str, object], cfg: NodeConfig) -> None:
        """A data directory keeps the data routing it was made with (``ha.data``).

        References made under routing by node name a node, under routing by partition a
        partition: read with the other routing, objects would be looked for in the wrong
        place.  A directory made before the routing was recorded was made with the old
        default, routing by node, unless its config said ``data`` explicitly (``nonstop
        local up`` wrote ``"partitions"``): that routing is recorded now.
        """
        explicit = "data" in cfg.ha.model_fields_set
        made = meta.get("routing")
        if made is None:
            if not explicit and cfg.ha.data != "nodes":
                raise ConfigError(
                    f"data directory {self.path} was made when a node routed by node by "
                    f'default; its objects are routed by node: add [ha] data = "nodes" to '
                    "this node's config to keep them, or start a new data directory "
                    "(`nonstop pipeline export` and `import` move the objects)"
                )
            store.write_meta({"routing": cfg.ha.data})
            return
        if made != cfg.ha.data:
            how = {"nodes": "by node", "partitions": "by partition"}
            raise ConfigError(
                f"data directory {self.path} holds objects routed {how.get(str(made), made)} "
                f'(ha.data = "{made}"), but this config routes {how[cfg.ha.data]} '
                f'(ha.data = "{cfg.ha.data}"{"" if explicit else ", the default"}): set '
                f'[ha] data = "{made}" to keep them, or start a new data directory '
                "(`nonstop pipeline export` and `import` move the objects)"
            )

    def open_identity(self, cfg: NodeConfig) -> tuple[ClusterStore, Identity]:
        """Open ``DATA/cluster``; create the identity or check it against ``cfg``."""
        self.path.mkdir(parents=True, exist_ok=True)
        store = ClusterStore(str(self.cluster_path), sync=cfg.sync)
        try:
            meta = store.read_meta()
            if not meta:
                ident = Identity(
                    cluster=cfg.cluster or DEFAULT_CLUSTER,
                    name=cfg.name,
                    location=location_code(cfg.name),
                    timestamp=time.time_ns(),
                )
                store.write_meta(
                    {
                        "cluster": ident.cluster,
                        "name": ident.name,
                        "location": ident.location,
                        "timestamp": ident.timestamp,
                        "format": 1,
                        "routing": cfg.ha.data,
                    }
                )
                return store, ident
            if cfg.cluster is not None and meta["cluster"] != cfg.cluster:
                raise ConfigError(
                    f"data directory {self.path} belongs to cluster {meta['cluster']!r}, "
                    f"not {cfg.cluster!r}"
                )
            if meta["name"] != cfg.name:
                raise ConfigError(
                    f"data directory {self.path} belongs to node {meta['name']!r}, not {cfg.name!r}"
                )
            self._check_routing(store, meta, cfg)
            return store, Identity(
                cluster=meta["cluster"],
                name=meta["name"],
                location=int(meta["location"]),
                timestamp=int(meta["timestamp"]),
            )
        except BaseException:
            store.close()
            raise

    # --------------------------------------------------------- start checks
    def check_writable(self) -> str | None:
        """None, or the one-line reason the data directory cannot take writes (a
        read-only file system, no space left, no permission), found by writing, syncing
        and removing a small file in it and in each part that exists."""
        for where in (self.path, self.cluster_path, self.store_path):
            if not where.is_dir():
                continue
            probe = where / ".write-probe"
            try:
                fd = os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                try:
                    os.write(fd, b"\0" * 4096)
                    os.fsync(fd)
                finally:
                    os.close(fd)
                    probe.unlink(missing_ok=True)
            except OSError as exc:
                return f"data directory {where} is not writable: {exc.strerror}"
        return None

    def verify(self, seconds: float = START_VERIFY_SECONDS) -> str | None:
        """None, or the one-line error naming the damaged file and where (structure and
        checksums of ``cluster`` and ``store``, each within ``seconds``; the walk runs in a
        child process, so a page that crashes LMDB is reported, not fatal)."""
        damage = self.damage(seconds)
        problem = damage.cluster or damage.store
        return None if problem is None else f"damaged store, refusing to serve it: {problem}"

    def damage(self, seconds: float = START_VERIFY_SECONDS) -> Damage:
        """What the start check finds wrong with ``cluster`` and with ``store``, each one line
        or None (:meth:`verify`); a store the node stopped serving at run time (its
        :attr:`damage_mark`) counts as damaged even when the bounded walk passes it."""
        found: list[str | None] = []
        for where in (self.cluster_path, self.store_path):
            if not (where / "data.mdb").exists():
                found.append(None)
                continue
            report = verify_isolated(str(where), seconds=seconds)
            found.append(None if report.ok else report.summary())
        cluster, store = found
        return Damage(cluster=cluster, store=store or self.marked_damage())

    # ------------------------------------------------------ damage at run time
    @property
    def damage_mark(self) -> Path:
        """``DATA/store/DAMAGED``: the one line of damage found while the node ran.  The
        bounded start walk may not reach a damaged record a transaction or the scrub found;
        the mark makes the next start treat the store as damaged.  It lives inside the store
        directory so that restoring ``DATA/store`` from a backup removes it too."""
        return self.store_path / "DAMAGED"

    def mark_damage(self, problem: str) -> None:
        """Remember ``problem`` (found at run time in the object store) for the next start;
        best effort (a full or read-only disk cannot take it, and the node stops anyway).
        Damage of the cluster store is not marked: the bounded walk of a small cluster log
        finds it, and the mark would survive restoring ``DATA/cluster`` from a backup."""
        if str(self.cluster_path) in problem or not self.store_path.is_dir():
            return
        with contextlib.suppress(OSError):
            self.damage_mark.write_text(problem.splitlines()[0] + "\n")

    def marked_damage(self) -> str | None:
        try:
            text = self.damage_mark.read_text().strip()
        except OSError:
            return None
        return text or None

    # ------------------------------------------------------------ pid file
    def running_pid(self) -> int | None:
        """The pid of the live node using this directory, or None."""
        try:
            text = self.pid_path.read_text().split()
            pid = int(text[0])
        except (OSError, ValueError, IndexError):
            return None
        return pid if pid_alive(pid) else None

    def running_address(self) -> str | None:
        try:
            parts = self.pid_path.read_text().split()
        except OSError:
            return None
        return parts[1] if len(parts) > 1 and self.running_pid() else None

    def write_pid(self, listen: str) -> None:
        tmp = self.pid_path.with_suffix(".pid.tmp")
        tmp.write_text(f"{os.getpid()} {listen}\n")
        os.replace(tmp, self.pid_path)

    def remove_pid(self) -> None:
        with contextlib.suppress(OSError):
            if self.pid_path.read_text().split()[0] == str(os.getpid()):
                self.pid_path.unlink()

    def save_config(self, cfg: NodeConfig) -> None:
        tmp = self.config_path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(cfg.to_dict(), indent=2, default=str))
        os.replace(tmp, self.config_path)


def pid_alive(pid: int) -> bool:
    """True when a process with ``pid`` exists (and is not a zombie we can see)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as fh:
            state = fh.read().rsplit(")", 1)[1].split()[0]
        return state != "Z"
    except (OSError, IndexError):
        return True
