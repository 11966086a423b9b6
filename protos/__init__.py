"""The EdgeSkill wire contract: the protobuf envelope, the hub service, and helpers."""

from protos import edgeskill_pb2 as pb
from protos.envelope import (
    MAX_ENVELOPE_BYTES,
    decode_envelope,
    encode_envelope,
    kind_of,
    make_envelope,
    new_id,
)
from protos.errors import ProtocolError, TransportError

__all__ = [
    "MAX_ENVELOPE_BYTES",
    "ProtocolError",
    "TransportError",
    "decode_envelope",
    "encode_envelope",
    "kind_of",
    "make_envelope",
    "new_id",
    "pb",
]
