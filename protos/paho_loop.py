"""Drive a paho-mqtt client from the asyncio event loop instead of paho's network thread.

paho's own thread waits with ``select()``, which cannot watch a descriptor numbered
1024 or more (so hundreds of connections in one process starve), and it costs a
thread per connection. Here the socket is watched with the loop's ``add_reader`` and
``add_writer`` and a task runs paho's keepalive about once a second. Only paho's
blocking connect (TCP connect, TLS handshake) runs on a worker thread, while no
callback is installed; after :meth:`PahoLoop.watch` every paho call and callback
happens on the event loop. The agent's transport and the hub's broker client both
use it; each names the error type it raises.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import ssl
import struct
from collections.abc import Callable
from typing import Any

import paho.mqtt.client as mqtt
from paho.mqtt import _packet
from paho.mqtt.enums import MessageState, MQTTErrorCode, MQTTProtocolVersion
from paho.mqtt.exception import MalformedPacket
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties, VariableByteIntegers
from paho.mqtt.reasoncodes import ReasonCode

__all__ = ["LeanClient", "PackedProperties", "PahoLoop", "publish_properties"]

_MISC_INTERVAL_S = 1.0
#: Shortest wait between two runs of paho's keepalive bookkeeping (its own loop's step).
_MISC_MIN_S = 1.0
#: Added to the wait for a ping's due time, so that paho finds it due when it looks.
_MISC_SLACK_S = 0.05
#: How far past its due time a ping may wait, as a share of the keepalive: a packet the
#: client sends meanwhile (an agent's heartbeat, as often as the keepalive) makes it
#: needless. The broker waits one and a half keepalives before it gives up on a client.
_PING_GRACE = 0.25
#: Bytes taken off the socket per read; paho then parses packets out of them.
_READ_CHUNK = 256 * 1024
#: Most bytes of queued packets joined into one ``send``.
_WRITE_CHUNK = 64 * 1024
_U16 = struct.Struct("!H")
_PUBLISH = 0x30
_DISCONNECT = 0xE0
#: The slot of ``MQTTMessage.info``, which :class:`_Received` fills on first use.
_SLOT_INFO: Any = vars(mqtt.MQTTMessage)["info"]


class _Received(mqtt.MQTTMessage):
    """An incoming message whose :class:`~paho.mqtt.client.MQTTMessageInfo` is made on first use.

    paho gives every message it receives an info object (a ``threading.Condition``
    inside) that only a publisher waits on; a fifth of the cost of receiving one.
    """

    __slots__ = ()

    @property  # type: ignore[override]
    def info(self) -> mqtt.MQTTMessageInfo:
        try:
            info: mqtt.MQTTMessageInfo = _SLOT_INFO.__get__(self)
        except AttributeError:
            info = mqtt.MQTTMessageInfo(self.mid)
            _SLOT_INFO.__set__(self, info)
        return info

    @info.setter
    def info(self, value: mqtt.MQTTMessageInfo) -> None:
        _SLOT_INFO.__set__(self, value)


def _received(mid: int, topic: bytes) -> _Received:
    """``MQTTMessage(mid, topic)`` without running its constructor (which makes the info)."""
    msg = _Received.__new__(_Received)
    msg.timestamp = 0.0
    msg.state = MessageState.MQTT_MS_INVALID
    msg.dup = False
    msg.mid = mid
    msg._topic = topic
    msg.payload = b""
    msg.qos = 0
    msg.retain = False
    msg.properties = None
    return msg


class _Sent(mqtt.MQTTMessage):
    """An outgoing QoS 1 message nobody waits on: no :class:`~paho.mqtt.client.MQTTMessageInfo`.

    paho touches a sent message's info only to mark it published when its PUBACK
    comes; :meth:`LeanClient.publish_at_least_once` returns the id and the code
    instead, so that stand-in does nothing.
    """

    __slots__ = ()

    @property  # type: ignore[override]
    def info(self) -> mqtt.MQTTMessageInfo:
        return _UNWATCHED  # type: ignore[return-value]

    @info.setter
    def info(self, value: mqtt.MQTTMessageInfo) -> None:
        raise AttributeError("a message sent by publish_at_least_once has no info")


_NO_PROPERTIES = Properties(PacketTypes.PUBLISH)


def _no_properties() -> Properties:
    """An empty PUBLISH ``Properties``, as paho would build, without rebuilding its tables.

    ``Properties.__init__`` builds three lookup tables that no method changes; the
    copy shares them, and gets its own attributes as properties are set.
    """
    props: Properties = Properties.__new__(Properties)
    props.__dict__.update(_NO_PROPERTIES.__dict__)
    return props


#: MQTT 5 identifiers of the PUBLISH properties :func:`publish_properties` writes.
_CONTENT_TYPE, _RESPONSE_TOPIC, _CORRELATION_DATA, _USER_PROPERTY = 0x03, 0x08, 0x09, 0x26
_MAX_FIELD = 65_535


class PackedProperties(Properties):
    """PUBLISH properties packed once, read like paho's and never changed.

    paho builds three lookup tables for every ``Properties`` it makes and walks
    every property name to pack one: some 40 µs a publish, most of a request's
    cost on an agent fetching over MQTT. These share paho's tables and keep the
    bytes :func:`publish_properties` packed; setting a property afterwards is
    refused rather than silently left out of the packet.
    """

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("packed properties cannot be changed; build new ones")

    def pack(self) -> bytes:
        """The packed properties, length first, as paho's ``pack`` gives them."""
        packed: bytes = self.__dict__["_packed"]
        return packed


