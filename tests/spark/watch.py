"""Watching a real cluster while a test's bulk work runs: nobody may be seen Down.

Shared by the large-overwrite tests (by node and by partition): :class:`DownWatcher`
asks every node for its view of the others all the time, and :class:`DownLog` finds
the lines a node's failure detector logs when it marks a peer Down.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from types import TracebackType

from nonstop.client.bulk import BulkClient


class DownWatcher:
    """A thread asking every node in ``addresses`` (name -> address) for its view of the
    cluster every 50 ms, from ``with`` until its end; :attr:`down_seen` lists each time a
    node saw a peer down."""

    def __init__(self, addresses: dict[str, str]) -> None:
        self.addresses = addresses
        self.down_seen: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run)

    def __enter__(self) -> DownWatcher:
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join(60)

    def _run(self) -> None:
        clients = {name: BulkClient(a, timeout=30) for name, a in self.addresses.items()}
        try:
            while not self._stop.is_set():
                for name, c in clients.items():
                    for peer in c.call("nodes")["nodes"]:
                        if not peer["up"]:
                            seen = f"{time.time():.3f} {name} saw {peer['name']} down"
                            self.down_seen.append(seen)
                time.sleep(0.05)
        finally:
            for c in clients.values():
                c.close()


class DownLog:
    """The failure detectors' "is Down" lines the nodes log from now on.

    The detector logs every peer it marks Down ("node B is Down: silent for ...")."""

    def __init__(self, logs: dict[str, Path]) -> None:
        self.logs = logs
        self.start = {name: path.stat().st_size for name, path in logs.items()}

    def lines(self) -> list[str]:
        found = []
        for name, path in self.logs.items():
            with path.open("rb") as f:
                f.seek(self.start[name])
                found += [f"{name}: {line!r}" for line in f if b" is Down" in line]
        return found
