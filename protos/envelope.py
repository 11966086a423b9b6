"""Building, encoding and decoding envelopes, with a size cap on everything read."""

from __future__ import annotations

import time
import uuid
from typing import Any

from google.protobuf.message import DecodeError

from protos import edgeskill_pb2 as pb
from protos.errors import ProtocolError
from protos.limits import (
    MAX_DEVICE_ID_CHARS,
    MAX_ENVELOPE_BYTES,
    MAX_MESSAGE_ID_CHARS,
    MAX_OFFER_BYTES,
    MAX_OFFER_FILES,
    MAX_PATH_CHARS,
)

__all__ = [
    "MAX_ENVELOPE_BYTES",
    "decode_envelope",
    "encode_envelope",
    "kind_of",
    "make_envelope",
    "new_id",
    "now_ms",
    "validate_envelope",
]


def new_id() -> str:
    """Return a fresh, globally unique message id."""
    return uuid.uuid4().hex


def now_ms() -> int:
    """Wall-clock time in milliseconds since the epoch."""
    return int(time.time() * 1000)


def make_envelope(
    device_id: str, correlation_id: str = "", msg_id: str = "", **body: Any
) -> pb.Envelope:
    """Wrap exactly one body message (``register=...``, ``ack=...``) in an envelope.

    Raises:
        ValueError: not exactly one body was given.
    """
    if len(body) != 1:
        raise ValueError("an envelope carries exactly one body, got " + ", ".join(body))
    env = pb.Envelope(
        id=msg_id or new_id(),
        device_id=device_id,
        sent_at_ms=now_ms(),
        correlation_id=correlation_id,
    )
    ((field, message),) = body.items()
    getattr(env, field).CopyFrom(message)
    return env


def kind_of(env: pb.Envelope) -> str:
    """The name of the body an envelope carries (``"register"``, ``"telemetry"``, ...).

    Raises:
        ProtocolError: the envelope carries no body.
    """
    kind = env.WhichOneof("body")
    if kind is None:
        raise ProtocolError(f"envelope {env.id!r} carries no body")
    return kind


def encode_envelope(env: pb.Envelope) -> bytes:
    """Serialize an envelope.

    Raises:
        ProtocolError: the encoded envelope exceeds :data:`MAX_ENVELOPE_BYTES`.
    """
    data = env.SerializeToString()
    if len(data) > MAX_ENVELOPE_BYTES:
        raise ProtocolError(f"envelope of {len(data)} bytes exceeds the {MAX_ENVELOPE_BYTES} cap")
    return data


def decode_envelope(data: bytes, max_bytes: int = MAX_ENVELOPE_BYTES) -> pb.Envelope:
    """Parse and validate an envelope received from outside.

    Raises:
        ProtocolError: too large, not a protobuf envelope, no id, or no body.
    """
    if len(data) > max_bytes:
        raise ProtocolError(f"message of {len(data)} bytes exceeds the {max_bytes} cap")
    env = pb.Envelope()
    try:
        env.ParseFromString(data)
    except DecodeError as exc:
        raise ProtocolError(f"not an envelope: {exc}") from exc
    validate_envelope(env)
    return env


def validate_envelope(env: pb.Envelope) -> None:
    """Check the fields every envelope must have.

    Raises:
        ProtocolError: the id is missing or too long, there is no body, or a
            metadata offer is out of bounds or not beside a desired state.
    """
    if not env.id or len(env.id) > MAX_MESSAGE_ID_CHARS:
        raise ProtocolError(f"envelope id missing or longer than {MAX_MESSAGE_ID_CHARS} characters")
    if len(env.device_id) > MAX_DEVICE_ID_CHARS:
        raise ProtocolError(f"device id longer than {MAX_DEVICE_ID_CHARS} characters")
    kind = kind_of(env)
    if env.HasField("metadata"):
        _check_offer(env.metadata, kind)


def _check_offer(offer: pb.MetadataOffer, kind: str) -> None:
    if kind not in ("desired", "signed_desired"):
        raise ProtocolError(f"a metadata offer beside {kind}, not a desired state")
    if len(offer.files) > MAX_OFFER_FILES:
        raise ProtocolError(f"a metadata offer of {len(offer.files)} files (cap {MAX_OFFER_FILES})")
    size = 0
    for file in offer.files:
        name = file.path.removeprefix("metadata/")
        bad = name == file.path or "/" in name or name.startswith(".") or not name.endswith(".json")
        if bad or len(file.path) > MAX_PATH_CHARS:
            raise ProtocolError(f"a metadata offer names {file.path[:80]!r}, not metadata/<file>")
        size += len(file.data)
    if size > MAX_OFFER_BYTES:
        raise ProtocolError(f"a metadata offer of {size} bytes (cap {MAX_OFFER_BYTES})")