def _field(data: bytes) -> bytes:
    if len(data) > _MAX_FIELD:
        raise ValueError(f"an MQTT property field is {len(data)} bytes, over {_MAX_FIELD}")
    return _U16.pack(len(data)) + data


def publish_properties(
    *,
    content_type: str | None = None,
    response_topic: str | None = None,
    correlation: bytes | None = None,
    user: tuple[tuple[str, str], ...] = (),
) -> PackedProperties:
    """PUBLISH properties with the bytes paho would pack for the same values.

    Raises:
        ValueError: a value is over the 65,535 bytes MQTT allows.
    """
    body = bytearray()
    values: dict[str, object] = {}
    if content_type is not None:
        body += bytes((_CONTENT_TYPE,)) + _field(content_type.encode())
        values["ContentType"] = content_type
    if response_topic is not None:
        body += bytes((_RESPONSE_TOPIC,)) + _field(response_topic.encode())
        values["ResponseTopic"] = response_topic
    if correlation is not None:
        body += bytes((_CORRELATION_DATA,)) + _field(correlation)
        values["CorrelationData"] = correlation
    for key, value in user:
        body += bytes((_USER_PROPERTY,)) + _field(key.encode()) + _field(value.encode())
    if user:
        values["UserProperty"] = list(user)
    props = PackedProperties.__new__(PackedProperties)
    props.__dict__.update(_NO_PROPERTIES.__dict__)
    props.__dict__.update(values)
    props.__dict__["_packed"] = VariableByteIntegers.encode(len(body)) + bytes(body)
    return props


#: What a plain PUBACK (two bytes: no reason code, no properties) says: success, nothing else.
_PUBACK_SUCCESS = ReasonCode(PacketTypes.PUBACK)
_PUBACK_NO_PROPERTIES = Properties(PacketTypes.PUBACK)


class _Unwatched:
    """Stands in for a publish's :class:`~paho.mqtt.client.MQTTMessageInfo` nobody keeps."""

    __slots__ = ()

    def _set_as_published(self) -> None:
        pass


_UNWATCHED = _Unwatched()


