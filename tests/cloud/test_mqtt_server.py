"""The hub's MQTT adapter, in process, against the real broker and a real SQLite store.

Devices are the agent's own MQTT transport; the attacker is plain paho.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import socket
import sqlite3
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from cloud.fetch_queue import Admission
from cloud.hub import Hub
from cloud.hubcore import HubCore, HubLimits, running
from cloud.mqtt_client import clear_retained
from cloud.mqtt_server import MqttHubServer, MqttServerSettings, start_mqtt_server
from edge_agent.errors import TransportError
from edge_agent.transport.mqtt import MqttAgentTransport
from protos import decode_envelope, encode_envelope, kind_of, make_envelope, pb
from protos.topics import MqttEndpoint
from skills.trust.director import Instruction, SignedInstruction
from skills.trust.offer import offer_message, read_offer
from tests.support import async_wait_until
from tests.support.hubs import hub_with_digits
from tests.support.services import mqtt_host_port, mqtt_url

pytestmark = pytest.mark.mqtt

FAST = MqttServerSettings(settle_s=0.1)


@pytest.fixture
def url() -> Iterator[str]:
    value = mqtt_url(f"es-test/{uuid.uuid4().hex[:12]}", session_expiry=30, keepalive=5)
    yield value
    clear_retained(value)


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[Hub]:
    opened = hub_with_digits(tmp_path / "hub")
    yield opened
    opened.close()


@contextlib.asynccontextmanager
async def serving(
    hub: Hub, url: str, settings: MqttServerSettings = FAST
) -> AsyncIterator[MqttHubServer]:
    async with running(hub.core()) as core:
        server = await start_mqtt_server(core, url, settings)
        try:
            yield server
        finally:
            await server.stop()


@contextlib.asynccontextmanager
async def device(
    url: str, device_id: str, labels: dict[str, str] | None = None
) -> AsyncIterator[MqttAgentTransport]:
    t = MqttAgentTransport(url, device_id)
    await t.connect(
        make_envelope(device_id, register=pb.Register(labels=labels or {"kind": "camera"}))
    )
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


def telemetry(device_id: str, seq: int = 1) -> pb.Envelope:
    msg = pb.Telemetry(skill="digits", version="1.0.0", inferences=5, metrics={"seq": float(seq)})
    return make_envelope(device_id, telemetry=msg)


async def eventually(check: Callable[[], bool], timeout_s: float = 5.0) -> None:
    await async_wait_until(check, timeout_s, "the condition")


def raw_client() -> mqtt.Client:
    client = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
    client.connect(*mqtt_host_port())
    client.loop_start()
    return client


def test_register_over_mqtt_answers_like_the_core(hub: Hub, url: str) -> None:
    hub.store.create_deployment("digits", "1.0.0", "cameras", now_ms=2)

    async def main() -> None:
        async with serving(hub, url), device(url, "cam-1") as cam:
            welcome = await next_of(cam, "welcome")
            desired = await next_of(cam, "signed_desired")
        direct = await hub.core().register(
            make_envelope("cam-2", register=pb.Register(labels={"kind": "camera"}))
        )
        assert [kind_of(e) for e in direct] == ["welcome", "signed_desired"]
        assert welcome.welcome == direct[0].welcome
        got = instruction_of(desired)
        assert got.device_id == "cam-1"
        assert got.payload == instruction_of(direct[1]).payload.replace(b"cam-2", b"cam-1")

    asyncio.run(main())


def instruction_of(env: pb.Envelope) -> Instruction:
    """The director's instruction a ``signed_desired`` envelope carries (not verified here)."""
    return SignedInstruction.from_bytes(env.signed_desired.instruction).instruction


def test_telemetry_is_stored_once_and_every_copy_is_acked(hub: Hub, url: str) -> None:
    async def main() -> None:
        async with serving(hub, url) as server, device(url, "cam-1") as cam:
            await next_of(cam, "welcome")
            env = telemetry("cam-1")
            for _ in range(2):  # the second copy is what an agent resends after a lost ack
                await cam.send(env)
                ack = await next_of(cam, "ack")
                assert list(ack.ack.ids) == [env.id]
            assert server.core.handled["telemetry"] == 1
            assert server.core.handled["duplicate"] == 1
        assert len(hub.store.telemetry_for("cam-1")) == 1

    asyncio.run(main())


