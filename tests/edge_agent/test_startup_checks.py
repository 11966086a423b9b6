"""The agent's settings are checked at start, each mistake with a one-line reason, nothing created.

Pure checks first (URLs, device ids, files, roots), then a whole configuration
through :func:`build_agent` and :func:`run_agent`, then a trusted root of
another hub, which only the hub's metadata can reveal: the agent says so once
in its log, reports it, and carries it in the failed skill's error.
"""

from __future__ import annotations

import asyncio
import datetime
import logging
import os
from collections.abc import AsyncIterator
from contextlib import AbstractContextManager
from pathlib import Path

import numpy as np
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.x509.oid import NameOID

from edge_agent.config import AgentConfig
from edge_agent.errors import TransportError
from edge_agent.startup_checks import (
    SettingsError,
    check_config,
    check_device_id,
    check_enroll_url,
    check_hub_url,
    check_run_config,
    check_source,
    check_trusted_root,
    read_claim_token,
    read_setting_file,
)
from edge_agent.state_lock import hold_state_folder
from edge_agent.transport import AgentTransport
from edge_agent.wiring import build_agent, run_agent
from protos import make_envelope, pb
from skills.trust import TrustRepository
from tests.fakes.fake_launcher import PROFILE, FakeLauncher
from tests.support import async_wait_until


def _refused(match: str) -> AbstractContextManager[pytest.ExceptionInfo[SettingsError]]:
    return pytest.raises(SettingsError, match=match)


def _one_line(exc: pytest.ExceptionInfo[SettingsError]) -> str:
    message = str(exc.value)
    assert message and "\n" not in message
    return message


# -- values ----------------------------------------------------------------------


@pytest.mark.parametrize("device_id", ["cam-1", "a", "Cam_2.north", "x" * 128])
def test_good_device_ids_pass(device_id: str) -> None:
    assert check_device_id(device_id) == device_id


@pytest.mark.parametrize(
    "device_id",
    ["", "a/b", "a+b", "a#b", "cam 1", "-cam", ".cam", "x" * 129, "cam\n1", "câm"],
)
def test_bad_device_ids_are_refused_and_quoted(device_id: str) -> None:
    with _refused("bad device id") as caught:
        check_device_id(device_id)
    message = _one_line(caught)
    assert repr(device_id[:60]) in message and "letters, digits" in message


@pytest.mark.parametrize(
    "url",
    [
        "grpc://127.0.0.1:7443",
        "grpcs://hub.example:7443",
        "grpc://hub",
        "grpc://[::1]:7443/",
        "mqtt://127.0.0.1:1883",
        "mqtt://u:p@broker:1883/plant/v1?session_expiry=60&keepalive=5",
        "mqtts://broker",
    ],
)
def test_good_hub_urls_pass(url: str) -> None:
    check_hub_url(url)


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("http://hub:7443", "has the scheme 'http'; expected grpc"),
        ("127.0.0.1:7443", "has no scheme"),
        ("hub:7443", "has no scheme"),
        ("grpc://:7443", "has no host"),
        ("grpc://hub:0", "bad port"),
        ("grpc://hub:65536", "bad port"),
        ("grpc://hub:port", "bad port"),
        ("grpc://hub:", "bad port"),
        ("mqtt://hub:99999", "bad port"),
        ("grpc://[::1:7443", "is not a URL"),
        ("grpc://hub name:7443", "bad host"),
        ("grpc://hub:7443/prefix", "takes no user, path or options"),
        ("mqtt://hub:1883/a+b", "bad topic prefix"),
        ("mqtt://hub:1883/a/#", "has a '#'"),
        ("grpc://hub:7443#x", "has a '#'"),
        ("mqtt://hub:1883?colour=red", "unknown MQTT URL options: colour"),
        ("mqtt://hub:1883?ca=/x.pem", "need an mqtts:// URL"),
    ],
)
def test_bad_hub_urls_are_refused_with_the_reason(url: str, reason: str) -> None:
    with _refused("hub URL") as caught:
        check_hub_url(url)
    message = _one_line(caught)
    assert reason in message and repr(url) in message


def test_an_mqtts_url_names_files_that_must_be_there(tmp_path: Path) -> None:
    with _refused(r"the hub URL's ca= file .*missing.pem does not exist"):
        check_hub_url(f"mqtts://broker?ca={tmp_path / 'missing.pem'}")


@pytest.mark.parametrize(
    ("url", "reason"),
    [
        ("grpc://hub:7444", "has the scheme 'grpc'; expected grpcs://HOST:PORT"),
        ("hub:7444", "has no scheme"),
        ("grpcs://hub:70000", "bad port"),
        ("grpcs://hub:7444/x", "takes no user, path or options"),
    ],
)
def test_bad_enrolment_urls_are_refused(url: str, reason: str) -> None:
    with _refused(f"enrolment URL {url!r}") as caught:
        check_enroll_url(url)
    assert reason in _one_line(caught)


