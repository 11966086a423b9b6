"""Bind addresses, broker and store URLs are checked once, and a hub's ports are its own."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Iterator
from pathlib import Path

import grpc.aio
import pytest

from cloud.endpoints import (
    ENROLMENT,
    GRPC,
    METRICS,
    check_can_listen,
    check_distinct,
    check_listeners,
    check_store_url,
    format_bind,
    parse_bind,
    parse_broker_url,
)
from cloud.errors import TransportError, ValidationError
from cloud.grpc_server import start_grpc_server
from cloud.hub import Hub

#: TEST-NET-1 (RFC 5737): never an address of this machine.
FOREIGN = "192.0.2.1"


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("127.0.0.1:7443", ("127.0.0.1", 7443)),
        ("0.0.0.0:0", ("0.0.0.0", 0)),
        ("localhost:65535", ("localhost", 65535)),
        ("hub-1.example.org:80", ("hub-1.example.org", 80)),
        ("[::1]:7443", ("::1", 7443)),
        ("[::]:9", ("::", 9)),
    ],
)
def test_a_bind_address_splits_into_host_and_port(text: str, expected: tuple[str, int]) -> None:
    assert parse_bind(text) == expected
    assert parse_bind(format_bind(*expected)) == expected


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("7443", "expected HOST:PORT"),
        ("host:", "expected HOST:PORT"),
        (":7443", "expected HOST:PORT"),
        (":x", "expected HOST:PORT"),
        ("host:99999", "bad port '99999'"),
        ("host:-1", "bad port '-1'"),
        ("host:\u0663", "bad port"),  # an Arabic-Indic three is a digit, not a port
        ("::1:7443", "IPv6 host in brackets"),
        ("[zz]:7443", "bad IPv6 address '[zz]'"),
        ("999.1.1.1:7443", "bad IPv4 address '999.1.1.1'"),
        ("http://x:7443", "bad host 'http://x'"),
        ("a b:7443", "bad host 'a b'"),
    ],
)
def test_a_malformed_bind_address_is_refused_by_name(text: str, why: str) -> None:
    with pytest.raises(ValidationError) as refused:
        parse_bind(text, "gRPC address")
    assert why in str(refused.value)
    assert repr(text) in str(refused.value) or text.rpartition(":")[2] in str(refused.value)
    assert "gRPC address" in str(refused.value)


def test_broker_urls_are_mqtt_urls_or_nothing() -> None:
    assert parse_broker_url("") is None
    endpoint = parse_broker_url("mqtt://broker:1884/site-a")
    assert endpoint is not None
    assert (endpoint.host, endpoint.port, endpoint.prefix) == ("broker", 1884, "site-a")
    for bad in ("http://x", "broker:1883", "mqtt://", "mqtt://h:99999"):
        with pytest.raises(ValidationError, match=r"mqtt|port"):
            parse_broker_url(bad)


def test_a_store_url_names_a_supported_database_and_hides_its_password() -> None:
    check_store_url("sqlite:///hub.db")
    check_store_url("postgresql+psycopg2://hub@db.example:5432/fleet")  # nothing is connected
    with pytest.raises(ValidationError, match=r"'notaurl'.*expected sqlite:///PATH"):
        check_store_url("notaurl")
    with pytest.raises(ValidationError, match="unsupported database 'mysql'"):
        check_store_url("mysql://hub@db/fleet")
    with pytest.raises(ValidationError) as refused:
        check_store_url("mysql://hub:s3cret@db/fleet")
    assert "s3cret" not in str(refused.value)
    assert "mysql://hub:***@db/fleet" in str(refused.value)


def test_two_listeners_may_not_share_an_address() -> None:
    check_distinct({GRPC: "127.0.0.1:0", ENROLMENT: "127.0.0.1:0", METRICS: "127.0.0.1:9"})
    with pytest.raises(ValidationError) as refused:
        check_distinct({GRPC: "127.0.0.1:7443", METRICS: "127.0.0.1:7443"})
    assert str(refused.value) == (
        "the gRPC address and the metrics address are both 127.0.0.1:7443; give each its own port"
    )
    with pytest.raises(ValidationError, match=r"the enrolment address .*gRPC port \+ 1"):
        check_distinct({ENROLMENT: "[::1]:7444", METRICS: "[::1]:7444"})
    with pytest.raises(ValidationError, match="bad metrics address 'nope'"):
        check_listeners({GRPC: "127.0.0.1:0", METRICS: "nope"})


@pytest.fixture
def listening() -> Iterator[int]:
    """A port a plain socket listens on, as another program's would."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield int(sock.getsockname()[1])


def test_a_taken_port_is_named_and_a_free_one_is_left_free(listening: int) -> None:
    with pytest.raises(TransportError) as refused:
        check_can_listen(f"127.0.0.1:{listening}")
    assert str(refused.value) == f"127.0.0.1:{listening} is already in use (another hub serve?)"

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        free = int(sock.getsockname()[1])
    check_can_listen(f"127.0.0.1:{free}")
    with socket.socket() as again:  # the probe did not keep it
        again.bind(("127.0.0.1", free))


def test_an_address_of_another_machine_cannot_be_listened_on() -> None:
    with pytest.raises(TransportError) as refused:
        check_can_listen(f"{FOREIGN}:7443")
    assert str(refused.value) == (
        f"cannot listen on {FOREIGN}:7443: address not available on this machine"
    )


def test_the_grpc_server_holds_its_port_alone(tmp_path: Path) -> None:
    hub = Hub.init(tmp_path / "hub", insecure=True)

    async def main() -> None:
        server, port = await start_grpc_server(hub.core(), "127.0.0.1:0")
        try:
            # gRPC shares ports by default (SO_REUSEPORT); the hub's port refuses that too.
            intruder = grpc.aio.server()
            with pytest.raises(RuntimeError):
                intruder.add_insecure_port(f"127.0.0.1:{port}")
            with pytest.raises(TransportError) as refused:
                await start_grpc_server(hub.core(), f"127.0.0.1:{port}")
            assert str(refused.value) == f"127.0.0.1:{port} is already in use (another hub serve?)"
            with pytest.raises(TransportError, match="address not available on this machine"):
                await start_grpc_server(hub.core(), f"{FOREIGN}:7443")
        finally:
            await server.stop(None)

    try:
        asyncio.run(main())
    finally:
        hub.close()
