"""Claims, enrolment, renewal and revocation of the hub's :class:`Enroller`, on real files."""

from __future__ import annotations

import datetime
import stat
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from cryptography.x509.oid import NameOID

from cloud.director import HubDirector
from cloud.enrolment import Enroller, EnrolmentError
from cloud.pki import init_hub_pki
from cloud.store import Store, open_store

CAMERA = {"kind": "camera"}


def make_csr(device_id: str, key: ec.EllipticCurvePrivateKey | None = None) -> bytes:
    key = key or ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, device_id)])
    csr = x509.CertificateSigningRequestBuilder().subject_name(subject).sign(key, hashes.SHA256())
    return csr.public_bytes(serialization.Encoding.PEM)


def tampered_csr(device_id: str) -> bytes:
    """A CSR whose signature was not made by the key it holds (its last byte flipped)."""
    pem = make_csr(device_id)
    der = bytearray(x509.load_pem_x509_csr(pem).public_bytes(serialization.Encoding.DER))
    der[-1] ^= 0x01
    return x509.load_der_x509_csr(bytes(der)).public_bytes(serialization.Encoding.PEM)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    opened = open_store(f"sqlite:///{tmp_path / 'hub.db'}")
    yield opened
    opened.close()


@pytest.fixture
def enroller(tmp_path: Path, store: Store) -> Enroller:
    init_hub_pki(tmp_path / "home")
    return Enroller(tmp_path / "home", store)


def test_a_claim_enrols_a_device_with_its_labels(enroller: Enroller, store: Store) -> None:
    token = enroller.create_claim({"kind": "camera", "site": "3"})
    done = enroller.enroll(token, make_csr("cam-1"))
    cert = x509.load_pem_x509_certificate(done.certificate_pem)
    ca = x509.load_pem_x509_certificate(done.ca_pem)
    cert.verify_directly_issued_by(ca)
    assert cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value == "cam-1"
    assert done.labels == {"kind": "camera", "site": "3"}
    assert done.director_public_pem == HubDirector(enroller.home).public_pem()
    assert done.not_after_ms == int(cert.not_valid_after_utc.timestamp() * 1000)
    device = store.get_device("cam-1")
    assert device is not None
    assert (device.labels, device.online) == ({"kind": "camera", "site": "3"}, False)


def test_claims_are_kept_only_as_hashes_in_a_private_file(enroller: Enroller) -> None:
    token = enroller.create_claim(CAMERA)
    claims = enroller.pki / "claims.json"
    assert token not in claims.read_text()
    assert stat.S_IMODE(claims.stat().st_mode) == 0o600


def test_a_token_works_only_as_often_as_it_allows(enroller: Enroller) -> None:
    token = enroller.create_claim(CAMERA, uses=2)
    enroller.enroll(token, make_csr("cam-1"))
    enroller.enroll(token, make_csr("cam-2"))
    with pytest.raises(EnrolmentError) as info:
        enroller.enroll(token, make_csr("cam-3"))
    assert info.value.reason == "used-up-token"
    assert enroller.refused == {"used-up-token": 1}


def test_expired_and_unknown_tokens_are_refused(tmp_path: Path, enroller: Enroller) -> None:
    past = Enroller(enroller.home, clock=lambda: time.time() - 3600)
    expired = past.create_claim(CAMERA, ttl_s=60)
    with pytest.raises(EnrolmentError) as info:
        enroller.enroll(expired, make_csr("cam-1"))
    assert info.value.reason == "expired-token"
    with pytest.raises(EnrolmentError) as info:
        enroller.enroll("x" * 43, make_csr("cam-1"))
    assert info.value.reason == "unknown-token"
    with pytest.raises(EnrolmentError) as info:
        enroller.enroll("x" * 500, make_csr("cam-1"))
    assert info.value.reason == "unknown-token"


@pytest.mark.parametrize(
    ("csr", "reason"),
    [
        (b"not a csr", "bad-csr"),
        (b"x" * 9000, "bad-csr"),
        (None, "bad-csr"),  # tampered signature
        (make_csr("-bad"), "bad-device-id"),
    ],
)
def test_bad_csrs_are_refused_and_use_no_token(
    enroller: Enroller, csr: bytes | None, reason: str
) -> None:
    token = enroller.create_claim(CAMERA)
    with pytest.raises(EnrolmentError) as info:
        enroller.enroll(token, csr if csr is not None else tampered_csr("cam-1"))
    assert info.value.reason == reason
    enroller.enroll(token, make_csr("cam-1"))  # the token was not used up


def test_a_non_ec_key_is_refused(enroller: Enroller) -> None:
    key = ed25519.Ed25519PrivateKey.generate()
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "cam-1")])
    csr = x509.CertificateSigningRequestBuilder().subject_name(subject).sign(key, None)
    with pytest.raises(EnrolmentError) as info:
        enroller.enroll(enroller.create_claim(CAMERA), csr.public_bytes(serialization.Encoding.PEM))
    assert info.value.reason == "bad-csr"


