"""TLS contexts for node↔node and client↔node connections (C7, G5).

TLS is optional and off by default: on one machine or a private network plain
TCP is simpler to run.  When a node's config names a certificate and key, its
listener speaks TLS only; when it also names a CA file, peers must present a
certificate signed by that CA (mutual TLS).  With ``member_names`` a node's
certificate must also *name* the node (its common name or a DNS subject
alternative name equal to the node name): a certificate of the CA then proves
which member is at the other end, on top of the cluster secret's proof of
membership (:mod:`nonstop.net.challenge`).  Dialing nodes verify the server
certificate against the CA file (or the system store when none is given).

A certificate without a CA file is a valid configuration only when the
certificates chain to a CA of the system store (a public CA): nodes verify
each other like any TLS client would.  A node checks this at start by
verifying its own certificate the way its peers will (the runtime dials its
own listener once) and refuses to start with one line if it cannot
(:class:`TLSSetupError`), instead of never connecting to anybody.

Speaking the wrong language on the node port gets a one-line answer
(``runtime/listener.py``): a plain client on a TLS node receives a plain
``reject`` frame with code :data:`TLS_REQUIRED`; a TLS client on a plain node
receives bytes that are not TLS, which its TLS library reports as a wrong
version number, read by the client as :data:`TLS_NOT_ENABLED`.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from typing import Any

TLS_REQUIRED = "TLSRequired"
"""Reject code: a plain-TCP client or node dialed a node that speaks TLS only."""
TLS_NOT_ENABLED = "TLSNotEnabled"
"""Refusal code: a TLS client dialed a node whose listener is plain TCP."""


class TLSSetupError(Exception):
    """The TLS configuration cannot work (files, or a certificate peers cannot verify)."""


@dataclass(frozen=True, slots=True)
class TLSConfig:
    """File names of the PEM certificate, private key and CA bundle."""

    cert: str | None = None
    key: str | None = None
    ca: str | None = None
    require_client_cert: bool = True
    check_hostname: bool = True
    member_names: bool = False
    """Node certificates must name the node they belong to (see the module doc)."""

    @property
    def enabled(self) -> bool:
        return self.cert is not None or self.ca is not None


def certificate_names(peercert: Any) -> set[str]:
    """The common names and DNS subject alternative names of a verified peer certificate."""
    names: set[str] = set()
    if not isinstance(peercert, dict):
        return names
    for rdn in peercert.get("subject", ()):
        for key, value in rdn:
            if key == "commonName":
                names.add(str(value))
    for kind, value in peercert.get("subjectAltName", ()):
        if kind == "DNS":
            names.add(str(value))
    return names


def server_context(cfg: TLSConfig) -> ssl.SSLContext:
    """The listener's context: our certificate, and the CA peers must be signed by."""
    if not cfg.cert:
        raise ValueError("TLS server needs a certificate (tls_cert)")
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(cfg.cert, cfg.key)
    if cfg.ca:
        ctx.load_verify_locations(cfg.ca)
        ctx.verify_mode = ssl.CERT_REQUIRED if cfg.require_client_cert else ssl.CERT_OPTIONAL
    return ctx


def client_context(cfg: TLSConfig) -> ssl.SSLContext:
    """The dialer's context: verify the server, present our certificate when we have one."""
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=cfg.ca)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.check_hostname = cfg.check_hostname
    if cfg.cert:
        ctx.load_cert_chain(cfg.cert, cfg.key)
    return ctx


def setup_problem(cfg: TLSConfig) -> str | None:
    """One line saying why ``cfg`` cannot be loaded (missing file, bad key), or None."""
    if not cfg.enabled:
        return None
    if not cfg.cert:
        return "TLS needs tls.cert (and tls.key) on every node"
    for key, path in (("tls.cert", cfg.cert), ("tls.key", cfg.key), ("tls.ca", cfg.ca)):
        if path is None:
            continue
        try:
            with open(path, "rb"):
                pass
        except OSError as exc:
            return f"{key} {path}: {exc.strerror}"
    try:
        server_context(cfg)
        client_context(cfg)
    except (ssl.SSLError, OSError, ValueError) as exc:
        return f"TLS files cannot be loaded ({cfg.cert}, {cfg.key}, {cfg.ca}): {exc}"
    return None


def looks_like_tls(head: bytes) -> bool:
    """Does a stream starting with ``head`` start with a TLS handshake record (type 22)?

    A frame's first byte is the top byte of its length: 0x16 would announce
    more than 350 MB, far above any frame limit, so one byte tells them apart.
    """
    return bool(head) and head[0] == 0x16
