"""Attacks on the MQTT side, against a Mosquitto started with the generated config and ACL.

The hub is the real MQTT adapter in process (its ``hub`` certificate), devices are
the agent's own transport with certificates from the hub's CA, and the attacker
is plain paho: without a certificate, with one from another CA, with a revoked
one, or with a device's own valid certificate used against other devices.
Each attack is refused by the broker (a failed TLS handshake, or an MQTT 5
"Not authorized" PUBACK), reaches neither the hub nor another device, and the
hub counts nothing from it.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.reasoncodes import ReasonCode

from cloud.enrolment import Enroller
from cloud.hub import Hub
from cloud.hubcore import HubCore, running
from cloud.mqtt_server import MqttHubServer, MqttServerSettings, start_mqtt_server
from cloud.pki import CertificateAuthority, IssuedCert
from edge_agent.transport.mqtt import MqttAgentTransport
from protos import encode_envelope, kind_of, make_envelope, pb
from protos.topics import Topics
from tests.support import async_wait_until, wait_until
from tests.support.broker import TlsBroker, tls_broker
from tests.support.hubs import hub_with_digits

pytestmark = pytest.mark.mqtt

FAST = MqttServerSettings(settle_s=0.1)
REFUSED = "Not authorized"


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[Hub]:
    opened = hub_with_digits(tmp_path / "hub", deployed=True)
    yield opened
    opened.close()


@pytest.fixture
def broker(hub: Hub, tmp_path: Path) -> Iterator[TlsBroker]:
    with tls_broker(hub.home, tmp_path / "broker-work") as running_broker:
        yield running_broker


@contextlib.asynccontextmanager
async def serving(hub: Hub, broker: TlsBroker) -> AsyncIterator[MqttHubServer]:
    async with running(hub.core()) as core:
        server = await start_mqtt_server(core, broker.hub_url(), FAST)
        try:
            yield server
        finally:
            await server.stop()


@contextlib.asynccontextmanager
async def device(broker: TlsBroker, device_id: str) -> AsyncIterator[MqttAgentTransport]:
    cert = broker.device_cert(device_id)
    t = MqttAgentTransport(broker.url(None), device_id, ca=broker.ca, cert=cert.cert, key=cert.key)
    await t.connect(make_envelope(device_id, register=pb.Register(labels={"kind": "camera"})))
    try:
        yield t
    finally:
        await t.close()


async def next_of(t: MqttAgentTransport, kind: str, timeout_s: float = 5.0) -> pb.Envelope:
    async with asyncio.timeout(timeout_s):
        while True:
            env = await t.receive()
            if kind_of(env) == kind:
                return env


async def until_ack(t: MqttAgentTransport, env_id: str) -> list[pb.Envelope]:
    """Everything ``t`` receives up to the hub's ack of ``env_id``."""
    got: list[pb.Envelope] = []
    async with asyncio.timeout(5):
        while not (got and kind_of(got[-1]) == "ack" and env_id in got[-1].ack.ids):
            got.append(await t.receive())
    return got


def telemetry(device_id: str) -> pb.Envelope:
    msg = pb.Telemetry(skill="digits", version="1.0.0", inferences=1_000_000)
    return make_envelope(device_id, telemetry=msg)


def context(ca: Path, cert: IssuedCert | None) -> ssl.SSLContext:
    ctx = ssl.create_default_context(cafile=ca)
    if cert is not None:
        ctx.load_cert_chain(cert.cert, cert.key)
    return ctx


def try_connect(port: int, ctx: ssl.SSLContext | None, username: str | None = None) -> str:
    """'connected', or how the broker refused this client (a deadline, no fixed sleep)."""
    client = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
    if ctx is not None:
        client.tls_set_context(ctx)
    if username is not None:
        client.username_pw_set(username, "guess")
    result: list[str] = []
    client.on_connect = lambda _c, _u, _f, rc, _p: result.append(
        "connected" if not rc.is_failure else f"refused: {rc}"
    )
    try:
        client.connect("127.0.0.1", port, 5)
        deadline = time.monotonic() + 5
        while not result and time.monotonic() < deadline:
            rc = client.loop(0.05)
            if rc != mqtt.MQTT_ERR_SUCCESS:
                result.append(f"dropped: {mqtt.error_string(rc)}")
    except (OSError, ssl.SSLError) as exc:
        result.append(f"handshake failed: {type(exc).__name__}")
    finally:
        client.disconnect()
    return result[0] if result else "no answer"