def test_an_enrolled_id_is_not_taken_over_without_a_reenrol_claim(enroller: Enroller) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    first = enroller.enroll(enroller.create_claim(CAMERA), make_csr("cam-1", key))
    with pytest.raises(EnrolmentError) as info:
        enroller.enroll(enroller.create_claim(CAMERA), make_csr("cam-1"))
    assert info.value.reason == "already-enrolled"
    # The same key again (an answer that got lost) is fine; the old certificate is revoked.
    again = enroller.enroll(enroller.create_claim(CAMERA), make_csr("cam-1", key))
    old = x509.load_pem_x509_certificate(first.certificate_pem).serial_number
    crl = x509.load_pem_x509_crl(enroller.crl_pem())
    assert crl.get_revoked_certificate_by_serial_number(old) is not None
    # A re-enrol claim replaces the key, and revokes the certificate before.
    replaced = enroller.enroll(enroller.create_claim(CAMERA, reenroll=True), make_csr("cam-1"))
    before = x509.load_pem_x509_certificate(again.certificate_pem).serial_number
    crl = x509.load_pem_x509_crl(enroller.crl_pem())
    assert crl.get_revoked_certificate_by_serial_number(before) is not None
    assert replaced.device_id == "cam-1"


def test_renewal_and_revocation(enroller: Enroller, store: Store) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    enroller.enroll(enroller.create_claim(CAMERA), make_csr("cam-1", key))
    store.set_device_labels("cam-1", {"kind": "gateway"})
    renewed = enroller.renew("cam-1", make_csr("cam-1", key))
    assert renewed.labels == CAMERA  # what the claim gave; the store is the hub's truth
    with pytest.raises(EnrolmentError) as info:
        enroller.renew("cam-1", make_csr("cam-2", key))
    assert info.value.reason == "foreign-csr"
    with pytest.raises(EnrolmentError) as info:
        enroller.renew("cam-9", make_csr("cam-9"))
    assert info.value.reason == "not-enrolled"

    enroller.revoke("cam-1")
    serial = x509.load_pem_x509_certificate(renewed.certificate_pem).serial_number
    crl = x509.load_pem_x509_crl(enroller.crl_path().read_bytes())
    assert crl.get_revoked_certificate_by_serial_number(serial) is not None
    assert crl.is_signature_valid(
        x509.load_pem_x509_certificate((enroller.pki / "ca.crt").read_bytes()).public_key()  # type: ignore[arg-type]
    )
    with pytest.raises(EnrolmentError) as info:
        enroller.renew("cam-1", make_csr("cam-1", key))
    assert info.value.reason == "not-enrolled"
    with pytest.raises(EnrolmentError):
        enroller.revoke("cam-9")


def test_an_empty_crl_is_written_on_first_use(enroller: Enroller) -> None:
    crl = x509.load_pem_x509_crl(enroller.crl_pem())
    assert len(crl) == 0
    assert enroller.crl_path().is_file()


@pytest.mark.parametrize("name", ["hub", "HUB", "edgeskill-broker"])
def test_the_hubs_own_certificate_names_cannot_be_enrolled(enroller: Enroller, name: str) -> None:
    token = enroller.create_claim({"kind": "camera"})
    with pytest.raises(EnrolmentError) as caught:
        enroller.enroll(token, make_csr(name))
    assert caught.value.reason == "bad-device-id"


def test_the_crl_is_signed_again_before_it_expires(enroller: Enroller) -> None:
    enroller.crl_pem()
    assert enroller.refresh_crl() is False  # fresh: nothing to do
    # An old CRL with five days of its thirty left, signed by the hub's CA.
    pki = enroller.home / "pki"
    key = serialization.load_pem_private_key((pki / "ca.key").read_bytes(), None)
    ca = x509.load_pem_x509_certificate((pki / "ca.crt").read_bytes())
    now = datetime.datetime.now(datetime.UTC)
    old = (
        x509.CertificateRevocationListBuilder()
        .issuer_name(ca.subject)
        .last_update(now - datetime.timedelta(days=25))
        .next_update(now + datetime.timedelta(days=5))
        .sign(key, hashes.SHA256())  # type: ignore[arg-type]
    )
    (pki / "crl.pem").write_bytes(old.public_bytes(serialization.Encoding.PEM))

    assert enroller.refresh_crl() is True
    fresh = x509.load_pem_x509_crl((pki / "crl.pem").read_bytes())
    assert fresh.next_update_utc is not None
    assert fresh.next_update_utc - now > datetime.timedelta(days=20)
    assert enroller.refresh_crl() is False
