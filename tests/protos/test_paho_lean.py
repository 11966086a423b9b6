"""LeanClient's own PUBLISH paths against paho's: the same messages, replies and packets."""

from __future__ import annotations

import socket
from typing import Any

import paho.mqtt.client as mqtt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from paho.mqtt.enums import CallbackAPIVersion
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties

from protos.paho_loop import (
    LeanClient,
    PackedProperties,
    _no_properties,
    _read_properties,
    publish_properties,
)

TOPIC = "es/dev/d-1/up/telemetry"


def _properties(**values: Any) -> Properties:
    props = Properties(PacketTypes.PUBLISH)
    for name, value in values.items():
        setattr(props, name, value)
    return props


def _client(cls: type[mqtt.Client], protocol: mqtt.MQTTProtocolVersion) -> mqtt.Client:
    client = cls(CallbackAPIVersion.VERSION2, client_id="lean-test", protocol=protocol)
    # A socket paho thinks it writes to later: queued packets stay in _out_packet.
    client._sock = socket.socket()
    client.on_socket_register_write = lambda *_a: None
    return client


def _wire(
    protocol: mqtt.MQTTProtocolVersion,
    qos: int,
    *,
    retain: bool = False,
    payload: bytes = b"body",
    topic: str = TOPIC,
    props: Properties | None = None,
) -> tuple[int, bytes]:
    """A PUBLISH as the broker would send it: its first byte and what follows the length."""
    sender = _client(mqtt.Client, protocol)
    try:
        sender.publish(topic, payload, qos=qos, retain=retain, properties=props)
        packet = bytes(sender._out_packet[0]["packet"])
    finally:
        sender._sock.close()  # type: ignore[union-attr]
    length_bytes = 1
    while packet[length_bytes] & 0x80:
        length_bytes += 1
    return packet[0], packet[1 + length_bytes :]


def _receive(
    cls: type[mqtt.Client], protocol: mqtt.MQTTProtocolVersion, header: int, body: bytes
) -> tuple[Any, list[mqtt.MQTTMessage], list[bytes], dict[int, mqtt.MQTTMessage]]:
    client = _client(cls, protocol)
    got: list[mqtt.MQTTMessage] = []
    client.on_message = lambda _c, _u, msg: got.append(msg)
    client._in_packet["command"] = header
    client._in_packet["packet"] = bytearray(body)
    rc: object
    try:
        rc = client._handle_publish()
    except Exception as exc:
        rc = type(exc)
    sent = [bytes(p["packet"]) for p in client._out_packet]
    client._sock.close()  # type: ignore[union-attr]
    return rc, got, sent, dict(client._in_messages)


def _fields(msg: mqtt.MQTTMessage) -> dict[str, Any]:
    props = msg.properties
    return {
        "topic": msg.topic,
        "payload": (type(msg.payload), bytes(msg.payload)),
        "qos": msg.qos,
        "retain": msg.retain,
        "dup": msg.dup,
        "mid": msg.mid,
        "state": msg.state,
        "info": (type(msg.info), msg.info.mid, msg.info.rc),
        "properties": None if props is None else (type(props), props.json(), props.packetType),
    }


CASES = [
    pytest.param(0, {}, id="qos0"),
    pytest.param(1, {}, id="qos1"),
    pytest.param(2, {}, id="qos2"),
    pytest.param(1, {"retain": True}, id="retained"),
    pytest.param(0, {"payload": b""}, id="empty-payload"),
    pytest.param(1, {"payload": bytes(range(256)) * 600}, id="big-payload"),
    pytest.param(
        1,
        {
            "props": _properties(
                ResponseTopic="es/dev/d-1/down/fetch",
                CorrelationData=b"\x00\x01corr",
                UserProperty=[("window", "4"), ("window", "8")],
                ContentType="application/x-protobuf",
            )
        },
        id="properties",
    ),
    pytest.param(0, {"props": _properties(MessageExpiryInterval=30)}, id="expiry"),
]


