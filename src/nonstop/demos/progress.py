"""Progress for the demos that reads well in a terminal and in a log file.

In a terminal: a tqdm bar (redrawn in place with carriage returns).  When the
output is a pipe or a file (``make demo > demo.log``, CI): no bar, since its
carriage-return frames would fill the log; a plain line every ``every`` seconds
instead, and a last line with the total.  Messages (``write``) go to stdout in
both cases, between the bar's redraws.
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

from tqdm import tqdm


class Progress:
    """``update(n)``, ``write(message)``, ``close()``; a context manager too."""

    def __init__(
        self,
        desc: str,
        unit: str,
        total: int | None = None,
        *,
        every: float = 5.0,
        enabled: bool = True,
        stream: TextIO | None = None,
    ) -> None:
        self._stream = sys.stdout if stream is None else stream
        self._desc, self._unit, self._total = desc, unit, total
        self._enabled = enabled
        self._every = every
        self._count = 0
        self._started = self._last = time.monotonic()
        self._bar: Any = None
        if enabled and self._stream.isatty():
            self._bar = tqdm(total=total, desc=desc, unit=unit, mininterval=1.0)

    def update(self, n: int = 1) -> None:
        self._count += n
        if self._bar is not None:
            self._bar.update(n)
            return
        now = time.monotonic()
        if self._enabled and now - self._last >= self._every:
            self._last = now
            self._line(now)

    def write(self, message: str) -> None:
        if self._bar is not None:
            self._bar.write(message)
        else:
            print(message, file=self._stream, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        elif self._enabled and self._count:
            self._line(time.monotonic())
            self._enabled = False  # a second close prints nothing

    def _line(self, now: float) -> None:
        elapsed = max(now - self._started, 1e-9)
        of = f" of {self._total:,}" if self._total is not None else ""
        print(
            f"  {self._desc}: {self._count:,}{of} {self._unit} in {elapsed:.0f} s "
            f"({self._count / elapsed:,.0f} {self._unit}/s)",
            file=self._stream,
            flush=True,
        )

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
