"""``edgeskill agent run`` with a mistake in it: exit status 2, one line, nothing created.

Each case runs the real command in a child process, as a person would, from a
scratch folder (so the paths typed are short and relative, as they usually are),
and checks that the state folder was not made.
"""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from securesystemslib.signer import CryptoSigner
from tuf.api.metadata import Metadata

from skills.trust import TrustRepository
from skills.trust.ceremony import generate_root_keys, load_signers

STATE = "agent-state"


def _agent_run(folder: Path, *args: str) -> str:
    """Run ``edgeskill agent run ARGS`` in ``folder``; check the refusal; return its line."""
    argv = [sys.executable, "-m", "edgeskill.cli", "agent", "run", "--state-dir", STATE, *args]
    # Wide, so that the console's line wrapping cannot split the one line.
    env = {**os.environ, "COLUMNS": "400", "GRPC_VERBOSITY": "ERROR"}
    proc = subprocess.run(
        argv, cwd=folder, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    output = proc.stdout + proc.stderr
    assert proc.returncode == 2, output
    assert "Traceback" not in output
    lines = [line for line in output.splitlines() if line.strip()]
    assert len(lines) == 1, output
    assert not (folder / STATE).exists(), "a refused start must create nothing"
    return lines[0]


@pytest.fixture
def files(tmp_path: Path) -> Path:
    """A scratch folder with a good root.json and CA, and a few bad files beside them."""
    repo = TrustRepository.init(tmp_path / "hub")
    (tmp_path / "root.json").write_bytes(repo.root_json())
    (tmp_path / "ca.pem").write_bytes(_self_signed_ca())
    (tmp_path / "corrupt.json").write_bytes(repo.root_json()[:-40])
    (tmp_path / "junk.pem").write_text("-----BEGIN CERTIFICATE-----\nbm9wZQ==\n")
    (tmp_path / "a-folder").mkdir()
    return tmp_path


def _self_signed_ca() -> bytes:
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "test hub CA")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    return cert.public_bytes(serialization.Encoding.PEM)


# Enrolling over grpcs:// with a claim token: everything else in these is right.
SECURE = ["--hub", "grpcs://127.0.0.1:7443", "--device-id", "cam-1", "--claim-token", "t0k3n"]


@pytest.mark.parametrize(
    ("hub", "expected"),
    [
        ("http://127.0.0.1:7443", "hub URL 'http://127.0.0.1:7443' has the scheme 'http'"),
        ("127.0.0.1:7443", "hub URL '127.0.0.1:7443' has no scheme"),
        ("grpcs://127.0.0.1:70000", "hub URL 'grpcs://127.0.0.1:70000' has a bad port"),
    ],
)
def test_a_bad_hub_url(files: Path, hub: str, expected: str) -> None:
    args = ["--hub", hub, "--device-id", "cam-1", "--trusted-root", "root.json"]
    assert expected in _agent_run(files, *args)


def test_a_bad_enrolment_url(files: Path) -> None:
    args = [*SECURE, "--hub-ca", "ca.pem", "--trusted-root", "root.json"]
    line = _agent_run(files, *args, "--enroll-url", "grpc://127.0.0.1:7444")
    assert "enrolment URL 'grpc://127.0.0.1:7444' has the scheme 'grpc'" in line


@pytest.mark.parametrize("hub", ["grpcs://127.0.0.1:7443", "mqtts://127.0.0.1:8883/es"])
@pytest.mark.parametrize("device_id", ["", "a/b"])
def test_a_bad_device_id(files: Path, hub: str, device_id: str) -> None:
    args = ["--hub", hub, "--device-id", device_id, "--trusted-root", "root.json"]
    line = _agent_run(files, *args)
    assert f"bad device id {device_id!r}" in line
    assert "expected 1 to 128 letters, digits" in line


def _root_below_threshold(folder: Path) -> bytes:
    signers = load_signers(generate_root_keys(folder / "offline-keys", 3))
    repo = TrustRepository.init(folder / "hub-2of3", root_signers=signers, root_threshold=2)
    root: Metadata[Any] = Metadata.from_bytes(repo.root_json())
    for keyid in list(root.signatures)[1:]:
        del root.signatures[keyid]
    return root.to_bytes()


def _root_signed_by_a_stranger(folder: Path) -> bytes:
    root: Metadata[Any] = Metadata.from_bytes((folder / "root.json").read_bytes())
    root.signatures.clear()
    root.sign(CryptoSigner.generate_ed25519())
    return root.to_bytes()


@pytest.mark.parametrize(
    ("root", "expected"),
    [
        ("missing.json", "trusted root missing.json does not exist"),
        ("a-folder", "trusted root a-folder is a folder; expected a file"),
        ("corrupt.json", "trusted root corrupt.json is not TUF metadata"),
        ("under.json", "has 1 valid signature(s) of its own root keys, below its threshold of 2"),
        ("stranger.json", "has 0 valid signature(s) of its own root keys, below its threshold"),
    ],
)
def test_a_bad_trusted_root(files: Path, root: str, expected: str) -> None:
    (files / "under.json").write_bytes(_root_below_threshold(files))
    (files / "stranger.json").write_bytes(_root_signed_by_a_stranger(files))
    line = _agent_run(files, *SECURE, "--hub-ca", "ca.pem", "--trusted-root", root)
    assert expected in line


@pytest.mark.parametrize(
    ("option", "value", "expected"),
    [
        ("--hub-ca", "missing.pem", "CA certificate missing.pem does not exist"),
        ("--hub-ca", "junk.pem", "CA certificate junk.pem is not a PEM certificate"),
        ("--claim-token-file", "a-folder", "claim token file a-folder is a folder"),
        ("--director-key", "ca.pem", "director key ca.pem is not a PEM public key"),
        ("--source", "root.json", "source root.json: input root.json: not an image, a folder of"),
        ("--source", "x.npz", "source x.npz does not exist"),
    ],
)
def test_a_bad_file_argument(files: Path, option: str, value: str, expected: str) -> None:
    args = [*SECURE, "--trusted-root", "root.json"]
    if option != "--hub-ca":
        args += ["--hub-ca", "ca.pem"]
    assert expected in _agent_run(files, *args, option, value)


def test_a_client_key_that_does_not_parse(files: Path) -> None:
    args = ["--hub", "grpcs://127.0.0.1:7443", "--device-id", "cam-1"]
    args += ["--trusted-root", "root.json", "--cert", "ca.pem", "--key", "junk.pem"]
    assert "client key junk.pem is not an unencrypted PEM private key" in _agent_run(files, *args)
