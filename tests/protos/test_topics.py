"""The MQTT topic layout and hub URLs: what is built parses back, and bad input is refused."""

from __future__ import annotations

import pytest

from protos import ProtocolError
from protos.topics import DEFAULT_PREFIX, MqttEndpoint, TopicRef, Topics


def test_device_topics_round_trip_under_a_custom_prefix() -> None:
    t = Topics("plant-3/edge")
    assert t.up("cam-1", "telemetry") == "plant-3/edge/dev/cam-1/up/telemetry"
    assert t.down("cam-1", "desired") == "plant-3/edge/dev/cam-1/down/desired"
    assert t.parse(t.up("cam-1", "telemetry")) == TopicRef("cam-1", "up", "telemetry")
    assert t.parse(t.down("cam.1_x", "fetch")) == TopicRef("cam.1_x", "down", "fetch")
    assert t.parse(t.status("cam-1")) == TopicRef("cam-1", "status", "status")
    assert t.device_down_filter("cam-1") == "plant-3/edge/dev/cam-1/down/#"


def test_hub_reads_through_shared_subscriptions() -> None:
    filters = Topics().hub_filters("hubs")
    assert filters == [
        f"$share/hubs/{DEFAULT_PREFIX}/dev/+/up/+",
        f"$share/hubs/{DEFAULT_PREFIX}/dev/+/status",
    ]


def test_there_are_no_group_topics() -> None:
    # A message to many devices cannot carry a per-device signature, so there are none.
    t = Topics()
    assert not hasattr(t, "group_down")
    assert not hasattr(t, "group_filter")
    assert t.down("cam-1", "signed_desired") == f"{DEFAULT_PREFIX}/dev/cam-1/down/desired"


@pytest.mark.parametrize(
    "topic",
    [
        "other/v1/dev/cam-1/up/telemetry",  # another prefix
        f"{DEFAULT_PREFIX}/dev/+/up/telemetry",  # a wildcard as device id
        f"{DEFAULT_PREFIX}/dev/-cam/up/telemetry",  # a device id that starts badly
        f"{DEFAULT_PREFIX}/dev/cam-1/up/welcome",  # devices do not send welcome
        f"{DEFAULT_PREFIX}/dev/cam-1/up/telemetry/extra",
        f"{DEFAULT_PREFIX}/dev/cam-1",
        f"{DEFAULT_PREFIX}/dev/{'x' * 129}/up/telemetry",
        f"{DEFAULT_PREFIX}/grp/kind=camera/down/desired",  # group topics are gone
    ],
)
def test_parse_refuses_what_is_not_a_device_topic(topic: str) -> None:
    with pytest.raises(ProtocolError):
        Topics().parse(topic)


@pytest.mark.parametrize("prefix", ["", "a//b", "a/+/b", "#", "$SYS/x", "a b", "x" * 200])
def test_bad_prefixes_are_refused(prefix: str) -> None:
    with pytest.raises(ProtocolError):
        Topics(prefix)


def test_building_refuses_bad_kinds_and_ids() -> None:
    with pytest.raises(ProtocolError):
        Topics().up("cam-1", "desired")
    with pytest.raises(ProtocolError):
        Topics().down("cam/1", "ack")


def test_url_defaults() -> None:
    ep = MqttEndpoint.parse("mqtt://broker.local")
    assert (ep.host, ep.port, ep.tls, ep.prefix) == ("broker.local", 1883, False, DEFAULT_PREFIX)
    assert (ep.session_expiry_s, ep.keepalive_s, ep.client_id) == (None, None, None)
    assert MqttEndpoint.parse("mqtts://b").port == 8883


def test_url_carries_prefix_credentials_and_options() -> None:
    ep = MqttEndpoint.parse(
        "mqtts://dev%40x:s3cret@10.0.0.5:8884/site-7/edge?session_expiry=600&keepalive=15"
        "&client_id=gw-7&share=hubs-a"
    )
    assert (ep.host, ep.port, ep.tls, ep.prefix) == ("10.0.0.5", 8884, True, "site-7/edge")
    assert (ep.username, ep.password) == ("dev@x", "s3cret")
    assert (ep.session_expiry_s, ep.keepalive_s, ep.client_id, ep.share_group) == (
        600,
        15,
        "gw-7",
        "hubs-a",
    )
    assert "s3cret" not in ep.redacted()
    assert ep.topics.up("d", "ack") == "site-7/edge/dev/d/up/ack"


@pytest.mark.parametrize(
    "url",
    [
        "grpc://host:1",
        "mqtt://",
        "mqtt://h:notaport",
        "mqtt://h/ok?keepalive=0",
        "mqtt://h/ok?session_expiry=-1",
        "mqtt://h/ok?keepalive=ten",
        "mqtt://h/ok?bogus=1",
        "mqtt://h/a/+/b",
    ],
)
def test_bad_urls_are_refused(url: str) -> None:
    with pytest.raises(ProtocolError):
        MqttEndpoint.parse(url)


def test_prefix_tag_is_stable_and_differs_by_prefix() -> None:
    a = MqttEndpoint.parse("mqtt://h/a").prefix_tag()
    assert a == MqttEndpoint.parse("mqtt://h:1883/a?keepalive=5").prefix_tag()
    assert a != MqttEndpoint.parse("mqtt://h/b").prefix_tag()
