"""The agent's MQTT transport against the real broker, with a scripted hub made of plain paho.

The scripted hub lets a test lose a chunk, stall, lie about sizes or trickle bytes,
which a real hub never does on purpose.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from cloud.mqtt_client import clear_retained
from edge_agent.errors import TransportError
from edge_agent.hublink import HubLink
from edge_agent.transport import FetchAborted, FetchLimits, open_transport
from edge_agent.transport.mqtt import MqttAgentTransport
from protos import decode_envelope, encode_envelope, make_envelope, pb
from protos.fetch import WINDOW_PROPERTY, FetchErrorCode
from protos.topics import CHUNK_CONTENT_TYPE, ERROR_CONTENT_TYPE, MqttEndpoint
from tests.support import async_wait_until, free_port, wait_until
from tests.support.services import mqtt_host_port, mqtt_url

pytestmark = pytest.mark.mqtt

DEVICE = "cam-1"


@pytest.fixture
def url() -> Iterator[str]:
    """A fresh topic prefix on the system broker, wiped of retained messages afterwards."""
    value = mqtt_url(f"es-test/{uuid.uuid4().hex[:12]}", session_expiry=30, keepalive=5)
    yield value
    clear_retained(value)


def register_env() -> pb.Envelope:
    return make_envelope(DEVICE, register=pb.Register(labels={"kind": "camera"}))


@dataclass
class Request:
    req: pb.FetchRequest
    corr: bytes
    topic: str
    window: int


class ScriptedHub:
    """A paho client playing the hub: welcomes registers and hands fetches to ``serve``."""

    def __init__(self, url: str, ignore_registers: int = 0) -> None:
        self.topics = MqttEndpoint.parse(url).topics
        self.lock = threading.Lock()
        self.seen: list[tuple[str, bytes]] = []
        self.requests: list[Request] = []
        self.ignore_registers = ignore_registers
        self.serve: Callable[[ScriptedHub, Request], None] | None = None
        self.client = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
        self.client.on_message = self._on_message
        subscribed = threading.Event()
        self.client.on_subscribe = lambda *_: subscribed.set()
        self.client.connect(*mqtt_host_port())
        self.client.loop_start()
        self.client.subscribe(f"{self.topics.prefix}/dev/+/up/#", qos=1)
        assert subscribed.wait(5)

    def _on_message(self, _c: mqtt.Client, _u: object, msg: mqtt.MQTTMessage) -> None:
        with self.lock:
            self.seen.append((msg.topic, bytes(msg.payload)))
        if msg.topic.endswith("/up/register"):
            if self.ignore_registers > 0:
                self.ignore_registers -= 1
                return
            env = decode_envelope(msg.payload)
            welcome = make_envelope(
                env.device_id, correlation_id=env.id, welcome=pb.Welcome(heartbeat_s=5)
            )
            self.down(env.device_id, "welcome", encode_envelope(welcome))
        elif msg.topic.endswith("/up/fetch") and self.serve is not None:
            req = pb.FetchRequest()
            req.ParseFromString(msg.payload)
            props = msg.properties
            window = int(dict(props.UserProperty)[WINDOW_PROPERTY])
            request = Request(req, bytes(props.CorrelationData), props.ResponseTopic, window)
            with self.lock:
                self.requests.append(request)
            threading.Thread(target=self.serve, args=(self, request), daemon=True).start()

    def down(self, device: str, kind: str, payload: bytes) -> mqtt.MQTTMessageInfo:
        return self.client.publish(self.topics.down(device, kind), payload, qos=1)

    def reply(
        self, request: Request, payload: bytes, content_type: str = CHUNK_CONTENT_TYPE
    ) -> None:
        props = Properties(PacketTypes.PUBLISH)
        props.CorrelationData = request.corr
        props.ContentType = content_type
        self.client.publish(request.topic, payload, qos=1, properties=props)

    def chunk(self, request: Request, offset: int, data: bytes, total: int) -> None:
        last = offset + len(data) >= total
        self.reply(
            request,
            pb.FetchChunk(
                offset=offset, data=data, total_size=total, last=last
            ).SerializeToString(),
        )

    def kinds(self) -> list[str]:
        with self.lock:
            return [topic.rsplit("/", 1)[1] for topic, _ in self.seen]

    def close(self) -> None:
        self.client.disconnect()
        self.client.loop_stop()


def serve_file(data: bytes, chunk: int = 16 * 1024) -> Callable[[ScriptedHub, Request], None]:
    def serve(hub: ScriptedHub, request: Request) -> None:
        offset = request.req.offset
        for _ in range(request.window):
            piece = data[offset : offset + chunk]
            hub.chunk(request, offset, piece, len(data))
            offset += len(piece)
            if offset >= len(data):
                return

    return serve


def retained(url: str, topic: str) -> bytes | None:
    got: list[bytes] = []
    client = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
    client.on_message = lambda _c, _u, msg: got.append(bytes(msg.payload))
    client.connect(*mqtt_host_port())
    client.loop_start()
    client.subscribe(topic, qos=1)
    with contextlib.suppress(TimeoutError):  # nothing retained: None
        wait_until(lambda: bool(got), 2, f"a retained message on {topic}")
    client.disconnect()
    client.loop_stop()
    return got[0] if got else None


def run_with(
    url: str, body: Callable[[MqttAgentTransport, ScriptedHub], object], ignore_registers: int = 0
) -> None:
    hub = ScriptedHub(url, ignore_registers)

    async def main() -> None:
        transport = open_transport(url, DEVICE)
        assert isinstance(transport, MqttAgentTransport)
        await transport.connect(register_env())
        try:
            await body(transport, hub)  # type: ignore[misc]
        finally:
            await transport.close()

    try:
        asyncio.run(main())
    finally:
        hub.close()


def test_connect_registers_announces_presence_and_says_offline_on_close(url: str) -> None:
    status = MqttEndpoint.parse(url).topics.status(DEVICE)

    async def body(t: MqttAgentTransport, hub: ScriptedHub) -> None:
        env = await asyncio.wait_for(t.receive(), 5)
        assert env.WhichOneof("body") == "welcome"
        assert hub.kinds()[0] == "register"
        assert retained(url, status) == b"online"
        await t.send(make_envelope(DEVICE, telemetry=pb.Telemetry(skill="s", inferences=1)))
        await t.send(make_envelope(DEVICE, heartbeat=pb.Heartbeat(uptime_s=1)))
        await async_wait_until(lambda: len(hub.kinds()) >= 3, 5, "the hub to get both")
        assert hub.kinds()[1:] == ["telemetry", "heartbeat"]

    run_with(url, body)
    assert retained(url, status) == b"offline"


def test_register_is_sent_again_until_the_hub_welcomes(url: str) -> None:

    async def body(t: MqttAgentTransport, hub: ScriptedHub) -> None:
        env = await asyncio.wait_for(t.receive(), 8)
        assert env.WhichOneof("body") == "welcome"
        registers = [decode_envelope(p) for topic, p in hub.seen if topic.endswith("/register")]
        assert len(registers) == 2
        assert registers[0].id != registers[1].id

    run_with(url, body, ignore_registers=1)


def test_receive_drops_garbage_and_duplicates(url: str) -> None:
    async def body(t: MqttAgentTransport, hub: ScriptedHub) -> None:
        assert (await asyncio.wait_for(t.receive(), 5)).WhichOneof("body") == "welcome"
        first = make_envelope(DEVICE, ack=pb.Ack(ids=["a"]))
        second = make_envelope(DEVICE, ack=pb.Ack(ids=["b"]))
        hub.down(DEVICE, "ack", b"\xff\x00garbage")
        for env in (first, first, second):
            hub.down(DEVICE, "ack", encode_envelope(env))
        got = [await asyncio.wait_for(t.receive(), 5) for _ in range(2)]
        assert [e.ack.ids[0] for e in got] == ["a", "b"]
        assert t.dropped == {"malformed": 1, "duplicate": 1}

    run_with(url, body)


def test_fetch_resumes_after_a_lost_chunk_and_fails_fast_on_a_stall(url: str) -> None:
    data = bytes(range(256)) * 1200  # 300 KiB in 16 KiB chunks
    served = serve_file(data)
    stall = [True]

    def flaky(hub: ScriptedHub, request: Request) -> None:
        n = len(hub.requests)
        if n == 1:  # lose the second chunk of the first window
            hub.chunk(request, 0, data[:16384], len(data))
            hub.chunk(request, 32768, data[32768:49152], len(data))
        elif n == 2 and stall[0]:
            return  # stall: nothing at all comes back
        else:
            served(hub, request)

    async def body(t: MqttAgentTransport, hub: ScriptedHub) -> None:
        await asyncio.wait_for(t.receive(), 5)
        hub.serve = flaky
        limits = FetchLimits(chunk_timeout_s=0.5)
        with pytest.raises(FetchAborted, match="stalled"):
            await t.fetch("targets/x", 1 << 20, limits)
        assert [r.req.offset for r in hub.requests] == [0, 16384]  # resumed where the gap was
        stall[0] = False
        hub.requests.clear()
        assert await t.fetch("targets/x", 1 << 20, limits) == data
        assert [r.req.offset for r in hub.requests][:2] == [0, 16384]
        assert len({r.corr for r in hub.requests}) == len(hub.requests)

    run_with(url, body)


def test_fetch_refuses_oversized_files_and_slow_or_endless_senders(url: str) -> None:
    def lying(hub: ScriptedHub, request: Request) -> None:
        hub.chunk(request, 0, b"x" * 1000, 10_000_000)

    def trickle(hub: ScriptedHub, request: Request) -> None:
        offset = request.req.offset
        for _ in range(200):
            hub.chunk(request, offset, b"y" * 100, 1 << 30)
            offset += 100
            time.sleep(0.02)

    async def body(t: MqttAgentTransport, hub: ScriptedHub) -> None:
        await asyncio.wait_for(t.receive(), 5)
        hub.serve = lying
        with pytest.raises(FetchAborted, match="larger than"):
            await t.fetch("targets/big", 1_000_000)
        hub.serve = trickle
        with pytest.raises(FetchAborted, match="slower than"):
            await t.fetch(
                "targets/slow", 1 << 31, FetchLimits(grace_s=0.5, min_rate_bytes_per_s=50_000)
            )
        started = time.monotonic()
        with pytest.raises(TransportError, match="deadline"):
            await t.fetch(
                "targets/endless", 1 << 31, FetchLimits(deadline_s=1.0, min_rate_bytes_per_s=0)
            )
        assert time.monotonic() - started < 3

    run_with(url, body)


def test_fetch_of_a_missing_file_raises_file_not_found(url: str) -> None:
    def missing(hub: ScriptedHub, request: Request) -> None:
        hub.reply(
            request,
            pb.Error(code=FetchErrorCode.NOT_FOUND, message="no").SerializeToString(),
            ERROR_CONTENT_TYPE,
        )

    async def body(t: MqttAgentTransport, hub: ScriptedHub) -> None:
        await asyncio.wait_for(t.receive(), 5)
        hub.serve = missing
        with pytest.raises(FileNotFoundError):
            await t.fetch("targets/none", 1000)

    run_with(url, body)


def test_a_hub_link_batch_reaches_the_hub_with_every_request_at_once(url: str) -> None:
    timestamp = b"t" * 3000
    both_asked = threading.Barrier(2, timeout=5)  # each request is served on its own thread

    def serve(hub: ScriptedHub, request: Request) -> None:
        both_asked.wait()
        if request.req.path == "metadata/timestamp.json":
            serve_file(timestamp)(hub, request)
        else:
            not_found = pb.Error(code=FetchErrorCode.NOT_FOUND, message="no")
            hub.reply(request, not_found.SerializeToString(), ERROR_CONTENT_TYPE)

    async def body(t: MqttAgentTransport, hub: ScriptedHub) -> None:
        await asyncio.wait_for(t.receive(), 5)
        hub.serve = serve
        link = HubLink(max_bytes=1 << 20)
        link.attach(t)
        requests = [("metadata/2.root.json", 1 << 19), ("metadata/timestamp.json", 1 << 14)]
        async with asyncio.timeout(30):
            got = await asyncio.to_thread(link.fetch_many, requests)
        assert got == [None, timestamp]
        assert len(hub.requests) == 2

    run_with(url, body)


def test_an_unreachable_broker_fails_fast(url: str) -> None:
    async def main() -> None:
        t = MqttAgentTransport(f"mqtt://127.0.0.1:{free_port()}/x", DEVICE, connect_timeout_s=2)
        started = time.monotonic()
        with pytest.raises(TransportError, match="cannot reach"):
            await t.connect(register_env())
        assert time.monotonic() - started < 2
        with pytest.raises(TransportError):
            await t.send(make_envelope(DEVICE, heartbeat=pb.Heartbeat()))

    asyncio.run(main())


def test_a_lost_connection_ends_receive_and_send(url: str) -> None:

    async def body(t: MqttAgentTransport, hub: ScriptedHub) -> None:
        await asyncio.wait_for(t.receive(), 5)
        # A second client with the same client id takes the session over; the broker drops us.
        ep = MqttEndpoint.parse(url)
        thief = mqtt.Client(
            CallbackAPIVersion.VERSION2,
            client_id=f"es-{DEVICE}-{ep.prefix_tag()}",
            protocol=mqtt.MQTTv5,
        )
        thief.connect(*mqtt_host_port())
        thief.loop_start()
        try:
            with pytest.raises(TransportError, match="lost"):
                await asyncio.wait_for(t.receive(), 5)
            with pytest.raises(TransportError):
                await t.send(make_envelope(DEVICE, heartbeat=pb.Heartbeat()))
        finally:
            thief.disconnect()
            thief.loop_stop()

    run_with(url, body)


def test_messages_sent_while_the_device_was_away_wait_in_its_session(url: str) -> None:
    hub = ScriptedHub(url)

    async def main() -> None:
        first = MqttAgentTransport(url, DEVICE)
        await first.connect(register_env())
        await asyncio.wait_for(first.receive(), 5)
        await first.close()
        sent = hub.down(
            DEVICE, "ack", encode_envelope(make_envelope(DEVICE, ack=pb.Ack(ids=["while-away"])))
        )
        # Acknowledged by the broker: queued in the device's session by now.
        await asyncio.to_thread(sent.wait_for_publish, 5)
        assert sent.is_published()
        second = MqttAgentTransport(url, DEVICE)
        await second.connect(register_env())
        try:
            kinds = {}
            for _ in range(2):
                env = await asyncio.wait_for(second.receive(), 5)
                kinds[env.WhichOneof("body")] = env
            assert list(kinds["ack"].ack.ids) == ["while-away"]
        finally:
            await second.close()

    try:
        asyncio.run(main())
    finally:
        hub.close()
