"""Identity attacks on the hub's gRPC port: each is refused, and counted where the hub can.

A real in-process hub (SQLite store, TUF repository, the session core) serves
mutual TLS on one port and server-only TLS for enrolment on another, exactly as
``hub serve`` does. Devices enrol with the agent's own enrolment code.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc
import grpc.aio
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from cloud.enrolment import Enroller
from cloud.grpc_server import ServerTls, start_grpc_server
from cloud.hubcore import HubCore, running
from cloud.pki import CertificateAuthority, init_hub_pki
from cloud.store import Store, open_store
from edge_agent.enrolment import EnrolmentRefusedError, Identity, enroll, renew
from edge_agent.errors import TransportError
from edge_agent.transport import AgentTransport, open_transport
from protos import kind_of, make_envelope, pb
from protos.envelope import now_ms
from skills.trust import TrustRepository
from tests.cloud.test_enrolment import make_csr, tampered_csr
from tests.support import async_wait_until, free_port

PAYLOAD = os.urandom(50_000)
SERVICE = "/" + pb.DESCRIPTOR.services_by_name["Hub"].full_name


@dataclass
class IdentityHub:
    """An in-process hub serving mTLS, plus its enrolment port."""

    home: Path
    work: Path
    store: Store
    core: HubCore
    enroller: Enroller
    port: int
    enroll_port: int
    target_path: str

    @property
    def url(self) -> str:
        return f"grpcs://127.0.0.1:{self.port}"

    @property
    def enroll_url(self) -> str:
        return f"grpcs://127.0.0.1:{self.enroll_port}"

    @property
    def ca(self) -> Path:
        return self.home / "pki" / "ca.crt"

    async def enrol(self, device_id: str, labels: dict[str, str] | None = None) -> Identity:
        token = self.enroller.create_claim(labels or {"kind": "camera"})
        return await enroll(self.enroll_url, self.ca, token, device_id, self.work / device_id)

    def transport(self, identity: Identity, device_id: str) -> AgentTransport:
        t = open_transport(
            self.url, device_id, ca=identity.ca, cert=identity.cert, key=identity.key
        )
        t._connect_timeout_s = 2.0  # type: ignore[attr-defined]
        return t


@asynccontextmanager
async def identity_hub(tmp_path: Path) -> AsyncIterator[IdentityHub]:
    """The hub ``hub serve`` would run, in this process, on two free ports."""
    home = tmp_path / "hub"
    init_hub_pki(home)
    store = open_store(f"sqlite:///{tmp_path / 'hub.db'}")
    trust = TrustRepository.init(home / "trust")
    blob = tmp_path / "blob.skill"
    blob.write_bytes(PAYLOAD)
    ref = trust.add_target("demo/blob.skill", blob)
    enroller = Enroller(home, store)
    pki = home / "pki"
    tls = ServerTls.from_files(
        pki / "server.crt", pki / "server.key", pki / "ca.crt", enroller.crl_path()
    )
    enroller.crl_pem()
    enroll_port = free_port()
    async with running(HubCore(store, trust)) as core:
        server, port = await start_grpc_server(
            core, "127.0.0.1:0", tls, enroller=enroller, enroll_bind=f"127.0.0.1:{enroll_port}"
        )
        try:
            yield IdentityHub(home, tmp_path, store, core, enroller, port, enroll_port, ref.path)
        finally:
            await server.stop(None)
            store.close()


def register(device_id: str, labels: dict[str, str] | None = None) -> pb.Envelope:
    return make_envelope(device_id, register=pb.Register(labels=labels or {"kind": "camera"}))


async def registers(
    t: AgentTransport, device_id: str, labels: dict[str, str] | None = None
) -> list[str]:
    await t.connect(register(device_id, labels))
    return [kind_of(await asyncio.wait_for(t.receive(), 5)) for _ in range(2)]


async def refused(t: AgentTransport, device_id: str) -> str:
    """Connect and read as ``device_id``; the hub must refuse. Returns the error text."""
    async with t:
        with pytest.raises(TransportError) as info:
            await registers(t, device_id)
    return str(info.value)


async def raw_status(port: int, creds: grpc.ChannelCredentials, method: str, body: bytes) -> str:
    """Call one method with raw bytes; the status code's name (OK when it answered)."""
    ident = lambda b: b  # noqa: E731 - raw bytes both ways
    async with grpc.aio.secure_channel(f"127.0.0.1:{port}", creds) as channel:
        try:
            if method == "Connect":
                # Written by hand, not from an iterator: a server that refuses at once can
                # end the call while grpc still feeds an iterator, which the client then
                # reports as INTERNAL instead of the server's status.
                stream = channel.stream_stream(f"{SERVICE}/Connect", ident, ident)()
                with contextlib.suppress(grpc.aio.AioRpcError, asyncio.InvalidStateError):
                    if body:  # an empty body: nothing written, so nothing races the refusal
                        await stream.write(body)
                        await stream.done_writing()
                code = await stream.code()
                return "OK" if code == grpc.StatusCode.OK else code.name
            if method == "Fetch":
                async for _ in channel.unary_stream(f"{SERVICE}/Fetch", ident, ident)(body):
                    pass
            else:
                await channel.unary_unary(f"{SERVICE}/{method}", ident, ident)(body, timeout=5)
        except grpc.aio.AioRpcError as exc:
            return exc.code().name
    return "OK"


