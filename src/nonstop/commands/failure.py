"""A command's refusal: :class:`CommandError` (one line and its kind)."""

from __future__ import annotations

from typing import Literal

ErrorKind = Literal["usage", "refused", "forbidden", "unavailable", "failed"]


class CommandError(Exception):
    """A command's refusal: one line for the operator and what kind of failure it is.

    ``usage``: the arguments name something that does not exist or cannot be
    (CLI exit 2, HTTP 400); ``refused``: the cluster refused the change (exit 2,
    HTTP 409); ``forbidden``: the node refused the caller's role (exit 1, HTTP 403);
    ``unavailable``: no node answered (exit 1, HTTP 503); ``failed``:
    anything else (exit 1, HTTP 500).
    """

    def __init__(self, message: str, kind: ErrorKind = "failed") -> None:
        super().__init__(message)
        self.message = message
        self.kind = kind


__all__ = ["CommandError", "ErrorKind"]
