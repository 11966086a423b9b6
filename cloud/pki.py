"""A small certificate authority for mutual TLS between the hub and its devices.

The hub's CA lives in ``<home>/pki/`` (``ca.crt``, and ``ca.key`` with mode
0600) and is created the first time a certificate is issued. It signs one
server certificate for the hub and one client certificate per device, whose
subject common name is the device id: with mTLS on, the hub lets a connection
speak only for the device named in its certificate. Keys are ECDSA P-256,
which every TLS stack gRPC builds on accepts.
"""

from __future__ import annotations

import datetime
import ipaddress
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from cloud.errors import HubError, TransportError, ValidationError
from protos.atomic import write_atomic
from protos.pem import read_pem

__all__ = [
    "DEVICE_CERT_DAYS",
    "CertificateAuthority",
    "DeviceCredentials",
    "HubPki",
    "IssuedCert",
    "csr_common_name",
    "init_hub_pki",
    "issue_device_credentials",
    "load_csr",
    "write_atomic",
]

PKI_DIR = "pki"
DEFAULT_SERVER_NAMES = ("127.0.0.1", "localhost")
_CA_DAYS = 3650
_LEAF_DAYS = 825
_MAX_PEM_BYTES = 64 * 1024
#: Enrolled device certificates are short-lived; agents renew them when a third is left.
DEVICE_CERT_DAYS = 90
#: A CRL is re-signed at every revocation; this is how long one stays valid without.
_CRL_DAYS = 30
#: Largest certificate signing request the hub parses.
MAX_CSR_BYTES = 8 * 1024
_CSR_CURVES = (ec.SECP256R1, ec.SECP384R1)
# X.509 caps a common name at 64 characters; device ids that fit are the ones we can bind.
_CN_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")


@dataclass(frozen=True)
class IssuedCert:
    """A certificate and its private key, as PEM files."""

    cert: Path
    key: Path


@dataclass(frozen=True)
class DeviceCredentials:
    """Everything one device and the hub need for mTLS."""

    ca: Path
    server: IssuedCert
    client: IssuedCert


