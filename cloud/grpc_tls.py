"""Who is calling the hub's gRPC server: its TLS material, the CRL, the peer's certificate.

:mod:`cloud.grpc_server` serves mutual TLS with a :class:`ServerTls`, refuses
what the :class:`RevocationList` revokes, and binds each call to the device
its client certificate names.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import grpc.aio
from cryptography import x509

from cloud.errors import HubError
from protos.pem import read_pem

__all__ = ["RevocationList", "ServerTls", "peer_common_name", "peer_serial"]

# The records keep the server's logger name: operators filter on it.
log = logging.getLogger("cloud.grpc_server")

_MAX_CRL_BYTES = 4 * 1024 * 1024


@dataclass(frozen=True)
class ServerTls:
    """PEM material for serving mutual TLS: the hub's certificate and the CA devices present."""

    cert_chain: bytes
    private_key: bytes
    client_ca: bytes
    #: The CA's revocation list (PEM), re-read when it changes; None: nothing revoked.
    crl: Path | None = None

    @classmethod
    def from_files(
        cls, cert: Path, key: Path, client_ca: Path, crl: Path | None = None
    ) -> ServerTls:
        """Read the three PEM files (the CRL is read while serving).

        Raises:
            TransportError: a file is missing, unreadable, empty or too large.
        """
        return cls(read_pem(cert), read_pem(key), read_pem(client_ca), crl)


class RevocationList:
    """The serials a CRL file revokes, re-read whenever the file changes.

    Only a CRL signed by the CA counts. A file that cannot be read or checked
    keeps the last good list (the hub writes it atomically, so that is an
    operator's mistake, and it is logged).
    """

    def __init__(self, path: Path, ca_pem: bytes) -> None:
        self.path = path
        self._ca = x509.load_pem_x509_certificate(ca_pem)
        self._stamp: tuple[int, int] | None = None
        self._serials: frozenset[int] = frozenset()

    def revoked(self, serial: int) -> bool:
        """True when the CRL lists ``serial``."""
        self._reload()
        return serial in self._serials

    def _reload(self) -> None:
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return
        except OSError as exc:
            log.warning("cannot stat the CRL %s: %s", self.path, exc)
            return
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp == self._stamp:
            return
        self._stamp = stamp
        try:
            crl = x509.load_pem_x509_crl(read_pem(self.path, _MAX_CRL_BYTES))
            if not crl.is_signature_valid(self._ca.public_key()):  # type: ignore[arg-type]
                raise ValueError("not signed by the hub CA")
        except (HubError, ValueError, TypeError) as exc:
            log.warning("keeping the last revocation list: %s: %s", self.path, exc)
            return
        self._serials = frozenset(r.serial_number for r in crl)


def peer_common_name(context: grpc.aio.ServicerContext) -> str | None:
    """The subject CN of the client certificate the peer presented, if any."""
    names = context.auth_context().get("x509_common_name") or []
    return names[0].decode("utf-8", "replace") if names else None


def peer_serial(context: grpc.aio.ServicerContext) -> int | None:
    """The serial number of the client certificate the peer presented, if it can be read."""
    pems = context.auth_context().get("x509_pem_cert") or []
    if not pems:
        return None
    try:
        return int(x509.load_pem_x509_certificate(pems[0]).serial_number)
    except ValueError:
        return None
