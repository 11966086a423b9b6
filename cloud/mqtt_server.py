"""The hub's MQTT 5 adapter: the twin of :mod:`cloud.grpc_server` over a broker.

Device traffic arrives through shared subscriptions, so hub processes split
it; inside one process each device's messages go to one worker queue, which
keeps them in order. Every message is checked before :class:`HubCore` sees
it: size, envelope, topic kind, that the topic's device is the envelope's
device, and that the device registered (register is the one exception).
Whatever fails is dropped and counted in ``core.dropped``; everyone else is
served. Desired-state changes made by any hub or the CLI are found by polling
the store (one query per interval for the whole fleet) and published as
retained per-device messages.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import zlib
from collections import OrderedDict
from dataclasses import dataclass

from google.protobuf.message import DecodeError
from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

from cloud.errors import HubError, TransportError
from cloud.hubcore import HubCore, desired_envelope
from cloud.mqtt_client import HubMqttClient, Incoming
from cloud.mqtt_fetch import FetchReply, requested_window
from protos import MAX_ENVELOPE_BYTES, decode_envelope, encode_envelope, kind_of, make_envelope, pb
from protos.envelope import now_ms
from protos.errors import ProtocolError
from protos.topics import (
    STATUS_OFFLINE,
    STATUS_ONLINE,
    MqttEndpoint,
    TopicRef,
)
from skills.errors import SkillError

__all__ = [
    "MqttHubServer",
    "MqttServerSettings",
    "start_mqtt_server",
]

log = logging.getLogger(__name__)

_MAX_FETCH_REQUEST = 4096
_ACKED_KINDS = ("reported", "telemetry")


@dataclass(frozen=True)
class MqttServerSettings:
    """Tuning and caps of the MQTT adapter."""

    # Each device's messages go to one worker (order per device); the workers' concurrent
    # telemetry is what the hub's group commit batches, so more workers, bigger batches.
    workers: int = 64
    queue_per_worker: int = 1000
    poll_interval_s: float = 1.0
    max_fetch_window: int = 64
    max_fetches: int = 32
    seen_ids: int = 100_000
    unknown_ttl_s: float = 5.0
    #: Largest packet the broker may hand the hub; bigger ones are dropped by the broker.
    max_packet: int = 1024 * 1024
    connect_timeout_s: float = 10.0


class _Lru:
    """A bounded set of recently seen keys, with the time each was added."""

    def __init__(self, cap: int) -> None:
        self._cap = cap
        self._items: OrderedDict[str, float] = OrderedDict()

    def add(self, key: str) -> None:
        self._items[key] = time.monotonic()
        self._items.move_to_end(key)
        if len(self._items) > self._cap:
            self._items.popitem(last=False)

    def age(self, key: str) -> float | None:
        added = self._items.get(key)
        return None if added is None else time.monotonic() - added

    def __contains__(self, key: str) -> bool:
        return key in self._items


class MqttHubServer:
    """Serves devices through an MQTT 5 broker on behalf of one :class:`HubCore`."""

    def __init__(self, core: HubCore, url: str, settings: MqttServerSettings | None = None) -> None:
        try:
            self.endpoint = MqttEndpoint.parse(url)
        except ProtocolError as exc:
            raise TransportError(str(exc)) from exc
        self.core = core
        self.settings = s = settings or MqttServerSettings()
        self.topics = self.endpoint.topics
        shared = SubscribeOptions(qos=1)
        tracking = SubscribeOptions(
            qos=1, noLocal=True, retainHandling=SubscribeOptions.RETAIN_SEND_IF_NEW_SUB
        )
        subs = [(f, shared) for f in self.topics.hub_filters(self.endpoint.share_group)]
        subs.append((self.topics.desired_filter(), tracking))
        self.mqtt = HubMqttClient(self.endpoint, subs, self._route, max_packet=s.max_packet)
        self._queues: list[asyncio.Queue[tuple[TopicRef, Incoming]]] = [
            asyncio.Queue(s.queue_per_worker) for _ in range(s.workers)
        ]
        self._fetch_slots = asyncio.Semaphore(s.max_fetches)
        self._tasks: list[asyncio.Task[None]] = []
        self._fetch_tasks: set[asyncio.Task[None]] = set()
        self._seen = _Lru(s.seen_ids)
        self._known: set[str] = set()
        self._unknown = _Lru(10_000)
        #: The desired generation last published (by any hub) per device.
        self.published: dict[str, int] = {}

    async def start(self) -> None:
        """Connect, subscribe and start the workers and the desired-state poller.

        Raises:
            TransportError: the broker could not be reached in time.
        """
        await self.mqtt.start(self.settings.connect_timeout_s)
        for queue in self._queues:
            self._tasks.append(asyncio.create_task(self._worker(queue)))
        self._tasks.append(asyncio.create_task(self._poll_desired()))
        log.info("hub serving MQTT on %s as %s", self.endpoint.redacted(), self.mqtt.client_id)

    async def stop(self) -> None:
        """Stop the workers and disconnect."""
        tasks = [*self._tasks, *self._fetch_tasks]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self._tasks.clear()
        await self.mqtt.stop()

    def broadcast(self, key: str, value: str, env: pb.Envelope) -> bool:
        """Publish ``env`` to every device carrying the label ``key=value``.

        Raises:
            ProtocolError: the label cannot name a topic, or the envelope is over the cap.
        """
        topic = self.topics.group_down(key, value, kind_of(env))
        return self.mqtt.publish(topic, encode_envelope(env))

    def _drop(self, reason: str) -> None:
        self.core.drop(reason)
        count = self.core.dropped[reason]
        if count == 1 or count % 1000 == 0:  # visible in the log, but a flood cannot flood it
            log.warning("dropped an MQTT message (%s); %d so far", reason, count)

    # -- routing (on the event loop) ---------------------------------------------

    def _route(self, msg: Incoming) -> None:
        try:
            ref = self.topics.parse(msg.topic)
        except ProtocolError:
            self._drop("bad-topic")
            return
        if ref.area == "down":
            self._track_desired(ref.device_id, msg)
        elif ref.kind == "fetch":
            self._start_fetch(ref, msg)
        else:
            queue = self._queues[zlib.crc32(ref.device_id.encode()) % len(self._queues)]
            try:
                queue.put_nowait((ref, msg))
            except asyncio.QueueFull:
                self._drop("overloaded")  # the device's outbox sends it again

    def _track_desired(self, device_id: str, msg: Incoming) -> None:
        if not msg.payload:
            self.published.pop(device_id, None)
            return
        with contextlib.suppress(ProtocolError):
            env = decode_envelope(msg.payload)
            if kind_of(env) == "desired":
                self.published[device_id] = env.desired.generation

    async def _worker(self, queue: asyncio.Queue[tuple[TopicRef, Incoming]]) -> None:
        while True:
            ref, msg = await queue.get()
            try:
                if ref.area == "status":
                    await self._presence(ref.device_id, msg.payload)
                else:
                    await self._handle(ref, msg.payload)
            except HubError as exc:
                self._drop("store-error")
                log.warning("message from %s not handled: %s", ref.device_id, exc)
            except Exception:  # one bad message must not stop this worker's devices
                self._drop("internal-error")
                log.exception("message from %s not handled", ref.device_id)

    # -- device messages ---------------------------------------------------------

    def _decode(self, ref: TopicRef, payload: bytes) -> pb.Envelope | None:
        if len(payload) > MAX_ENVELOPE_BYTES:
            self._drop("oversized")
            return None
        try:
            env = decode_envelope(payload)
        except ProtocolError:
            self._drop("malformed")
            return None
        if kind_of(env) != ref.kind:
            self._drop("wrong-topic")
            return None
        if env.device_id != ref.device_id:
            self._drop("spoofed")
            return None
        return env

    async def _handle(self, ref: TopicRef, payload: bytes) -> None:
        env = self._decode(ref, payload)
        if env is None:
            return
        device = ref.device_id
        if ref.kind == "register":
            await self._register(env)
            return
        if not await self._is_known(device):
            self._drop("unknown-device")
            return
        if env.id in self._seen:
            self.core.handled["duplicate"] += 1
            if ref.kind in _ACKED_KINDS:  # the first ack was lost: say it again
                ack = pb.Ack(ids=[env.id])
                self._send(device, make_envelope(device, correlation_id=env.id, ack=ack))
            return
        try:
            replies = await self.core.handle(device, env)
        except ProtocolError as exc:
            self._drop("bad-message")
            log.debug("dropped a message from %s: %s", device, exc)
            return
        self._seen.add(env.id)
        for reply in replies:
            self._send(device, reply)

    async def _register(self, env: pb.Envelope) -> None:
        try:
            replies = await self.core.register(env)
        except ProtocolError as exc:
            self._drop("bad-register")
            log.debug("refused a register from %s: %s", env.device_id, exc)
            return
        self._known.add(env.device_id)
        for reply in replies:
            self._send(env.device_id, reply)

    async def _is_known(self, device: str) -> bool:
        if device in self._known:
            return True
        age = self._unknown.age(device)
        if age is not None and age < self.settings.unknown_ttl_s:
            return False
        if await asyncio.to_thread(self.core.store.get_device, device) is None:
            self._unknown.add(device)
            return False
        self._known.add(device)
        return True

    async def _presence(self, device: str, payload: bytes) -> None:
        if payload not in (STATUS_ONLINE, STATUS_OFFLINE):
            self._drop("malformed")
            return
        if not await self._is_known(device):
            return  # presence of a device that never registered says nothing
        if payload == STATUS_OFFLINE:
            await self.core.disconnected(device)
        else:
            await asyncio.to_thread(
                self.core.store.touch_device, device, now_ms=now_ms(), online=True
            )

    def _send(self, device: str, env: pb.Envelope) -> None:
        kind = kind_of(env)
        if not self.mqtt.publish(
            self.topics.down(device, kind), encode_envelope(env), retain=kind == "desired"
        ):
            self._drop("publish-failed")
            return
        if kind == "desired":
            self.published[device] = env.desired.generation

    # -- desired state -------------------------------------------------------------

    async def _poll_desired(self) -> None:
        # Polling the store keeps hub processes stateless: a deployment made through
        # any hub or the CLI reaches every device. One query covers the whole fleet.
        await asyncio.sleep(0.5)  # let retained desired states arrive first
        while True:
            try:
                await self._publish_changes()
            except HubError as exc:
                log.warning("desired-state poll failed: %s", exc)
            await asyncio.sleep(self.settings.poll_interval_s)

    async def _publish_changes(self) -> None:
        generations = await asyncio.to_thread(self.core.store.desired_generations)
        self._known.update(generations)
        changed = [d for d, g in generations.items() if g and g != self.published.get(d)]
        for start in range(0, len(changed), 500):
            batch = changed[start : start + 500]
            for record in await asyncio.to_thread(self.core.store.desired_many, batch):
                self._send(record.device_id, desired_envelope(record.device_id, record))

    # -- fetch: MQTT 5 request/response --------------------------------------------

    def _start_fetch(self, ref: TopicRef, msg: Incoming) -> None:
        if self._fetch_slots.locked():
            self._drop("fetch-busy")  # the agent asks again after its chunk timeout
            return
        task = asyncio.create_task(self._fetch(ref.device_id, msg))
        self._fetch_tasks.add(task)
        task.add_done_callback(self._fetch_tasks.discard)

    async def _fetch(self, device: str, msg: Incoming) -> None:
        async with self._fetch_slots:
            req = await self._fetch_request(device, msg)
            if req is None:
                return
            assert msg.correlation is not None and msg.response_topic is not None
            reply = FetchReply(self._publish_reply, msg.response_topic, msg.correlation)
            window = requested_window(msg.user, self.settings.max_fetch_window)
            try:
                size, chunks = await asyncio.to_thread(
                    self.core.open_fetch, req.path, req.offset, req.max_bytes
                )
            except FileNotFoundError:
                reply.error("not-found", f"no such file: {req.path}")
                return
            except ProtocolError as exc:
                reply.error("too-large" if "cap" in str(exc) else "refused", str(exc))
                return
            except SkillError as exc:  # the trust repository refused the path
                reply.error("refused", str(exc))
                return
            with contextlib.closing(chunks):
                if not await reply.chunks(chunks, req.offset, size, window):
                    self._drop("publish-failed")

    def _publish_reply(self, topic: str, payload: bytes, props: Properties) -> bool:
        return self.mqtt.publish(topic, payload, props=props)

    async def _fetch_request(self, device: str, msg: Incoming) -> pb.FetchRequest | None:
        corr, rt = msg.correlation, msg.response_topic
        if not corr or len(corr) > 64 or rt != self.topics.down(device, "fetch"):
            self._drop("bad-fetch")
            return None
        if len(msg.payload) > _MAX_FETCH_REQUEST:
            self._drop("oversized")
            return None
        req = pb.FetchRequest()
        try:
            req.ParseFromString(msg.payload)
        except DecodeError:
            self._drop("malformed")
            return None
        if req.device_id != device:
            self._drop("spoofed")
            return None
        if not await self._is_known(device):
            self._drop("unknown-device")
            FetchReply(self._publish_reply, rt, corr).error("unknown-device", "register first")
            return None
        return req


async def start_mqtt_server(
    core: HubCore, url: str, settings: MqttServerSettings | None = None
) -> MqttHubServer:
    """Start serving ``core`` through the broker at ``url``.

    Raises:
        TransportError: a malformed URL, or the broker could not be reached in time.
    """
    server = MqttHubServer(core, url, settings)
    await server.start()
    return server