class CertificateAuthority:
    """A CA certificate and key kept as ``ca.crt`` and ``ca.key`` in one folder."""

    def __init__(self, directory: Path, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey):
        self.directory = directory
        self.certificate = cert
        self._key = key

    @property
    def cert_path(self) -> Path:
        """The CA certificate (PEM) that peers trust."""
        return self.directory / "ca.crt"

    @classmethod
    def open_or_create(
        cls, directory: Path, name: str = "EdgeSkill hub CA"
    ) -> CertificateAuthority:
        """Load the CA kept in ``directory``, creating it there the first time.

        Raises:
            HubError: the folder cannot be written, or holds an unreadable CA.
        """
        cert_path, key_path = directory / "ca.crt", directory / "ca.key"
        if cert_path.exists() and key_path.exists():
            return cls._load(directory)
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = _now()
        cert = (
            _builder(subject, subject, key.public_key(), now, _CA_DAYS)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(_key_usage(ca=True), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), False)
            .sign(key, hashes.SHA256())
        )
        try:
            directory.mkdir(parents=True, exist_ok=True)
            _write_private_key(key_path, key)
            write_atomic(cert_path, cert.public_bytes(serialization.Encoding.PEM), 0o644)
        except OSError as exc:
            raise HubError(f"cannot create the CA in {directory}: {exc}") from exc
        return cls(directory, cert, key)

    @classmethod
    def _load(cls, directory: Path) -> CertificateAuthority:
        try:
            cert = x509.load_pem_x509_certificate(read_pem(directory / "ca.crt", _MAX_PEM_BYTES))
            key = serialization.load_pem_private_key(
                read_pem(directory / "ca.key", _MAX_PEM_BYTES), None
            )
        except (TransportError, ValueError, TypeError) as exc:
            raise HubError(f"cannot load the CA in {directory}: {exc}") from exc
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise HubError(f"the CA key in {directory} is not an EC key")
        return cls(directory, cert, key)

    def issue(
        self, common_name: str, out_dir: Path, stem: str, server_names: Sequence[str] = ()
    ) -> IssuedCert:
        """Sign a new leaf certificate; a server one when ``server_names`` are given.

        Args:
            common_name: the subject CN (a device id for client certificates).
            out_dir: where ``<stem>.crt`` and ``<stem>.key`` (mode 0600) are written.
            stem: the file names' stem.
            server_names: DNS names or IP addresses for a server certificate's SAN.

        Raises:
            ValidationError: the common name cannot go into a certificate.
            HubError: the files cannot be written.
        """
        _check_common_name(common_name)
        key = ec.generate_private_key(ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
        usage = ExtendedKeyUsageOID.SERVER_AUTH if server_names else ExtendedKeyUsageOID.CLIENT_AUTH
        builder = (
            _builder(subject, self.certificate.subject, key.public_key(), _now(), _LEAF_DAYS)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_key_usage(ca=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()), False
            )
        )
        if server_names:
            builder = builder.add_extension(
                x509.SubjectAlternativeName([_general_name(n) for n in server_names]), False
            )
        cert = builder.sign(self._key, hashes.SHA256())
        issued = IssuedCert(out_dir / f"{stem}.crt", out_dir / f"{stem}.key")
        try:
            out_dir.mkdir(parents=True, exist_ok=True)
            _write_private_key(issued.key, key)
            write_atomic(issued.cert, cert.public_bytes(serialization.Encoding.PEM), 0o644)
        except OSError as exc:
            raise HubError(f"cannot write the certificate for {common_name}: {exc}") from exc
        return issued

    def sign_csr(
        self, csr: x509.CertificateSigningRequest, common_name: str, days: int = DEVICE_CERT_DAYS
    ) -> x509.Certificate:
        """Sign a client certificate for the key in ``csr`` (checked by :func:`load_csr`).

        Only the key is taken from the request: the name, lifetime and usage are the CA's.

        Raises:
            ValidationError: the common name cannot go into a certificate, or the key is
                not an EC P-256/P-384 key.
        """
        _check_common_name(common_name)
        key = csr.public_key()
        if not isinstance(key, ec.EllipticCurvePublicKey) or not isinstance(key.curve, _CSR_CURVES):
            raise ValidationError("a device key must be EC P-256 or P-384")
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])
        return (
            _builder(subject, self.certificate.subject, key, _now(), days)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(_key_usage(ca=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), False)
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(self._key.public_key()), False
            )
            .sign(self._key, hashes.SHA256())
        )

    def crl(self, revoked: Mapping[int, int]) -> bytes:
        """A CRL (PEM) signed by this CA listing ``revoked`` (serial -> revoked at, ms)."""
        now = _now()
        builder = (
            x509.CertificateRevocationListBuilder()
            .issuer_name(self.certificate.subject)
            .last_update(now - datetime.timedelta(minutes=5))
            .next_update(now + datetime.timedelta(days=_CRL_DAYS))
        )
        for serial, when_ms in sorted(revoked.items()):
            when = datetime.datetime.fromtimestamp(when_ms / 1000, datetime.UTC)
            entry = x509.RevokedCertificateBuilder().serial_number(serial).revocation_date(when)
            builder = builder.add_revoked_certificate(entry.build())
        crl = builder.sign(self._key, hashes.SHA256())
        return crl.public_bytes(serialization.Encoding.PEM)


def load_csr(pem: bytes) -> x509.CertificateSigningRequest:
    """Parse a PEM certificate signing request and check its self-signature.

    Raises:
        ValidationError: too large, not a CSR, or signed by another key than the one it holds.
    """
    if len(pem) > MAX_CSR_BYTES:
        raise ValidationError(f"the CSR is larger than {MAX_CSR_BYTES} bytes")
    try:
        csr = x509.load_pem_x509_csr(pem)
        valid = csr.is_signature_valid
    except (ValueError, TypeError) as exc:
        raise ValidationError(f"not a certificate signing request: {exc}") from exc
    if not valid:
        raise ValidationError("the CSR's signature does not match its key")
    return csr