# -- files -----------------------------------------------------------------------


def test_a_setting_file_must_be_a_readable_non_empty_file(tmp_path: Path) -> None:
    with _refused(r"^trusted root .*nowhere.json does not exist$"):
        read_setting_file(tmp_path / "nowhere.json", "trusted root")
    with _refused(r"is a folder; expected a file$"):
        read_setting_file(tmp_path, "trusted root")
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with _refused("is not a regular file"):  # reading it would block forever
        read_setting_file(fifo, "trusted root")
    empty = tmp_path / "empty"
    empty.write_bytes(b" \n")
    with _refused("is empty"):
        read_setting_file(empty, "trusted root")
    big = tmp_path / "big"
    big.write_bytes(b"x" * 101)
    with _refused("is larger than 100 bytes"):
        read_setting_file(big, "trusted root", max_bytes=100)
    big.write_bytes(b"x" * 100)
    assert read_setting_file(big, "trusted root", max_bytes=100) == b"x" * 100


def test_a_trusted_root_is_parsed_and_its_signatures_checked(tmp_path: Path) -> None:
    repo = TrustRepository.init(tmp_path / "hub")
    good = tmp_path / "hub" / "metadata" / "root.json"
    assert check_trusted_root(good) == good.read_bytes()
    corrupt = tmp_path / "corrupt.json"
    corrupt.write_bytes(good.read_bytes()[:-20])
    with _refused(r"trusted root .*corrupt.json is not TUF metadata"):
        check_trusted_root(corrupt)
    wrong_role = tmp_path / "timestamp.json"
    wrong_role.write_bytes(repo.read("metadata/timestamp.json", 1 << 20))
    with _refused("holds 'timestamp' metadata, not a root"):
        check_trusted_root(wrong_role)


def _key_and_cert(tmp_path: Path, name: str) -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    key_path, cert_path = tmp_path / f"{name}.key", tmp_path / f"{name}.crt"
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return key_path, cert_path


def _config(tmp_path: Path, **overrides: object) -> AgentConfig:
    root = tmp_path / "hub" / "metadata" / "root.json"
    if not root.exists():
        TrustRepository.init(tmp_path / "hub")
    settings: dict[str, object] = {
        "hub_url": "grpcs://127.0.0.1:7443",
        "device_id": "cam-1",
        "state_dir": tmp_path / "agent",
        "trusted_root": root,
    }
    settings.update(overrides)
    return AgentConfig(**settings)  # type: ignore[arg-type]


def test_tls_files_are_parsed_and_must_belong_together(tmp_path: Path) -> None:
    key, cert = _key_and_cert(tmp_path, "cam-1")
    other_key, _ = _key_and_cert(tmp_path, "cam-2")
    junk = tmp_path / "junk.pem"
    junk.write_text("-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydA==\n-----END CERTIFICATE-----\n")
    check_config(_config(tmp_path, tls_ca=cert, tls_cert=cert, tls_key=key))
    cases: list[tuple[dict[str, object], str]] = [
        ({"tls_ca": junk}, r"CA certificate .*junk.pem is not a PEM certificate"),
        ({"tls_ca": tmp_path}, r"CA certificate .* is a folder"),
        ({"tls_cert": cert}, "needs both --cert and --key"),
        ({"tls_cert": junk, "tls_key": key}, r"client certificate .*junk.pem is not a PEM"),
        ({"tls_cert": cert, "tls_key": cert}, r"client key .*cam-1.crt is not an unencrypted"),
        ({"tls_cert": cert, "tls_key": other_key}, r"is not for the key .*cam-2.key"),
        ({"tls_ca": cert, "hub_url": "grpc://127.0.0.1:7443"}, "apply to grpcs:// and mqtts://"),
    ]
    for overrides, reason in cases:
        with _refused(reason):
            check_config(_config(tmp_path, **overrides))


