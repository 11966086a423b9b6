"""Mutual TLS on gRPC: real certificates, a real loopback server, and one hub + agent end to end.

With mTLS on, a connection may act only as the device its client certificate
names; everything else is refused before the hub stores anything.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from cloud.grpc_server import ServerTls, start_grpc_server
from cloud.hub import Hub
from cloud.hub_config import TlsFiles
from cloud.hubcore import HubCore, running
from cloud.pki import CertificateAuthority, DeviceCredentials, issue_device_credentials
from cloud.service import FleetService
from cloud.store import Store, open_store
from edge_agent.errors import TransportError
from edge_agent.transport import AgentTransport, open_transport
from protos import edgeskill_pb2_grpc as pb_grpc
from protos import kind_of, make_envelope, pb
from protos.envelope import now_ms
from skills.trust import TrustRepository
from tests.integration.conftest import Bundles
from tests.support import Fleet, agent_args, free_port, wait_for_port, wait_until

PAYLOAD = os.urandom(300_000)


@dataclass
class TlsHub:
    """An in-process mTLS hub on loopback and the certificates made for it."""

    store: Store
    core: HubCore
    port: int
    creds: DeviceCredentials  # the CA, the hub's server cert and cam-1's client cert
    target_path: str
    certs: Path

    def url(self, scheme: str = "grpcs") -> str:
        return f"{scheme}://127.0.0.1:{self.port}"


@asynccontextmanager
async def tls_hub(tmp_path: Path) -> AsyncIterator[TlsHub]:
    store = open_store(f"sqlite:///{tmp_path / 'hub.db'}")
    trust = TrustRepository.init(tmp_path / "trust")
    blob = tmp_path / "blob.skill"
    blob.write_bytes(PAYLOAD)
    ref = trust.add_target("demo/blob.skill", blob)
    creds = issue_device_credentials(tmp_path / "home", "cam-1", tmp_path / "certs")
    tls = ServerTls.from_files(creds.server.cert, creds.server.key, creds.ca)
    async with running(HubCore(store, trust)) as core:
        server, port = await start_grpc_server(core, "127.0.0.1:0", tls)
        try:
            yield TlsHub(store, core, port, creds, ref.path, tmp_path / "certs")
        finally:
            await server.stop(None)
            store.close()


async def _registers(transport: AgentTransport, device_id: str) -> list[str]:
    await transport.connect(make_envelope(device_id, register=pb.Register(labels={"k": "v"})))
    return [kind_of(await asyncio.wait_for(transport.receive(), 5)) for _ in range(2)]


async def _refused(transport: AgentTransport, device_id: str) -> str:
    """Connect and read; the hub must refuse somewhere on the way. Returns the error text."""
    transport._connect_timeout_s = 1.0  # type: ignore[attr-defined]
    async with transport:
        with pytest.raises(TransportError) as info:
            await _registers(transport, device_id)
    return str(info.value)


def test_a_device_with_its_certificate_registers_and_fetches(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with tls_hub(tmp_path) as hub:
            c = hub.creds
            t = open_transport(hub.url(), "cam-1", ca=c.ca, cert=c.client.cert, key=c.client.key)
            assert t.url.startswith("grpcs://")
            async with t:
                assert await _registers(t, "cam-1") == ["welcome", "desired"]
                assert await t.fetch(hub.target_path, 10**6) == PAYLOAD
            device = hub.store.get_device("cam-1")
            assert device is not None and device.labels == {"k": "v"}

    asyncio.run(scenario())


def test_no_client_certificate_is_refused(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with tls_hub(tmp_path) as hub:
            await _refused(open_transport(hub.url(), "cam-1", ca=hub.creds.ca), "cam-1")
            assert hub.store.get_device("cam-1") is None

    asyncio.run(scenario())


def test_a_certificate_from_another_ca_is_refused(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with tls_hub(tmp_path) as hub:
            rogue = CertificateAuthority.open_or_create(tmp_path / "rogue", "Rogue CA")
            leaf = rogue.issue("cam-1", tmp_path / "rogue-out", "cam-1")
            t = open_transport(hub.url(), "cam-1", ca=hub.creds.ca, cert=leaf.cert, key=leaf.key)
            await _refused(t, "cam-1")
            assert hub.store.get_device("cam-1") is None

    asyncio.run(scenario())


def test_a_certificate_for_another_device_cannot_act_as_this_one(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with tls_hub(tmp_path) as hub:
            cam2 = issue_device_credentials(tmp_path / "home", "cam-2", hub.certs).client
            t = open_transport(hub.url(), "cam-1", ca=hub.creds.ca, cert=cam2.cert, key=cam2.key)
            assert "PERMISSION_DENIED" in await _refused(t, "cam-1")
            assert hub.store.get_device("cam-1") is None
            assert hub.core.dropped["identity-mismatch"] == 1
            # Fetches are bound to the certificate too.
            t = open_transport(hub.url(), "cam-1", ca=hub.creds.ca, cert=cam2.cert, key=cam2.key)
            async with t:
                assert await _registers(t, "cam-2") == ["welcome", "desired"]
                with pytest.raises(TransportError, match="PERMISSION_DENIED"):
                    await t.fetch(hub.target_path, 10**6)
            assert hub.core.dropped["identity-mismatch"] == 2  # refused once, not retried

    asyncio.run(scenario())


def test_infer_tail_names_the_device_by_its_certificate_not_the_request(tmp_path: Path) -> None:
    async def ping(hub: TlsHub, cert: DeviceCredentials, claimed: str) -> pb.InferResponse:
        leaf = cert.client
        creds = grpc.ssl_channel_credentials(
            hub.creds.ca.read_bytes(), leaf.key.read_bytes(), leaf.cert.read_bytes()
        )
        async with grpc.aio.secure_channel(f"127.0.0.1:{hub.port}", creds) as channel:
            ask = pb.InferRequest(
                device_id=claimed, model="net", split="ping", skill="splitter",
                version="1.0.0", request_id="p1", deadline_ms=2000,
            )  # fmt: skip
            return await pb_grpc.HubStub(channel).InferTail(ask, timeout=5)

    async def scenario() -> None:
        async with tls_hub(tmp_path) as hub:
            c = hub.creds
            t = open_transport(hub.url(), "cam-1", ca=c.ca, cert=c.client.cert, key=c.client.key)
            async with t:
                await _registers(t, "cam-1")
                cam3 = issue_device_credentials(tmp_path / "home", "cam-3", hub.certs)
                # cam-3 never registered: naming the registered cam-1 in the field changes nothing.
                with pytest.raises(grpc.aio.AioRpcError, match="register first") as refused:
                    await ping(hub, cam3, "cam-1")
                assert refused.value.code() == grpc.StatusCode.PERMISSION_DENIED
                # cam-1's own certificate is served whatever the field says.
                answer = await ping(hub, c, "someone-else")
                assert answer.request_id == "p1" and not answer.outputs
                assert hub.core.tails.counts["ping"] == 1

    asyncio.run(scenario())


def test_plain_grpc_against_a_tls_hub_fails(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with tls_hub(tmp_path) as hub:
            await _refused(open_transport(hub.url("grpc"), "cam-1"), "cam-1")
            assert hub.store.get_device("cam-1") is None

    asyncio.run(scenario())


def test_missing_or_mismatched_tls_files_fail_before_connecting(tmp_path: Path) -> None:
    missing = tmp_path / "nope.pem"
    with pytest.raises(TransportError, match="cannot read TLS file"):
        open_transport("grpcs://127.0.0.1:9", "cam-1", ca=missing)
    with pytest.raises(TransportError, match="both --cert and --key"):
        open_transport("grpcs://127.0.0.1:9", "cam-1", cert=missing)
    with pytest.raises(TransportError, match="apply to grpcs:// and mqtts:// hubs only"):
        open_transport("grpc://127.0.0.1:9", "cam-1", ca=missing)


# -- end to end: a hub process with TLS and an agent process over grpcs:// ----


@dataclass
class TlsCluster:
    hub: Hub
    work: Path
    fleet: Fleet
    port: int


@pytest.fixture
def tls_cluster(tmp_path: Path, bundles: Bundles) -> Iterator[TlsCluster]:
    home = tmp_path / "hub"
    port = free_port()
    tls = TlsFiles(Path("pki/server.crt"), Path("pki/server.key"), Path("pki/ca.crt"))
    hub = Hub.init(home, grpc_bind=f"127.0.0.1:{port}", tls=tls)
    FleetService(hub).skills.publish(bundles.v1)
    hub.store.create_group("cameras", "kind=camera")
    fleet = Fleet(tmp_path / "logs")
    fleet.start(
        "certs",
        ["hub", "issue-cert", "cam-1", "--home", str(home), "--out", str(tmp_path / "certs")],
    )
    fleet.procs["certs"].wait(60)
    fleet.start("hub", ["hub", "serve", "--home", str(home)])
    try:
        wait_for_port(port)
        yield TlsCluster(hub, tmp_path, fleet, port)
    finally:
        fleet.stop_all()
        hub.close()


def test_an_agent_over_grpcs_installs_a_skill(tls_cluster: TlsCluster) -> None:
    c = tls_cluster
    certs = c.work / "certs"
    root = c.work / "hub" / "trust" / "metadata" / "root.json"
    args = agent_args(
        f"grpcs://127.0.0.1:{c.port}", "cam-1", ["kind=camera"], c.work / "agent", root, None
    )
    args += ["--ca", str(certs / "ca.crt"), "--cert", str(certs / "cam-1.crt")]
    # Certificates issued by hand, not by enrolment: the director key is given explicitly.
    args += ["--director-key", str(c.work / "hub" / "director" / "director.pub")]
    c.fleet.start("cam-1", [*args, "--key", str(certs / "cam-1.key")])
    c.hub.store.create_deployment("digits", "1.0.0", "cameras", now_ms=now_ms())

    def running() -> bool:
        rep = c.hub.store.reported_for("cam-1")
        return rep is not None and any(
            (s.name, s.version, s.state) == ("digits", "1.0.0", "running") for s in rep.skills
        )

    try:
        wait_until(running, 60, "cam-1 to run digits 1.0.0 over grpcs://")
    except TimeoutError as exc:
        log = c.work / "logs" / "cam-1.log"
        raise AssertionError(f"{exc}; {log.read_text()[-3000:] if log.exists() else ''}") from exc
