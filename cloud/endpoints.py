"""Where the hub listens and which broker it uses, parsed and checked in one place.

Bind addresses (``HOST:PORT``) and broker URLs come from people: the command
line, ``hub.toml``, later a REST API. They are checked here, before anything
is written or started, so every entry point refuses a bad one with the same
one-line message. :func:`check_can_listen` asks the operating system whether
an address can be listened on right now, so a taken port or an address of
another machine is reported before the hub changes anything.
"""

from __future__ import annotations

import errno
import ipaddress
import re
import socket
from collections.abc import Mapping

from cloud.errors import HubError, TransportError, ValidationError
from protos.errors import ProtocolError
from protos.topics import MqttEndpoint

__all__ = [
    "BIND_FORM",
    "ENROLMENT",
    "GRPC",
    "METRICS",
    "STORE_URL_FORM",
    "bind_failure",
    "check_can_listen",
    "check_distinct",
    "check_hub_addresses",
    "check_listeners",
    "check_store_url",
    "format_bind",
    "parse_bind",
    "parse_broker_url",
]

#: The expected form of a bind address, quoted in every refusal.
BIND_FORM = "HOST:PORT such as 127.0.0.1:7443, 0.0.0.0:7443 or [::1]:7443"
#: The expected form of a store URL.
STORE_URL_FORM = "sqlite:///PATH or postgresql+psycopg2://USER@HOST:PORT/DB"
#: What the hub's listeners are called in refusals.
GRPC = "gRPC address"
ENROLMENT = "enrolment address"
METRICS = "metrics address"
_ENROL_DEFAULT = "devices enrol on the gRPC port + 1 unless the hub was set up with another"
_MAX_PORT = 65535
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
_HOSTNAME = re.compile(rf"{_LABEL}(?:\.{_LABEL})*\.?")


def parse_bind(text: str, what: str = "address") -> tuple[str, int]:
    """Split a bind address ``HOST:PORT`` (``[IPV6]:PORT``) into host and port.

    Port 0 asks the system for a free port. Nothing is resolved or bound here.

    Args:
        text: the address as a person wrote it.
        what: what the address is for, as refusals name it ("metrics address").

    Returns:
        The host (IPv6 without brackets) and the port.

    Raises:
        ValidationError: no host, no port, a port outside 0..65535, or a host
            that is neither a name nor an address.
    """
    host, sep, port_text = text.rpartition(":")
    if not sep or not host or not port_text:
        raise ValidationError(f"bad {what} {text!r}; expected {BIND_FORM}")
    if not (port_text.isascii() and port_text.isdigit()) or int(port_text) > _MAX_PORT:
        raise ValidationError(
            f"bad port {port_text!r} in {what} {text!r}; expected a number from 0 to {_MAX_PORT}"
        )
    return _check_host(host, f"{what} {text!r}"), int(port_text)


def _check_host(host: str, where: str) -> str:
    if host.startswith("[") and host.endswith("]"):
        try:
            return str(ipaddress.IPv6Address(host[1:-1]))
        except ValueError:
            raise ValidationError(f"bad IPv6 address {host!r} in {where}") from None
    if _is_ipv6(host):
        raise ValidationError(f"bad {where}; write an IPv6 host in brackets: [::1]:PORT")
    if all(part.isdigit() for part in host.rstrip(".").split(".")):
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            raise ValidationError(f"bad IPv4 address {host!r} in {where}") from None
    elif _HOSTNAME.fullmatch(host) is None:
        raise ValidationError(f"bad host {host!r} in {where}; expected {BIND_FORM}")
    return host


def _is_ipv6(text: str) -> bool:
    try:
        ipaddress.IPv6Address(text)
    except ValueError:
        return False
    return True


