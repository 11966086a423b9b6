"""The hub's MQTT fetch queue, against the real broker: arrival order, caps, expiry, stop.

Devices register with the agent's own transport; the fetch requests are
published by plain paho, one at a time, each waited for until the hub has
started or queued it, so the order they reached the hub is known. A gate in
front of the hub's file opening holds every started fetch (its slot stays
taken) and records the order the hub started them in.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import threading
import time
from collections.abc import AsyncIterator, Iterator

import paho.mqtt.client as mqtt
import pytest
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from cloud.hub import Hub
from cloud.mqtt_server import MqttHubServer
from cloud.session import DeviceSession
from protos import pb
from protos.fetch import FetchErrorCode
from protos.topics import CHUNK_CONTENT_TYPE, ERROR_CONTENT_TYPE, MqttEndpoint
from tests.cloud.test_mqtt_server import (
    FAST,
    device,
    eventually,
    next_of,
    raw_client,
    serving,
)
from tests.cloud.test_mqtt_server import hub as hub  # noqa: PLC0414 - a fixture, used
from tests.cloud.test_mqtt_server import url as url  # noqa: PLC0414 - a fixture, used

pytestmark = pytest.mark.mqtt

ROOT = "metadata/1.root.json"


class Gate:
    """Holds each fetch the hub starts until opened; records which request started when."""

    def __init__(self) -> None:
        self.started: list[int] = []
        self.opened = asyncio.Event()


@pytest.fixture
def gate(monkeypatch: pytest.MonkeyPatch) -> Gate:
    gate = Gate()
    real = DeviceSession.fetch

    async def held(session: DeviceSession, payload: bytes) -> object:
        # Every request asks for the same small file; its byte cap (above the file's
        # size) is the request's number, so the record says which one this is.
        gate.started.append(pb.FetchRequest.FromString(payload).max_bytes - (1 << 20))
        await gate.opened.wait()
        return await real(session, payload)

    monkeypatch.setattr(DeviceSession, "fetch", held)
    return gate


class Replies:
    """What the hub answered on the devices' fetch topics, by request number."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_request: dict[int, list[tuple[str, bytes]]] = {}

    def add(self, number: int, content_type: str, payload: bytes) -> None:
        with self._lock:
            self._by_request.setdefault(number, []).append((content_type, payload))

    def of(self, number: int) -> list[tuple[str, bytes]]:
        with self._lock:
            return list(self._by_request.get(number, []))

    def served(self, number: int) -> bool:
        """The request got its file: a last chunk."""
        return any(
            ct == CHUNK_CONTENT_TYPE and pb.FetchChunk.FromString(body).last
            for ct, body in self.of(number)
        )

    def busy(self, number: int) -> bool:
        """The request was told "busy"."""
        return any(
            ct == ERROR_CONTENT_TYPE and pb.Error.FromString(body).code == FetchErrorCode.BUSY
            for ct, body in self.of(number)
        )


class Asker:
    """Publishes numbered fetch requests in devices' names and collects the replies."""

    def __init__(self, url: str, client: mqtt.Client, server: MqttHubServer, gate: Gate) -> None:
        self.topics = MqttEndpoint.parse(url).topics
        self.client, self.server, self.gate = client, server, gate
        self.replies = Replies()
        self.sent_at: dict[int, float] = {}
        self._next = 0
        client.on_message = self._on_message

    def _on_message(self, _client: object, _userdata: object, msg: mqtt.MQTTMessage) -> None:
        corr = getattr(msg.properties, "CorrelationData", b"")
        if corr.startswith(b"q-"):
            ct = getattr(msg.properties, "ContentType", "")
            self.replies.add(int(corr[2:]), ct, msg.payload)

    def listen(self, device_id: str) -> None:
        result, _ = self.client.subscribe(self.topics.down(device_id, "fetch"), qos=1)
        assert result == mqtt.MQTT_ERR_SUCCESS

    def _seen_by_hub(self) -> int:
        """Requests the hub took: started, waiting, or told busy."""
        return len(self.gate.started) + len(self.server.fetches.queue) + self.busy_count()

    def busy_count(self) -> int:
        return self.server.core.dropped["fetch-busy"]

    async def ask(self, device_id: str) -> int:
        """Send the next request as ``device_id``; return once the hub has taken it."""
        number, self._next = self._next, self._next + 1
        before = self._seen_by_hub()
        props = Properties(PacketTypes.PUBLISH)
        props.ResponseTopic = self.topics.down(device_id, "fetch")
        props.CorrelationData = f"q-{number}".encode()
        req = pb.FetchRequest(device_id=device_id, path=ROOT, max_bytes=(1 << 20) + number)
        self.sent_at[number] = time.monotonic()
        self.client.publish(
            self.topics.up(device_id, "fetch"), req.SerializeToString(), qos=1, properties=props
        )
        await eventually(lambda: self._seen_by_hub() == before + 1)
        return number


@pytest.fixture
def client() -> Iterator[mqtt.Client]:
    """A plain client that outlives the hub in each test (it hears what the hub says last)."""
    plain = raw_client()
    yield plain
    plain.disconnect()
    plain.loop_stop()