def client(identity: Identity) -> grpc.ChannelCredentials:
    """mTLS credentials with an enrolled device's files."""
    return grpc.ssl_channel_credentials(
        identity.ca.read_bytes(), identity.key.read_bytes(), identity.cert.read_bytes()
    )


def server_only(hub: IdentityHub) -> grpc.ChannelCredentials:
    return grpc.ssl_channel_credentials(hub.ca.read_bytes())


# -- the baseline the attacks are measured against --------------------------------------


def test_an_enrolled_device_registers_fetches_and_renews(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with identity_hub(tmp_path) as hub:
            me = await hub.enrol("cam-1", {"kind": "camera", "site": "3"})
            async with hub.transport(me, "cam-1") as t:
                assert await registers(t, "cam-1", {}) == ["welcome", "desired"]
                assert await t.fetch(hub.target_path, 10**6) == PAYLOAD
            old = me.certificate().serial_number
            await renew(hub.url, me, "cam-1")
            assert me.certificate().serial_number != old
            device = hub.store.get_device("cam-1")
            assert device is not None and device.labels == {"kind": "camera", "site": "3"}

    asyncio.run(scenario())


# -- anonymous clients ----------------------------------------------------------------


def test_an_anonymous_client_cannot_connect_fetch_infer_or_renew(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with identity_hub(tmp_path) as hub:
            fetch = pb.FetchRequest(device_id="cam-1", path=hub.target_path).SerializeToString()
            # Connect sends no message: the hub refuses a caller without a certificate when
            # the call starts, and a register written meanwhile can race that refusal in the
            # client, which then reports INTERNAL instead of the hub's status.
            calls = [("Connect", b""), ("Fetch", fetch), ("InferTail", b""), ("Renew", b"")]
            # The enrolment port serves TLS without a client certificate: all but Enroll refused.
            for method, body in calls:
                code = await raw_status(hub.enroll_port, server_only(hub), method, body)
                assert (method, code) == (method, "UNAUTHENTICATED")
            assert hub.core.dropped["no-certificate"] == 4
            # The main port does not even finish the handshake.
            for method, body in calls:
                code = await raw_status(hub.port, server_only(hub), method, body)
                assert (method, code) == (method, "UNAVAILABLE")
            assert hub.store.get_device("cam-1") is None

    asyncio.run(scenario())


# -- device A acting as device B ------------------------------------------------------


def test_device_a_cannot_register_fetch_or_send_as_device_b(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with identity_hub(tmp_path) as hub:
            a = await hub.enrol("cam-a")
            await hub.enrol("cam-b")
            assert "PERMISSION_DENIED" in await refused(hub.transport(a, "cam-b"), "cam-b")
            assert hub.core.dropped["identity-mismatch"] == 1
            fetch = pb.FetchRequest(device_id="cam-b", path=hub.target_path)
            code = await raw_status(hub.port, client(a), "Fetch", fetch.SerializeToString())
            assert code == "PERMISSION_DENIED"
            assert hub.core.dropped["identity-mismatch"] == 2
            async with hub.transport(a, "cam-a") as t:
                assert await registers(t, "cam-a") == ["welcome", "desired"]
                report = pb.ReportedState(generation=7)
                await t.send(make_envelope("cam-b", reported=report))
                await t.send(make_envelope("cam-a", heartbeat=pb.Heartbeat()))

                async def counted() -> bool:
                    return hub.core.dropped["identity-mismatch"] == 3

                await async_wait_until(counted, 5, "the forged report to be dropped")
            assert hub.store.reported_for("cam-b") is None

    asyncio.run(scenario())


def test_re_registering_with_other_labels_changes_nothing(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with identity_hub(tmp_path) as hub:
            hub.store.add_skill_version(
                "digits", "1.0.0", target_name="digits-1.0.0.skill", sha256="ab" * 32,
                size=1, manifest="{}", now_ms=now_ms(),
            )  # fmt: skip
            hub.store.create_group("cameras", "kind=camera")
            hub.store.create_deployment("digits", "1.0.0", "cameras", now_ms=now_ms())
            me = await hub.enrol("cam-1")
            before = hub.store.desired_for("cam-1")
            assert [s.name for s in before.skills] == ["digits"]
            async with hub.transport(me, "cam-1") as t:
                assert await registers(t, "cam-1", {"kind": "gateway"}) == ["welcome", "desired"]
            device = hub.store.get_device("cam-1")
            assert device is not None and device.labels == {"kind": "camera"}
            assert hub.store.desired_for("cam-1") == before

    asyncio.run(scenario())


def test_renewing_as_another_device_is_refused(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with identity_hub(tmp_path) as hub:
            a = await hub.enrol("cam-a")
            body = pb.RenewRequest(csr_pem=make_csr("cam-b")).SerializeToString()
            assert await raw_status(hub.port, client(a), "Renew", body) == "PERMISSION_DENIED"
            assert hub.core.dropped["enrolment-foreign-csr"] == 1

    asyncio.run(scenario())


# -- certificates that must not work ---------------------------------------------------


def test_a_revoked_certificate_is_refused_on_every_call(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with identity_hub(tmp_path) as hub:
            me = await hub.enrol("cam-1")
            async with hub.transport(me, "cam-1") as t:
                assert await registers(t, "cam-1") == ["welcome", "desired"]
            hub.enroller.revoke("cam-1")
            assert "PERMISSION_DENIED" in await refused(hub.transport(me, "cam-1"), "cam-1")
            fetch = pb.FetchRequest(device_id="cam-1", path=hub.target_path)
            code = await raw_status(hub.port, client(me), "Fetch", fetch.SerializeToString())
            assert code == "PERMISSION_DENIED"
            with pytest.raises(EnrolmentRefusedError, match="revoked"):
                await renew(hub.url, me, "cam-1")
            assert hub.core.dropped["revoked-certificate"] == 3

    asyncio.run(scenario())


def _expired_cert(hub: IdentityHub, device_id: str) -> tuple[Path, Path]:
    ca = CertificateAuthority.open_or_create(hub.home / "pki")
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, device_id)]))
        .issuer_name(ca.certificate.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=2))
        .not_valid_after(now - datetime.timedelta(days=1))
        .sign(ca._key, hashes.SHA256())
    )
    out = hub.work / "expired"
    out.mkdir()
    (out / "c.crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (out / "c.key").write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return out / "c.crt", out / "c.key"


def test_expired_and_wrong_ca_certificates_are_refused_by_tls(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with identity_hub(tmp_path) as hub:
            cert, key = _expired_cert(hub, "cam-1")
            t = open_transport(hub.url, "cam-1", ca=hub.ca, cert=cert, key=key)
            t._connect_timeout_s = 2.0  # type: ignore[attr-defined]
            await refused(t, "cam-1")
            rogue = CertificateAuthority.open_or_create(tmp_path / "rogue", "EdgeSkill hub CA")
            leaf = rogue.issue("cam-1", tmp_path / "rogue-out", "cam-1")
            t = open_transport(hub.url, "cam-1", ca=hub.ca, cert=leaf.cert, key=leaf.key)
            t._connect_timeout_s = 2.0  # type: ignore[attr-defined]
            await refused(t, "cam-1")
            assert hub.store.get_device("cam-1") is None

    asyncio.run(scenario())


# -- enrolment abuse --------------------------------------------------------------------


def test_a_claim_token_reused_past_its_limit_or_expired_is_refused(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with identity_hub(tmp_path) as hub:
            token = hub.enroller.create_claim({"kind": "camera"}, uses=1)
            await enroll(hub.enroll_url, hub.ca, token, "cam-1", tmp_path / "cam-1")
            with pytest.raises(EnrolmentRefusedError, match="used-up-token"):
                await enroll(hub.enroll_url, hub.ca, token, "cam-2", tmp_path / "cam-2")
            past = Enroller(hub.home, clock=lambda: datetime.datetime.now().timestamp() - 3600)
            old = past.create_claim({"kind": "camera"}, ttl_s=60)
            with pytest.raises(EnrolmentRefusedError, match="expired-token"):
                await enroll(hub.enroll_url, hub.ca, old, "cam-3", tmp_path / "cam-3")
            assert hub.core.dropped["enrolment-used-up-token"] == 1
            assert hub.core.dropped["enrolment-expired-token"] == 1
            assert hub.store.get_device("cam-2") is None
            assert hub.store.get_device("cam-3") is None

    asyncio.run(scenario())


def test_a_csr_whose_signature_does_not_match_its_key_is_refused(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with identity_hub(tmp_path) as hub:
            token = hub.enroller.create_claim({"kind": "camera"})
            body = pb.EnrollRequest(claim_token=token, csr_pem=tampered_csr("cam-1"))
            code = await raw_status(
                hub.enroll_port, server_only(hub), "Enroll", body.SerializeToString()
            )
            assert code == "PERMISSION_DENIED"
            assert hub.core.dropped["enrolment-bad-csr"] == 1
            assert hub.store.get_device("cam-1") is None

    asyncio.run(scenario())


def test_taking_over_an_enrolled_device_id_is_refused(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with identity_hub(tmp_path) as hub:
            await hub.enrol("cam-1")
            token = hub.enroller.create_claim({"kind": "gateway"})
            with pytest.raises(EnrolmentRefusedError, match="already-enrolled"):
                await enroll(hub.enroll_url, hub.ca, token, "cam-1", tmp_path / "thief")
            device = hub.store.get_device("cam-1")
            assert device is not None and device.labels == {"kind": "camera"}

    asyncio.run(scenario())