def format_bind(host: str, port: int) -> str:
    """The bind address of ``host`` and ``port``, with an IPv6 host in brackets."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def parse_broker_url(url: str) -> MqttEndpoint | None:
    """Check a broker URL (``mqtt://`` or ``mqtts://``); ``''`` means no broker.

    Raises:
        ValidationError: not an ``mqtt(s)://host[:port][/prefix]`` URL, or a bad option.
    """
    if not url:
        return None
    try:
        return MqttEndpoint.parse(url)
    except ProtocolError as exc:
        raise ValidationError(str(exc)) from exc


def check_store_url(url: str) -> None:
    """Check a store URL names a database the hub supports, connecting to nothing.

    Raises:
        ValidationError: malformed, an unsupported database, or a driver that is
            not installed; the message shows the URL without its password.
    """
    from cloud.store.engine import create_store_engine  # noqa: PLC0415 - SQLAlchemy when used

    try:
        create_store_engine(url).dispose()
    except HubError as exc:
        raise ValidationError(
            f"cannot use the store URL {_without_password(url)!r}: {exc}; expected {STORE_URL_FORM}"
        ) from exc


def _without_password(url: str) -> str:
    scheme, sep, rest = url.partition("://")
    credentials, at, location = rest.rpartition("@")
    if not sep or not at or ":" not in credentials:
        return url
    return f"{scheme}://{credentials.split(':', 1)[0]}:***@{location}"


def check_distinct(listeners: Mapping[str, str]) -> None:
    """Check each listener's address, and that no two share a fixed one (port 0 is free).

    Args:
        listeners: what each address is for ("gRPC address") and the address.

    Raises:
        ValidationError: a malformed address, or one address for two listeners.
    """
    seen: dict[tuple[str, int], str] = {}
    for what, bind in listeners.items():
        host, port = parse_bind(bind, what)
        other = seen.setdefault((host, port), what)
        if port and other != what:
            hint = f" ({_ENROL_DEFAULT})" if ENROLMENT in (what, other) else ""
            raise ValidationError(
                f"the {other} and the {what} are both {bind}; give each its own port{hint}"
            )


def check_hub_addresses(grpc_bind: str, enroll_bind: str, mqtt_url: str) -> None:
    """Check the addresses and broker URL a hub is set up with (``hub init``).

    Raises:
        ValidationError: a malformed address or URL, or one address for both ports.
    """
    check_distinct({GRPC: grpc_bind, ENROLMENT: enroll_bind})
    parse_broker_url(mqtt_url)


def check_listeners(listeners: Mapping[str, str]) -> None:
    """Check every listener's address: well formed, distinct, and free to listen on now.

    Args:
        listeners: what each address is for ("gRPC address") and the address.

    Raises:
        ValidationError: a malformed address, or one address for two listeners.
        TransportError: an address cannot be listened on (see :func:`check_can_listen`).
    """
    check_distinct(listeners)
    for bind in listeners.values():
        check_can_listen(bind)


def check_can_listen(bind: str) -> None:
    """Check that this machine can listen on ``bind`` now, without keeping the port.

    Every address the host resolves to is bound once, exclusively (address
    reuse only for connections that are closing, as servers do), and released.

    Raises:
        ValidationError: a malformed ``bind``.
        TransportError: the address is in use, not an address of this machine,
            needs privileges, or the host name does not resolve.
    """
    host, port = parse_bind(bind)
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise TransportError(f"cannot listen on {bind}: unknown host ({exc.strerror})") from exc
    addresses = list(dict.fromkeys(infos))
    failures = []
    for family, kind, proto, _, address in addresses:
        with socket.socket(family, kind, proto) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind(address)
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    raise _refusal(bind, exc) from exc
                failures.append(exc)
    if failures and len(failures) == len(addresses):
        raise _refusal(bind, failures[0]) from failures[0]


def bind_failure(bind: str) -> TransportError:
    """The error to raise when a server could not bind ``bind``: why, if the system says.

    For servers (gRPC) that report a failed bind without its reason; the
    address is probed again to find it.
    """
    try:
        check_can_listen(bind)
    except (TransportError, ValidationError) as exc:
        return TransportError(str(exc))
    return TransportError(f"cannot listen on {bind}")


def _refusal(bind: str, exc: OSError) -> TransportError:
    if exc.errno == errno.EADDRINUSE:
        return TransportError(f"{bind} is already in use (another hub serve?)")
    if exc.errno == errno.EADDRNOTAVAIL:
        return TransportError(f"cannot listen on {bind}: address not available on this machine")
    if exc.errno == errno.EACCES:
        return TransportError(
            f"cannot listen on {bind}: permission denied (ports below 1024 need privileges)"
        )
    return TransportError(f"cannot listen on {bind}: {exc.strerror or exc}")
