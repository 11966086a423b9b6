"""The agent's MQTT 5 transport: one broker session per connection, same semantics as gRPC.

paho is driven from the asyncio event loop (:class:`PahoLoop`: ``add_reader`` and
``add_writer``, no network thread), so its callbacks run on that loop and all
state is touched there only. The session is persistent (``clean_start=False``
with a session expiry), everything travels at QoS 1, presence is a retained
``online`` plus a Last Will ``offline``, and fetches are MQTT 5 request/response
in windows of chunks. A lost connection ends the transport (``receive`` raises),
as a broken gRPC stream does; the agent then opens a new one and the broker
resumes the session.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import ssl
from collections import Counter, OrderedDict
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import paho.mqtt.client as mqtt
from google.protobuf.message import DecodeError
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode
from paho.mqtt.subscribeoptions import SubscribeOptions

from edge_agent.errors import InferRefusedError, TransportError
from edge_agent.eventloop import Wake
from edge_agent.transport.base import AgentTransport
from edge_agent.transport.mqtt_fetch import MAX_CHUNK_BYTES, read_chunk, window_request
from protos import decode_envelope, encode_envelope, kind_of, new_id, pb
from protos.envelope import now_ms
from protos.errors import ProtocolError
from protos.fetch import MAX_CORRELATION_BYTES
from protos.paho_loop import LeanClient, PahoLoop, publish_properties
from protos.topics import (
    ERROR_CONTENT_TYPE,
    INFER_CONTENT_TYPE,
    INFER_REFUSALS,
    STATUS_OFFLINE,
    STATUS_ONLINE,
    MqttEndpoint,
)
from skills.codec_limits import MAX_INFER_BYTES

__all__ = ["MqttAgentTransport"]

log = logging.getLogger(__name__)

_MAX_PACKET = MAX_CHUNK_BYTES + 64 * 1024
_DEFAULT_SESSION_EXPIRY_S = 24 * 3600
_DEFAULT_KEEPALIVE_S = 30
_QUEUE_CAP = 1000
_SEEN_CAP = 4096
_UNACKED_CAP = 1000
_REGISTER_RETRY_S = (2.0, 30.0)
_CLOSE_TIMEOUT_S = 2.0


class _Lost(TransportError):
    """The broker connection ended."""


class MqttAgentTransport(AgentTransport):
    """Talks to ``mqtt://host:port/prefix`` (or ``mqtts://``) as one device.

    Over ``mqtts://`` with a client certificate (the device's enrolled identity,
    ``<state>/identity/device.crt`` and ``device.key``), the broker names the
    device by its certificate and its ACL confines it to its own topics. The
    device receives only messages addressed to it: there are no group topics.

    Args:
        url: the broker and topic prefix; ``ca``, ``cert`` and ``key`` may also be
            given in its query (the arguments win).
        device_id: this device's id (its certificate's common name).
        ca: PEM CA the broker's certificate must chain to (default: the system's roots).
        cert: PEM client certificate naming this device.
        key: the client certificate's PEM private key.
        connect_timeout_s: how long to wait for the broker's answers.
        fetch_window: chunks asked for per fetch request.
        send_timeout_s: how long ``send`` waits while the broker stops acknowledging.

    Raises:
        TransportError: the URL is malformed, TLS files are given for ``mqtt://``,
            a certificate without its key or the other way round, or the TLS files
            cannot be loaded (from the constructor).
    """

    def __init__(
        self,
        url: str,
        device_id: str,
        *,
        ca: Path | None = None,
        cert: Path | None = None,
        key: Path | None = None,
        connect_timeout_s: float = 10.0,
        fetch_window: int = 32,
        send_timeout_s: float = 30.0,
    ) -> None:
        try:
            self._ep = MqttEndpoint.parse(url)
            self._topics = self._ep.topics
            self._status_topic = self._topics.status(device_id)
        except ProtocolError as exc:
            raise TransportError(str(exc)) from exc
        self._tls = _tls_context(self._ep, ca, cert, key)
        self.url = self._ep.redacted()
        self._device_id = device_id
        self._connect_timeout_s = connect_timeout_s
        self._send_timeout_s = send_timeout_s
        self._fetch_window = max(1, min(fetch_window, 64))
        self._client: LeanClient | None = None
        self._incoming: asyncio.Queue[pb.Envelope | TransportError] = asyncio.Queue()
        self._waiters: dict[str, asyncio.Future[Any]] = {}
        self._fetches: dict[bytes, asyncio.Queue[tuple[str, bytes] | TransportError]] = {}
        #: Inference requests waiting for their answer, by correlation data (request id).
        self._infers: dict[bytes, asyncio.Future[tuple[str, bytes]]] = {}
        self._seen: OrderedDict[str, None] = OrderedDict()
        self._welcomed = asyncio.Event()
        self._unacked: set[int] = set()
        self._drained = Wake()
        self._drained.set()
        self._lost: str | None = None
        self._io: PahoLoop | None = None
        self._tasks: list[asyncio.Task[None]] = []
        #: Messages from the broker this transport refused, by reason.
        self.dropped: Counter[str] = Counter()

    # -- paho, driven from the event loop ---------------------------------------------

    def _make_client(self) -> LeanClient:
        ep = self._ep
        client_id = ep.client_id or f"es-{self._device_id}-{ep.prefix_tag()}"
        client = LeanClient(
            CallbackAPIVersion.VERSION2,
            client_id=client_id,
            protocol=mqtt.MQTTv5,
            reconnect_on_failure=False,
        )
        # The user name defaults to the device id; a broker that names clients by
        # their certificate (use_identity_as_username) ignores it.
        client.username_pw_set(ep.username or self._device_id, ep.password)
        if self._tls is not None:
            client.tls_set_context(self._tls)
        client.connect_timeout = self._connect_timeout_s
        client.will_set(self._status_topic, STATUS_OFFLINE, qos=1, retain=True)
        return client

    def _install_callbacks(self, client: mqtt.Client) -> None:
        client.on_connect = lambda _c, _u, _f, rc, _p: self._on_connack(rc)
        client.on_disconnect = lambda _c, _u, _f, rc, _p: self._on_lost(str(rc))
        client.on_subscribe = lambda _c, _u, mid, rcs, _p: self._on_suback(mid, rcs)
        client.on_publish = lambda _c, _u, mid, _rc, _p: self._on_puback(mid)
        client.on_message = lambda _c, _u, msg: self._on_message(*_unpack(msg))

    def _on_connack(self, rc: ReasonCode) -> None:
        self._resolve("connack", None if not rc.is_failure else TransportError(f"refused: {rc}"))

    def _on_suback(self, mid: int, codes: list[ReasonCode]) -> None:
        bad = [str(c) for c in codes if c.is_failure]
        self._resolve(f"sub-{mid}", TransportError(f"subscription refused: {bad}") if bad else None)

    def _on_puback(self, mid: int) -> None:
        self._unacked.discard(mid)
        if len(self._unacked) < _UNACKED_CAP // 2:
            self._drained.set()
        self._resolve(f"pub-{mid}", None)

    def _resolve(self, key: str, error: TransportError | None) -> None:
        fut = self._waiters.pop(key, None)
        if fut is not None and not fut.done():
            if error is None:
                fut.set_result(None)
            else:
                fut.set_exception(error)

    def _on_lost(self, reason: str) -> None:
        if self._lost is not None:
            return
        self._lost = reason
        error = _Lost(f"connection to {self.url} lost: {reason}")
        self._incoming.put_nowait(error)
        for queue in self._fetches.values():
            queue.put_nowait(error)
        for waiting in self._infers.values():
            if not waiting.done():
                waiting.set_exception(error)
        for key in list(self._waiters):
            self._resolve(key, error)
        self._drained.set()

    def _on_message(self, topic: str, payload: bytes, corr: bytes | None, ctype: str) -> None:
        if corr is not None and topic == self._topics.down(self._device_id, "fetch"):
            queue = self._fetches.get(corr)
            if queue is None or queue.qsize() >= 256:
                self.dropped["stale-chunk"] += 1
            else:
                queue.put_nowait((ctype, payload))
            return
        if corr is not None and topic == self._topics.down(self._device_id, "infer"):
            answer = self._infers.get(corr)
            if answer is None or answer.done():
                self.dropped["stale-infer"] += 1
            else:
                answer.set_result((ctype, payload))
            return
        try:
            env = decode_envelope(payload)
        except ProtocolError as exc:
            self.dropped["malformed"] += 1
            log.debug("dropped a message on %s: %s", topic, exc)
            return
        if env.id in self._seen:
            self.dropped["duplicate"] += 1
            return
        self._seen[env.id] = None
        if len(self._seen) > _SEEN_CAP:
            self._seen.popitem(last=False)
        if kind_of(env) == "welcome":
            self._welcomed.set()
        if self._incoming.qsize() >= _QUEUE_CAP:
            self.dropped["overflow"] += 1  # acks come again on resend; desired is retained
            return
        self._incoming.put_nowait(env)

    async def _wait(self, key: str, timeout_s: float | None = None) -> None:
        fut = asyncio.get_running_loop().create_future()
        self._waiters[key] = fut
        try:
            async with asyncio.timeout(timeout_s or self._connect_timeout_s):
                await fut
        except TimeoutError as exc:
            raise TransportError(f"{self.url} did not answer ({key}) in time") from exc
        finally:
            self._waiters.pop(key, None)

    # -- the AgentTransport interface ----------------------------------------------

    async def connect(self, register: pb.Envelope) -> None:
        """Connect to the broker, subscribe, announce presence and send ``register``.

        Raises:
            TransportError: the broker is unreachable, refused us, or did not answer in time.
        """
        client = self._client = self._make_client()
        try:
            await self._open_socket(client)
            await self._wait("connack")
            await self._subscribe(client, register)
            self._publish(self._status_topic, STATUS_ONLINE, retain=True)
            self._publish_envelope(register)
        except BaseException:
            self._on_lost("not connected")  # nothing to say goodbye on: just drop the socket
            await self.close()
            raise
        self._tasks.append(asyncio.create_task(self._retry_register(register)))

    async def _open_socket(self, client: mqtt.Client) -> None:
        props = Properties(PacketTypes.CONNECT)
        props.SessionExpiryInterval = (
            _DEFAULT_SESSION_EXPIRY_S
            if self._ep.session_expiry_s is None
            else self._ep.session_expiry_s
        )
        props.MaximumPacketSize = _MAX_PACKET
        keepalive = self._ep.keepalive_s or _DEFAULT_KEEPALIVE_S
        connect = functools.partial(
            client.connect,
            self._ep.host,
            self._ep.port,
            keepalive,
            clean_start=False,
            properties=props,
        )
        # Keepalive bookkeeping when a ping falls due, and at least every K / 2 s, not
        # every second: thousands of agents on one simulator host (and every board's
        # idle CPU) pay for each wake-up.
        misc_s = max(1.0, keepalive / 2)
        io = self._io = PahoLoop(client, self.url, TransportError, misc_interval_s=misc_s)
        await io.connect(connect, self._connect_timeout_s + 1)
        self._install_callbacks(client)
        io.watch()

    async def _subscribe(self, client: mqtt.Client, register: pb.Envelope) -> None:
        # Retained desired state is sent only for a new subscription; a resumed
        # session gets what was queued for it instead of a second copy.
        opts = SubscribeOptions(qos=1, retainHandling=SubscribeOptions.RETAIN_SEND_IF_NEW_SUB)
        rc, mid = client.subscribe([(self._topics.device_down_filter(self._device_id), opts)])
        if rc != mqtt.MQTT_ERR_SUCCESS or mid is None:
            raise TransportError(f"cannot subscribe: {mqtt.error_string(rc)}")
        await self._wait(f"sub-{mid}")

    async def _retry_register(self, register: pb.Envelope) -> None:
        # A register published while no hub was subscribed is gone; ask again.
        delay, cap = _REGISTER_RETRY_S
        while not self._welcomed.is_set() and self._lost is None:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(delay):
                    await self._welcomed.wait()
            if self._welcomed.is_set() or self._lost is not None:
                return
            again = pb.Envelope()
            again.CopyFrom(register)
            again.id, again.sent_at_ms = new_id(), now_ms()
            with contextlib.suppress(TransportError):
                self._publish_envelope(again)
            delay = min(cap, delay * 2)

    def _check_open(self) -> LeanClient:
        if self._client is None:
            raise TransportError("not connected to the broker")
        if self._lost is not None:
            raise TransportError(f"connection to {self.url} lost: {self._lost}")
        return self._client

    def _publish(
        self, topic: str, payload: bytes, *, retain: bool = False, props: Properties | None = None
    ) -> int:
        client = self._check_open()
        rc, mid = client.publish_at_least_once(topic, payload, retain=retain, properties=props)
        if rc != mqtt.MQTT_ERR_SUCCESS:
            raise TransportError(f"publish on {topic} failed: {mqtt.error_string(rc)}")
        self._unacked.add(mid)
        if len(self._unacked) >= _UNACKED_CAP:
            self._drained.clear()
        return mid

    def _publish_envelope(self, env: pb.Envelope) -> None:
        try:
            payload, kind = encode_envelope(env), kind_of(env)
            topic = self._topics.up(self._device_id, kind)
        except ProtocolError as exc:
            raise TransportError(f"cannot send: {exc}") from exc
        self._publish(topic, payload)

    async def send(self, env: pb.Envelope) -> None:
        """Publish one envelope at QoS 1 on this device's ``up`` topic for its kind.

        Waits (bounded) while too many publishes await the broker's PUBACK.

        Raises:
            TransportError: not connected, the broker stopped acknowledging, or the
                envelope is over the size cap.
        """
        self._check_open()
        if not await self._drained.wait(self._send_timeout_s):
            raise TransportError(f"{self.url} stopped acknowledging publishes")
        self._publish_envelope(env)

    async def receive(self) -> pb.Envelope:
        """Next envelope from the hub; duplicates and malformed messages are dropped.

        Raises:
            TransportError: not connected, or the connection was lost.
        """
        self._check_open()
        item = await self._incoming.get()
        if isinstance(item, TransportError):
            self._incoming.put_nowait(item)  # every later caller sees the same end
            raise item
        return item

    async def _fetch(self, path: str, offset: int, max_bytes: int) -> AsyncIterator[bytes]:
        self._check_open()
        if not self._welcomed.is_set():  # the hub serves registered devices only
            try:
                async with asyncio.timeout(self._connect_timeout_s):
                    await self._welcomed.wait()
            except TimeoutError as exc:
                raise TransportError(f"no welcome from the hub behind {self.url}") from exc
        corr = new_id().encode()
        queue: asyncio.Queue[tuple[str, bytes] | TransportError] = asyncio.Queue()
        self._fetches[corr] = queue
        try:
            while True:
                req = pb.FetchRequest(
                    device_id=self._device_id, path=path, offset=offset, max_bytes=max_bytes
                )
                topic, payload, props = window_request(
                    self._topics, self._device_id, corr, req, self._fetch_window
                )
                self._publish(topic, payload, props=props)
                for _ in range(self._fetch_window):
                    item = await queue.get()
                    if isinstance(item, TransportError):
                        raise item
                    chunk = read_chunk(*item, path, offset, max_bytes)
                    if chunk.offset < offset:
                        continue  # a redelivered chunk already taken
                    offset += len(chunk.data)
                    yield chunk.data
                    if chunk.last:
                        return
        finally:
            self._fetches.pop(corr, None)

    async def infer_tail(self, request: pb.InferRequest, timeout_s: float) -> pb.InferResponse:
        """Run a tail on the hub: MQTT 5 request/response on this device's ``infer`` topics.

        The request goes to ``up/infer`` with response topic ``down/infer`` and the
        request id as correlation data; the hub answers there with an
        ``InferResponse`` (content type :data:`~protos.topics.INFER_CONTENT_TYPE`)
        or an ``Error`` (:data:`~protos.topics.ERROR_CONTENT_TYPE`) whose code says
        why. The broker names the device by this connection's topic.

        Raises:
            InferRefusedError: The hub refused, or the request is malformed or over the cap.
            TransportError: Not connected or registered, the connection was lost, no
                answer came in ``timeout_s``, or the answer is malformed or over the cap.
        """
        self._check_open()
        corr = request.request_id.encode()
        if not 0 < len(corr) <= MAX_CORRELATION_BYTES or corr in self._infers:
            raise InferRefusedError(
                f"an inference request needs a unique request id of 1..{MAX_CORRELATION_BYTES} "
                "bytes",
                "invalid-argument",
            )
        payload = request.SerializeToString()
        if len(payload) > MAX_INFER_BYTES:
            raise InferRefusedError(
                f"an inference request of {len(payload)} bytes is over the {MAX_INFER_BYTES} "
                "byte cap",
                "invalid-argument",
            )
        answer: asyncio.Future[tuple[str, bytes]] = asyncio.get_running_loop().create_future()
        self._infers[corr] = answer
        try:
            async with asyncio.timeout(timeout_s):
                await self._welcomed.wait()  # the hub serves registered devices only
                self._publish(
                    self._topics.up(self._device_id, "infer"),
                    payload,
                    props=self._response_props("infer", corr),
                )
                ctype, body = await answer
        except TimeoutError as exc:
            raise TransportError(f"no inference answer from {self.url} in {timeout_s:g} s") from exc
        finally:
            self._infers.pop(corr, None)
        return _infer_answer(ctype, body)

    def _response_props(self, kind: str, corr: bytes) -> Properties:
        return publish_properties(
            response_topic=self._topics.down(self._device_id, kind), correlation=corr
        )

    async def close(self) -> None:
        """Say ``offline``, disconnect and stop watching the socket; safe to call twice."""
        for task in self._tasks:
            task.cancel()
        self._tasks.clear()
        client, self._client = self._client, None
        if client is None:
            return
        if self._lost is None:
            self._client = client
            with contextlib.suppress(TransportError):
                mid = self._publish(self._status_topic, STATUS_OFFLINE, retain=True)
                if mid in self._unacked:
                    await self._wait(f"pub-{mid}", _CLOSE_TIMEOUT_S)
            self._client = None
            if client.disconnect() == mqtt.MQTT_ERR_SUCCESS and self._io is not None:
                # The writer sends the DISCONNECT, then paho closes the socket.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(_CLOSE_TIMEOUT_S):
                        await self._io.closed.wait()
        self._on_lost("closed")
        if self._io is not None:
            self._io.close()


def _infer_answer(content_type: str, payload: bytes) -> pb.InferResponse:
    """Read the hub's answer to an inference request.

    Raises:
        InferRefusedError: The answer is a refusal.
        TransportError: The answer is another error, malformed or over the cap.
    """
    if len(payload) > MAX_INFER_BYTES:
        raise TransportError(f"an inference answer over the {MAX_INFER_BYTES} byte cap")
    try:
        if content_type == INFER_CONTENT_TYPE:
            return pb.InferResponse.FromString(payload)
        if content_type == ERROR_CONTENT_TYPE:
            error = pb.Error.FromString(payload)
        else:
            raise TransportError(f"an inference answer of type {content_type[:64]!r}")
    except DecodeError as exc:
        raise TransportError(f"a malformed inference answer: {exc}") from exc
    message = error.message[:1000] or error.code[:64]
    if error.code in INFER_REFUSALS:
        raise InferRefusedError(message, error.code)
    raise TransportError(f"the hub could not answer ({error.code[:64]}): {message}")


def _tls_context(
    ep: MqttEndpoint, ca: Path | None, cert: Path | None, key: Path | None
) -> ssl.SSLContext | None:
    """The TLS context for ``ep`` (``None`` for ``mqtt://``); arguments win over the URL's."""
    ca_file = ca or (Path(ep.ca_file) if ep.ca_file else None)
    cert_file = cert or (Path(ep.cert_file) if ep.cert_file else None)
    key_file = key or (Path(ep.key_file) if ep.key_file else None)
    if not ep.tls:
        if any(f is not None for f in (ca_file, cert_file, key_file)):
            raise TransportError(f"TLS files given for {ep.redacted()}: use mqtts://")
        return None
    if (cert_file is None) != (key_file is None):
        raise TransportError("a client certificate and its key go together")
    try:
        ctx = ssl.create_default_context(cafile=ca_file)
        if cert_file is not None and key_file is not None:
            ctx.load_cert_chain(cert_file, key_file)
    except (OSError, ssl.SSLError, ValueError) as exc:
        raise TransportError(f"cannot load the TLS files for {ep.redacted()}: {exc}") from exc
    return ctx


def _unpack(msg: mqtt.MQTTMessage) -> tuple[str, bytes, bytes | None, str]:
    """Copy what the agent needs out of a paho message."""
    props = msg.properties
    corr = getattr(props, "CorrelationData", None) if props is not None else None
    ctype = getattr(props, "ContentType", "") if props is not None else ""
    return msg.topic, bytes(msg.payload), bytes(corr) if corr is not None else None, str(ctype)
