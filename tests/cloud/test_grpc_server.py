"""The hub's two transport servers drop, count, deduplicate and acknowledge alike.

Every test here runs over gRPC (an in-process server) and over MQTT (the real
broker), against a real SQLite store. Devices are raw clients that can send
any bytes; the shared session core decides, the servers only carry bytes.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any, Protocol, cast

import grpc
import grpc.aio
import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion

from cloud.grpc_server import start_grpc_server
from cloud.hubcore import HubCore, running
from cloud.mqtt_client import clear_retained
from cloud.mqtt_server import start_mqtt_server
from cloud.store import open_store
from protos import decode_envelope, encode_envelope, kind_of, make_envelope, pb
from protos.limits import MAX_ENVELOPE_BYTES
from protos.topics import MqttEndpoint
from skills.trust import TrustRepository
from tests.fakes.failing_store import FailingStore
from tests.support import async_wait_until
from tests.support.services import mqtt_host_port, mqtt_url

TIMEOUT_S = 10.0


class RawDevice(Protocol):
    """A device that sends raw payloads and reads the hub's envelopes."""

    device_id: str

    async def send(self, payload: bytes, kind: str) -> None: ...

    async def receive(self) -> pb.Envelope: ...


class GrpcDevice:
    """One ``Connect`` stream whose requests are raw bytes."""

    def __init__(self, port: int, device_id: str) -> None:
        self.device_id = device_id
        self.channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        self._out: asyncio.Queue[bytes] = asyncio.Queue()
        connect = self.channel.stream_stream(
            "/edgeskill.v1.Hub/Connect", response_deserializer=pb.Envelope.FromString
        )
        self.call = connect(self._requests())

    async def _requests(self) -> AsyncIterator[bytes]:
        while True:
            yield await self._out.get()

    async def send(self, payload: bytes, kind: str) -> None:
        await self._out.put(payload)

    async def receive(self) -> pb.Envelope:
        env = await self.call.read()
        assert isinstance(env, pb.Envelope), "the hub ended the stream"
        return env

    async def close(self) -> None:
        self.call.cancel()
        await self.channel.close()


class MqttDevice:
    """A plain paho client publishing raw payloads on a device's ``up`` topics."""

    def __init__(self, url: str, device_id: str) -> None:
        self.device_id = device_id
        self.topics = MqttEndpoint.parse(url).topics
        self._loop = asyncio.get_running_loop()
        self._in: asyncio.Queue[bytes] = asyncio.Queue()
        self._subscribed = threading.Event()
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
        self.client.on_message = self._on_message
        self.client.on_subscribe = lambda *_: self._subscribed.set()

    def _on_message(self, _c: mqtt.Client, _u: object, msg: mqtt.MQTTMessage) -> None:
        self._loop.call_soon_threadsafe(self._in.put_nowait, bytes(msg.payload))

    async def start(self) -> None:
        self.client.connect(*mqtt_host_port())
        self.client.loop_start()
        self.client.subscribe(self.topics.device_down_filter(self.device_id), qos=1)
        assert await asyncio.to_thread(self._subscribed.wait, TIMEOUT_S)

    async def send(self, payload: bytes, kind: str) -> None:
        self.client.publish(self.topics.up(self.device_id, kind), payload, qos=1)

    async def receive(self) -> pb.Envelope:
        return decode_envelope(await self._in.get())

    async def close(self) -> None:
        self.client.disconnect()
        await asyncio.to_thread(self.client.loop_stop)


@pytest.fixture(params=["grpc", pytest.param("mqtt", marks=pytest.mark.mqtt)])
def transport(request: pytest.FixtureRequest) -> str:
    return cast(str, request.param)


@pytest.fixture
def url() -> Iterator[str]:
    value = mqtt_url(f"es-test/{uuid.uuid4().hex[:12]}", session_expiry=30)
    yield value
    clear_retained(value)


@pytest.fixture
def store(tmp_path: Path) -> FailingStore:
    return FailingStore(open_store(f"sqlite:///{tmp_path / 'hub.db'}"))


@pytest.fixture
def core(tmp_path: Path, store: FailingStore) -> HubCore:
    return HubCore(cast(Any, store), TrustRepository.init(tmp_path / "trust"))


