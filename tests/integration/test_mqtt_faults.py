"""MQTT faults end to end: a killed agent, a change made while it is away, garbage on the broker.

Both tests run on the cluster's own TLS broker with the generated ACL, as a real
fleet does; neither needs the plain system broker. Over TLS an anonymous client
gets no session at all, so "garbage on the broker" comes from what can still
connect: a compromised device (its own enrolled certificate and key) and a
certificate from the hub's CA for a device the hub has no record of. The broker
refuses everything they try outside their own ``up/`` topics, and the hub drops
what reaches it, each with a counted reason.
"""

from __future__ import annotations

import signal
import ssl
import threading
import time
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.properties import Properties

from cloud.hubcore import HEARD_LINGER_S
from protos import decode_envelope, encode_envelope, kind_of, make_envelope, pb
from protos.envelope import now_ms
from protos.topics import Topics
from skills.trust.director import DirectorVerifier
from tests.integration.conftest import Cluster
from tests.support import wait_until
from tests.support.broker import TlsBroker

CAMERAS = ["kind=camera", "site=plant-3"]
KEEPALIVE_S = 5  # what the cluster's MQTT URL asks for
REFUSED = "Not authorized"

mqtt_only = pytest.mark.parametrize("cluster", ["mqtt"], indirect=True)


class Client:
    """Plain paho over TLS with a certificate the hub's CA issued, outside any agent."""

    def __init__(self, broker: TlsBroker, cert: Path, key: Path, client_id: str) -> None:
        self.lock = threading.Lock()
        self.acks: dict[int, str] = {}
        self.got: list[bytes] = []
        connected = threading.Event()
        ctx = ssl.create_default_context(cafile=broker.ca)
        ctx.load_cert_chain(cert, key)
        self.client = mqtt.Client(
            CallbackAPIVersion.VERSION2, client_id=client_id, protocol=mqtt.MQTTv5
        )
        self.client.tls_set_context(ctx)
        self.client.on_connect = lambda *_: connected.set()
        self.client.on_publish = self._on_publish
        self.client.on_message = self._on_message
        self.client.connect("127.0.0.1", broker.port, 10)
        self.client.loop_start()
        wait_until(connected.is_set, 10, f"{client_id} to connect", 0.02)

    def _on_publish(self, _c: object, _u: object, mid: int, rc: object, _p: Properties) -> None:
        with self.lock:
            self.acks[mid] = str(rc)

    def _on_message(self, _c: object, _u: object, msg: mqtt.MQTTMessage) -> None:
        with self.lock:
            self.got.append(bytes(msg.payload))

    def publish_all(self, messages: list[tuple[str, bytes]]) -> list[str]:
        """Publish each (topic, payload) at QoS 1; the broker's PUBACK reason for each."""
        mids = [self.client.publish(topic, data, qos=1).mid for topic, data in messages]
        wait_until(lambda: all(m in self.acks for m in mids), 30, "PUBACKs", 0.02)
        with self.lock:
            return [self.acks[m] for m in mids]

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def _online(cluster: Cluster, device_id: str) -> bool:
    dev = cluster.hub.store.get_device(device_id)
    return dev is not None and dev.online


def _broker(cluster: Cluster) -> TlsBroker:
    assert cluster.broker is not None  # the mqtt variant runs its own broker
    return cluster.broker


def _identity(cluster: Cluster, device_id: str) -> Path:
    return cluster.state(device_id) / "identity"


def _retained_generation(cluster: Cluster, device_id: str) -> int:
    """The generation of the signed desired state retained for the device, as it reads it.

    Read with the device's own certificate (the ACL lets it read its ``down/``
    topics) and checked with the director key it enrolled with; -1 if none is retained.
    """
    ids = _identity(cluster, device_id)
    broker = _broker(cluster)
    reader = Client(broker, ids / "device.crt", ids / "device.key", f"{device_id}-probe")
    try:
        reader.client.subscribe(Topics(broker.prefix).down(device_id, "desired"), qos=1)
        try:
            wait_until(lambda: bool(reader.got), 3, f"the retained desired state of {device_id}")
        except TimeoutError:
            return -1
    finally:
        reader.close()
    env = decode_envelope(reader.got[-1])
    assert kind_of(env) == "signed_desired"  # a secure hub never sends a plain one
    verifier = DirectorVerifier([(ids / "director.pub").read_bytes()])
    inst = verifier.verify(
        env.signed_desired.instruction, device_id=device_id, last_counter=-1, now_ms=now_ms()
    )
    return pb.DesiredState.FromString(inst.payload).generation