def csr_common_name(csr: x509.CertificateSigningRequest) -> str:
    """The subject CN a CSR asks for.

    Raises:
        ValidationError: none, or more than one.
    """
    names = csr.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if len(names) != 1 or not isinstance(names[0].value, str):
        raise ValidationError("the CSR must name exactly one subject CN (the device id)")
    return names[0].value


@dataclass(frozen=True)
class HubPki:
    """What ``hub init`` makes under ``<home>/pki/``."""

    ca: Path
    server: IssuedCert
    mqtt_client: IssuedCert


def init_hub_pki(home: Path, server_names: Sequence[str] = DEFAULT_SERVER_NAMES) -> HubPki:
    """Create the hub's CA, its gRPC server certificate and its MQTT client certificate (CN hub).

    Existing files are kept, so this is safe to run again.

    Raises:
        ValidationError: a server name cannot go into a certificate.
        HubError: the PKI folder cannot be written.
    """
    pki = home / PKI_DIR
    ca = CertificateAuthority.open_or_create(pki)
    server = IssuedCert(pki / "server.crt", pki / "server.key")
    if not (server.cert.exists() and server.key.exists()):
        names = list(dict.fromkeys([*DEFAULT_SERVER_NAMES, *server_names]))
        server = ca.issue("edgeskill-hub", pki, "server", names)
    client = IssuedCert(pki / "hub-client.crt", pki / "hub-client.key")
    if not (client.cert.exists() and client.key.exists()):
        client = ca.issue("hub", pki, "hub-client")
    return HubPki(ca.cert_path, server, client)


def issue_device_credentials(
    home: Path, device_id: str, out_dir: Path, server_names: Sequence[str] = DEFAULT_SERVER_NAMES
) -> DeviceCredentials:
    """Issue a client certificate for ``device_id`` from the hub's CA.

    The CA, and the hub's server certificate (``<home>/pki/server.crt``), are
    made the first time; later calls reuse them. ``out_dir`` receives
    ``<device_id>.crt``, ``<device_id>.key`` and a copy of ``ca.crt``.

    Raises:
        ValidationError: ``device_id`` cannot be a certificate name.
        HubError: the PKI folder or ``out_dir`` cannot be read or written.
    """
    _check_common_name(device_id)  # before anything is created
    pki = home / PKI_DIR
    ca = CertificateAuthority.open_or_create(pki)
    server = IssuedCert(pki / "server.crt", pki / "server.key")
    if not (server.cert.exists() and server.key.exists()):
        server = ca.issue("edgeskill-hub", pki, "server", server_names or DEFAULT_SERVER_NAMES)
    client = ca.issue(device_id, out_dir, device_id)
    ca_copy = out_dir / "ca.crt"
    try:
        write_atomic(ca_copy, ca.cert_path.read_bytes(), 0o644)
    except OSError as exc:
        raise HubError(f"cannot write {ca_copy}: {exc}") from exc
    return DeviceCredentials(ca=ca_copy, server=server, client=client)


def _check_common_name(name: str) -> None:
    if not _CN_RE.fullmatch(name):
        raise ValidationError(
            f"{name!r} cannot be a certificate name: use 1-64 letters, digits, . _ -"
        )


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _builder(
    subject: x509.Name,
    issuer: x509.Name,
    public_key: ec.EllipticCurvePublicKey,
    now: datetime.datetime,
    days: int,
) -> x509.CertificateBuilder:
    # Back-dated a little so a device whose clock runs slightly behind accepts it.
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=days))
    )


def _key_usage(*, ca: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=not ca,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=ca,
        crl_sign=ca,
        encipher_only=False,
        decipher_only=False,
    )


def _general_name(name: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(name))
    except ValueError:
        return x509.DNSName(name)


def _write_private_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    write_atomic(path, pem, 0o600)