@contextlib.asynccontextmanager
async def serving(transport: str, core: HubCore, url: str) -> AsyncIterator[RawDevice]:
    """Serve ``core`` over ``transport`` and yield device cam-1, registered."""
    async with running(core), contextlib.AsyncExitStack() as stack:
        dev: GrpcDevice | MqttDevice
        if transport == "grpc":
            server, port = await start_grpc_server(core, "127.0.0.1:0")
            stack.push_async_callback(server.stop, None)
            dev = GrpcDevice(port, "cam-1")
        else:
            mqtt_server = await start_mqtt_server(core, url)
            stack.push_async_callback(mqtt_server.stop)
            dev = MqttDevice(url, "cam-1")
            await dev.start()
        stack.push_async_callback(dev.close)
        register = make_envelope("cam-1", register=pb.Register(labels={"kind": "camera"}))
        await dev.send(encode_envelope(register), "register")
        assert kind_of(await next_of(dev, "welcome")) == "welcome"
        yield dev


async def next_of(dev: RawDevice, kind: str) -> pb.Envelope:
    async with asyncio.timeout(TIMEOUT_S):
        while True:
            env = await dev.receive()
            if kind_of(env) == kind:
                return env


def telemetry(device_id: str = "cam-1", **fields: Any) -> pb.Envelope:
    body = pb.Telemetry(skill="digits", version="1.0.0", inferences=5, **fields)
    return make_envelope(device_id, telemetry=body)


async def acked(dev: RawDevice, env: pb.Envelope) -> list[str]:
    await dev.send(encode_envelope(env), kind_of(env))
    return list((await next_of(dev, "ack")).ack.ids)


async def dropped(core: HubCore, expected: dict[str, int]) -> None:
    await async_wait_until(lambda: core.dropped == expected, TIMEOUT_S, f"drops {expected}")


def oversized() -> bytes:
    env = telemetry(metrics={f"m{i}": 1.0 for i in range(10)})
    env.telemetry.skill = "x" * (MAX_ENVELOPE_BYTES + 1)  # one field past the cap
    return env.SerializeToString()


BAD = {
    "malformed": (b"\x08\x96\x01 not protobuf", "telemetry"),
    "oversized": (oversized(), "telemetry"),
    "spoofed": (encode_envelope(telemetry("cam-2")), "telemetry"),
    "wrong-kind": (
        encode_envelope(make_envelope("cam-1", desired=pb.DesiredState(generation=3))),
        "telemetry",
    ),
    "invalid": (encode_envelope(telemetry(labelled=9)), "telemetry"),
}


@pytest.mark.parametrize("reason", sorted(BAD))
def test_a_bad_message_is_dropped_with_its_reason_and_the_device_stays_served(
    transport: str, core: HubCore, url: str, reason: str
) -> None:
    payload, kind = BAD[reason]

    async def main() -> None:
        async with serving(transport, core, url) as dev:
            await dev.send(payload, kind)
            await dropped(core, {reason: 1})
            good = telemetry()
            assert await acked(dev, good) == [good.id]
        assert core.dropped == {reason: 1}
        assert core.handled["telemetry"] == 1

    asyncio.run(main())
    assert len(core.store.telemetry_for("cam-1")) == 1


def test_a_duplicate_is_acknowledged_again_and_stored_once(
    transport: str, core: HubCore, url: str
) -> None:
    async def main() -> None:
        async with serving(transport, core, url) as dev:
            env = telemetry()
            assert await acked(dev, env) == [env.id]
            assert await acked(dev, env) == [env.id]  # what an agent resends after a lost ack
        assert (core.handled["telemetry"], core.handled["duplicate"]) == (1, 1)

    asyncio.run(main())
    assert len(core.store.telemetry_for("cam-1")) == 1


def test_a_store_error_is_counted_logged_and_not_acknowledged(
    transport: str, core: HubCore, store: FailingStore, url: str, caplog: pytest.LogCaptureFixture
) -> None:
    async def main() -> None:
        async with serving(transport, core, url) as dev:
            env = telemetry()
            store.failing.add("add_telemetry_windows")
            await dev.send(encode_envelope(env), "telemetry")
            await dropped(core, {"store-error": 1})
            store.failing.clear()
            # The agent sends it again on the same connection, and now it is stored.
            assert await acked(dev, env) == [env.id]
            later = telemetry()
            assert await acked(dev, later) == [later.id]  # no second ack was queued
        assert (core.handled["telemetry"], core.handled["duplicate"]) == (2, 0)

    with caplog.at_level(logging.WARNING, logger="cloud.hubcore"):
        asyncio.run(main())
    assert store.refused == {"add_telemetry_windows": 1}
    assert [r.getMessage() for r in caplog.records if "store-error" in r.getMessage()] == [
        "dropped a message from 'cam-1' (store-error; 1 so far): "
        "add_telemetry_windows failed (injected)"
    ]
    assert len(core.store.telemetry_for("cam-1")) == 2