class RawClient:
    """Plain paho with a device's (or anyone's) certificate: what an attacker controls."""

    def __init__(self, broker: TlsBroker, cert: IssuedCert, client_id: str) -> None:
        self.lock = threading.Lock()
        self.acks: dict[int, str] = {}
        self.got: list[str] = []
        self.subacks: list[list[str]] = []
        self.client = mqtt.Client(
            CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5
        )
        self.client.tls_set_context(context(broker.ca, cert))
        self.client.on_publish = self._on_publish
        self.client.on_message = self._on_message
        self.client.on_subscribe = self._on_subscribe
        self.client.connect("127.0.0.1", broker.port, 10)
        self.client.loop_start()

    def _on_message(self, _c: object, _u: object, msg: mqtt.MQTTMessage) -> None:
        with self.lock:
            self.got.append(msg.topic)

    def _on_subscribe(
        self, _c: object, _u: object, _mid: int, codes: list[ReasonCode], _p: object
    ) -> None:
        with self.lock:
            self.subacks.append([str(c) for c in codes])

    def _on_publish(self, _c: object, _u: object, mid: int, rc: ReasonCode, _p: object) -> None:
        with self.lock:
            self.acks[mid] = str(rc)

    def publish_all(self, topics: list[str], payload: bytes, *, retain: bool) -> list[str]:
        """Publish on each topic at QoS 1 and return the broker's PUBACK reason codes."""
        mids = [self.client.publish(t, payload, qos=1, retain=retain).mid for t in topics]
        wait_until(lambda: all(m in self.acks for m in mids), 5, "PUBACKs", 0.02)
        with self.lock:
            return [self.acks[m] for m in mids]

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def foreign_cert(work: Path, common_name: str) -> tuple[IssuedCert, Path]:
    """A certificate naming ``common_name`` from a CA the broker does not trust."""
    ca = CertificateAuthority.open_or_create(work / "evil-ca", name="Evil CA")
    return ca.issue(common_name, work / "evil", common_name), ca.cert_path


def enrolled_cert(hub: Hub, work: Path, device_id: str) -> IssuedCert:
    """Enrol ``device_id`` as a real device does: a claim, its own key and a CSR."""
    key = ec.generate_private_key(ec.SECP256R1())
    csr = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, device_id)]))
        .sign(key, hashes.SHA256())
    )
    enroller = Enroller(hub.home)
    done = enroller.enroll(
        enroller.create_claim({"kind": "camera"}), csr.public_bytes(serialization.Encoding.PEM)
    )
    work.mkdir(parents=True, exist_ok=True)
    issued = IssuedCert(work / f"{device_id}.crt", work / f"{device_id}.key")
    issued.cert.write_bytes(done.certificate_pem)
    issued.key.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return issued


# -- who may connect ----------------------------------------------------------------------


def test_a_client_without_a_certificate_is_refused(broker: TlsBroker) -> None:
    assert try_connect(broker.port, context(broker.ca, None)).startswith(
        ("handshake failed", "dropped")
    )
    # a user name and password are no substitute, and plain MQTT gets no session either
    assert try_connect(broker.port, context(broker.ca, None), "hub") != "connected"
    assert try_connect(broker.port, None, "cam-a") != "connected"
    assert try_connect(broker.port, context(broker.ca, broker.device_cert("cam-a"))) == "connected"


def test_a_certificate_from_another_ca_is_refused(broker: TlsBroker, tmp_path: Path) -> None:
    # even one that names the hub itself
    evil, _ = foreign_cert(tmp_path, "hub")
    assert try_connect(broker.port, context(broker.ca, evil)).startswith(
        ("handshake failed", "dropped")
    )


def test_a_revoked_certificate_is_refused_after_the_broker_reloads(
    hub: Hub, broker: TlsBroker, tmp_path: Path
) -> None:
    cert = enrolled_cert(hub, tmp_path / "enrolled", "cam-r")
    other = enrolled_cert(hub, tmp_path / "enrolled", "cam-s")
    assert try_connect(broker.port, context(broker.ca, cert)) == "connected"
    Enroller(hub.home).revoke("cam-r")
    broker.reload()
    wait_until(
        lambda: try_connect(broker.port, context(broker.ca, cert)) != "connected",
        10,
        "the broker to refuse the revoked certificate",
    )
    assert try_connect(broker.port, context(broker.ca, other)) == "connected"
    broker.restart()  # and after a restart: the list is read from the hub's home
    assert try_connect(broker.port, context(broker.ca, cert)) != "connected"


# -- what a device with a valid certificate may do ------------------------------------------