def test_a_director_key_must_be_an_ed25519_public_key(tmp_path: Path) -> None:
    good = tmp_path / "director.pub"
    good.write_bytes(
        Ed25519PrivateKey.generate()
        .public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    check_config(_config(tmp_path, director_key=good))
    key, cert = _key_and_cert(tmp_path, "cam-1")
    with _refused(r"director key .*cam-1.key is not a PEM public key"):
        check_config(_config(tmp_path, director_key=key))
    ec_public = tmp_path / "ec.pub"
    ec_public.write_bytes(
        x509.load_pem_x509_certificate(cert.read_bytes())
        .public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    with _refused("is not an ed25519 public key"):
        check_config(_config(tmp_path, director_key=ec_public))


def test_a_source_is_an_npz_with_an_x_array(tmp_path: Path) -> None:
    good = tmp_path / "good.npz"
    np.savez(good, x=np.zeros((2, 3), np.float32), y=np.array([0, 1]))
    check_source(good)
    no_x = tmp_path / "no-x.npz"
    np.savez(no_x, images=np.zeros(2))
    one_array = tmp_path / "one.npy"
    np.save(one_array, np.zeros(2))
    junk = tmp_path / "junk.npz"
    junk.write_bytes(os.urandom(256))
    for path, reason in [
        (no_x, r"has no x array \(it has \['images'\]\)"),
        (one_array, "is one array, not an .npz file"),
        (junk, "is not an .npz file with an x array"),
        (tmp_path / "none.npz", "does not exist"),
    ]:
        with _refused(reason):
            check_source(path)


def test_a_claim_token_file_holds_one_token(tmp_path: Path) -> None:
    path = tmp_path / "token"
    path.write_text("abc-123_XYZ\n")
    assert read_claim_token(path) == "abc-123_XYZ"
    for content, reason in [
        (b"one\ntwo\n", "holds more than one token"),
        (b"\xff\xfe", "is not text"),
        (b"\n\n", "is empty"),
    ]:
        path.write_bytes(content)
        with _refused(reason):
            read_claim_token(path)


# -- a whole configuration ---------------------------------------------------------


def test_no_trusted_root_given_or_kept_is_refused(tmp_path: Path) -> None:
    with _refused("no trusted root: give the hub's root.json"):
        check_config(_config(tmp_path, trusted_root=None))
    kept = tmp_path / "agent" / "trust" / "metadata" / "root.json"
    kept.parent.mkdir(parents=True)
    kept.write_bytes((tmp_path / "hub" / "metadata" / "root.json").read_bytes())
    assert check_config(_config(tmp_path, trusted_root=None)) is None


def test_a_real_agent_needs_an_authenticated_hub_and_a_way_to_an_identity(
    tmp_path: Path,
) -> None:
    key, cert = _key_and_cert(tmp_path, "cam-1")
    with _refused(r"grpc:// is not authenticated"):
        check_run_config(_config(tmp_path, hub_url="grpc://127.0.0.1:7443"))
    assert check_run_config(_config(tmp_path, hub_url="grpc://h:1", insecure=True))
    with _refused("this device is not enrolled: pass --claim-token and --hub-ca"):
        check_run_config(_config(tmp_path))
    with _refused("pass --enroll-url"):
        check_run_config(_config(tmp_path, hub_url="mqtts://b", claim_token="t", tls_ca=cert))
    check_run_config(_config(tmp_path, claim_token="t", tls_ca=cert))
    check_run_config(_config(tmp_path, tls_cert=cert, tls_key=key))
    with _refused("bad metrics address"):
        check_run_config(_config(tmp_path, tls_cert=cert, tls_key=key, metrics_bind="nowhere"))
    assert not (tmp_path / "agent").exists()


def test_a_held_state_folder_is_named_before_anything_else(tmp_path: Path) -> None:
    config = _config(tmp_path)  # not enrolled, but the folder's holder is the first news
    with hold_state_folder(config.state_dir), _refused(rf"another agent \(pid {os.getpid()}\)"):
        check_run_config(config)
    check_run_config(_config(tmp_path, insecure=True, hub_url="grpc://h:1"))  # released


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        ({"hub_url": "http://127.0.0.1:7443"}, "has the scheme 'http'"),
        ({"hub_url": "127.0.0.1:7443"}, "has no scheme"),
        ({"device_id": "a/b", "hub_url": "mqtt://127.0.0.1:1883"}, "bad device id 'a/b'"),
        ({"trusted_root": Path("missing-root.json")}, "missing-root.json does not exist"),
        ({"source_rate_hz": 0.0}, "source_rate_hz must be more than 0"),
    ],
)
def test_build_and_run_refuse_a_bad_setting_and_create_nothing(
    tmp_path: Path, overrides: dict[str, object], reason: str
) -> None:
    config = _config(tmp_path, **{"insecure": True, "hub_url": "grpc://h:1", **overrides})
    with _refused(reason):
        build_agent(config, PROFILE, launcher=FakeLauncher())
    with _refused(reason):
        asyncio.run(run_agent(config, asyncio.Event()))
    assert not config.state_dir.exists()


# -- a trusted root of another hub ---------------------------------------------------


