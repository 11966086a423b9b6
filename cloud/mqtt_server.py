"""The hub's MQTT 5 adapter: the twin of :mod:`cloud.grpc_server` over a broker.

Device traffic arrives through shared subscriptions, so hub processes split
it; inside one process each device's messages go to one worker queue, which
keeps them in order. The adapter parses topics and hands each payload to a
:class:`~cloud.session.DeviceSession` for the topic's device, which checks,
deduplicates, counts drops and answers; the answers are published here.
Desired-state changes found by the core's shared notifier are published as
retained per-device messages; the retained messages of every hub process are
tracked, so a change is published once whichever process sees it first.
There is no group broadcast: everything the hub sends names one device.

Split and joint inference is MQTT 5 request/response, like fetch: an
``InferRequest`` on ``up/infer`` with response topic ``down/infer`` and
correlation data (the request id) is answered on that topic with the same
correlation data, by an ``InferResponse`` (content type
:data:`~protos.topics.INFER_CONTENT_TYPE`) or, when refused, an ``Error``
(:data:`~protos.topics.ERROR_CONTENT_TYPE`) whose code is a wire code of
:data:`~protos.topics.INFER_ERROR_CODES`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import zlib
from dataclasses import dataclass
from typing import NamedTuple

from paho.mqtt.properties import Properties
from paho.mqtt.subscribeoptions import SubscribeOptions

from cloud.errors import FetchRefusedError, HubError, TransportError
from cloud.fetch_queue import FetchQueue, FetchScheduler
from cloud.hubcore import HubCore, fetch_error_code
from cloud.mqtt_client import HubMqttClient, Incoming
from cloud.mqtt_fetch import FetchReply, requested_window
from cloud.session import DropReason
from cloud.tail_serving import TailRefusedError
from cloud.telemetry_ingest import TelemetryIngest, ack_envelopes
from protos import decode_envelope, encode_envelope, kind_of, pb
from protos.errors import ProtocolError
from protos.fetch import MAX_CORRELATION_BYTES, MAX_WINDOW, FetchErrorCode
from protos.paho_loop import publish_properties
from protos.topics import (
    DESIRED_KINDS,
    ERROR_CONTENT_TYPE,
    INFER_CONTENT_TYPE,
    STATUS_OFFLINE,
    STATUS_ONLINE,
    MqttEndpoint,
    TopicRef,
)

__all__ = ["MqttHubServer", "MqttServerSettings", "start_mqtt_server"]

log = logging.getLogger(__name__)

_PRESENCE = {STATUS_ONLINE: True, STATUS_OFFLINE: False}
#: Replies whose loss the device repairs by sending again (its outbox keeps the message).
_AT_MOST_ONCE = frozenset({"ack", "error"})
#: Topics parsed and remembered (each device sends on a few, again and again).
_PARSED_TOPICS = 50_000


@dataclass(frozen=True)
class MqttServerSettings:
    """Tuning and caps of the MQTT adapter."""

    # Each device's messages other than telemetry go to one worker (order per device).
    # Telemetry goes to the bulk path (cloud.telemetry_ingest): its order does not
    # matter (every window says when it was), and what arrives together is stored in
    # one group commit and acknowledged with one ack per device.
    workers: int = 1024
    queue_per_worker: int = 256
    #: Telemetry messages taken and not yet answered; more are dropped (``overloaded``).
    max_telemetry: int = 20_000
    max_fetch_window: int = MAX_WINDOW
    #: Fetch requests (one window each) served at once.
    max_fetches: int = 32
    #: Fetch requests waiting for a slot, in the order they came; more are told "busy".
    #: About 4 s of work at the thousand small fetches a second one hub process
    #: served on two cores: well within ``max_fetch_wait_s``, so a request that gets
    #: in is served in time rather than expiring.
    max_queued_fetches: int = 4096
    #: Fetch requests of one device waiting at once (so one cannot fill the queue).
    max_queued_fetches_per_device: int = 4
    #: Longest wait for a slot; older requests are told "busy". Below the agent's own
    #: bounds (FetchLimits: no data for 15 s aborts a fetch, and a small file whose
    #: first chunk comes after its 10 s grace fails the minimum-rate check).
    max_fetch_wait_s: float = 8.0
    #: Inference requests in progress at once; more are refused (``resource-exhausted``).
    max_infers: int = 1024
    #: Largest packet the broker may hand the hub; bigger ones are dropped by the broker.
    max_packet: int = 1024 * 1024
    connect_timeout_s: float = 10.0
    #: Time after connecting for the retained desired states to arrive before publishing.
    settle_s: float = 0.5


class _FetchAsk(NamedTuple):
    """A fetch request whose reply path was checked, waiting or being served."""

    device: str
    msg: Incoming
    reply: FetchReply


class MqttHubServer:
    """Serves devices through an MQTT 5 broker on behalf of one :class:`HubCore`."""

    def __init__(self, core: HubCore, url: str, settings: MqttServerSettings | None = None) -> None:
        """Prepare the adapter; nothing connects before :meth:`start`.

        Raises:
            TransportError: a malformed URL, or its TLS files cannot be loaded.
        """
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
        self._tasks: list[asyncio.Task[None]] = []
        #: Fetches being served, and those waiting for a slot (first come, first served).
        self.fetches = FetchScheduler(
            FetchQueue[_FetchAsk](
                s.max_fetches,
                s.max_queued_fetches,
                s.max_queued_fetches_per_device,
                s.max_fetch_wait_s,
            ),
            self._fetch,
            self._refuse_fetch,
        )
        self.telemetry = TelemetryIngest(core, self._send_acks, s.max_telemetry)
        #: Message ids to acknowledge at the end of this turn of the loop, by device.
        self._acks: dict[str, list[str]] = {}
        self._infer_tasks: set[asyncio.Task[None]] = set()
        #: The desired-state revision last published (by any hub) per device: the
        #: director's counter, or the generation when the hub runs insecure.
        self.published: dict[str, int] = {}
        #: ``topics.parse`` remembered; a topic it refuses is not remembered, so it is
        #: refused (and counted) every time.
        self._parse = functools.lru_cache(maxsize=_PARSED_TOPICS)(self.topics.parse)

    async def start(self) -> None:
        """Connect, subscribe and start the workers and the desired-state publisher.

        Raises:
            TransportError: the broker could not be reached in time.
        """
        await self.mqtt.start(self.settings.connect_timeout_s)
        for queue in self._queues:
            self._tasks.append(asyncio.create_task(self._worker(queue)))
        self._tasks.append(asyncio.create_task(self._publish_desired()))
        log.info("hub serving MQTT on %s as %s", self.endpoint.redacted(), self.mqtt.client_id)

    async def stop(self) -> None:
        """Stop the workers and disconnect; waiting fetches are told "busy"."""
        self.fetches.close()
        tasks = [*self._tasks, *self.fetches.tasks, *self._infer_tasks]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.telemetry.close()
        self._tasks.clear()
        await self.mqtt.stop()

    # -- routing (on the event loop) ---------------------------------------------

    def _route(self, msg: Incoming) -> None:
        try:
            ref = self._parse(msg.topic)
        except ProtocolError as exc:
            self.core.drop(DropReason.BAD_TOPIC, "", exc)
            return
        if ref.area == "down":
            self._track_desired(ref.device_id, msg)
        elif ref.kind == "fetch":
            self._start_fetch(ref, msg)
        elif ref.kind == "infer":
            self._start_infer(ref, msg)
        elif ref.kind == "telemetry":
            if not self.telemetry.add(ref.device_id, msg.payload):
                self.core.drop(DropReason.OVERLOADED, ref.device_id)  # the outbox sends it again
        else:
            queue = self._queues[zlib.crc32(ref.device_id.encode()) % len(self._queues)]
            try:
                queue.put_nowait((ref, msg))
            except asyncio.QueueFull:
                self.core.drop(DropReason.OVERLOADED, ref.device_id)  # the outbox sends it again

    def _track_desired(self, device_id: str, msg: Incoming) -> None:
        if not msg.payload:
            self.published.pop(device_id, None)
            return
        with contextlib.suppress(ProtocolError):
            revision = self.core.revision(decode_envelope(msg.payload))
            if revision is not None:
                self.published[device_id] = revision

    async def _worker(self, queue: asyncio.Queue[tuple[TopicRef, Incoming]]) -> None:
        while True:
            ref, msg = await queue.get()
            session = self.core.session(ref.device_id)
            try:
                if ref.area == "status":
                    online = _PRESENCE.get(msg.payload)
                    if online is None:
                        session.drop(DropReason.MALFORMED, "status payload")
                    else:  # the connected flag only: a retained status is no sign of life
                        await session.presence(online=online)
                    continue
                for reply in await session.receive(msg.payload, ref.kind):
                    self._send(ref.device_id, reply)
            except Exception:  # one bad message must not stop this worker's devices
                session.drop(DropReason.INTERNAL_ERROR)
                log.exception("message from %s not handled", ref.device_id)

    def _send(self, device: str, env: pb.Envelope) -> None:
        kind = kind_of(env)
        desired = kind in DESIRED_KINDS
        # An ack or an error answers a message the device keeps until it is acked: a lost
        # one costs a resend, which is deduplicated and acked again. At QoS 0 it skips
        # the broker's PUBACK round and its bookkeeping on both sides.
        qos = 0 if kind in _AT_MOST_ONCE else 1
        if not self.mqtt.publish(
            self.topics.down(device, kind), encode_envelope(env), retain=desired, qos=qos
        ):
            self.core.drop(DropReason.PUBLISH_FAILED, device)
            return
        revision = self.core.revision(env) if desired else None
        if revision is not None:
            self.published[device] = revision

    def _send_acks(self, device: str, ids: list[str]) -> None:
        """Acknowledge the device's messages ``ids`` at the end of this turn of the loop.

        Every ack is a packet the broker routes and the device parses. The groups
        one commit stored wake in the same turn, so their acks go out together:
        one envelope per device and ``cloud.telemetry_ingest.MAX_ACK_IDS`` ids.
        """
        if not self._acks:
            asyncio.get_running_loop().call_soon(self._flush_acks)
        self._acks.setdefault(device, []).extend(ids)

    def _flush_acks(self) -> None:
        acks, self._acks = self._acks, {}
        for device, ids in acks.items():
            topic = self.topics.down(device, "ack")
            for env in ack_envelopes(device, ids):
                # At QoS 0, as every ack (see _send): a lost one costs a resend.
                if not self.mqtt.publish(topic, encode_envelope(env), qos=0):
                    self.core.drop(DropReason.PUBLISH_FAILED, device)

    # -- desired state -------------------------------------------------------------

    async def _publish_desired(self) -> None:
        await asyncio.sleep(self.settings.settle_s)  # let retained desired states arrive first
        while True:
            try:
                async for batch in self.core.desired_changes(self.published):
                    for env in batch:
                        self._send(env.device_id, env)
            except HubError as exc:
                log.warning("publishing desired state failed; retrying: %s", exc)
                await asyncio.sleep(1.0)

    # -- fetch: MQTT 5 request/response --------------------------------------------

    def _start_fetch(self, ref: TopicRef, msg: Incoming) -> None:
        device, corr, topic = ref.device_id, msg.correlation, msg.response_topic
        if (
            corr is None
            or not 0 < len(corr) <= MAX_CORRELATION_BYTES
            or topic != self.topics.down(device, "fetch")
        ):
            self.core.drop(DropReason.BAD_FETCH, device)
            return
        self.fetches.submit(
            device, _FetchAsk(device, msg, FetchReply(self._publish_reply, topic, corr))
        )

    def _refuse_fetch(self, ask: _FetchAsk) -> None:
        # Say so, rather than let the device wait out its stall bound: it asks again soon.
        self.core.drop(DropReason.FETCH_BUSY, ask.device)
        ask.reply.error(FetchErrorCode.BUSY, "the hub is serving too many fetches; ask again")

    async def _fetch(self, ask: _FetchAsk) -> None:
        device, msg, reply = ask
        window = requested_window(msg.user, self.settings.max_fetch_window)
        try:
            req, size, chunks = await self.core.session(device).fetch(msg.payload)
        except (FileNotFoundError, FetchRefusedError) as exc:
            reply.error(fetch_error_code(exc), str(exc))
            return
        except HubError:
            return  # counted by the session; the agent asks again after its timeout
        with contextlib.closing(chunks):
            if not await reply.chunks(chunks, req.offset, size, window):
                self.core.drop(DropReason.PUBLISH_FAILED, device)

    # -- split and joint inference: MQTT 5 request/response --------------------------

    def _start_infer(self, ref: TopicRef, msg: Incoming) -> None:
        corr, topic = msg.correlation, msg.response_topic
        if (
            corr is None
            or not 0 < len(corr) <= MAX_CORRELATION_BYTES
            or topic != self.topics.down(ref.device_id, "infer")
        ):
            self.core.drop(DropReason.BAD_INFER, ref.device_id, "no usable reply path")
            return
        if len(self._infer_tasks) >= self.settings.max_infers:
            refusal = TailRefusedError("resource-exhausted", "the hub is serving too many tails")
            self._answer_infer(ref.device_id, topic, corr, refusal)
            return
        task = asyncio.create_task(self._infer(ref.device_id, msg.payload, topic, corr))
        self._infer_tasks.add(task)
        task.add_done_callback(self._infer_tasks.discard)

    async def _infer(self, device: str, payload: bytes, topic: str, corr: bytes) -> None:
        try:
            answer: pb.InferResponse | TailRefusedError = await self.core.session(
                device
            ).infer_payload(payload)
        except TailRefusedError as exc:
            answer = exc
        self._answer_infer(device, topic, corr, answer)

    def _answer_infer(
        self, device: str, topic: str, corr: bytes, answer: pb.InferResponse | TailRefusedError
    ) -> None:
        if isinstance(answer, TailRefusedError):
            ctype = ERROR_CONTENT_TYPE
            body = pb.Error(code=answer.code, message=answer.message[:1000]).SerializeToString()
        else:
            ctype = INFER_CONTENT_TYPE
            body = answer.SerializeToString()
        props = publish_properties(correlation=corr, content_type=ctype)
        if not self.mqtt.publish(topic, body, props=props):
            self.core.drop(DropReason.PUBLISH_FAILED, device)

    def _publish_reply(self, topic: str, payload: bytes, props: Properties) -> bool:
        return self.mqtt.publish(topic, payload, props=props)


async def start_mqtt_server(
    core: HubCore, url: str, settings: MqttServerSettings | None = None
) -> MqttHubServer:
    """Start serving ``core`` through the broker at ``url``.

    Desired-state changes are published only while the core's loops run (the
    hub's control-loop host, or :func:`cloud.hubcore.running`).

    Raises:
        TransportError: a malformed URL, or the broker could not be reached in time.
    """
    server = MqttHubServer(core, url, settings)
    await server.start()
    return server
