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
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from typing import Any


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