class RepoTransport(AgentTransport):
    """A hub session that serves one TUF repository and sends one desired state."""

    def __init__(self, repo: TrustRepository, desired: pb.DesiredState) -> None:
        self.repo = repo
        self.sent: list[pb.Envelope] = []
        self.inbox: asyncio.Queue[pb.Envelope] = asyncio.Queue()
        self.inbox.put_nowait(make_envelope("hub", desired=desired))

    async def connect(self, register: pb.Envelope) -> None:
        return None

    async def send(self, env: pb.Envelope) -> None:
        self.sent.append(env)

    async def receive(self) -> pb.Envelope:
        return await self.inbox.get()

    async def _fetch(self, path: str, offset: int, max_bytes: int) -> AsyncIterator[bytes]:
        data = self.repo.read(path, offset + max_bytes)  # FileNotFoundError: the hub has none
        yield data[offset:]

    async def close(self) -> None:
        return None


def test_a_foreign_root_is_named_once_in_the_log_and_in_the_skill_error(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    hint = "not signed by the keys in the trusted root (is the trusted root this hub's root.json?)"
    ours = TrustRepository.init(tmp_path / "ours")
    theirs = TrustRepository.init(tmp_path / "theirs")
    bundle = tmp_path / "guard-1.0.0.skill"
    bundle.write_bytes(b"a bundle the agent must never get to")
    target = theirs.add_target("guard/guard-1.0.0.skill", bundle).name
    spec = pb.SkillSpec(name="guard", version="1.0.0", target_name=target)
    desired = pb.DesiredState(generation=1, skills=[spec])
    config = AgentConfig(
        hub_url="grpc://127.0.0.1:7443",
        device_id="cam-1",
        state_dir=tmp_path / "agent",
        trusted_root=tmp_path / "ours" / "metadata" / "root.json",
        insecure=True,
        reconcile_interval_s=0.2,
        metadata_refresh_s=0.1,
    )
    transports: list[RepoTransport] = []

    def connect() -> RepoTransport:
        transports.append(RepoTransport(theirs, desired))
        return transports[-1]

    agent = build_agent(config, PROFILE, launcher=FakeLauncher(), transports=connect)
    stale = ("metadata-stale", "bad-signature")
    refused = ("install-refused", "trust")

    async def scenario() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(agent.run(stop))
        try:
            await async_wait_until(
                lambda: agent.security.totals.get(stale, 0) >= 3, 20, "several refreshes"
            )
            await async_wait_until(
                lambda: agent.security.totals.get(refused, 0) >= 1, 20, "the install refused"
            )
        finally:
            stop.set()
            await task

    with caplog.at_level(logging.INFO, logger="edge_agent"):
        asyncio.run(scenario())
    state = agent.reconciler.states["guard"]
    assert state.state == "failed" and hint in state.error
    reported = [e.reported for t in transports for e in t.sent if e.HasField("reported")]
    assert any(hint in s.error for r in reported for s in r.skills)
    stale_lines = [r for r in caplog.records if "metadata-stale" in r.getMessage()]
    assert len(stale_lines) == 1 and hint in stale_lines[0].getMessage()
    assert not [r for r in caplog.records if r.exc_info], "no traceback in the log"
    assert ours.root_json() != theirs.root_json()


# -- the connect loop ------------------------------------------------------------------


class Unreachable(RepoTransport):
    """A hub that never answers."""

    async def connect(self, register: pb.Envelope) -> None:
        raise TransportError("hub at 127.0.0.1:9 did not answer in 5 s")


def test_connection_failures_are_one_line_each_without_a_traceback(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    repo = TrustRepository.init(tmp_path / "hub")
    config = _config(tmp_path, hub_url="grpc://127.0.0.1:9", insecure=True, max_backoff_s=0.05)
    attempts: list[str] = []

    def connect() -> AgentTransport:
        attempts.append("open")
        if len(attempts) % 2:  # a transport that cannot even be made (say, a TLS file gone)
            raise TransportError("cannot read TLS file ca.pem: No such file or directory")
        return Unreachable(repo, pb.DesiredState())

    agent = build_agent(config, PROFILE, launcher=FakeLauncher(), transports=connect)

    async def scenario() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(agent.run(stop))
        try:
            await async_wait_until(lambda: len(attempts) >= 8, 20, "eight attempts")
        finally:
            stop.set()
            await task

    with caplog.at_level(logging.INFO, logger="edge_agent"):
        asyncio.run(scenario())
    lines = [
        r.getMessage() for r in caplog.records if "cannot connect to the hub" in r.getMessage()
    ]
    assert len(attempts) - 1 <= len(lines) <= len(attempts)
    assert any("cannot read TLS file" in line for line in lines)
    assert any("did not answer" in line for line in lines)
    assert all("trying again in" in line for line in lines)
    assert not [r for r in caplog.records if r.exc_info], "no traceback at the info level"
    assert not [r for r in caplog.records if "failed; restarting" in r.getMessage()]
