"""The device's identity: enrolment with a claim token, renewal, and the files they keep.

On the first start the agent makes an EC P-256 key (mode 0600; it never
leaves the device), sends a CSR naming its device id with the operator's
claim token to the hub's enrolment port over TLS (checking the hub with the
CA the operator gave), and keeps what comes back in ``<state>/identity/``:
``device.crt``, ``ca.crt`` and ``director.pub`` (interface 2 of issue 8).
Later starts reuse them; the certificate is renewed over mutual TLS, with the
same key, once less than a third of its lifetime is left.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from edge_agent.errors import AgentError
from protos import pb
from protos.atomic import write_atomic

__all__ = [
    "IDENTITY_DIR",
    "EnrolmentRefusedError",
    "Identity",
    "enroll",
    "enroll_url_for",
    "load_identity",
    "renew",
    "renewal_due",
]

log = logging.getLogger(__name__)

IDENTITY_DIR = "identity"
#: Largest PEM file (certificate, CA, key) read back from the identity folder.
MAX_PEM_BYTES = 64 * 1024
#: Largest enrolment answer accepted from the hub.
MAX_RESPONSE_BYTES = 64 * 1024
_SERVICE = pb.DESCRIPTOR.services_by_name["Hub"].full_name


class EnrolmentRefusedError(AgentError):
    """The hub refused the enrolment or renewal (a bad or used-up token, a revoked device)."""


@dataclass(frozen=True)
class Identity:
    """The files of an enrolled device, in ``<state>/identity/``."""

    folder: Path

    @property
    def key(self) -> Path:
        """The device's private key (0600)."""
        return self.folder / "device.key"

    @property
    def cert(self) -> Path:
        """The device's certificate, CN = its device id."""
        return self.folder / "device.crt"

    @property
    def ca(self) -> Path:
        """The hub's CA: the hub and the broker must chain to it."""
        return self.folder / "ca.crt"

    @property
    def director(self) -> Path:
        """The director's public key that signed desired states are checked with."""
        return self.folder / "director.pub"

    def complete(self) -> bool:
        """True when every file is there."""
        return all(p.is_file() for p in (self.key, self.cert, self.ca, self.director))

    def certificate(self) -> x509.Certificate:
        """The current certificate.

        Raises:
            AgentError: unreadable or not a certificate.
        """
        try:
            return x509.load_pem_x509_certificate(_read(self.cert))
        except ValueError as exc:
            raise AgentError(f"{self.cert} is not a certificate: {exc}") from exc


def load_identity(state_dir: Path) -> Identity | None:
    """The identity kept in ``state_dir``, or None before the first enrolment."""
    identity = Identity(state_dir / IDENTITY_DIR)
    return identity if identity.complete() else None


def enroll_url_for(hub_url: str) -> str | None:
    """The enrolment address next to a ``grpcs://`` hub: the same host, the port plus one."""
    parts = urlsplit(hub_url)
    if parts.scheme != "grpcs" or not parts.hostname:
        return None
    return f"grpcs://{parts.hostname}:{(parts.port or 7443) + 1}"


def renewal_due(cert: x509.Certificate, now: datetime.datetime | None = None) -> bool:
    """True once less than a third of the certificate's lifetime is left."""
    now = now or datetime.datetime.now(datetime.UTC)
    start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
    return (end - now) < (end - start) / 3


async def enroll(
    url: str, hub_ca: Path, token: str, device_id: str, state_dir: Path, timeout_s: float = 30.0
) -> Identity:
    """Enrol this device with a claim token; returns the identity written in ``state_dir``.

    A key made earlier (an enrolment whose answer was lost) is used again.

    Raises:
        EnrolmentRefusedError: the hub refused the token or the request.
        AgentError: the hub cannot be reached, answers something unusable, or the
            files cannot be written.
    """
    identity = Identity(state_dir / IDENTITY_DIR)
    ca_pem = _read(hub_ca)
    key = _load_or_make_key(identity.key)
    request = pb.EnrollRequest(claim_token=token, csr_pem=_csr(key, device_id))
    answer = await _call(url, ca_pem, None, "Enroll", request, timeout_s)
    _keep(identity, answer, key, device_id, ca_pem)
    log.info("enrolled as %s; certificate until %d ms", device_id, answer.not_after_ms)
    return identity


async def renew(url: str, identity: Identity, device_id: str, timeout_s: float = 30.0) -> None:
    """Get a fresh certificate for the same key over mutual TLS, and keep it.

    Raises:
        EnrolmentRefusedError: the hub refused (say, the device was revoked).
        AgentError: the hub cannot be reached, or answers something unusable.
    """
    key = _load_key(identity.key)
    ca_pem = _read(identity.ca)
    client = (_read(identity.key), _read(identity.cert))
    request = pb.RenewRequest(csr_pem=_csr(key, device_id))
    answer = await _call(url, ca_pem, client, "Renew", request, timeout_s)
    _keep(identity, answer, key, device_id, ca_pem)
    log.info("renewed the certificate of %s until %d ms", device_id, answer.not_after_ms)