@contextlib.asynccontextmanager
async def fetch_queue_hub(
    hub: Hub, url: str, gate: Gate, client: mqtt.Client, devices: list[str], **settings: float
) -> AsyncIterator[Asker]:
    """The hub serving with ``settings``, ``devices`` registered, and an asker for them."""
    async with contextlib.AsyncExitStack() as stack:
        server = await stack.enter_async_context(
            serving(hub, url, dataclasses.replace(FAST, **settings))
        )
        for device_id in devices:
            await next_of(await stack.enter_async_context(device(url, device_id)), "welcome")
        asker = Asker(url, client, server, gate)
        for device_id in devices:
            asker.listen(device_id)
        yield asker


def test_fetches_beyond_the_slots_wait_and_are_all_served_in_arrival_order(
    hub: Hub, url: str, gate: Gate, client: mqtt.Client
) -> None:
    order = ["cam-1", "cam-2", "cam-3", "cam-1", "cam-3", "cam-2", "cam-2", "cam-1", "cam-3"]

    async def main() -> None:
        async with fetch_queue_hub(
            hub, url, gate, client, sorted(set(order)), max_fetches=2
        ) as asker:
            numbers = [await asker.ask(device_id) for device_id in order]
            assert gate.started == numbers[:2]
            assert len(asker.server.fetches.queue) == len(order) - 2
            gate.opened.set()
            await eventually(lambda: all(asker.replies.served(n) for n in numbers))
            assert gate.started == numbers
            assert asker.busy_count() == 0
            assert not any(asker.replies.busy(n) for n in numbers)

    asyncio.run(main())


def test_beyond_the_queue_cap_fetches_are_told_busy_and_counted(
    hub: Hub, url: str, gate: Gate, client: mqtt.Client
) -> None:
    async def main() -> None:
        settings = {"max_fetches": 1, "max_queued_fetches": 2}
        async with fetch_queue_hub(hub, url, gate, client, ["cam-1", "cam-2"], **settings) as asker:
            served = [await asker.ask("cam-1"), await asker.ask("cam-2"), await asker.ask("cam-1")]
            refused = await asker.ask("cam-2")
            await eventually(lambda: asker.replies.busy(refused))
            assert asker.busy_count() == 1
            gate.opened.set()
            await eventually(lambda: all(asker.replies.served(n) for n in served))
            assert gate.started == served
            assert not asker.replies.served(refused)

    asyncio.run(main())


def test_one_device_over_its_share_of_the_queue_is_told_busy_while_others_are_served(
    hub: Hub, url: str, gate: Gate, client: mqtt.Client
) -> None:
    async def main() -> None:
        settings = {"max_fetches": 1, "max_queued_fetches_per_device": 2}
        async with fetch_queue_hub(
            hub, url, gate, client, ["greedy", "cam-2"], **settings
        ) as asker:
            first = [await asker.ask("greedy") for _ in range(3)]  # one served, two waiting
            refused = [await asker.ask("greedy") for _ in range(2)]
            others = [await asker.ask("cam-2"), await asker.ask("cam-2")]
            await eventually(lambda: all(asker.replies.busy(n) for n in refused))
            assert asker.busy_count() == len(refused)
            gate.opened.set()
            await eventually(lambda: all(asker.replies.served(n) for n in first + others))
            assert gate.started == first + others

    asyncio.run(main())


def test_a_fetch_that_waited_past_the_limit_is_told_busy_and_never_served(
    hub: Hub, url: str, gate: Gate, client: mqtt.Client
) -> None:
    wait_s = 0.5

    async def main() -> None:
        settings = {"max_fetches": 1, "max_fetch_wait_s": wait_s}
        async with fetch_queue_hub(hub, url, gate, client, ["cam-1", "cam-2"], **settings) as asker:
            holder = await asker.ask("cam-1")
            stale = await asker.ask("cam-2")
            await eventually(lambda: asker.replies.busy(stale))  # the slot is still held
            assert time.monotonic() - asker.sent_at[stale] >= wait_s  # it waited, then expired
            assert (asker.busy_count(), len(asker.server.fetches.queue)) == (1, 0)
            gate.opened.set()
            fresh = await asker.ask("cam-2")
            await eventually(lambda: asker.replies.served(holder) and asker.replies.served(fresh))
            assert gate.started == [holder, fresh]
            assert not asker.replies.served(stale)

    asyncio.run(main())


def test_stopping_the_hub_tells_waiting_fetches_busy(
    hub: Hub, url: str, gate: Gate, client: mqtt.Client
) -> None:
    async def main() -> None:
        async with fetch_queue_hub(hub, url, gate, client, ["cam-1"], max_fetches=1) as asker:
            held = await asker.ask("cam-1")
            waiting = [await asker.ask("cam-1"), await asker.ask("cam-1")]
            assert asker.busy_count() == 0
        # Stopped: the waiting requests were told before the hub disconnected.
        assert len(asker.server.fetches.queue) == 0
        await eventually(lambda: all(asker.replies.busy(n) for n in waiting))
        assert asker.busy_count() == len(waiting)
        assert gate.started == [held]
        assert not asker.replies.of(held)

    asyncio.run(main())