@pytest.mark.parametrize(("qos", "extra"), CASES)
@pytest.mark.parametrize("dup", [False, True])
def test_publish_read_as_paho_reads_it(qos: int, extra: dict[str, Any], dup: bool) -> None:
    header, body = _wire(mqtt.MQTTv5, qos, **extra)
    header |= 0x08 if dup else 0
    paho = _receive(mqtt.Client, mqtt.MQTTv5, header, body)
    lean = _receive(LeanClient, mqtt.MQTTv5, header, body)
    assert lean[0] == paho[0]  # return code
    assert [_fields(m) for m in lean[1]] == [_fields(m) for m in paho[1]]
    assert lean[2] == paho[2]  # PUBACK or PUBREC sent
    assert {k: _fields(m) for k, m in lean[3].items()} == {
        k: _fields(m) for k, m in paho[3].items()
    }
    if qos == 2:  # held for the PUBREL, not delivered yet
        assert not lean[1] and list(lean[3]) == [lean[3][next(iter(lean[3]))].mid]
    else:
        assert len(lean[1]) == 1
        assert isinstance(lean[1][0], mqtt.MQTTMessage)


def test_properties_of_a_received_message_are_its_own() -> None:
    header, body = _wire(mqtt.MQTTv5, 0)
    _, (first,), _, _ = _receive(LeanClient, mqtt.MQTTv5, header, body)
    _, (second,), _, _ = _receive(LeanClient, mqtt.MQTTv5, header, body)
    assert first.properties is not None and second.properties is not None
    first.properties.ResponseTopic = "x/y"
    assert not hasattr(second.properties, "ResponseTopic")
    assert second.properties.isEmpty()
    assert first.info is first.info  # made once, then kept


def test_mqtt_311_messages_take_paho_s_own_path() -> None:
    header, body = _wire(mqtt.MQTTv311, 1, retain=True)
    paho = _receive(mqtt.Client, mqtt.MQTTv311, header, body)
    lean = _receive(LeanClient, mqtt.MQTTv311, header, body)
    assert [_fields(m) for m in lean[1]] == [_fields(m) for m in paho[1]]
    assert lean[2] == paho[2]


@pytest.mark.parametrize(
    "body",
    [
        b"",
        b"\x00",
        b"\x00\x09es/d",  # topic longer than the packet
        b"\x00\x02es",  # no properties length
        b"\x00\x02es\x05\x01",  # properties longer than the packet
    ],
)
@pytest.mark.parametrize("qos", [0, 1])
def test_malformed_publish_refused_as_paho_refuses_it(body: bytes, qos: int) -> None:
    header = 0x30 | qos << 1
    paho = _receive(mqtt.Client, mqtt.MQTTv5, header, body)
    lean = _receive(LeanClient, mqtt.MQTTv5, header, body)
    assert lean[0] == paho[0]
    assert lean[1] == paho[1] == []


def _field(data: bytes, claimed: int | None = None) -> bytes:
    size = len(data) if claimed is None else claimed
    return size.to_bytes(2, "big") + data


#: Property blocks as a broker may relay them: the ones agents and the hub send each other,
#: repeated ones, other properties, text MQTT forbids, and lengths that do not fit.
_TEXTS = st.sampled_from(
    [b"", b"es/dev/d-1/down/fetch", "caf\u00e9".encode(), b"a\x00b", b"\xef\xbb\xbf", b"\xff"]
)
_ONE_PROPERTY = st.one_of(
    st.tuples(st.sampled_from([0x03, 0x08]), _TEXTS).map(lambda p: bytes([p[0]]) + _field(p[1])),
    st.binary(max_size=40).map(lambda b: b"\x09" + _field(b)),
    st.tuples(_TEXTS, _TEXTS).map(lambda p: b"\x26" + _field(p[0]) + _field(p[1])),
    st.integers(0, 2**32 - 1).map(lambda n: b"\x02" + n.to_bytes(4, "big")),  # message expiry
    st.binary(max_size=6).map(lambda b: b"\x09" + _field(b, len(b) + 3)),  # runs past the block
    st.binary(min_size=1, max_size=3),  # anything
)