def test_desired_changes_are_pushed_by_the_shared_notifier(
    transport: str, core: HubCore, url: str
) -> None:
    real = core.store
    real.add_skill_version(
        "digits",
        "1.0.0",
        target_name="digits/d.skill",
        sha256="a" * 64,
        size=1,
        manifest="",
        now_ms=1,
    )
    real.create_group("cameras", "kind=camera")

    async def main() -> None:
        async with serving(transport, core, url) as dev:
            assert (await next_of(dev, "desired")).desired.generation == 0
            polls = core.notifier.polls
            await asyncio.to_thread(real.create_deployment, "digits", "1.0.0", "cameras", now_ms=2)
            pushed = await next_of(dev, "desired")
            assert core.notifier.polls > polls
        assert pushed.desired.generation == 1
        assert [s.version for s in pushed.desired.skills] == ["1.0.0"]

    asyncio.run(main())


# -- what only one transport can do -----------------------------------------------


def test_grpc_refuses_a_stream_that_does_not_register(core: HubCore) -> None:
    async def main() -> None:
        async with running(core):
            server, port = await start_grpc_server(core, "127.0.0.1:0")
            dev = GrpcDevice(port, "cam-1")
            try:
                await dev.send(encode_envelope(telemetry()), "telemetry")
                with pytest.raises(grpc.aio.AioRpcError) as info:
                    await dev.receive()
                assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            finally:
                await dev.close()
                await server.stop(None)

    asyncio.run(main())
    assert core.dropped == {"bad-register": 1}
    assert core.store.get_device("cam-1") is None


def test_grpc_fetch_refusals_are_typed_and_counted(core: HubCore) -> None:
    fetch_call = "/edgeskill.v1.Hub/Fetch"

    async def code_of(channel: grpc.aio.Channel, payload: bytes) -> grpc.StatusCode:
        call = channel.unary_stream(fetch_call, response_deserializer=pb.FetchChunk.FromString)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            async for _ in call(payload):
                pass
        return info.value.code()

    def request(device_id: str, path: str, max_bytes: int = 1 << 20) -> bytes:
        req = pb.FetchRequest(device_id=device_id, path=path, max_bytes=max_bytes)
        return req.SerializeToString()

    async def main() -> None:
        server, port = await start_grpc_server(core, "127.0.0.1:0")
        channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
        try:
            root = "metadata/1.root.json"
            assert (
                await code_of(channel, request("ghost", root))
                == grpc.StatusCode.FAILED_PRECONDITION
            )
            await core.register(make_envelope("cam-1", register=pb.Register()))
            assert await code_of(channel, b"\xff\xff") == grpc.StatusCode.INVALID_ARGUMENT
            assert await code_of(channel, b"x" * 5000) == grpc.StatusCode.INVALID_ARGUMENT
            assert (
                await code_of(channel, request("cam-1", "../hub.db"))
                == grpc.StatusCode.INVALID_ARGUMENT
            )
            assert (
                await code_of(channel, request("cam-1", "metadata/9.root.json"))
                == grpc.StatusCode.NOT_FOUND
            )
            assert (
                await code_of(channel, request("cam-1", root, 10))
                == grpc.StatusCode.RESOURCE_EXHAUSTED
            )
        finally:
            await channel.close()
            await server.stop(None)

    asyncio.run(main())
    assert core.dropped == {"unknown-device": 1, "malformed": 1, "oversized": 1}


@pytest.mark.mqtt
def test_mqtt_drops_messages_of_a_device_that_never_registered(core: HubCore, url: str) -> None:
    async def main() -> None:
        async with running(core):
            server = await start_mqtt_server(core, url)
            ghost = MqttDevice(url, "ghost")
            await ghost.start()
            try:
                await ghost.send(encode_envelope(telemetry("ghost")), "telemetry")
                await dropped(core, {"unknown-device": 1})
            finally:
                await ghost.close()
                await server.stop()

    asyncio.run(main())
    assert core.store.get_device("ghost") is None
    assert core.store.telemetry_for() == []