def test_telemetry_is_acked_only_once_committed_and_one_ack_carries_a_devices_ids(
    hub: Hub, url: str, tmp_path: Path
) -> None:
    core = HubCore(hub.store, hub.trust, HubLimits(telemetry_linger_s=0.3))

    async def main() -> None:
        async with running(core), device(url, "cam-1") as cam:
            server = await start_mqtt_server(core, url, FAST)
            try:
                await next_of(cam, "welcome")
                # Another writer holds the database: the hub's commit waits for it.
                blocker = sqlite3.connect(tmp_path / "hub" / "hub.db")
                try:
                    blocker.execute("BEGIN IMMEDIATE")
                    sent = [telemetry("cam-1", seq) for seq in range(3)]
                    for env in sent:
                        await cam.send(env)
                    with pytest.raises(TimeoutError):
                        await next_of(cam, "ack", timeout_s=1.0)
                    assert hub.store.telemetry_for("cam-1") == []
                finally:
                    blocker.rollback()
                    blocker.close()
                ack = await next_of(cam, "ack")
                assert sorted(ack.ack.ids) == sorted(env.id for env in sent)
                assert len(hub.store.telemetry_for("cam-1")) == 3  # stored before the ack
                assert core.handled["telemetry"] == 3
            finally:
                await server.stop()
                await core.close()

    asyncio.run(main())


def test_bad_windows_among_good_ones_are_refused_alone(hub: Hub, url: str) -> None:
    core = HubCore(hub.store, hub.trust, HubLimits(telemetry_linger_s=0.3))
    good = [telemetry("cam-1", seq) for seq in range(4)]
    bad = [
        make_envelope("cam-1", telemetry=pb.Telemetry(skill="digits", version="1", **fields))
        for fields in (
            {"inferences": 1, "labelled": 2},
            {"inferences": -1},
            {"latency_p50_ms": float("nan")},
            {"metrics": {"no spaces": 1.0}},
        )
    ]

    async def main() -> None:
        async with running(core), device(url, "cam-1") as cam:
            server = await start_mqtt_server(core, url, FAST)
            try:
                await next_of(cam, "welcome")
                for env in [good[0], *bad[:2], *good[1:3], *bad[2:], good[3]]:
                    await cam.send(env)  # within the linger: one group commit
                acked: set[str] = set()
                while len(acked) < len(good):
                    acked.update((await next_of(cam, "ack")).ack.ids)
                assert acked == {env.id for env in good}
                await eventually(lambda: core.dropped == {"invalid": len(bad)})
            finally:
                await server.stop()
                await core.close()

    asyncio.run(main())
    assert sorted(r.metrics["seq"] for r in hub.store.telemetry_for("cam-1")) == [0, 1, 2, 3]


def test_bad_messages_are_dropped_and_counted_while_others_are_served(hub: Hub, url: str) -> None:
    topics = MqttEndpoint.parse(url).topics

    async def main() -> None:
        async with (
            serving(hub, url) as server,
            device(url, "cam-1") as cam,
            device(url, "cam-2") as cam2,
        ):
            await next_of(cam, "welcome")
            await next_of(cam2, "welcome")
            attacker = raw_client()
            try:
                send = lambda topic, payload, **kw: attacker.publish(topic, payload, qos=1, **kw)  # noqa: E731
                send(topics.up("cam-1", "telemetry"), b"\x08\x96\x01 not protobuf")
                send(
                    topics.up("cam-1", "telemetry"),
                    encode_envelope(telemetry("cam-1"))[:10] + b"x" * 300_000,
                )
                send(topics.up("ghost", "telemetry"), encode_envelope(telemetry("ghost")))
                send(topics.up("cam-2", "telemetry"), encode_envelope(telemetry("cam-1")))
                send(
                    topics.up("cam-1", "telemetry"),
                    encode_envelope(make_envelope("cam-1", heartbeat=pb.Heartbeat())),
                )
                props = Properties(PacketTypes.PUBLISH)
                props.ResponseTopic = topics.down(
                    "cam-2", "fetch"
                )  # chunks aimed at another device
                props.CorrelationData = b"c1"
                req = pb.FetchRequest(
                    device_id="cam-1", path="metadata/root.json", max_bytes=1 << 20
                )
                send(topics.up("cam-1", "fetch"), req.SerializeToString(), properties=props)
                expected = {
                    "malformed": 1,
                    "oversized": 1,
                    "unknown-device": 1,
                    "spoofed": 1,
                    "wrong-kind": 1,
                    "bad-fetch": 1,
                }
                await eventually(lambda: server.core.dropped == expected)
                assert server.core.dropped == expected
            finally:
                attacker.disconnect()
                attacker.loop_stop()
            good = telemetry("cam-2")
            await cam2.send(good)
            assert list((await next_of(cam2, "ack")).ack.ids) == [good.id]
        assert [r.device_id for r in hub.store.telemetry_for()] == ["cam-2"]
        assert hub.store.get_device("ghost") is None

    asyncio.run(main())


def test_desired_changes_reach_devices_and_stay_retained(hub: Hub, url: str) -> None:
    topic = MqttEndpoint.parse(url).topics.down("cam-1", "signed_desired")

    async def main() -> None:
        async with serving(hub, url), device(url, "cam-1") as cam:
            first = instruction_of(await next_of(cam, "signed_desired"))
            # a deployment made outside this hub process (the CLI, another hub)
            hub.store.create_deployment("digits", "1.0.0", "cameras", now_ms=3)
            pushed_env = await next_of(cam, "signed_desired")
            pushed = instruction_of(pushed_env)
            assert pushed.counter > first.counter
            assert b"1.0.0" in pushed.payload
            # beside it, the metadata an upgrade would fetch (skills.trust.offer)
            offer = read_offer(hub.trust.read)
            assert offer is not None and pushed_env.metadata == offer_message(offer)
        got: list[bytes] = []
        reader = raw_client()
        reader.on_message = lambda _c, _u, msg: got.append(bytes(msg.payload))
        reader.subscribe(topic, qos=1)
        await eventually(lambda: bool(got))
        reader.disconnect()
        reader.loop_stop()
        assert instruction_of(decode_envelope(got[0])).counter == pushed.counter

    asyncio.run(main())