@settings(max_examples=400, deadline=None)
@given(
    parts=st.lists(_ONE_PROPERTY, max_size=5),
    size_change=st.sampled_from([0, 0, 0, -1, 1, 200]),
    qos=st.sampled_from([0, 1]),
)
def test_properties_read_as_paho_reads_or_refuses_them(
    parts: list[bytes], size_change: int, qos: int
) -> None:
    block = b"".join(parts)
    size = max(0, len(block) + size_change)
    length = bytes([size]) if size < 0x80 else bytes([size & 0x7F | 0x80, size >> 7])
    body = _field(TOPIC.encode()) + (b"\x00\x07" if qos else b"") + length + block + b"payload"
    header = 0x30 | qos << 1
    paho = _receive(mqtt.Client, mqtt.MQTTv5, header, body)
    lean = _receive(LeanClient, mqtt.MQTTv5, header, body)
    assert lean[0] == paho[0]
    assert [_fields(m) for m in lean[1]] == [_fields(m) for m in paho[1]]
    assert lean[2] == paho[2]


def test_the_properties_of_a_fetch_are_read_without_paho() -> None:
    props = publish_properties(
        content_type="application/x-protobuf",
        response_topic="es/dev/d-1/down/fetch",
        correlation=b"\x00\x01corr",
        user=(("window", "4"), ("window", "8")),
    )
    block = props.pack()
    read = _no_properties()
    assert _read_properties(read, block + b"payload", 0) == len(block)
    assert read.json() == props.json()
    # Another property is left to paho, with nothing read.
    other = _properties(MessageExpiryInterval=30).pack()
    untouched = _no_properties()
    assert _read_properties(untouched, other, 0) is None and untouched.isEmpty()


@pytest.mark.parametrize("protocol", [mqtt.MQTTv5, mqtt.MQTTv311])
@pytest.mark.parametrize("payload", [b"", b"ack", bytes(300)])
def test_publish_at_most_once_sends_paho_s_packet(
    protocol: mqtt.MQTTProtocolVersion, payload: bytes
) -> None:
    header, body = _wire(protocol, 0, payload=payload)
    lean = _client(LeanClient, protocol)
    published: list[int] = []
    lean.on_publish = lambda _c, _u, mid, _rc, _p: published.append(mid)
    try:
        assert isinstance(lean, LeanClient)
        assert lean.publish_at_most_once(TOPIC, payload) == mqtt.MQTT_ERR_SUCCESS
        (queued,) = lean._out_packet
        assert queued["qos"] == 0
        assert bytes(queued["packet"]).endswith(body)
        assert bytes(queued["packet"])[0] == header
        # written: on_publish fires with the message id, as for publish(qos=0)
        lean._sock, sock = FakeSocket(), lean._sock  # type: ignore[assignment]
        lean.loop_write()
        assert published == [queued["mid"]]
        sock.close()  # type: ignore[union-attr]
    finally:
        lean._sock = None


