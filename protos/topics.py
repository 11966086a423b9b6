"""The MQTT topic layout and hub URLs, shared by the hub and the agent.

Every topic lives under a configurable prefix (the path of the hub URL,
``edgeskill/v1`` by default):

========================================  ===========  ========  ==========================
topic                                     direction    retained  payload
========================================  ===========  ========  ==========================
``{p}/dev/{device}/up/{kind}``            device → hub no        Envelope of that kind
``{p}/dev/{device}/up/fetch``             device → hub no        FetchRequest (+ response
                                                                 topic, correlation data)
``{p}/dev/{device}/down/{kind}``          hub → device desired   Envelope of that kind; the
                                                                 desired state, signed or
                                                                 not, on ``down/desired``
``{p}/dev/{device}/down/fetch``           hub → device no        FetchChunk or Error
``{p}/dev/{device}/up/infer``             device → hub no        InferRequest (+ response
                                                                 topic, correlation data)
``{p}/dev/{device}/down/infer``           hub → device no        InferResponse or Error
``{p}/dev/{device}/status``               device/Will  yes       ``online`` / ``offline``
========================================  ===========  ========  ==========================

The hub reads device traffic through shared subscriptions
(``$share/{group}/{p}/dev/+/up/+``) so several hub processes split the load.
There are no group topics: a message that reaches many devices cannot be bound to
one device, so everything the hub sends is addressed to one device. The broker
config the project generates (:mod:`cloud.broker`) names each client by its
certificate and lets a device publish only on its own ``up/`` topics and status,
and receive only its own ``down/`` topics; only the hub writes ``down/``.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Literal
from urllib.parse import parse_qs, unquote, urlsplit

from protos.errors import ProtocolError
from protos.limits import DEVICE_ID_PATTERN

__all__ = [
    "CHUNK_CONTENT_TYPE",
    "DEFAULT_PREFIX",
    "DESIRED_KINDS",
    "DOWN_KINDS",
    "ERROR_CONTENT_TYPE",
    "INFER_CONTENT_TYPE",
    "INFER_ERROR_CODES",
    "INFER_REFUSALS",
    "STATUS_OFFLINE",
    "STATUS_ONLINE",
    "UP_KINDS",
    "MqttEndpoint",
    "TopicRef",
    "Topics",
]

DEFAULT_PREFIX = "edgeskill/v1"
#: Message kinds a device may publish, by topic.
UP_KINDS = frozenset(
    {
        "register",
        "heartbeat",
        "reported",
        "telemetry",
        "ack",
        "fetch",
        "security_event",
        "infer",
        "drift_samples",
    }
)
#: Message kinds the hub publishes to a device.
DOWN_KINDS = frozenset({"welcome", "desired", "signed_desired", "ack", "error", "fetch", "infer"})
#: Kinds that carry a device's desired state: both go to its one retained ``down/desired``
#: topic, so a newer state replaces an older one of the other kind.
DESIRED_KINDS = frozenset({"desired", "signed_desired"})
STATUS_ONLINE = b"online"
STATUS_OFFLINE = b"offline"
#: MQTT 5 content types of fetch responses: a FetchChunk, or an Error (its code
#: one of :class:`protos.fetch.FetchErrorCode`).
CHUNK_CONTENT_TYPE = "application/vnd.edgeskill.fetch-chunk"
ERROR_CONTENT_TYPE = "application/vnd.edgeskill.error"
#: MQTT 5 content type of an inference answer: an InferResponse. A refusal is an
#: Error (ERROR_CONTENT_TYPE) whose ``code`` is one of :data:`INFER_ERROR_CODES`.
INFER_CONTENT_TYPE = "application/vnd.edgeskill.infer-response"
#: Codes of refused inference requests, as gRPC status names by wire code.
INFER_ERROR_CODES = {
    "not-found": "NOT_FOUND",
    "permission-denied": "PERMISSION_DENIED",
    "invalid-argument": "INVALID_ARGUMENT",
    "resource-exhausted": "RESOURCE_EXHAUSTED",
    "deadline-exceeded": "DEADLINE_EXCEEDED",
    "unavailable": "UNAVAILABLE",
}
#: The codes after which asking again with the same request is pointless.
INFER_REFUSALS = frozenset(
    {"not-found", "permission-denied", "invalid-argument", "resource-exhausted"}
)

_DEVICE_RE = re.compile(rf"^{DEVICE_ID_PATTERN}$")
_LEVEL_RE = re.compile(r"^[A-Za-z0-9._-]{1,64}$")
_MAX_PREFIX = 128
_MAX_SESSION_EXPIRY = 2**32 - 1
_TLS_OPTIONS = frozenset({"ca", "cert", "key"})
_OPTIONS = frozenset({"client_id", "session_expiry", "keepalive", "share"}) | _TLS_OPTIONS
Area = Literal["up", "down", "status"]


def _check_prefix(prefix: str) -> str:
    levels = prefix.split("/")
    if not prefix or len(prefix) > _MAX_PREFIX or not all(_LEVEL_RE.match(lv) for lv in levels):
        raise ProtocolError(
            f"bad topic prefix {prefix!r}: 1..{_MAX_PREFIX} characters, levels of [A-Za-z0-9._-]"
        )
    return prefix


def _check_device(device_id: str) -> str:
    if not _DEVICE_RE.match(device_id):
        raise ProtocolError(f"bad device id {device_id!r}")
    return device_id


@dataclass(frozen=True)
class TopicRef:
    """What a device topic names: the device, up/down/status, and the message kind."""

    device_id: str
    area: Area
    kind: str


@dataclass(frozen=True)
class Topics:
    """Builds and parses the topics under one prefix.

    Raises:
        ProtocolError: the prefix is empty, too long, or has wildcard or odd characters.
    """

    prefix: str = DEFAULT_PREFIX

    def __post_init__(self) -> None:
        _check_prefix(self.prefix)

    def up(self, device_id: str, kind: str) -> str:
        """Topic a device publishes messages of ``kind`` on.

        Raises:
            ProtocolError: a bad device id or a kind devices may not send.
        """
        if kind not in UP_KINDS:
            raise ProtocolError(f"devices may not send {kind!r}")
        return f"{self.prefix}/dev/{_check_device(device_id)}/up/{kind}"

    def down(self, device_id: str, kind: str) -> str:
        """Topic the hub publishes messages of ``kind`` to one device on.

        Raises:
            ProtocolError: a bad device id or a kind the hub does not send.
        """
        if kind not in DOWN_KINDS:
            raise ProtocolError(f"the hub does not send {kind!r}")
        level = "desired" if kind in DESIRED_KINDS else kind
        return f"{self.prefix}/dev/{_check_device(device_id)}/down/{level}"

    def status(self, device_id: str) -> str:
        """The retained presence topic of a device (also its Last Will topic).

        Raises:
            ProtocolError: a bad device id.
        """
        return f"{self.prefix}/dev/{_check_device(device_id)}/status"

    def device_down_filter(self, device_id: str) -> str:
        """Filter a device subscribes to for everything addressed to it.

        Raises:
            ProtocolError: a bad device id.
        """
        return f"{self.prefix}/dev/{_check_device(device_id)}/down/#"

    def hub_filters(self, share_group: str) -> list[str]:
        """Shared-subscription filters the hub reads device traffic and presence through.

        Raises:
            ProtocolError: a bad share group name.
        """
        if not _LEVEL_RE.match(share_group):
            raise ProtocolError(f"bad share group {share_group!r}")
        share = f"$share/{share_group}/{self.prefix}/dev/+"
        return [f"{share}/up/+", f"{share}/status"]

    def desired_filter(self) -> str:
        """Filter over every device's retained desired state."""
        return f"{self.prefix}/dev/+/down/desired"

    def parse(self, topic: str) -> TopicRef:
        """Split a device topic into device id, area and kind.

        Raises:
            ProtocolError: not a device topic under this prefix, a bad device id or kind.
        """
        head = f"{self.prefix}/dev/"
        if not topic.startswith(head):
            raise ProtocolError(f"topic {topic[:200]!r} is not under {head}")
        parts = topic[len(head) :].split("/")
        device = _check_device(parts[0])
        if parts[1:] == ["status"]:
            return TopicRef(device, "status", "status")
        if len(parts) == 3 and parts[1] == "up" and parts[2] in UP_KINDS:
            return TopicRef(device, "up", parts[2])
        if len(parts) == 3 and parts[1] == "down" and parts[2] in DOWN_KINDS:
            return TopicRef(device, "down", parts[2])
        raise ProtocolError(f"topic {topic[:200]!r} names no known message kind")


