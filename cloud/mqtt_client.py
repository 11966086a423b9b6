"""The hub's broker connection: a paho client that reconnects on its own, bridged to asyncio.

paho runs on the asyncio loop (its socket watched with ``add_reader``), not in a
network thread: under load a thread per client meant a wake-up and a GIL
hand-over per message. A task reconnects with a capped backoff. Each message is
copied into an :class:`Incoming`. Subscriptions are (re)made on every connect,
so a broker restart without persistence is survived too.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import NamedTuple

import paho.mqtt.client as mqtt
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from paho.mqtt.reasoncodes import ReasonCode
from paho.mqtt.subscribeoptions import SubscribeOptions

from cloud.errors import TransportError
from protos.errors import ProtocolError
from protos.paho_loop import LeanClient, PahoLoop
from protos.topics import MqttEndpoint, Topics

__all__ = ["HubMqttClient", "Incoming", "clear_device_topics", "clear_retained", "tls_context"]

log = logging.getLogger(__name__)

#: First and longest wait between connection attempts, in seconds.
_RECONNECT_S = (1.0, 5.0)
#: Hub sessions are short by default: Mosquitto keeps handing a share of the
#: shared subscription to a dead hub's session until it expires.
DEFAULT_HUB_SESSION_EXPIRY_S = 30


class Incoming(NamedTuple):
    """One message from the broker, copied out of paho's message.

    A named tuple: the hub makes one per message it receives, and a frozen
    dataclass took several times as long to build.
    """

    topic: str
    payload: bytes
    response_topic: str | None = None
    correlation: bytes | None = None
    user: tuple[tuple[str, str], ...] = ()
    retained: bool = False


def _incoming(msg: mqtt.MQTTMessage) -> Incoming:
    props = msg.properties
    if props is None:
        return Incoming(msg.topic, bytes(msg.payload), retained=bool(msg.retain))
    rt = getattr(props, "ResponseTopic", None)
    corr = getattr(props, "CorrelationData", None)
    user = getattr(props, "UserProperty", None)
    return Incoming(
        msg.topic,
        bytes(msg.payload),
        str(rt) if rt is not None else None,
        bytes(corr) if corr is not None else None,
        tuple((str(k), str(v)) for k, v in user) if user else (),
        bool(msg.retain),
    )


def tls_context(ep: MqttEndpoint) -> ssl.SSLContext:
    """A TLS client context for ``ep``: its CA (or the system's) and its client certificate.

    Raises:
        TransportError: the CA, certificate or key file is missing, unreadable or bad.
    """
    try:
        ctx = ssl.create_default_context(cafile=ep.ca_file)
        if ep.cert_file and ep.key_file:
            ctx.load_cert_chain(ep.cert_file, ep.key_file)
    except (OSError, ssl.SSLError, ValueError) as exc:
        raise TransportError(f"cannot load the TLS files of {ep.redacted()}: {exc}") from exc
    return ctx


class HubMqttClient:
    """One hub process's connection to the broker, driven from the asyncio event loop.

    paho's socket is watched by the loop (:class:`protos.paho_loop.PahoLoop`), so
    every callback runs on the loop and nothing crosses threads; a task reconnects
    with a capped backoff when the connection ends.

    Args:
        endpoint: the parsed broker URL.
        subscriptions: filters and options, subscribed on every connect.
        on_message: called on the asyncio loop for every message.
        max_packet: largest packet the broker may send us (MQTT 5 Maximum Packet Size).

    Raises:
        TransportError: the endpoint's TLS files cannot be loaded.
    """

    def __init__(
        self,
        endpoint: MqttEndpoint,
        subscriptions: Sequence[tuple[str, SubscribeOptions]],
        on_message: Callable[[Incoming], None],
        *,
        max_packet: int,
        max_queued: int = 50_000,
    ) -> None:
        self.endpoint = endpoint
        self._subs = list(subscriptions)
        self._on_message = on_message
        self._subscribed = asyncio.Event()
        self.connected = False
        self._stopping = False
        self._io: PahoLoop | None = None
        self._runner: asyncio.Task[None] | None = None
        self.client_id = endpoint.client_id or (
            f"es-hub-{endpoint.prefix_tag()}-{socket.gethostname()[:32]}-{os.getpid()}"
        )
        self._client = self._make_client(max_packet, max_queued)

    def _make_client(self, max_packet: int, max_queued: int) -> LeanClient:
        ep = self.endpoint
        client = LeanClient(
            CallbackAPIVersion.VERSION2,
            client_id=self.client_id,
            protocol=mqtt.MQTTv5,
            reconnect_on_failure=False,
        )
        if ep.username:
            client.username_pw_set(ep.username, ep.password)
        if ep.tls:
            client.tls_set_context(tls_context(ep))
        client.max_queued_messages_set(max_queued)
        props = Properties(PacketTypes.CONNECT)
        expiry = ep.session_expiry_s
        props.SessionExpiryInterval = DEFAULT_HUB_SESSION_EXPIRY_S if expiry is None else expiry
        props.MaximumPacketSize = max_packet
        self._connect_props = props
        # Callbacks fire only while the loop reads the socket (never during paho's connect
        # on the worker thread), so they all run on the event loop.
        client.on_connect = lambda _c, _u, _f, rc, _p: self._connacked(rc)
        client.on_disconnect = lambda _c, _u, _f, rc, _p: self._set_connected(False, str(rc))
        client.on_subscribe = lambda _c, _u, _mid, rcs, _p: self._subacked(rcs)
        client.on_message = lambda _c, _u, msg: self._on_message(_incoming(msg))
        return client

    def _connacked(self, rc: ReasonCode) -> None:
        if rc.is_failure:
            log.warning("broker %s refused the hub: %s", self.endpoint.redacted(), rc)
            return
        self._client.subscribe(self._subs)
        self._set_connected(True)

    def _set_connected(self, up: bool, why: str = "") -> None:
        if self.connected and not up and not self._stopping:
            log.warning("lost the broker %s (%s); reconnecting", self.endpoint.redacted(), why)
        self.connected = up

    def _subacked(self, codes: list[ReasonCode]) -> None:
        bad = [str(c) for c in codes if c.is_failure]
        if bad:
            log.error("broker refused hub subscriptions: %s", ", ".join(bad))
            return
        self._subscribed.set()

    async def start(self, timeout_s: float = 10.0) -> None:
        """Connect and subscribe; later losses are repaired in the background.

        Raises:
            TransportError: no connection and subscription within ``timeout_s``.
        """
        self._runner = asyncio.create_task(self._stay_connected(timeout_s))
        try:
            async with asyncio.timeout(timeout_s):
                await self._subscribed.wait()
        except TimeoutError as exc:
            await self.stop()
            raise TransportError(
                f"the hub could not connect and subscribe to {self.endpoint.redacted()} "
                f"in {timeout_s} s"
            ) from exc

    async def _stay_connected(self, connect_timeout_s: float) -> None:
        ep, delay = self.endpoint, _RECONNECT_S[0]
        connect = functools.partial(
            self._client.connect,
            ep.host,
            ep.port,
            30,
            clean_start=False,
            properties=self._connect_props,
        )
        while not self._stopping:
            io = self._io = PahoLoop(self._client, ep.redacted(), TransportError)
            try:
                await io.connect(connect, connect_timeout_s)
            except TransportError as exc:
                log.debug("%s; trying again in %.0f s", exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, _RECONNECT_S[1])
                continue
            delay = _RECONNECT_S[0]
            io.watch()
            await io.closed.wait()
            self._set_connected(False, "connection closed")
            if not self._stopping:
                await asyncio.sleep(delay)

    def publish(
        self,
        topic: str,
        payload: bytes,
        *,
        retain: bool = False,
        props: Properties | None = None,
        qos: int = 1,
    ) -> bool:
        """Queue a publish, QoS 1 unless told (sent after a reconnect if the broker is away).

        Returns:
            False when paho refused it (its queue is full).
        """
        if qos == 0 and not retain and props is None:  # the hub's acks: one per message
            rc = self._client.publish_at_most_once(topic, payload)
        elif qos == 1:  # desired states and fetch replies: nobody waits on paho's info
            rc, _ = self._client.publish_at_least_once(
                topic, payload, retain=retain, properties=props
            )
        else:
            rc = self._client.publish(topic, payload, qos=qos, retain=retain, properties=props).rc
        return rc in (mqtt.MQTT_ERR_SUCCESS, mqtt.MQTT_ERR_NO_CONN)

    async def stop(self) -> None:
        """Say goodbye to the broker (bounded wait) and stop reconnecting."""
        self._stopping = True
        io = self._io
        if io is not None and self.connected:
            self._client.disconnect()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(5.0):
                    await io.closed.wait()
        if io is not None:
            io.close()
        if self._runner is not None:
            self._runner.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._runner
        self.connected = False


@contextlib.contextmanager
def _plain_client(url: str) -> Iterator[tuple[mqtt.Client, MqttEndpoint]]:
    """A short-lived paho client connected to the URL's broker, its network loop running.

    Raises:
        TransportError: the broker is unreachable or the URL is malformed.
    """
    try:
        ep = MqttEndpoint.parse(url)
    except ProtocolError as exc:
        raise TransportError(str(exc)) from exc
    client = mqtt.Client(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
    if ep.username:
        client.username_pw_set(ep.username, ep.password)
    if ep.tls:
        client.tls_set_context(tls_context(ep))
    try:
        client.connect(ep.host, ep.port, 10)
    except OSError as exc:
        raise TransportError(f"cannot reach {ep.redacted()}: {exc}") from exc
    client.loop_start()
    try:
        yield client, ep
    finally:
        client.disconnect()
        client.loop_stop()


def _delete_retained(client: mqtt.Client, topics: Sequence[str], timeout_s: float) -> int:
    """Publish an empty retained message on each topic; how many the broker acknowledged."""
    infos = [client.publish(t, b"", qos=1, retain=True) for t in topics]
    deadline = time.monotonic() + timeout_s
    for info in infos:
        info.wait_for_publish(max(0.0, deadline - time.monotonic()))
    return sum(info.is_published() for info in infos)


def clear_retained(url: str, timeout_s: float = 5.0) -> int:
    """Delete every retained message under the URL's topic prefix (tests, the demo).

    Returns:
        How many retained topics were cleared.

    Raises:
        TransportError: the broker is unreachable or the URL is malformed.
    """
    found: set[str] = set()
    lock = threading.Lock()
    last = [time.monotonic()]

    def on_message(_c: mqtt.Client, _u: object, msg: mqtt.MQTTMessage) -> None:
        if msg.retain and msg.payload:
            with lock:
                found.add(msg.topic)
                last[0] = time.monotonic()

    with _plain_client(url) as (client, ep):
        client.on_message = on_message
        client.subscribe(f"{ep.prefix}/#", qos=0)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline and time.monotonic() - last[0] < 0.5:
            time.sleep(0.05)
        with lock:
            topics = sorted(found)
        _delete_retained(client, topics, timeout_s)
    return len(topics)


def clear_device_topics(url: str, device_ids: Iterable[str], timeout_s: float = 30.0) -> int:
    """Delete what these devices have retained under the URL's prefix: desired state, status.

    Only their own topics: the prefix may be shared with other devices and hubs.
    An empty retained message on a topic that holds none changes nothing.

    Returns:
        How many of the topics the broker acknowledged clearing (two a device).

    Raises:
        TransportError: the broker is unreachable, or the URL or a device id is malformed.
    """
    with _plain_client(url) as (client, ep):
        topics = Topics(ep.prefix)
        try:
            names = [
                name
                for device in device_ids
                for name in (topics.down(device, "desired"), topics.status(device))
            ]
        except ProtocolError as exc:
            raise TransportError(str(exc)) from exc
        return _delete_retained(client, names, timeout_s)
