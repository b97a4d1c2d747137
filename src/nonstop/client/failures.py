"""How a client tells a failed connection (fail over) from a refusal (raise at once).

A client tries the next address when a node cannot be reached or stops
answering: another node of the cluster may well answer.  It does *not* when a
node answers and refuses the client itself, at connect time:

* the cluster name differs (``WrongCluster``),
* no protocol version is spoken by both (``UnsupportedProtocol``),
* the TLS credentials are not accepted (the node's certificate is not trusted
  by ours, or ours by the node's).

Those are configuration errors: every node of the same cluster is set up
alike and would refuse the same way, so failing over would only turn a
precise reason into a vague :class:`~nonstop.errors.Unavailable` after
``rounds`` passes.  (During a rolling upgrade the ranges of old and new nodes
overlap, E4; a client no node of its cluster can speak to must be upgraded.)
Such a refusal raises :class:`NodeRefused` naming the node and the reason.
"""

from __future__ import annotations

import ssl

from nonstop.errors import AuthenticationFailed, ProtocolError
from nonstop.net.connection import HandshakeRejected
from nonstop.net.frames import FrameError
from nonstop.net.handshake import AUTHENTICATION_FAILED, CATCHING_UP, Hello
from nonstop.net.tls import TLS_NOT_ENABLED
from nonstop.runtime.limits import TOO_MANY_CONNECTIONS

NETWORK_ERRORS = (OSError, EOFError, TimeoutError, FrameError, ProtocolError)
"""What a lost, refused, reset or silent connection raises (``ConnectionError`` is an
``OSError``; a peer that does not speak the protocol at all is a ``ProtocolError``).
:class:`NodeRefused` is one of them by class: test it first (:func:`is_network_error`)."""

NOT_TLS_REASONS = frozenset(
    {"WRONG_VERSION_NUMBER", "PACKET_LENGTH_TOO_LONG", "RECORD_LAYER_FAILURE"}
)
"""OpenSSL's reasons for a TLS handshake answered with bytes that are not TLS."""

TLS_REFUSED = "TLSRefused"
"""The code of a refusal by TLS (certificates), next to the handshake's reject codes."""


class NodeRefused(HandshakeRejected):
    """A node refused this client when it connected: a configuration error that every
    node of the cluster would repeat, so it is raised at once (see the module docstring).

    A :class:`~nonstop.errors.ProtocolError`; ``address`` is the node's address,
    ``code`` the reject code (``WrongCluster``, ``UnsupportedProtocol``, ``TLSRefused``)
    and ``reason`` the explanation.
    """

    def __init__(self, address: str, code: str, reason: str, peer: Hello | None = None) -> None:
        super().__init__(code, reason, peer)
        self.address = address
        self.args = (f"connection to node {address} refused: {code}: {reason}",)


class AuthenticationRefused(NodeRefused, AuthenticationFailed):
    """A node refused this client's credential (or its lack of one): the
    :class:`~nonstop.errors.AuthenticationFailed` that callers catch."""


def is_network_error(exc: BaseException) -> bool:
    """True for a failure worth trying another node for (not a :class:`NodeRefused`)."""
    return isinstance(exc, NETWORK_ERRORS) and not isinstance(exc, NodeRefused)


def refusal(address: str, exc: BaseException) -> NodeRefused | None:
    """The :class:`NodeRefused` that a failure while connecting to ``address`` means, if any.

    A handshake refusal either way (a ``reject`` frame, or the node's hello
    failing our check), or a TLS certificate that one side does not accept.
    Other TLS failures are network errors — including, under TLS 1.3, a node
    that does not accept *our* certificate: it just closes the connection
    (EOF), which looks like any lost connection, so that one fails over.
    """
    if isinstance(exc, NodeRefused):
        return exc
    if isinstance(exc, HandshakeRejected) and exc.code == AUTHENTICATION_FAILED:
        return AuthenticationRefused(address, exc.code, exc.reason, exc.peer)
    if isinstance(exc, HandshakeRejected):
        if exc.code in (TOO_MANY_CONNECTIONS, CATCHING_UP):
            # The node is busy or just restarted, not misconfigured: another node (or
            # this one on the next round) may take us.
            return None
        return NodeRefused(address, exc.code, exc.reason, exc.peer)
    if isinstance(exc, ssl.SSLError) and exc.reason in NOT_TLS_REASONS:
        # The node answered our TLS handshake with bytes that are not TLS.
        return NodeRefused(
            address,
            TLS_NOT_ENABLED,
            "the node does not speak TLS on this port (its listener is plain TCP): "
            "connect without TLS options",
        )
    if isinstance(exc, ssl.SSLCertVerificationError):
        return NodeRefused(address, TLS_REFUSED, f"its certificate is not trusted: {exc}")
    if isinstance(exc, ssl.SSLError) and "CERTIFICATE" in str(exc.reason or "").upper():
        # An alert from the node: it did not accept our certificate (or we sent none).
        return NodeRefused(address, TLS_REFUSED, f"it did not accept our certificate: {exc}")
    return None


__all__ = [
    "NETWORK_ERRORS",
    "TLS_REFUSED",
    "AuthenticationRefused",
    "NodeRefused",
    "is_network_error",
    "refusal",
]