class LeanClient(mqtt.Client):
    """A paho client with the costs of its message path taken out.

    * paho reads every packet with two or three ``recv`` calls (the type byte, the
      length, the body); this client takes whatever the socket holds in one call,
      cuts the packets that are whole out of it at once and hands paho's reader
      only what is cut short.
    * paho matches every message's topic against the filters of
      ``message_callback_add`` even when there are none (a tenth of a hub's
      time under load); this client has none and calls ``on_message`` directly.
    * paho decodes an MQTT 5 PUBLISH through a generic properties parser that
      rebuilds its lookup tables for every message, and gives each message a
      thread condition for publishers to wait on; this client builds the same
      message with the tables shared and the condition made only if asked for.
    * :meth:`publish_at_most_once` and :meth:`publish_at_least_once` send QoS 0
      and QoS 1 messages without the :class:`~paho.mqtt.client.MQTTMessageInfo`
      nobody waits on.
    * paho writes each queued packet with a ``send`` of its own (a hub queues a
      PUBACK and an ack per message); this client joins the queued packets that
      need nothing done once written into one ``send``.

    They override private methods of the pinned paho-mqtt 2.2; the tests in
    ``tests/protos/test_paho_lean.py`` compare them with paho's own.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._rbuf = bytearray()
        self._rbuf_of: object = None

    def buffered(self) -> int:
        """Bytes read from the socket that paho has not parsed yet."""
        return len(self._rbuf) if self._rbuf_of is self._sock else 0

    def message_callback_add(self, sub: str, callback: Any) -> None:
        """Not offered: every message goes to ``on_message``.

        Raises:
            NotImplementedError: always.
        """
        raise NotImplementedError("LeanClient delivers every message to on_message")

    def _handle_on_message(self, message: mqtt.MQTTMessage) -> None:
        on_message = self.on_message
        if on_message is not None:
            with self._in_callback_mutex:
                on_message(self, self._userdata, message)

    def _checked_publish(self, topic: str, payload: bytes) -> tuple[bytes, int]:
        """The topic as bytes and a new message id, once both are checked as paho checks them.

        Raises:
            ValueError: the topic holds a wildcard or is too long, or the payload is
                too large.
        """
        topic_bytes = topic.encode()
        self._raise_for_invalid_topic(topic_bytes)
        if len(payload) > 268_435_455:
            raise ValueError("Payload too large.")
        return topic_bytes, self._mid_generate()

    def publish_at_most_once(self, topic: str, payload: bytes) -> MQTTErrorCode:
        """Send ``payload`` at QoS 0, not retained, without properties; the return code.

        The packet is the one ``publish(topic, payload, qos=0)`` sends and
        ``on_publish`` still fires once it is written, but nothing is returned to
        wait on.

        Raises:
            ValueError: the topic holds a wildcard or is too long, or the payload is
                too large.
        """
        topic_bytes, mid = self._checked_publish(topic, payload)
        if self._sock is None:
            return MQTTErrorCode.MQTT_ERR_NO_CONN
        v5 = self._protocol == MQTTProtocolVersion.MQTTv5
        packet = bytearray((_PUBLISH,))
        self._pack_remaining_length(packet, 2 + len(topic_bytes) + v5 + len(payload))
        packet += _U16.pack(len(topic_bytes))
        packet += topic_bytes
        if v5:
            packet.append(0)  # no properties
        packet += payload
        if self._logger is not None or self.on_log is not None:
            self._easy_log(
                mqtt.MQTT_LOG_DEBUG,
                "Sending PUBLISH (d0, q0, r0, m%d), '%s', ... (%d bytes)",
                mid,
                topic_bytes,
                len(payload),
            )
        return self._packet_queue(_PUBLISH, packet, mid, 0, _UNWATCHED)  # type: ignore[arg-type]

    def publish_at_least_once(
        self,
        topic: str,
        payload: bytes,
        *,
        retain: bool = False,
        properties: Properties | None = None,
    ) -> tuple[MQTTErrorCode, int]:
        """Send ``payload`` at QoS 1 as ``publish(topic, payload, qos=1)`` does; its code and id.

        The packet, the resends, the inflight queue and ``on_publish`` are paho's,
        but no :class:`~paho.mqtt.client.MQTTMessageInfo` is made: its thread
        condition was a tenth of a simulated agent's time, and the agents wait
        for ``on_publish``, never on the info.

        Raises:
            ValueError: the topic holds a wildcard or is too long, or the payload is
                too large.
        """
        topic_bytes, mid = self._checked_publish(topic, payload)
        message = _Sent.__new__(_Sent)
        message.timestamp = mqtt.time_func()
        message.state = MessageState.MQTT_MS_INVALID
        message.mid = mid
        message._topic = topic_bytes
        message.payload = payload
        message.qos = 1
        message.retain = retain
        message.dup = False
        message.properties = properties
        with self._out_message_mutex:
            if (
                0 < self._max_queued_messages <= len(self._out_messages)
                or mid in self._out_messages
            ):
                return MQTTErrorCode.MQTT_ERR_QUEUE_SIZE, mid
            self._out_messages[mid] = message
            if self._max_inflight_messages and (
                self._inflight_messages >= self._max_inflight_messages
            ):
                message.state = MessageState.MQTT_MS_QUEUED
                return MQTTErrorCode.MQTT_ERR_SUCCESS, mid
            self._inflight_messages += 1
            message.state = MessageState.MQTT_MS_WAIT_FOR_PUBACK
            unwatched: Any = _UNWATCHED
            rc = self._send_publish(
                mid, topic_bytes, payload, 1, retain, False, unwatched, properties
            )
            if rc == MQTTErrorCode.MQTT_ERR_NO_CONN:  # sent again once connected
                self._inflight_messages -= 1
                message.state = MessageState.MQTT_MS_PUBLISH
            return rc, mid

    def _handle_pubackcomp(self, cmd: Any) -> MQTTErrorCode:
        """A plain MQTT 5 PUBACK without paho's decoding (a reason code and a fresh,
        empty ``Properties`` for every one); anything else goes to paho."""
        packet = self._in_packet["packet"]
        if cmd != "PUBACK" or self._protocol != MQTTProtocolVersion.MQTTv5 or len(packet) != 2:
            return super()._handle_pubackcomp(cmd)
        (mid,) = _U16.unpack(packet)
        if self._logger is not None or self.on_log is not None:
            self._easy_log(mqtt.MQTT_LOG_DEBUG, "Received PUBACK (Mid: %d)", mid)
        with self._out_message_mutex:
            if mid in self._out_messages:
                return self._do_on_publish(mid, _PUBACK_SUCCESS, _PUBACK_NO_PROPERTIES)
        return MQTTErrorCode.MQTT_ERR_SUCCESS

    def _handle_publish(self) -> MQTTErrorCode:
        if self._protocol != MQTTProtocolVersion.MQTTv5:
            return super()._handle_publish()
        header: int = self._in_packet["command"]
        message = _decode_publish(header, self._in_packet["packet"])
        if self._logger is not None or self.on_log is not None:
            self._easy_log(
                mqtt.MQTT_LOG_DEBUG,
                "Received PUBLISH (d%d, q%d, r%d, m%d), '%s', properties=%s, ...  (%d bytes)",
                message.dup,
                message.qos,
                message.retain,
                message.mid,
                _printable(message._topic),
                message.properties,
                len(message.payload),
            )
        message.timestamp = mqtt.time_func()
        qos = message.qos
        if qos == 0:
            self._handle_on_message(message)
            return MQTTErrorCode.MQTT_ERR_SUCCESS
        if qos == 1:
            self._handle_on_message(message)
            if self._manual_ack:
                return MQTTErrorCode.MQTT_ERR_SUCCESS
            return self._send_puback(message.mid)
        if qos == 2:
            rc = self._send_pubrec(message.mid)
            message.state = MessageState.MQTT_MS_WAIT_FOR_PUBREL
            with self._in_message_mutex:
                self._in_messages[message.mid] = message
            return rc
        return MQTTErrorCode.MQTT_ERR_PROTOCOL

    def _packet_write(self) -> MQTTErrorCode:
        """Write what is queued, and count it as traffic for the keepalive.

        paho-mqtt 2.2.0 (pinned) records a packet sent (``_last_msg_out``) only when it
        leaves its write loop by a path an emptied queue never takes, so a client
        publishing every few seconds still pinged once a keepalive; any packet the
        client sends keeps the connection alive (MQTT 5, 3.1.2.10).
        """
        out = self._out_packet
        if len(out) > 1:
            self._join_quiet_packets()
        if not out:
            return super()._packet_write()
        head, pos = out[0], out[0]["pos"]
        rc = super()._packet_write()
        if not out or out[0] is not head or head["pos"] != pos:  # some bytes went
            with self._msgtime_mutex:
                self._last_msg_out = mqtt.time_func()
        return rc

    def _join_quiet_packets(self) -> None:
        """Make the leading packets that need nothing done once written one packet.

        paho does something after writing a QoS 0 PUBLISH (``on_publish``, its info)
        and a DISCONNECT (closes); any other packet it only drops.
        """
        out, on_publish = self._out_packet, self.on_publish
        count = size = 0
        for packet in out:
            command = packet["command"] & 0xF0
            if command == _DISCONNECT or (
                command == _PUBLISH
                and packet["qos"] == 0
                and (on_publish is not None or not isinstance(packet["info"], _Unwatched))
            ):
                break
            if count and size + packet["to_process"] > _WRITE_CHUNK:
                break
            count += 1
            size += packet["to_process"]
        if count < 2:
            return
        joined = bytearray()
        for _ in range(count):
            packet = out.popleft()
            joined += memoryview(packet["packet"])[packet["pos"] :]
        out.appendleft(
            {
                "command": 0,  # no packet type: nothing to do once written
                "mid": 0,
                "qos": 0,
                "pos": 0,
                "to_process": len(joined),
                "packet": joined,
                "info": None,
            }
        )

    def _packet_read(self) -> MQTTErrorCode:
        """Handle the whole packet at the front of the read buffer, if there is one.

        paho reads a packet a byte at a time (the type, each byte of the length),
        then the body, through a dictionary of partial state: a tenth of a hub's
        time at thousands of messages a second. A packet already whole in the
        buffer is cut out of it at once and handed to paho's handlers just as
        paho would hand it; an empty buffer, a packet cut short or one paho has
        begun reading goes to paho's own reader.
        """
        buf = self._rbuf
        if self._in_packet["command"] or not buf or self._rbuf_of is not self._sock:
            return super()._packet_read()
        size = len(buf)
        length, mult, pos = 0, 1, 1
        while True:
            if pos >= size or pos > 4:  # cut short, or over MQTT's four length bytes
                return super()._packet_read()
            byte = buf[pos]
            pos += 1
            length += (byte & 0x7F) * mult
            if not byte & 0x80:
                break
            mult *= 128
        end = pos + length
        if end > size:
            return super()._packet_read()
        self._in_packet = {
            "command": buf[0],
            "have_remaining": 1,
            "remaining_count": list(buf[1:pos]),
            "remaining_mult": mult * 128,
            "remaining_length": length,
            "packet": buf[pos:end],
            "to_process": 0,
            "pos": 0,
        }
        del buf[:end]
        with self._msgtime_mutex:
            self._last_bytes_received = mqtt.time_func()
        try:
            rc = self._packet_handle()
        except MalformedPacket as exc:
            self._easy_log(mqtt.MQTT_LOG_DEBUG, "Received malformed packet: %s", exc)
            rc = MQTTErrorCode.MQTT_ERR_PROTOCOL
        self._in_packet = {
            "command": 0,
            "have_remaining": 0,
            "remaining_count": [],
            "remaining_mult": 1,
            "remaining_length": 0,
            "packet": bytearray(),
            "to_process": 0,
            "pos": 0,
        }
        return rc

    def _sock_recv(self, bufsize: int) -> bytes:
        if self._rbuf_of is not self._sock:  # a new connection: nothing of the old one
            self._rbuf.clear()
            self._rbuf_of = self._sock
        if not self._rbuf:
            data = super()._sock_recv(_READ_CHUNK)  # raises BlockingIOError when empty
            if not data:
                return b""  # closed: paho sees the connection lost
            self._rbuf += data
        out = bytes(self._rbuf[:bufsize])
        del self._rbuf[:bufsize]
        return out


def _decode_publish(header: int, packet: bytes | bytearray) -> mqtt.MQTTMessage:
    """An MQTT 5 PUBLISH as paho's ``decode_publish`` reads it, as paho's message.

    Raises:
        MalformedPacket: the packet is cut short or its properties are malformed.
    """
    qos = (header & 0x06) >> 1
    try:
        (topic_len,) = _U16.unpack_from(packet, 0)
        pos = 2 + topic_len
        if pos > len(packet):
            raise MalformedPacket("topic longer than the packet")
        message = _received(0, bytes(packet[2:pos]))
        if qos > 0:
            (message.mid,) = _U16.unpack_from(packet, pos)
            pos += 2
        if packet[pos] == 0:  # no properties, the usual case
            message.properties = _no_properties()
            pos += 1
        else:
            props = message.properties = _no_properties()
            end = _read_properties(props, packet, pos)
            if end is None:  # not one the short reader takes: paho reads it, or refuses it
                end = pos + props.unpack(bytes(packet[pos:]))[1]  # bytes values, as paho gives
            pos = end
    except _packet.DECODE_ERRORS as err:
        raise MalformedPacket(str(err)) from err
    message.dup = header & 0x08 != 0
    message.qos = qos
    message.retain = header & 0x01 != 0
    message.payload = bytes(packet[pos:])
    return message


#: The properties :func:`_read_properties` reads: their names, and whether a text value.
_SHORT_PROPERTIES = {
    _CONTENT_TYPE: ("ContentType", True),
    _RESPONSE_TOPIC: ("ResponseTopic", True),
    _CORRELATION_DATA: ("CorrelationData", False),
}


class _NotShort(Exception):
    """A property block :func:`_read_properties` leaves to paho."""


def _read_properties(props: Properties, packet: bytes | bytearray, pos: int) -> int | None:
    """Read the PUBLISH properties at ``pos`` into ``props``; the position after them.

    paho's ``Properties.unpack`` copies the rest of the packet for every field and
    looks each name up by walking its tables: a tenth of an agent's time while a
    fleet fetches its bundles, on the few properties the hub and its agents send
    each other (a fetch's response topic and correlation data, a reply's content
    type, user properties). Those are read here when their block is under 128
    bytes and well formed; for anything else (another property, a repeated one, a
    length that does not fit, text MQTT forbids) this returns None with ``props``
    untouched, and paho reads the block, or refuses it, as it always did.
    """
    size = packet[pos]
    end = pos + 1 + size
    if size >= 0x80 or end > len(packet):
        return None
    values: dict[str, Any] = {}
    users: list[tuple[str, str]] = []
    at = pos + 1
    try:
        while at < end:
            ident = packet[at]
            if ident == _USER_PROPERTY:
                key, at = _short_field(packet, at + 1, end)
                value, at = _short_field(packet, at, end)
                users.append((_mqtt_text(key), _mqtt_text(value)))
                continue
            name, is_text = _SHORT_PROPERTIES.get(ident) or ("", False)
            data, at = _short_field(packet, at + 1, end)
            if not name or name in values:
                raise _NotShort
            values[name] = _mqtt_text(data) if is_text else data
    except _NotShort:
        return None
    if users:
        values["UserProperty"] = users
    props.__dict__.update(values)
    return end


def _short_field(packet: bytes | bytearray, at: int, end: int) -> tuple[bytes, int]:
    """The length-prefixed field at ``at``, which must end by ``end``; the position after it."""
    if at + 2 > end:
        raise _NotShort
    (length,) = _U16.unpack_from(packet, at)
    after = at + 2 + length
    if after > end:
        raise _NotShort
    return bytes(packet[at + 2 : after]), after


def _mqtt_text(data: bytes) -> str:
    """``data`` as the UTF-8 text MQTT allows (no NUL, no U+FEFF)."""
    try:
        text = data.decode("utf-8")  # refuses the surrogates D800-DFFF, as MQTT does
    except UnicodeDecodeError:
        raise _NotShort from None
    if "\x00" in text or "\ufeff" in text:
        raise _NotShort
    return text


def _printable(topic: bytes) -> str:
    try:
        return topic.decode("utf-8")
    except UnicodeDecodeError:
        return f"TOPIC WITH INVALID UTF-8: {topic!r}"


class PahoLoop:
    """The network I/O of one paho client, run on the running event loop.

    Args:
        client: a paho client with no socket callbacks of its own.
        name: what to call the broker in error messages (a redacted URL).
        error: the exception type :meth:`connect` raises (the caller's transport error).
        misc_interval_s: the longest wait between two runs of paho's keepalive
            bookkeeping (its own loop runs it each second). It runs when a ping falls
            due (see :meth:`misc_wait_s`), and at least this often.
    """

    def __init__(
        self,
        client: mqtt.Client,
        name: str,
        error: type[Exception] = ConnectionError,
        misc_interval_s: float = _MISC_INTERVAL_S,
    ) -> None:
        self._client = client
        self._misc_interval_s = max(misc_interval_s, _MISC_MIN_S)
        self._name = name
        self._error = error
        self._loop = asyncio.get_running_loop()
        self._sock: socket.socket | None = None
        self._misc: asyncio.Task[None] | None = None
        #: A write at the end of this turn of the loop, asked for and not yet run.
        self._flush_soon: asyncio.Handle | None = None
        #: Whether the socket is registered for writability (it was full at a write).
        self._watching_write = False
        #: Set while this loop writes: paho's own "want write" then is answered after.
        self._writing = False
        #: Set once paho has closed the socket (a DISCONNECT sent, or the connection lost).
        self.closed = asyncio.Event()

    async def connect(self, connect: Callable[[], mqtt.MQTTErrorCode], timeout_s: float) -> None:
        """Run paho's blocking ``connect`` (bound to its arguments) on a worker thread.

        Install paho's callbacks after this returns, then call :meth:`watch`: a callback
        installed earlier could run on the worker thread.

        Raises:
            Exception: of the ``error`` type given: the broker is unreachable or did not
                answer in time.
        """
        connecting = self._loop.run_in_executor(None, connect)
        try:
            async with asyncio.timeout(timeout_s):
                rc = await asyncio.shield(connecting)
        except BaseException as exc:
            if not connecting.done():  # the thread goes on: close what it opens once it ends
                connecting.add_done_callback(self._abandon)
            if isinstance(exc, OSError | ValueError):  # TimeoutError is an OSError
                reason = str(exc) or "no answer in time"
                raise self._error(f"cannot reach the broker at {self._name}: {reason}") from exc
            raise
        sock = self._client.socket()
        if rc != mqtt.MQTT_ERR_SUCCESS or not isinstance(sock, socket.socket):
            self.close()
            reason = mqtt.error_string(rc) if rc else "connection closed"
            raise self._error(f"cannot reach the broker at {self._name}: {reason}")
        self._sock = sock

    def watch(self) -> None:
        """Hand the connected socket to the event loop and start the keepalive task."""
        sock, client, loop = self._sock, self._client, self._loop
        if sock is None or self.closed.is_set():
            return
        # paho never sets it; Nagle adds tens of ms to small request/response traffic.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        client.on_socket_close = lambda _c, _u, _s: self._unwatch()
        client.on_socket_register_write = lambda _c, _u, _s: self._want_write()
        client.on_socket_unregister_write = lambda _c, _u, _s: self._done_writing()
        loop.add_reader(sock, self._readable)
        if client.want_write():  # part of the CONNECT is still unsent
            self._want_write()
        self._misc = loop.create_task(self._keep_alive())

    def close(self) -> None:
        """Stop watching and close the socket if paho has not; safe to call twice."""
        if self._misc is not None:
            self._misc.cancel()
        sock = self._client.socket()
        if isinstance(sock, socket.socket) and sock.fileno() >= 0:
            self._unwatch()
            sock.close()
        self.closed.set()

    def _readable(self) -> None:
        client, sock = self._client, self._sock
        client.loop_read()
        # Whole packets may wait in the read buffer, which no poll reports either.
        while isinstance(client, LeanClient) and client.buffered() and client.socket() is sock:
            client.loop_read()
        # TLS may hold whole packets already taken off the socket, which no poll reports.
        while isinstance(sock, ssl.SSLSocket) and sock.pending() and client.socket() is sock:
            client.loop_read()

    def _want_write(self) -> None:
        """paho queued a packet: write what is queued at the end of this turn of the loop.

        Registering the socket with the selector for each packet, and taking it off
        once written, were two system calls a message, about a tenth of the CPU
        of 10,000 simulated agents. Written at the end of the turn, every packet queued in the turn
        goes in one send, and a socket with room (the usual case) is never watched:
        only one that was full is, until it drains.
        """
        sock = self._sock
        if self._writing or self._watching_write or self._flush_soon is not None:
            return  # a write is under way or due: it takes this packet too
        if self._client.socket() is not sock or sock is None:
            return  # closed already
        self._flush_soon = self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        self._flush_soon = None
        sock = self._sock
        if not isinstance(sock, socket.socket) or self._client.socket() is not self._sock:
            return  # closed since it was asked for
        self._write()
        still_open = sock.fileno() >= 0 and self._client.socket() is self._sock
        if still_open and self._client.want_write():
            self._watching_write = True  # full: write again once it has room
            self._loop.add_writer(sock, self._writable)

    def _writable(self) -> None:
        self._write()
        if not self._client.want_write():  # in case paho did not say so
            self._done_writing()

    def _write(self) -> None:
        self._writing = True
        try:
            self._client.loop_write()
        finally:
            self._writing = False

    def _done_writing(self) -> None:
        if not self._watching_write:
            return
        self._watching_write = False
        if self._sock is not None and self._sock.fileno() >= 0:
            self._loop.remove_writer(self._sock)

    def _unwatch(self) -> None:
        """Stop watching the socket; paho calls this just before it closes it."""
        sock, self._sock = self._sock, None
        if self._flush_soon is not None:
            self._flush_soon.cancel()
            self._flush_soon = None
        self._watching_write = False
        if sock is not None and sock.fileno() >= 0 and not self._loop.is_closed():
            self._loop.remove_reader(sock)
            self._loop.remove_writer(sock)
        self.closed.set()

    async def _keep_alive(self) -> None:
        # Pings, and the keepalive deadline that paho's own loop would check each second.
        while self._client.loop_misc() == mqtt.MQTT_ERR_SUCCESS:
            await asyncio.sleep(self.misc_wait_s())

    def misc_wait_s(self) -> float:
        """How long paho's keepalive bookkeeping has nothing to do, capped by ``misc_interval_s``.

        With a keepalive of K seconds it acts once K seconds have passed since the
        last packet sent or the last bytes received: it sends a ping then, and a
        ping unanswered K seconds later closes the connection (sending one sets both
        times, so that deadline is the same one). Before that it has nothing to do:
        looking at fixed steps of K / 8, an idle agent woke eight times a keepalive
        for the one ping, a third of its wake-ups (paho-mqtt 2.2.0 keeps these times;
        the version is pinned).

        It looks a quarter of a keepalive after the ping falls due (:data:`_PING_GRACE`),
        well within the broker's one and a half: an agent's heartbeat goes as often as
        its keepalive, and on a busy loop it went a little after the ping fell due, so
        a loaded agent sent a ping (and the broker answered it) beside every other
        heartbeat. A packet sent in the grace makes the ping needless; paho sends it
        only if it still finds the connection quiet for a keepalive.
        """
        client = self._client
        keepalive = client.keepalive
        if keepalive <= 0:
            return self._misc_interval_s
        with client._msgtime_mutex:
            quiet_since = min(client._last_msg_out, client._last_bytes_received)
        due = quiet_since + keepalive * (1 + _PING_GRACE)
        wait = due - mqtt.time_func() + _MISC_SLACK_S
        return min(max(wait, _MISC_MIN_S), self._misc_interval_s)

    def _abandon(self, connecting: asyncio.Future[mqtt.MQTTErrorCode]) -> None:
        """Close the socket of a connect given up on while its thread still ran."""
        if not connecting.cancelled():
            connecting.exception()  # retrieved: it was reported as a timeout already
        sock = self._client.socket()
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.close()
        self.closed.set()