async def _call(
    url: str,
    ca_pem: bytes,
    client: tuple[bytes, bytes] | None,
    method: str,
    request: pb.EnrollRequest | pb.RenewRequest,
    timeout_s: float,
) -> pb.EnrollResponse:
    """One call to the hub's enrolment service, trusting ``ca_pem``; ``client``: (key, cert).

    gRPC is imported here, not with the module: an agent on MQTT loads it only for an
    enrolment or a renewal (~9 MB, and the code pages its channel touches).
    """
    import grpc  # noqa: PLC0415
    import grpc.aio  # noqa: PLC0415

    key_pem, cert_pem = client if client is not None else (None, None)
    creds = grpc.ssl_channel_credentials(ca_pem, key_pem, cert_pem)
    parts = urlsplit(url)
    if parts.scheme != "grpcs" or not parts.hostname:
        raise AgentError(f"the enrolment URL must be grpcs://HOST:PORT, not {url!r}")
    options = [("grpc.max_receive_message_length", MAX_RESPONSE_BYTES)]
    target = f"{parts.hostname}:{parts.port or 7444}"
    try:
        async with grpc.aio.secure_channel(target, creds, options=options) as channel:
            call = channel.unary_unary(
                f"/{_SERVICE}/{method}",
                request_serializer=type(request).SerializeToString,
                response_deserializer=pb.EnrollResponse.FromString,
            )
            async with asyncio.timeout(timeout_s + 1):
                return await call(request, timeout=timeout_s)
    except grpc.aio.AioRpcError as exc:
        if exc.code() == grpc.StatusCode.PERMISSION_DENIED:
            raise EnrolmentRefusedError(f"the hub refused: {exc.details()}") from exc
        raise AgentError(f"{method} at {url} failed: {exc.code().name} {exc.details()}") from exc
    except TimeoutError as exc:
        raise AgentError(f"{method} at {url} timed out after {timeout_s:.0f} s") from exc


def _keep(
    identity: Identity,
    answer: pb.EnrollResponse,
    key: ec.EllipticCurvePrivateKey,
    device_id: str,
    ca_pem: bytes,
) -> None:
    """Check the hub's answer and write it: director key and CA first, the certificate last."""
    try:
        cert = x509.load_pem_x509_certificate(answer.certificate_pem)
        ca = x509.load_pem_x509_certificate(ca_pem)
        cert.verify_directly_issued_by(ca)
        serialization.load_pem_public_key(answer.director_public_pem)
    except (ValueError, TypeError, InvalidSignature) as exc:
        raise AgentError(f"the hub's enrolment answer is unusable: {exc}") from exc
    names = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    if [n.value for n in names] != [device_id] or cert.public_key() != key.public_key():
        raise AgentError("the hub's certificate is not for this device's key and name")
    try:
        write_atomic(identity.ca, ca_pem, 0o644)
        write_atomic(identity.director, answer.director_public_pem, 0o644)
        write_atomic(identity.cert, answer.certificate_pem, 0o644)
    except OSError as exc:
        raise AgentError(f"cannot write the identity in {identity.folder}: {exc}") from exc


def _csr(key: ec.EllipticCurvePrivateKey, device_id: str) -> bytes:
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, device_id)])
    csr = x509.CertificateSigningRequestBuilder().subject_name(subject).sign(key, hashes.SHA256())
    return csr.public_bytes(serialization.Encoding.PEM)


def _load_or_make_key(path: Path) -> ec.EllipticCurvePrivateKey:
    if path.is_file():
        return _load_key(path)
    key = ec.generate_private_key(ec.SECP256R1())
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        write_atomic(path, pem, 0o600)
    except OSError as exc:
        raise AgentError(f"cannot write the device key {path}: {exc}") from exc
    return key


def _load_key(path: Path) -> ec.EllipticCurvePrivateKey:
    try:
        key = serialization.load_pem_private_key(_read(path), None)
    except (ValueError, TypeError) as exc:
        raise AgentError(f"{path} is not a private key: {exc}") from exc
    if not isinstance(key, ec.EllipticCurvePrivateKey):
        raise AgentError(f"{path} is not an EC key")
    return key


def _read(path: Path) -> bytes:
    try:
        with path.open("rb") as fh:
            data = fh.read(MAX_PEM_BYTES + 1)
    except OSError as exc:
        raise AgentError(f"cannot read {path}: {exc}") from exc
    if len(data) > MAX_PEM_BYTES:
        raise AgentError(f"{path} is larger than {MAX_PEM_BYTES} bytes")
    return data
