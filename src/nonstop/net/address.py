"""``host:port`` addresses: the one parser every node, client and tool uses."""

from __future__ import annotations


def split_address(address: str) -> tuple[str, int]:
    """``"host:port"`` (IPv6 as ``"[::1]:7101"``) → ``(host, port)``; ``ValueError`` otherwise."""
    if not isinstance(address, str):
        raise ValueError(f"not a host:port address: {address!r:.60}")
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"not a host:port address: {address!r:.60}")
    return host.strip("[]"), int(port)


__all__ = ["split_address"]