@mqtt_only
def test_killed_agent_goes_offline_and_applies_what_changed_while_away(cluster: Cluster) -> None:
    cluster.start_agent("cam-1", CAMERAS)
    cluster.deploy("1.0.0")
    cluster.wait_state("cam-1", "1.0.0", "running")
    wait_until(lambda: _online(cluster, "cam-1"), 10, "cam-1 online")

    killed = time.monotonic()
    cluster.fleet.stop("cam-1", signal.SIGKILL)
    # The broker sends the Will within 1.5 keepalives; the hub writes it with its next
    # presence batch.
    limit_s = KEEPALIVE_S * 1.5 + HEARD_LINGER_S
    wait_until(
        lambda: not _online(cluster, "cam-1"), limit_s, "the Last Will to mark cam-1 offline"
    )
    assert time.monotonic() - killed <= limit_s

    cluster.deploy("2.0.0")
    wanted = cluster.hub.store.desired_for("cam-1").generation
    wait_until(
        lambda: _retained_generation(cluster, "cam-1") == wanted,
        10,
        "the retained desired state",
    )
    cluster.start_agent("cam-1", CAMERAS)
    cluster.wait_state("cam-1", "2.0.0", "running")
    assert cluster.active_version("cam-1") == "2.0.0"
    wait_until(lambda: _online(cluster, "cam-1"), 10, "cam-1 online again")


def _heartbeat(device_id: str) -> bytes:
    return encode_envelope(make_envelope(device_id, heartbeat=pb.Heartbeat(uptime_s=1)))


@mqtt_only
def test_garbage_on_the_broker_does_not_stop_the_hub(cluster: Cluster) -> None:
    cluster.start_agent("cam-1", CAMERAS)
    cluster.deploy("1.0.0")
    cluster.wait_state("cam-1", "1.0.0", "running")

    broker = _broker(cluster)
    topics = Topics(broker.prefix)
    ids = _identity(cluster, "cam-1")
    # cam-1's key and certificate in an attacker's hands, beside the running agent
    evil = Client(broker, ids / "device.crt", ids / "device.key", "cam-1-evil")
    ghost_cert = broker.device_cert("ghost-0")  # the CA's, but never enrolled
    ghost = Client(broker, ghost_cert.cert, ghost_cert.key, "ghost-0")
    spoofed = encode_envelope(make_envelope("cam-2", reported=pb.ReportedState(generation=99)))
    own: list[tuple[str, bytes]] = []
    foreign: list[tuple[str, bytes]] = []
    for i in range(100):
        own += [
            (topics.up("cam-1", "telemetry"), b"\x00garbage" * i),
            (topics.up("cam-1", "reported"), spoofed),  # in cam-2's name
            (topics.up("cam-1", "telemetry"), b"y" * 300_000),
            (topics.status("cam-1"), b"maybe"),
        ]
        foreign += [
            (topics.up(f"ghost-{i}", "heartbeat"), _heartbeat(f"ghost-{i}")),
            (topics.up("cam-2", "reported"), spoofed),
            (topics.down("cam-1", "desired"), b"\x00forged"),
        ]
    try:
        assert set(evil.publish_all(own)) == {"Success"}
        assert evil.publish_all(foreign) == [REFUSED] * len(foreign)
        beats = [(topics.up("ghost-0", "heartbeat"), _heartbeat("ghost-0"))] * 100
        assert ghost.publish_all(beats) == ["Success"] * 100
    finally:
        evil.close()
        ghost.close()

    cluster.deploy("2.0.0")
    cluster.wait_state("cam-1", "2.0.0", "running")
    assert cluster.fleet.procs["hub"].poll() is None
    hub_log = (cluster.work / "logs" / "hub.log").read_text()
    for reason in ("malformed", "unknown-device", "spoofed", "oversized"):
        # The first drop of each reason is logged; the next line would be the 1000th.
        assert hub_log.count(f"({reason}; 1 so far)") == 1, reason
        assert f"({reason}; 2 so far)" not in hub_log
    assert cluster.hub.store.get_device("cam-2") is None
    assert cluster.hub.store.get_device("ghost-0") is None
    reported = cluster.hub.store.reported_for("cam-1")
    assert reported is not None
    assert reported.generation == cluster.hub.store.desired_for("cam-1").generation != 99