@dataclass(frozen=True)
class MqttEndpoint:
    """An ``mqtt://`` or ``mqtts://`` hub URL, parsed and checked.

    ``mqtt://user:pass@host:1883/edgeskill/v1?session_expiry=3600&keepalive=20``:
    the path is the topic prefix; the query may set ``client_id``,
    ``session_expiry`` (seconds the broker keeps a session after a disconnect),
    ``keepalive`` (seconds), ``share`` (the hub's shared-subscription group), and
    for ``mqtts`` only: ``ca`` (the CA file the broker's certificate must chain to),
    ``cert`` and ``key`` (this client's certificate and private key, PEM files; both
    or neither). With a client certificate the broker names the client by its
    certificate, so no user name or password is sent.
    """

    host: str
    port: int
    tls: bool
    prefix: str
    username: str | None
    password: str | None
    client_id: str | None
    session_expiry_s: int | None
    keepalive_s: int | None
    share_group: str
    ca_file: str | None
    cert_file: str | None = None
    key_file: str | None = None

    @classmethod
    def parse(cls, url: str) -> MqttEndpoint:
        """Parse ``url``.

        Raises:
            ProtocolError: not an ``mqtt(s)://`` URL, no host, or a bad prefix or option.
        """
        parts = urlsplit(url)
        if parts.scheme not in ("mqtt", "mqtts") or not parts.hostname:
            raise ProtocolError(f"{url!r} is not an mqtt://host[:port][/prefix] URL")
        try:
            port = parts.port or (8883 if parts.scheme == "mqtts" else 1883)
        except ValueError as exc:
            raise ProtocolError(f"bad port in {url!r}") from exc
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        unknown = set(query) - _OPTIONS
        if unknown:
            raise ProtocolError(f"unknown MQTT URL options: {', '.join(sorted(unknown))}")
        _check_tls_options(query, tls=parts.scheme == "mqtts")
        return cls(
            host=parts.hostname,
            port=port,
            tls=parts.scheme == "mqtts",
            prefix=_check_prefix(unquote(parts.path.strip("/")) or DEFAULT_PREFIX),
            username=unquote(parts.username) if parts.username else None,
            password=unquote(parts.password) if parts.password else None,
            client_id=query.get("client_id"),
            session_expiry_s=_int_option(query, "session_expiry", 0, _MAX_SESSION_EXPIRY),
            keepalive_s=_int_option(query, "keepalive", 1, 3600),
            share_group=query.get("share", "edgeskill-hub"),
            ca_file=query.get("ca"),
            cert_file=query.get("cert"),
            key_file=query.get("key"),
        )

    @property
    def topics(self) -> Topics:
        """The topic layout under this endpoint's prefix."""
        return Topics(self.prefix)

    def prefix_tag(self) -> str:
        """A short stable tag of host, port and prefix, for client ids."""
        return hashlib.sha256(f"{self.host}:{self.port}/{self.prefix}".encode()).hexdigest()[:8]

    def redacted(self) -> str:
        """The URL without credentials or options, for logs."""
        scheme = "mqtts" if self.tls else "mqtt"
        return f"{scheme}://{self.host}:{self.port}/{self.prefix}"


def _check_tls_options(query: dict[str, str], *, tls: bool) -> None:
    given = sorted(_TLS_OPTIONS & set(query))
    if given and not tls:
        raise ProtocolError(f"MQTT URL options {', '.join(given)} need an mqtts:// URL")
    if ("cert" in query) != ("key" in query):
        raise ProtocolError("MQTT URL options cert and key go together")


def _int_option(query: dict[str, str], name: str, low: int, high: int) -> int | None:
    if name not in query:
        return None
    try:
        value = int(query[name])
    except ValueError as exc:
        raise ProtocolError(f"MQTT URL option {name} must be an integer") from exc
    if not low <= value <= high:
        raise ProtocolError(f"MQTT URL option {name} must be in {low}..{high}")
    return value
