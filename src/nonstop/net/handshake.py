"""The hello exchanged when a connection opens: identity checks, version negotiation.

Both sides send a hello as their first frame.  The dialing side speaks first;
the accepting side answers with its own hello carrying the chosen version, or
with a ``reject`` naming why.  Checks, in order:

1. the message is a hello at all (else: the connection is garbage, close it);
2. the cluster id matches (a node started on another cluster's data directory
   must not mix its state into this cluster); a client may leave it empty to
   talk to whatever cluster answers;
3. protocol versions overlap: the *highest common* version is used, so a
   newer node keeps talking to an older one during a rolling upgrade (E4);
   no overlap → ``UnsupportedProtocol``;
4. (after the proof when the accepting node authenticates, ``connection.accept``)
   for node↔node connections: the names differ from ours and the location code
   and store timestamp are not ours (``DuplicateLocation``,
   ``DuplicateTimestamp``, C3) — a second process started with a copy of
   another node's data would otherwise be taken for that node.
"""

from __future__ import annotations

import zlib
from dataclasses import asdict, dataclass
from typing import Any

PROTOCOL_MIN = 1
"""Oldest wire protocol version this build still speaks."""

PROTOCOL_MAX = 1
"""Newest wire protocol version this build speaks."""

ROLE_NODE = "node"
ROLE_CLIENT = "client"

# Reject codes (also the C3 node-state names where they apply).
UNSUPPORTED_PROTOCOL = "UnsupportedProtocol"
WRONG_CLUSTER = "WrongCluster"
DUPLICATE_NAME = "DuplicateName"
DUPLICATE_LOCATION = "DuplicateLocation"
DUPLICATE_TIMESTAMP = "DuplicateTimestamp"
BAD_HELLO = "BadHello"
AUTHENTICATION_FAILED = "AuthenticationFailed"
"""The proof of membership or of a user's password is missing or wrong."""
CATCHING_UP = "CatchingUp"
"""The node restarted and has not yet applied the cluster log as far as a leader has it:
its users table may still hold a removed user or an old password, so it checks no
user's proof yet.  Retryable: another node, or this one a moment later, will."""
WRONG_CERTIFICATE = "WrongCertificate"
"""With ``tls.member_names``: the node's certificate does not name it."""


def location_code(name: str) -> int:
    """The numeric location code derived from a node name by hashing (C1).

    CRC-32 is stable across platforms and Python versions (``hash()`` is not).
    """
    return zlib.crc32(name.encode("utf-8"))


@dataclass(frozen=True, slots=True)
class Hello:
    """What a side says about itself when a connection opens."""

    cluster: str
    name: str
    location: int
    timestamp: int
    proto_min: int = PROTOCOL_MIN
    proto_max: int = PROTOCOL_MAX
    role: str = ROLE_NODE
    address: str = ""
    pid: int = 0
    proto: int | None = None
    """Set only in the accepting side's answer: the version both will use."""
    auth: str = ""
    """The dialer's proof scheme (``node`` or ``user``, :mod:`nonstop.net.auth`); "" none."""
    user: str = ""
    """With ``auth = "user"``: the user name whose password the dialer will prove."""
    nonce: bytes = b""
    """The dialer's fresh random nonce (signed by both proofs)."""

    def to_wire(self) -> dict[str, Any]:
        """The msgpack-able frame value."""
        d = asdict(self)
        d["t"] = "hello"
        return d

    @classmethod
    def from_wire(cls, value: Any) -> Hello:
        """Parse a received hello; ``ValueError`` when it is not one."""
        if not isinstance(value, dict) or value.get("t") != "hello":
            raise ValueError("first frame is not a hello")
        try:
            hello = cls(
                cluster=str(value["cluster"]),
                name=str(value["name"]),
                location=int(value["location"]),
                timestamp=int(value["timestamp"]),
                proto_min=int(value["proto_min"]),
                proto_max=int(value["proto_max"]),
                role=str(value.get("role", ROLE_NODE)),
                address=str(value.get("address", "")),
                pid=int(value.get("pid", 0)),
                proto=None if value.get("proto") is None else int(value["proto"]),
                auth=str(value.get("auth", "")),
                user=str(value.get("user", "")),
                nonce=_bytes(value.get("nonce", b"")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"malformed hello: {exc!r}") from exc
        if hello.role not in (ROLE_NODE, ROLE_CLIENT):
            raise ValueError(f"unknown role {hello.role!r}")
        return hello


def _bytes(value: Any) -> bytes:
    if not isinstance(value, bytes) or len(value) > 64:
        raise ValueError("nonce must be at most 64 bytes")
    return value


def negotiate(lo_a: int, hi_a: int, lo_b: int, hi_b: int) -> int | None:
    """The highest version in both ranges, or None when they do not overlap."""
    hi = min(hi_a, hi_b)
    lo = max(lo_a, lo_b)
    return hi if hi >= lo else None


@dataclass(frozen=True, slots=True)
class Rejection:
    """Why a hello was refused: ``code`` is one of the reject codes above."""

    code: str
    reason: str

    def to_wire(self, ours: Hello | None = None) -> dict[str, Any]:
        """The reject frame; it carries our hello so the dialer can classify us too (C3)."""
        out: dict[str, Any] = {"t": "reject", "code": self.code, "reason": self.reason}
        if ours is not None:
            out["hello"] = ours.to_wire()
        return out


def check(ours: Hello, theirs: Hello) -> tuple[int | None, Rejection | None]:
    """Check a peer's hello against ours; return (version, None) or (None, rejection)."""
    anonymous_client = (ours.role == ROLE_CLIENT and not ours.cluster) or (
        theirs.role == ROLE_CLIENT and not theirs.cluster
    )
    if theirs.cluster != ours.cluster and not anonymous_client:
        return None, Rejection(
            WRONG_CLUSTER,
            f"peer {theirs.name!r} belongs to cluster {theirs.cluster!r}, "
            f"this node to {ours.cluster!r}",
        )
    version = negotiate(ours.proto_min, ours.proto_max, theirs.proto_min, theirs.proto_max)
    if version is None:
        return None, Rejection(
            UNSUPPORTED_PROTOCOL,
            f"peer {theirs.name!r} speaks protocol {theirs.proto_min}..{theirs.proto_max}, "
            f"this node {ours.proto_min}..{ours.proto_max}",
        )
    if theirs.role == ROLE_NODE and ours.role == ROLE_NODE:
        if theirs.name == ours.name:
            return None, Rejection(
                DUPLICATE_NAME, f"another process already uses node name {ours.name!r}"
            )
        if theirs.location == ours.location:
            return None, Rejection(
                DUPLICATE_LOCATION,
                f"peer {theirs.name!r} has this node's location code {ours.location}",
            )
        if theirs.timestamp == ours.timestamp:
            return None, Rejection(
                DUPLICATE_TIMESTAMP,
                f"peer {theirs.name!r} has this node's store timestamp {ours.timestamp}",
            )
    return version, None
