"""The hub's small CA: made once, keys private, device certificates name their device."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from cloud.errors import HubError, ValidationError
from cloud.pki import CertificateAuthority, issue_device_credentials


def _load(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def _cn(cert: x509.Certificate) -> str:
    return str(cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)[0].value)


def test_device_credentials_chain_to_the_hub_ca(tmp_path: Path) -> None:
    creds = issue_device_credentials(tmp_path / "hub", "cam-1", tmp_path / "out")
    ca = _load(tmp_path / "hub" / "pki" / "ca.crt")
    client, server = _load(creds.client.cert), _load(creds.server.cert)
    assert _cn(client) == "cam-1"
    client.verify_directly_issued_by(ca)
    server.verify_directly_issued_by(ca)
    eku = client.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert ExtendedKeyUsageOID.CLIENT_AUTH in eku
    san = server.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "localhost" in san.get_values_for_type(x509.DNSName)
    assert [str(ip) for ip in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert creds.ca.read_bytes() == (tmp_path / "hub" / "pki" / "ca.crt").read_bytes()


def test_private_keys_are_owner_only(tmp_path: Path) -> None:
    creds = issue_device_credentials(tmp_path / "hub", "cam-1", tmp_path / "out")
    for key in (tmp_path / "hub" / "pki" / "ca.key", creds.server.key, creds.client.key):
        assert stat.S_IMODE(key.stat().st_mode) == 0o600, key


def test_the_ca_and_server_cert_are_made_once(tmp_path: Path) -> None:
    home = tmp_path / "hub"
    first = issue_device_credentials(home, "cam-1", tmp_path / "out")
    ca_before = (home / "pki" / "ca.crt").read_bytes()
    server_before = first.server.cert.read_bytes()
    second = issue_device_credentials(home, "cam-2", tmp_path / "out")
    assert (home / "pki" / "ca.crt").read_bytes() == ca_before
    assert second.server.cert.read_bytes() == server_before
    _load(second.client.cert).verify_directly_issued_by(_load(home / "pki" / "ca.crt"))
    assert _cn(_load(first.client.cert)) == "cam-1"


@pytest.mark.parametrize("bad", ["", "a/b", "x" * 65, "cam 1", "-cam"])
def test_a_name_that_cannot_be_a_cn_is_refused(tmp_path: Path, bad: str) -> None:
    ca = CertificateAuthority.open_or_create(tmp_path / "ca")
    with pytest.raises(ValidationError):
        ca.issue(bad, tmp_path / "out", "leaf")
    assert not (tmp_path / "out").exists()


def test_a_bad_device_id_creates_nothing(tmp_path: Path) -> None:
    with pytest.raises(ValidationError):
        issue_device_credentials(tmp_path / "hub", "cam/1", tmp_path / "out")
    assert not (tmp_path / "hub").exists()
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("content", [b"", b" \n", b"x" * (64 * 1024 + 1)])
def test_an_empty_or_oversized_ca_file_is_refused(tmp_path: Path, content: bytes) -> None:
    CertificateAuthority.open_or_create(tmp_path / "pki")
    (tmp_path / "pki" / "ca.crt").write_bytes(content)
    with pytest.raises(HubError, match=r"cannot load the CA .* empty or larger than 65536 bytes"):
        CertificateAuthority.open_or_create(tmp_path / "pki")


def test_a_corrupt_ca_key_is_refused(tmp_path: Path) -> None:
    CertificateAuthority.open_or_create(tmp_path / "pki")
    (tmp_path / "pki" / "ca.key").write_bytes(b"-----BEGIN PRIVATE KEY-----\nnope\n")
    with pytest.raises(HubError, match="cannot load the CA in"):
        CertificateAuthority.open_or_create(tmp_path / "pki")