def test_publish_at_most_once_without_a_connection_or_with_a_wildcard() -> None:
    lean = LeanClient(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
    assert lean.publish_at_most_once(TOPIC, b"x") == mqtt.MQTT_ERR_NO_CONN
    with pytest.raises(ValueError, match="wildcards"):
        lean.publish_at_most_once("es/+/x", b"x")


class FakeSocket:
    """Takes up to ``per_send`` bytes of each ``send``; counts the calls."""

    def __init__(self, per_send: int = 1_000_000) -> None:
        self.sent = bytearray()
        self.per_send = per_send
        self.calls = 0

    def send(self, data: bytes) -> int:
        self.calls += 1
        taken = bytes(data[: self.per_send])
        self.sent += taken
        return len(taken)


def _queue_mixed(client: mqtt.Client, lean: bool) -> mqtt.MQTTMessageInfo:
    """Queue packets of every sort the write path treats apart; the QoS 0 publish's info."""
    client._send_puback(7)
    client.publish(TOPIC, b"one", qos=1)
    if lean:
        assert isinstance(client, LeanClient)
        client.publish_at_most_once(TOPIC, b"ack")
    else:
        client.publish(TOPIC, b"ack", qos=0)
    client._send_puback(8)
    info = client.publish(TOPIC, b"watched", qos=0)
    client.publish(TOPIC, bytes(70_000), qos=1)
    client._send_puback(9)
    return info


@pytest.mark.parametrize("per_send", [1_000_000, 7])
def test_queued_packets_written_as_paho_writes_them(per_send: int) -> None:
    wires, sends, infos = [], [], []
    for cls in (mqtt.Client, LeanClient):
        client = _client(cls, mqtt.MQTTv5)
        client._sock.close()  # type: ignore[union-attr]
        info = _queue_mixed(client, lean=cls is LeanClient)
        sock = client._sock = FakeSocket(per_send)  # type: ignore[assignment]
        for _ in range(100_000):
            if not client._out_packet:
                break
            client.loop_write()
        wires.append(bytes(sock.sent))
        sends.append(sock.calls)
        infos.append(info.is_published())
        client._sock = None
    assert wires[1] == wires[0]
    assert infos == [True, True]
    if per_send > 100_000:  # joined: the PUBACK, the QoS 1 publish and the ack go in one send
        assert sends[1] < sends[0]


def test_packets_that_need_work_once_written_are_not_joined() -> None:
    client = _client(LeanClient, mqtt.MQTTv5)
    assert isinstance(client, LeanClient)
    published: list[int] = []
    client._send_puback(1)
    client._send_puback(2)
    client.publish(TOPIC, b"watched", qos=0)
    client._send_puback(3)
    client._send_simple_command(0xE0)  # DISCONNECT
    client._join_quiet_packets()
    assert [p["command"] & 0xF0 for p in client._out_packet] == [0, 0x30, 0x40, 0xE0]
    client._out_packet.clear()
    client.on_publish = lambda _c, _u, mid, _rc, _p: published.append(mid)
    client._send_puback(4)
    client.publish_at_most_once(TOPIC, b"ack")  # on_publish is set: it must fire
    client._join_quiet_packets()
    assert [p["command"] & 0xF0 for p in client._out_packet] == [0x40, 0x30]
    client._sock.close()  # type: ignore[union-attr]
    client._sock = None


PACKED_CASES = [
    pytest.param({}, {}, id="none"),
    pytest.param(
        {"response_topic": "es/dev/d-1/down/fetch", "correlation": b"\x00c" * 20},
        {"ResponseTopic": "es/dev/d-1/down/fetch", "CorrelationData": b"\x00c" * 20},
        id="request",
    ),
    pytest.param(
        {"correlation": b"id", "content_type": "application/x-es-chunk"},
        {"CorrelationData": b"id", "ContentType": "application/x-es-chunk"},
        id="reply",
    ),
    pytest.param(
        {"response_topic": "é/ü", "correlation": b"", "user": (("window", "8"), ("k", "v"))},
        {
            "ResponseTopic": "é/ü",
            "CorrelationData": b"",
            "UserProperty": [("window", "8"), ("k", "v")],
        },
        id="utf8-and-user-pairs",
    ),
]


@pytest.mark.parametrize(("packed_args", "paho_values"), PACKED_CASES)
def test_packed_properties_are_the_bytes_and_values_paho_would_make(
    packed_args: dict[str, Any], paho_values: dict[str, Any]
) -> None:
    packed = publish_properties(**packed_args)
    paho = _properties(**paho_values)
    assert packed.pack() == paho.pack()
    assert packed.json() == paho.json() and str(packed) == str(paho)
    for name, value in paho_values.items():
        assert getattr(packed, name) == value
    # The PUBLISH paho writes with them is the one it writes with its own.
    assert _wire(mqtt.MQTTv5, 1, props=packed) == _wire(mqtt.MQTTv5, 1, props=paho)


def test_packed_properties_refuse_changes_and_oversized_fields() -> None:
    packed = publish_properties(correlation=b"id")
    with pytest.raises(AttributeError, match="cannot be changed"):
        packed.ContentType = "text/plain"
    assert (
        isinstance(packed, PackedProperties)
        and packed.pack() == _properties(CorrelationData=b"id").pack()
    )
    with pytest.raises(ValueError, match="65535"):
        publish_properties(correlation=bytes(65_536))


def _puback(cls: type[mqtt.Client], packet: bytes) -> list[tuple[int, int, str]]:
    """What ``on_publish`` hears when ``packet`` acknowledges the client's one QoS 1 publish."""
    client = _client(cls, mqtt.MQTTv5)
    heard: list[tuple[int, int, str]] = []
    client.on_publish = lambda _c, _u, mid, rc, props: heard.append((mid, rc.value, str(props)))
    info = client.publish(TOPIC, b"body", qos=1)
    client._in_packet["command"] = 0x40
    client._in_packet["packet"] = bytearray(packet.replace(b"MM", info.mid.to_bytes(2, "big")))
    try:
        assert client._handle_pubackcomp("PUBACK") == mqtt.MQTT_ERR_SUCCESS
    finally:
        client._sock.close()  # type: ignore[union-attr]
    return heard


@pytest.mark.parametrize(
    "packet",
    [
        pytest.param(b"MM", id="plain"),
        pytest.param(b"MM\x10", id="reason-code"),
        pytest.param(b"MM\x00\x05\x1f\x00\x02no", id="reason-string"),
        pytest.param(b"\xff\xfe", id="unknown-mid"),
    ],
)
def test_a_puback_is_heard_as_paho_hears_it(packet: bytes) -> None:
    heard = _puback(LeanClient, packet)
    assert heard == _puback(mqtt.Client, packet)
    assert len(heard) == (0 if packet == b"\xff\xfe" else 1)


class ReadSocket:
    """Hands out a byte stream at most ``per_recv`` bytes a ``recv``; counts the calls."""

    def __init__(self, stream: bytes, per_recv: int) -> None:
        self.stream = stream
        self.per_recv = per_recv
        self.calls = 0

    def recv(self, bufsize: int) -> bytes:
        self.calls += 1
        if not self.stream:
            raise BlockingIOError
        taken = self.stream[: min(bufsize, self.per_recv)]
        self.stream = self.stream[len(taken) :]
        return taken

    def close(self) -> None:
        pass


def _stream() -> bytes:
    """Packets of every sort a client reads, the lengths from one to three bytes long."""
    packets = []
    for qos, extra in [(0, {}), (1, {}), (1, {"payload": bytes(300)}), (2, {})]:
        header, body = _wire(mqtt.MQTTv5, qos, **extra)
        packets.append((header, body))
    props = _properties(ResponseTopic="es/r", CorrelationData=b"c", UserProperty=[("k", "v")])
    packets.append(_wire(mqtt.MQTTv5, 1, props=props, payload=bytes(range(256)) * 70))
    packets += [(0x40, b"\x00\x07"), (0xD0, b""), (0x40, b"\x00\x08\x10")]
    out = bytearray()
    for header, body in packets * 3:
        out.append(header)
        LeanClient._pack_remaining_length(None, out, len(body))  # type: ignore[arg-type]
        out += body
    return bytes(out)


def _read_all(cls: type[mqtt.Client], stream: bytes, per_recv: int) -> dict[str, Any]:
    """Read ``stream`` as the event loop would: packets until the socket has nothing."""
    client = _client(cls, mqtt.MQTTv5)
    client._sock.close()  # type: ignore[union-attr]
    sock = client._sock = ReadSocket(stream, per_recv)  # type: ignore[assignment]
    got: list[mqtt.MQTTMessage] = []
    client.on_message = lambda _c, _u, msg: got.append(msg)
    codes = []
    for _ in range(1_000_000):
        rc = client._packet_read()
        codes.append(rc)
        if rc not in (mqtt.MQTT_ERR_SUCCESS, mqtt.MQTT_ERR_AGAIN):
            break  # an error ends the connection
        if rc == mqtt.MQTT_ERR_AGAIN and not sock.stream:
            break  # the socket has nothing more
    client._sock = None
    return {
        "codes": [c for c in codes if c != mqtt.MQTT_ERR_AGAIN],
        "messages": [_fields(m) for m in got],
        "sent": [bytes(p["packet"]) for p in client._out_packet],
        "held": sorted(client._in_messages),
        "left": sock.stream,
        "recvs": sock.calls,
    }


@pytest.mark.parametrize("per_recv", [1, 5, 1000, 10_000_000])
def test_a_byte_stream_is_read_as_paho_reads_it(per_recv: int) -> None:
    stream = _stream()
    paho = _read_all(mqtt.Client, stream, per_recv)
    lean = _read_all(LeanClient, stream, per_recv)
    assert not paho["left"] and not lean["left"]
    for key in ("codes", "messages", "sent", "held"):
        assert lean[key] == paho[key], key
    assert len(lean["messages"]) == 5 * 3 - 3  # the QoS 2 ones wait for their PUBREL
    if per_recv == 10_000_000:  # whole packets cut out of one read, not read byte by byte
        assert lean["recvs"] * 10 < paho["recvs"]


@pytest.mark.parametrize(
    "stream",
    [
        pytest.param(b"\x30\xff\xff\xff\xff\x01", id="five-length-bytes"),
        pytest.param(b"\x30\x03\x00\x09a", id="topic-past-the-end"),
        pytest.param(b"\xf0\x00", id="unknown-type"),
    ],
)
def test_a_malformed_packet_ends_the_read_as_paho_ends_it(stream: bytes) -> None:
    paho = _read_all(mqtt.Client, stream, 10_000_000)
    lean = _read_all(LeanClient, stream, 10_000_000)
    assert lean["codes"] == paho["codes"] and lean["codes"][-1] == mqtt.MQTT_ERR_PROTOCOL
    assert lean["messages"] == paho["messages"] == []


def _at_least_once(cls: type[mqtt.Client]) -> list[Any]:
    """What a client does with three QoS 1 publishes, two allowed in flight, as PUBACKs come."""
    client = _client(cls, mqtt.MQTTv5)
    client.max_inflight_messages_set(2)
    client.max_queued_messages_set(3)
    heard: list[tuple[int, int]] = []
    client.on_publish = lambda _c, _u, mid, rc, _p: heard.append((mid, rc.value))
    props = _properties(ContentType="application/x-protobuf")
    sends = [(b"one", False, None), (b"two", True, props), (bytes(300), False, None)]
    codes = []
    for payload, retain, properties in [*sends, (b"over the queue", False, None)]:
        if isinstance(client, LeanClient):
            rc, mid = client.publish_at_least_once(
                TOPIC, payload, retain=retain, properties=properties
            )
        else:
            info = client.publish(TOPIC, payload, qos=1, retain=retain, properties=properties)
            rc, mid = info.rc, info.mid
        codes.append((rc, mid))

    def state() -> list[Any]:
        packets = [bytes(p["packet"]) for p in client._out_packet]
        client._out_packet.clear()
        messages = {
            m: (o.state, o.qos, o.retain, o.payload) for m, o in client._out_messages.items()
        }
        return [packets, messages, client._inflight_messages, list(heard)]

    transcript = [codes, state()]
    for mid in (codes[0][1], codes[1][1]):  # the broker acks the first two: the third goes out
        client._sock.close()  # type: ignore[union-attr]
        client._sock = ReadSocket(bytes((0x40, 2)) + mid.to_bytes(2, "big"), 100)  # type: ignore[assignment]
        assert client._packet_read() == mqtt.MQTT_ERR_SUCCESS
        transcript.append(state())
    client._sock = None
    return transcript


def test_publish_at_least_once_is_paho_s_qos_1_publish() -> None:
    lean = _at_least_once(LeanClient)
    assert lean == _at_least_once(mqtt.Client)
    codes, first = lean[0], lean[1]
    assert [rc for rc, _ in codes] == [mqtt.MQTT_ERR_SUCCESS] * 3 + [mqtt.MQTT_ERR_QUEUE_SIZE]
    assert len(first[0]) == 2 and first[2] == 2  # two in flight, the third queued
    assert len(lean[2][0]) == 1 and lean[3][3] == [(codes[0][1], 0), (codes[1][1], 0)]


def test_publish_at_least_once_without_a_connection_is_kept_for_later() -> None:
    lean = LeanClient(CallbackAPIVersion.VERSION2, protocol=mqtt.MQTTv5)
    rc, mid = lean.publish_at_least_once(TOPIC, b"x")
    assert rc == mqtt.MQTT_ERR_NO_CONN
    assert lean._out_messages[mid].state == mqtt.mqtt_ms_publish and not lean._inflight_messages
    with pytest.raises(ValueError, match="wildcards"):
        lean.publish_at_least_once("es/#", b"x")
    with pytest.raises(AttributeError, match="no info"):
        lean._out_messages[mid].info = mqtt.MQTTMessageInfo(mid)
