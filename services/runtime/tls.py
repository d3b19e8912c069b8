"""gRPC over TLS: the server's credentials, reread from their files when they change, and the
client certificate's identity.

Rotation: gRPC asks for the certificate configuration at each new handshake; the files are
checked (one ``stat`` each) and read again only when one changed, so a renewed certificate (the
files cert-manager rewrites in a mounted Secret) is served to new connections without a restart,
while open connections and their streams keep the session they have. A pair that does not load
(a key written before its certificate) keeps the previous one until the next handshake.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import Any

import grpc

from services.runtime.server_settings import TLSSettings

log = logging.getLogger(__name__)


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


class CertificateFiles:
    """The server's certificate chain, key and (mutual TLS) client CA, as files."""

    def __init__(self, tls: TLSSettings) -> None:
        self._paths = [p for p in (tls.cert_file, tls.key_file, tls.client_ca_file) if p]
        self._tls = tls
        self._stamp = self._stamps()
        self.reloads = 0

    def _stamps(self) -> tuple[tuple[int, int], ...]:
        out = []
        for p in self._paths:
            st = os.stat(p)
            out.append((st.st_mtime_ns, st.st_size))
        return tuple(out)

    def load(self) -> Any:
        t = self._tls
        return grpc.ssl_server_certificate_configuration(
            [(_read(t.key_file), _read(t.cert_file))], root_certificates=_read(t.client_ca_file) if t.client_ca_file else None,
        )

    def fetch(self) -> Any:
        """gRPC's callback at each handshake: a new configuration when the files changed, else None."""
        try:
            stamp = self._stamps()
            if stamp == self._stamp:
                return None
            config = self.load()
        except (OSError, ValueError, RuntimeError) as e:
            log.warning("TLS certificate files changed but do not load (the previous ones stay): %s", e)
            return None
        self._stamp = stamp
        self.reloads += 1
        log.info("TLS certificate files reloaded", extra={"cert": self._tls.cert_file, "reloads": self.reloads})
        return config


def server_credentials(tls: TLSSettings) -> grpc.ServerCredentials | None:
    """None without a certificate (plaintext: loopback only, see check_exposure)."""
    if not tls.serving:
        return None
    files = CertificateFiles(tls)
    return grpc.dynamic_ssl_server_credentials(files.load(), files.fetch, require_client_authentication=bool(tls.client_ca_file))


def channel_credentials(tls: TLSSettings) -> grpc.ChannelCredentials | None:
    """For this service's own calls (to blob_svc): None without a CA to trust (plaintext)."""
    if not tls.ca_file:
        return None
    if tls.cert_file:
        return grpc.ssl_channel_credentials(_read(tls.ca_file), _read(tls.key_file), _read(tls.cert_file))
    return grpc.ssl_channel_credentials(_read(tls.ca_file))


def peer_identity(context: grpc.aio.ServicerContext) -> str | None:
    """The verified client certificate's identity (its first URI SAN, else its CN); None without one."""
    auth = context.auth_context() or {}
    for key in ("peer_uri", "x509_common_name"):
        for value in auth.get(key, ()):
            return value.decode(errors="replace")
    return None


def peer_match(context: grpc.aio.ServicerContext, identities: Mapping[str, str]) -> tuple[str, str] | None:
    """The client certificate's identity that ``identities`` maps, with its role: one of its URI
    SANs, or its CN when it has none (as RFC 6125 has it: a certificate whose URI SAN names an
    identity without a role does not get the role of a CN it also carries, which its requester
    may have chosen); None when none is mapped."""
    auth = context.auth_context() or {}
    for value in auth.get("peer_uri", ()) or auth.get("x509_common_name", ()):
        identity = value.decode(errors="replace")
        role = identities.get(identity)
        if role is not None:
            return identity, role
    return None


def peer_role(context: grpc.aio.ServicerContext, identities: Mapping[str, str]) -> str | None:
    """The role of the client certificate's identity (``peer_match``)."""
    match = peer_match(context, identities)
    return match[1] if match is not None else None
