"""Device enrolment: claim tokens in, device certificates out; renewal and revocation.

An operator makes a claim (``edgeskill hub claim create``): a random token,
shown once and kept only as its SHA-256, with the labels the device will
carry, the project (tenant) it joins, how many devices may use it and when
it expires. A device sends the
token and a CSR for a key it made itself (the key never leaves it); the hub
checks both, signs a short-lived client certificate with its CA, records the
device with the claim's labels, and answers with the certificate, the CA and
the director key the device checks its desired state with.

State lives in ``<home>/pki/``: ``claims.json`` and ``enrolled.json`` (mode
0600, changed only under a file lock, so every hub process and CLI command
can enrol), and ``crl.pem``, the CA's revocation list, rewritten at each
revocation for the gRPC server and the broker.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import re
import secrets
import time
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives import serialization

from cloud.errors import HubError, NotFoundError, ValidationError
from cloud.pki import (
    PKI_DIR,
    CertificateAuthority,
    csr_common_name,
    load_csr,
    write_atomic,
)
from cloud.selectors import check_labels
from cloud.store import Store
from cloud.store.checks import name as check_name
from cloud.store.projects import DEFAULT_PROJECT
from protos.limits import DEVICE_ID_PATTERN

__all__ = ["MAX_TOKEN_CHARS", "Enrolled", "Enroller", "EnrolmentError"]

#: Longest claim token the hub looks at.
MAX_TOKEN_CHARS = 128
#: Most claims kept at once; expired ones are pruned first.
MAX_CLAIMS = 10_000
MAX_CLAIM_USES = 100_000
MAX_CLAIM_TTL_S = 365 * 86400
#: Expired claims are kept this long, so a late device hears "expired", not "unknown".
_EXPIRED_KEPT_MS = 7 * 86400 * 1000
_DEVICE_ID_RE = re.compile(DEVICE_ID_PATTERN)
#: Certificate names the hub and broker use for themselves; the broker's ACL gives the
#: ``hub`` name every device's topics, so no device may enrol as one of them.
RESERVED_IDS = frozenset({"hub", "edgeskill-hub", "edgeskill-broker", "broker"})


class EnrolmentError(HubError):
    """The hub refused an enrolment or a renewal; ``reason`` is one word for counters."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


@dataclass(frozen=True)
class Enrolled:
    """What an enrolled (or renewed) device receives."""

    device_id: str
    certificate_pem: bytes
    ca_pem: bytes
    director_public_pem: bytes
    not_after_ms: int
    labels: dict[str, str] = field(default_factory=dict)


