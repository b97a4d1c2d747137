"""Request ids for exactly-once commits (H1): one client, many concurrent commits.

A commit carries ``[client id, sequence number]``; the node records its
outcome under that id, keeping a window of the last results *per client id*.
Sliding that window is serialized per id on the node, so one id shared by many
concurrent commits would make them wait for each other's fsync.  A client
therefore numbers its commits on *lanes*: ``"<client uuid>.<lane>"``, each lane
with its own sequence, and a lane carries one commit at a time.  A commit takes
a free lane (or opens a new one) and gives it back when its outcome is known,
so there are as many lanes as the client ever had commits in flight at once,
and each lane's sequence numbers are consecutive (never outside the window).
"""

from __future__ import annotations

import threading
import uuid


class RequestLanes:
    """Hands out ``[lane id, seq]`` pairs; thread-safe."""

    def __init__(self, client_id: str | None = None) -> None:
        self.client_id = client_id or uuid.uuid4().hex
        self._free: list[list[object]] = []  # [lane id, last seq used]
        self._opened = 0
        self._lock = threading.Lock()

    def take(self) -> list[object]:
        """A request id for one commit: ``[lane id, seq]``; give it back with :meth:`done`."""
        with self._lock:
            if self._free:
                lane = self._free.pop()
            else:
                self._opened += 1
                lane = [f"{self.client_id}.{self._opened}", 0]
            lane[1] = int(lane[1]) + 1  # type: ignore[call-overload]
            return [lane[0], lane[1]]

    def done(self, req: list[object]) -> None:
        """The commit's outcome is known (or given up on): its lane may carry the next one."""
        with self._lock:
            self._free.append([req[0], req[1]])

    @property
    def lanes(self) -> int:
        """How many lanes were ever opened (the most commits in flight at once)."""
        return self._opened


__all__ = ["RequestLanes"]