def test_the_hub_and_a_device_work_end_to_end(hub: Hub, broker: TlsBroker) -> None:
    async def main() -> None:
        async with serving(hub, broker) as server, device(broker, "cam-a") as cam:
            welcome = await next_of(cam, "welcome")
            env = telemetry("cam-a")
            await cam.send(env)
            assert list((await next_of(cam, "ack")).ack.ids) == [env.id]
            assert server.core.handled["telemetry"] == 1
            assert server.core.dropped == {}
        direct = await HubCore(hub.store, hub.trust).register(
            make_envelope("cam-z", register=pb.Register(labels={"kind": "camera"}))
        )
        assert welcome.welcome.ListFields()[0][0].name == direct[0].welcome.ListFields()[0][0].name
        assert hub.store.get_device("cam-a") is not None

    asyncio.run(main())


@pytest.mark.parametrize("retain", [False, True])
def test_a_device_cannot_publish_for_another_or_as_the_hub(
    hub: Hub, broker: TlsBroker, retain: bool
) -> None:
    t = Topics(broker.prefix)
    forged = [
        t.up("cam-b", "telemetry"),  # as device B
        t.up("cam-b", "register"),  # re-register B with other labels
        t.status("cam-b"),  # mark B offline
        t.up("ghost", "register"),  # a new ghost device
        t.down("cam-a", "desired"),  # its own down/ topics: only the hub writes down/
        t.down("cam-b", "desired"),  # any down/ topic
        f"{broker.prefix}/grp/kind=camera/down/desired",  # a group message
        f"{broker.prefix}/dev/cam-b/up/telemetry/extra",
        "elsewhere/dev/cam-b/up/telemetry",
    ]

    async def main() -> None:
        async with (
            serving(hub, broker) as server,
            device(broker, "cam-a") as cam_a,
            device(broker, "cam-b") as cam_b,
        ):
            for cam in (cam_a, cam_b):
                await next_of(cam, "welcome")
            group_reader = RawClient(broker, broker.device_cert("cam-b"), "b-group")
            group_reader.client.subscribe(f"{broker.prefix}/grp/#", qos=1)
            await async_wait_until(lambda: bool(group_reader.subacks), 5, "SUBACK")
            attacker = RawClient(broker, broker.device_cert("cam-a"), "a-evil")
            try:
                forged_env = telemetry("cam-b")
                payload = encode_envelope(forged_env)
                codes = await asyncio.to_thread(
                    attacker.publish_all, forged, payload, retain=retain
                )
                assert codes == [REFUSED] * len(forged)
                # A's own up/ topic works, and the hub has seen nothing else
                env = telemetry("cam-a")
                await cam_a.send(env)
                await until_ack(cam_a, env.id)
                probe = telemetry("cam-b")
                await cam_b.send(probe)
                seen_by_b = await until_ack(cam_b, probe.id)
                assert forged_env.id not in {e.id for e in seen_by_b}
                assert server.core.handled["telemetry"] == 2
                assert server.core.dropped == {}
                assert group_reader.got == []
            finally:
                attacker.close()
                group_reader.close()
        assert sorted(r.device_id for r in hub.store.telemetry_for()) == ["cam-a", "cam-b"]
        assert hub.store.get_device("ghost") is None

    asyncio.run(main())


def test_a_device_cannot_read_another_devices_topics(hub: Hub, broker: TlsBroker) -> None:
    async def main() -> None:
        async with serving(hub, broker) as server, device(broker, "cam-b") as cam_b:
            await next_of(cam_b, "welcome")
            # B's desired state is retained on its down/desired topic
            await async_wait_until(lambda: "cam-b" in server.published, 5, "B's desired")
            spy = RawClient(broker, broker.device_cert("cam-a"), "a-spy")
            try:
                spy.client.subscribe(
                    [(f"{broker.prefix}/dev/cam-b/down/#", 1), ("#", 1), ("$share/x/#", 1)]
                )
                await async_wait_until(lambda: bool(spy.subacks), 5, "SUBACK")
                probe = telemetry("cam-b")
                await cam_b.send(probe)  # the hub answers B while A listens
                await until_ack(cam_b, probe.id)
                async with device(broker, "cam-a") as cam_a:  # a sentinel A may read
                    await next_of(cam_a, "welcome")
                    await async_wait_until(
                        lambda: any(x.endswith("/welcome") for x in spy.got), 5, "A's welcome"
                    )
                with spy.lock:
                    got = list(spy.got)
                assert got and all(x.startswith(f"{broker.prefix}/dev/cam-a/") for x in got)
            finally:
                spy.close()

    asyncio.run(main())