def _hash_token(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def _key_id(cert: x509.Certificate) -> str:
    der = cert.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return hashlib.sha256(der).hexdigest()


def _csr_key_id(csr: x509.CertificateSigningRequest) -> str:
    der = csr.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return hashlib.sha256(der).hexdigest()


def _director_pem(home: Path) -> bytes:
    from cloud.director import HubDirector  # noqa: PLC0415 - the director key is made on use

    return HubDirector(home).public_pem()


class Enroller:
    """Claims, enrolment, renewal and revocation for one hub home.

    Args:
        home: the hub home (state in ``<home>/pki/``).
        store: where enrolled devices and their labels are recorded; ``None`` skips that.
        director_pem: returns the director's public key (PEM) given to devices.
        clock: wall-clock seconds.
    """

    def __init__(
        self,
        home: Path,
        store: Store | None = None,
        *,
        director_pem: Callable[[Path], bytes] = _director_pem,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.home = home
        self.pki = home / PKI_DIR
        self._store = store
        self._director_pem = director_pem
        self._clock = clock
        #: Refused enrolments and renewals, by :attr:`EnrolmentError.reason`.
        self.refused: Counter[str] = Counter()

    def _now_ms(self) -> int:
        return int(self._clock() * 1000)

    # -- claims -----------------------------------------------------------------------

    def create_claim(
        self,
        labels: Mapping[str, str],
        uses: int = 1,
        ttl_s: float = 86400,
        *,
        reenroll: bool = False,
        project: str = DEFAULT_PROJECT,
    ) -> str:
        """Make a claim token; only its hash is kept, so show the token once.

        Args:
            labels: the labels devices enrolled with it get.
            uses: how many enrolments it allows.
            ttl_s: seconds until it expires.
            reenroll: it may replace the key of a device that is already enrolled.
            project: the project devices enrolled with it join (a device the hub
                already knew keeps its own).

        Raises:
            ValidationError: bad labels, uses, lifetime or project name.
            NotFoundError: no such project (checked when the enroller has a store).
            HubError: the claims file cannot be read or written, or holds too many claims.
        """
        labels = check_labels(labels)
        check_name(project, "project name")
        if self._store is not None and not self._store.project_exists(project):
            raise NotFoundError(f"no project {project!r}")
        if not 1 <= uses <= MAX_CLAIM_USES:
            raise ValidationError(f"uses must be 1..{MAX_CLAIM_USES}")
        if not 0 < ttl_s <= MAX_CLAIM_TTL_S:
            raise ValidationError(f"the lifetime must be 1 s..{MAX_CLAIM_TTL_S} s")
        token = secrets.token_urlsafe(32)
        claim = {
            "labels": dict(labels),
            "uses_left": uses,
            "expires_ms": self._now_ms() + int(ttl_s * 1000),
            "reenroll": reenroll,
            "project": project,
        }
        with self._locked():
            claims = self._pruned_claims()
            if len(claims) >= MAX_CLAIMS:
                raise HubError(f"{MAX_CLAIMS} live claims already; let some expire first")
            claims[_hash_token(token)] = claim
            self._write("claims.json", {"claims": claims})
        return token

    # -- enrolment ---------------------------------------------------------------------

    def enroll(self, token: str, csr_pem: bytes) -> Enrolled:
        """Enrol the device a CSR names, if the claim token allows it.

        Raises:
            EnrolmentError: a bad CSR or device id, an unknown, expired or used-up
                token, a device enrolled with another key (and the claim may not
                re-enrol), or a claim whose project no longer exists. Counted in
                :attr:`refused`.
            ValidationError: the claim's labels are refused by the store.
            HubError: the PKI files cannot be read or written.
            StoreError: the store failed.
        """
        try:
            return self._enroll(token, csr_pem)
        except EnrolmentError as exc:
            self.refused[exc.reason] += 1
            raise

    def _enroll(self, token: str, csr_pem: bytes) -> Enrolled:
        csr, device_id = _checked_csr(csr_pem)
        if not token or len(token) > MAX_TOKEN_CHARS:
            raise EnrolmentError("unknown-token", "no such claim token")
        with self._locked():
            claims = self._pruned_claims()
            claim = self._usable_claim(claims, _hash_token(token))
            enrolled = self._read("enrolled.json")
            devices: dict[str, Any] = enrolled.setdefault("devices", {})
            revoked: dict[str, int] = enrolled.setdefault("revoked", {})
            old = devices.get(device_id)
            if old is not None and old["serial"] not in revoked:
                if old["key"] != _csr_key_id(csr) and not claim["reenroll"]:
                    raise EnrolmentError(
                        "already-enrolled", f"{device_id} is enrolled with another key"
                    )
                revoked[old["serial"]] = self._now_ms()
            labels = dict(claim["labels"])
            if self._store is not None:
                # Claims made before projects carry none: theirs is the default.
                project = str(claim.get("project", DEFAULT_PROJECT))
                try:
                    self._store.enroll_device(
                        device_id, labels, now_ms=self._now_ms(), project=project
                    )
                except NotFoundError as exc:
                    raise EnrolmentError("unknown-project", str(exc)) from exc
            result = self._issue(csr, device_id, labels, devices)
            claim["uses_left"] -= 1
            self._write("claims.json", {"claims": claims})
            self._write("enrolled.json", enrolled)
            if old is not None and old["serial"] in revoked:
                self._write_crl(revoked)
        return result

    def renew(self, device_id: str, csr_pem: bytes) -> Enrolled:
        """A new certificate for an enrolled device (which proved who it is over mTLS).

        Raises:
            EnrolmentError: a bad CSR, a CSR for another device, or a device that is
                not enrolled or revoked. Counted in :attr:`refused`.
            HubError: the PKI files cannot be read or written.
        """
        try:
            return self._renew(device_id, csr_pem)
        except EnrolmentError as exc:
            self.refused[exc.reason] += 1
            raise

    def _renew(self, device_id: str, csr_pem: bytes) -> Enrolled:
        csr, named = _checked_csr(csr_pem)
        if named != device_id:
            raise EnrolmentError("foreign-csr", f"{device_id} asked for a certificate as {named}")
        with self._locked():
            enrolled = self._read("enrolled.json")
            devices: dict[str, Any] = enrolled.setdefault("devices", {})
            old = devices.get(device_id)
            if old is None or old["serial"] in enrolled.get("revoked", {}):
                raise EnrolmentError("not-enrolled", f"{device_id} is not enrolled")
            labels = dict(old.get("labels", {}))
            result = self._issue(csr, device_id, labels, devices)
            self._write("enrolled.json", enrolled)
        return result

    def _usable_claim(self, claims: dict[str, Any], digest: str) -> dict[str, Any]:
        claim = claims.get(digest)
        if claim is None:
            raise EnrolmentError("unknown-token", "no such claim token")
        if claim["expires_ms"] <= self._now_ms():
            raise EnrolmentError("expired-token", "the claim token has expired")
        if claim["uses_left"] <= 0:
            raise EnrolmentError("used-up-token", "the claim token has been used up")
        return claim  # type: ignore[no-any-return]

    def _issue(
        self,
        csr: x509.CertificateSigningRequest,
        device_id: str,
        labels: dict[str, str],
        devices: dict[str, Any],
    ) -> Enrolled:
        ca = CertificateAuthority.open_or_create(self.pki)
        try:
            cert = ca.sign_csr(csr, device_id)
        except ValidationError as exc:
            raise EnrolmentError("bad-csr", str(exc)) from exc
        not_after_ms = int(cert.not_valid_after_utc.timestamp() * 1000)
        devices[device_id] = {
            "serial": str(cert.serial_number),
            "key": _key_id(cert),
            "not_after_ms": not_after_ms,
            "labels": labels,
        }
        return Enrolled(
            device_id=device_id,
            certificate_pem=cert.public_bytes(serialization.Encoding.PEM),
            ca_pem=ca.certificate.public_bytes(serialization.Encoding.PEM),
            director_public_pem=self._director_pem(self.home),
            not_after_ms=not_after_ms,
            labels=labels,
        )

    # -- revocation --------------------------------------------------------------------

    def revoke(self, device_id: str) -> None:
        """Revoke the device's certificate: it is added to the CRL, which is rewritten.

        Raises:
            EnrolmentError: the device is not enrolled.
            HubError: the PKI files cannot be read or written.
        """
        with self._locked():
            enrolled = self._read("enrolled.json")
            device = enrolled.get("devices", {}).get(device_id)
            if device is None:
                raise EnrolmentError("not-enrolled", f"{device_id} is not enrolled")
            revoked: dict[str, int] = enrolled.setdefault("revoked", {})
            revoked.setdefault(device["serial"], self._now_ms())
            self._write("enrolled.json", enrolled)
            self._write_crl(revoked)

    def crl_path(self) -> Path:
        """The CRL file (PEM) the gRPC server and the broker honour."""
        return self.pki / "crl.pem"

    def crl_pem(self) -> bytes:
        """The current CRL (PEM), written first if there is none yet.

        Raises:
            HubError: the PKI files cannot be read or written.
        """
        path = self.crl_path()
        if not path.exists():
            with self._locked():
                self._write_crl(self._read("enrolled.json").get("revoked", {}))
        try:
            return path.read_bytes()
        except OSError as exc:
            raise HubError(f"cannot read {path}: {exc}") from exc

    def refresh_crl(self) -> bool:
        """Sign the CRL again once a third of its lifetime is left.

        Mosquitto refuses every client once the CRL it was given expires, so the
        leader hub runs this on a schedule (tell the broker with ``broker reload``).

        Returns:
            Whether a new CRL was written.

        Raises:
            HubError: the PKI files cannot be read or written.
        """
        try:
            crl = x509.load_pem_x509_crl(self.crl_pem())
        except ValueError:
            crl = None
        if crl is not None and crl.next_update_utc is not None:
            life = crl.next_update_utc - crl.last_update_utc
            left = crl.next_update_utc - datetime.now(UTC)
            if left > life / 3:
                return False
        with self._locked():
            self._write_crl(self._read("enrolled.json").get("revoked", {}))
        return True

    def _write_crl(self, revoked: Mapping[str, int]) -> None:
        ca = CertificateAuthority.open_or_create(self.pki)
        pem = ca.crl({int(serial): when for serial, when in revoked.items()})
        try:
            write_atomic(self.crl_path(), pem, 0o644)
        except OSError as exc:
            raise HubError(f"cannot write {self.crl_path()}: {exc}") from exc

    # -- files -------------------------------------------------------------------------

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        try:
            self.pki.mkdir(parents=True, exist_ok=True)
            fh = (self.pki / "enrol.lock").open("a")
        except OSError as exc:
            raise HubError(f"cannot lock {self.pki}: {exc}") from exc
        with fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            yield

    def _pruned_claims(self) -> dict[str, Any]:
        horizon = self._now_ms() - _EXPIRED_KEPT_MS
        claims: dict[str, Any] = self._read("claims.json").get("claims", {})
        return {k: c for k, c in claims.items() if c["expires_ms"] > horizon}

    def _read(self, name: str) -> dict[str, Any]:
        path = self.pki / name
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as exc:
            raise HubError(f"cannot read {path}: {exc}") from exc
        if not isinstance(data, dict):
            raise HubError(f"{path} is corrupt")
        return data

    def _write(self, name: str, data: Mapping[str, Any]) -> None:
        path = self.pki / name
        try:
            write_atomic(path, json.dumps(data, sort_keys=True).encode("utf-8"), 0o600)
        except OSError as exc:
            raise HubError(f"cannot write {path}: {exc}") from exc


def _checked_csr(csr_pem: bytes) -> tuple[x509.CertificateSigningRequest, str]:
    try:
        csr = load_csr(csr_pem)
        device_id = csr_common_name(csr)
    except ValidationError as exc:
        raise EnrolmentError("bad-csr", str(exc)) from exc
    if not _DEVICE_ID_RE.fullmatch(device_id):
        raise EnrolmentError("bad-device-id", f"{device_id!r} is not a device id")
    if device_id.lower() in RESERVED_IDS:
        raise EnrolmentError("bad-device-id", f"{device_id!r} is reserved for the hub")
    return csr, device_id
