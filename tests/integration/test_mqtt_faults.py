"""MQTT faults end to end: a killed agent, a change made while it is away, garbage on the broker."""

from __future__ import annotations

import contextlib
import signal
import time

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from protos import decode_envelope, encode_envelope, make_envelope, pb
from protos.topics import MqttEndpoint
from tests.support import wait_until

CAMERAS = ["kind=camera", "site=plant-3"]
KEEPALIVE_S = 5  # what the cluster's MQTT URL asks for

mqtt_only = pytest.mark.parametrize("cluster", ["mqtt"], indirect=True)


def _online(cluster, device_id: str) -> bool:
    dev = cluster.hub.store.get_device(device_id)
    return dev is not None and dev.online


def _retained_generation(url: str, device_id: str) -> int:
    got: list[bytes] = []
    client = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
    client.on_message = lambda _c, _u, msg: got.append(bytes(msg.payload))
    client.connect("127.0.0.1", 1883)
    client.loop_start()
    client.subscribe(MqttEndpoint.parse(url).topics.down(device_id, "desired"), qos=1)
    with contextlib.suppress(TimeoutError):  # nothing retained: -1
        wait_until(lambda: bool(got), 3, f"the retained desired state of {device_id}")
    client.disconnect()
    client.loop_stop()
    return decode_envelope(got[0]).desired.generation if got else -1


@mqtt_only
def test_killed_agent_goes_offline_and_applies_what_changed_while_away(cluster) -> None:
    cluster.start_agent("cam-1", CAMERAS)
    cluster.deploy("1.0.0")
    cluster.wait_state("cam-1", "1.0.0", "running")
    wait_until(lambda: _online(cluster, "cam-1"), 10, "cam-1 online")

    killed = time.monotonic()
    cluster.fleet.stop("cam-1", signal.SIGKILL)
    wait_until(
        lambda: not _online(cluster, "cam-1"),
        KEEPALIVE_S * 1.5,
        "the Last Will to mark cam-1 offline",
    )
    assert time.monotonic() - killed <= KEEPALIVE_S * 1.5

    cluster.deploy("2.0.0")
    wanted = cluster.hub.store.desired_for("cam-1").generation
    wait_until(
        lambda: _retained_generation(cluster.hub_url, "cam-1") == wanted,
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
def test_garbage_on_the_broker_does_not_stop_the_hub(cluster) -> None:
    cluster.start_agent("cam-1", CAMERAS)
    cluster.deploy("1.0.0")
    cluster.wait_state("cam-1", "1.0.0", "running")

    topics = MqttEndpoint.parse(cluster.hub_url).topics
    attacker = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
    attacker.connect("127.0.0.1", 1883)
    attacker.loop_start()
    spoofed = encode_envelope(make_envelope("cam-1", reported=pb.ReportedState(generation=99)))
    infos = []
    for i in range(100):
        infos += [
            attacker.publish(topics.up("cam-1", "telemetry"), b"\x00garbage" * i, qos=1),
            attacker.publish(topics.up(f"ghost-{i}", "heartbeat"), _heartbeat(f"ghost-{i}"), qos=1),
            attacker.publish(topics.up("cam-2", "reported"), spoofed, qos=1),
            attacker.publish(topics.up("cam-1", "telemetry"), b"y" * 300_000, qos=1),
            attacker.publish(topics.status("cam-1"), b"maybe", qos=1),
        ]
    for info in infos:
        info.wait_for_publish(10)
    attacker.disconnect()
    attacker.loop_stop()

    cluster.deploy("2.0.0")
    cluster.wait_state("cam-1", "2.0.0", "running")
    assert cluster.fleet.procs["hub"].poll() is None
    hub_log = (cluster.work / "logs" / "hub.log").read_text()
    for reason in ("malformed", "unknown-device", "spoofed", "oversized"):
        # The first drop of each reason is logged; the next line would be the 1000th.
        assert hub_log.count(f"({reason}; 1 so far)") == 1, reason
        assert f"({reason}; 2 so far)" not in hub_log
    assert cluster.hub.store.get_device("cam-2") is None
    assert cluster.hub.store.reported_for("cam-1").generation != 99