def test_presence_follows_status_and_the_last_will(hub: Hub, url: str) -> None:
    online = lambda: (dev := hub.store.get_device("cam-1")) is not None and dev.online  # noqa: E731

    async def main() -> None:
        async with serving(hub, url):
            async with device(url, "cam-1") as cam:
                await next_of(cam, "welcome")
                await eventually(online)
            await eventually(lambda: not online())  # a clean close says offline itself
            cam = MqttAgentTransport(url, "cam-1")
            await cam.connect(make_envelope("cam-1", register=pb.Register()))
            await next_of(cam, "welcome")
            await eventually(online)
            sock = cam._client.socket() if cam._client else None
            assert isinstance(sock, socket.socket)
            sock.shutdown(socket.SHUT_RDWR)  # no DISCONNECT: the broker publishes the Will
            await eventually(lambda: not online())
            with pytest.raises(TransportError):
                await asyncio.wait_for(cam.receive(), 5)
            await cam.close()

    asyncio.run(main())


def test_two_hub_processes_split_the_device_traffic(hub: Hub, url: str) -> None:
    base, query = url.split("?")

    async def main() -> None:
        async with (
            serving(hub, f"{base}?{query}&client_id=hub-a-{uuid.uuid4().hex[:6]}") as a,
            serving(hub, f"{base}?{query}&client_id=hub-b-{uuid.uuid4().hex[:6]}") as b,
        ):
            async with contextlib.AsyncExitStack() as stack:
                cams = [await stack.enter_async_context(device(url, f"cam-{i}")) for i in range(6)]
                for cam in cams:
                    await next_of(cam, "welcome")
                sent: dict[int, set[str]] = {i: set() for i in range(len(cams))}
                for seq in range(4):
                    for i, cam in enumerate(cams):
                        env = telemetry(f"cam-{i}", seq)
                        sent[i].add(env.id)
                        await cam.send(env)
                for i, cam in enumerate(cams):  # a device's acks may come merged
                    acked: set[str] = set()
                    while acked != sent[i]:
                        acked.update((await next_of(cam, "ack")).ack.ids)
                        assert acked <= sent[i]
            assert a.core.handled["telemetry"] > 0
            assert b.core.handled["telemetry"] > 0
            assert a.core.handled["telemetry"] + b.core.handled["telemetry"] == 24
        assert len(hub.store.telemetry_for()) == 24

    asyncio.run(main())


def test_fetch_serves_signed_files_in_chunks(hub: Hub, url: str, tmp_path: Path) -> None:
    payload = bytes(range(256)) * 3000  # 750 KiB: twelve 64 KiB chunks
    (tmp_path / "blob.bin").write_bytes(payload)
    hub.trust.add_target("blobs/blob.bin", tmp_path / "blob.bin")
    served = next((hub.home / "trust" / "targets" / "blobs").iterdir()).name

    async def main() -> None:
        async with serving(hub, url), device(url, "cam-1") as cam:
            await next_of(cam, "welcome")
            assert await cam.fetch(f"targets/blobs/{served}", 1 << 20) == payload
            root = await cam.fetch("metadata/1.root.json", 1 << 20)
            assert b'"_type": "root"' in root or b'"_type":"root"' in root
            with pytest.raises(FileNotFoundError):
                await cam.fetch("targets/blobs/nothing.bin", 1 << 20)
            with pytest.raises(TransportError, match="refused"):
                await cam.fetch("targets/../hub.db", 1 << 20)

    asyncio.run(main())


def test_a_fetch_beyond_the_hubs_limit_is_told_busy_and_completes_when_a_slot_frees(
    hub: Hub, url: str
) -> None:
    async def main() -> None:
        settings = dataclasses.replace(FAST, max_fetches=1, max_queued_fetches=0)
        async with serving(hub, url, settings) as server, device(url, "cam-1") as cam:
            await next_of(cam, "welcome")
            slots = server.fetches.queue
            assert slots.offer("cam-2", None) is Admission.START  # the slot: another's fetch
            fetch = asyncio.create_task(cam.fetch("metadata/1.root.json", 1 << 20))
            await eventually(lambda: server.core.dropped["fetch-busy"] >= 2)
            assert not fetch.done()  # told "busy" and asking again, not failed
            assert slots.release() is None
            root = await asyncio.wait_for(fetch, 10)
            assert b"root" in root

    asyncio.run(main())
