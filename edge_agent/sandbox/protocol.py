"""The pipe protocol between the agent and a skill's control process.

A frame is a 4-byte big-endian length followed by that many bytes of UTF-8
JSON. Numpy arrays travel as ``{"__ndarray__": dtype, "shape": [...], "b64": ...}``
and numpy scalars as plain numbers. Both directions cap frames at
:data:`MAX_FRAME_BYTES`; the decoder trusts nothing it reads, since the other
end runs a bundle author's code.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import struct
from collections.abc import Mapping
from typing import IO, Any

import numpy as np

from edge_agent.errors import SandboxError

__all__ = [
    "MAX_FRAME_BYTES",
    "PipeProtocolError",
    "decode_frame",
    "encode_frame",
    "read_frame",
    "write_frame",
]

MAX_FRAME_BYTES = 16 * 1024 * 1024
_HEADER = struct.Struct(">I")
_MAX_NDIM = 32
_ARRAY_KEY = "__ndarray__"
_ARRAY_KINDS = frozenset("biufc")


class PipeProtocolError(SandboxError, ValueError):
    """A frame is malformed, too large, or cannot be encoded."""


def _to_json(value: Any) -> Any:
    """``json.dumps``'s hook for what JSON cannot hold natively."""
    if isinstance(value, np.ndarray):
        if value.dtype.kind not in _ARRAY_KINDS:
            raise PipeProtocolError(f"arrays of dtype {value.dtype} cannot be sent")
        contiguous = np.ascontiguousarray(value)
        return {
            _ARRAY_KEY: contiguous.dtype.str,
            "shape": list(contiguous.shape),
            "b64": base64.b64encode(contiguous.tobytes()).decode("ascii"),
        }
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, (set, frozenset)):
        raise PipeProtocolError("sets cannot be sent; use a list")
    raise PipeProtocolError(f"values of type {type(value).__name__} cannot be sent")


def _array_from_json(obj: dict[str, Any]) -> np.ndarray:
    """Rebuild an array, checking dtype, shape and byte count against each other."""
    try:
        dtype = np.dtype(obj[_ARRAY_KEY])
        shape = tuple(obj["shape"])
        raw = base64.b64decode(obj["b64"], validate=True)
    except (KeyError, TypeError, ValueError, binascii.Error) as exc:
        raise PipeProtocolError(f"malformed array: {exc}") from exc
    if dtype.kind not in _ARRAY_KINDS or dtype.fields is not None or dtype.shape != ():
        raise PipeProtocolError(f"arrays of dtype {dtype} are not accepted")
    if len(shape) > _MAX_NDIM or not all(type(d) is int and d >= 0 for d in shape):
        raise PipeProtocolError(f"malformed array shape {list(shape)}")
    if math.prod(shape) * dtype.itemsize != len(raw):
        raise PipeProtocolError(
            f"array of shape {list(shape)} and dtype {dtype} has {len(raw)} bytes"
        )
    return np.frombuffer(bytearray(raw), dtype=dtype).reshape(shape)


def _from_json(obj: dict[str, Any]) -> Any:
    return _array_from_json(obj) if _ARRAY_KEY in obj else obj


def encode_frame(message: Mapping[str, Any]) -> bytes:
    """Encode one message as a frame (header included).

    Raises:
        PipeProtocolError: Something in the message cannot be sent, or the frame
            would exceed :data:`MAX_FRAME_BYTES`.
    """
    try:
        body = json.dumps(message, default=_to_json, separators=(",", ":")).encode("utf-8")
    except (TypeError, ValueError) as exc:  # PipeProtocolError is a ValueError
        raise PipeProtocolError(f"message cannot be encoded: {exc}") from exc
    if len(body) > MAX_FRAME_BYTES:
        raise PipeProtocolError(f"message of {len(body)} bytes exceeds the {MAX_FRAME_BYTES} cap")
    return _HEADER.pack(len(body)) + body


def decode_frame(body: bytes) -> dict[str, Any]:
    """Decode a frame's body (header removed) into a message.

    Raises:
        PipeProtocolError: The body is not a JSON object or holds a malformed array.
    """
    try:
        message = json.loads(body, object_hook=_from_json)
    except PipeProtocolError:
        raise
    except (ValueError, RecursionError) as exc:  # bad UTF-8, bad JSON, huge integers
        raise PipeProtocolError(f"frame is not valid JSON: {exc}") from exc
    if not isinstance(message, dict):
        raise PipeProtocolError(f"frame holds a {type(message).__name__}, not an object")
    return message


def write_frame(stream: IO[bytes], message: Mapping[str, Any]) -> None:
    """Encode and write one frame, then flush.

    Raises:
        PipeProtocolError: The message cannot be encoded or is too large.
        OSError: The stream is closed or broken.
    """
    stream.write(encode_frame(message))
    stream.flush()


def _read_exactly(stream: IO[bytes], size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = stream.read(size - len(data))
        if not chunk:
            break
        data += chunk
    return bytes(data)


def read_frame(stream: IO[bytes]) -> dict[str, Any] | None:
    """Read one frame; ``None`` at a clean end of stream (between frames).

    Raises:
        PipeProtocolError: The stream ends inside a frame, a frame is over the cap,
            or its body does not decode.
        OSError: The stream is broken.
    """
    header = _read_exactly(stream, _HEADER.size)
    if not header:
        return None
    if len(header) < _HEADER.size:
        raise PipeProtocolError("stream ended inside a frame header")
    (size,) = _HEADER.unpack(header)
    if size > MAX_FRAME_BYTES:
        raise PipeProtocolError(f"frame of {size} bytes exceeds the {MAX_FRAME_BYTES} cap")
    body = _read_exactly(stream, size)
    if len(body) < size:
        raise PipeProtocolError(f"stream ended {size - len(body)} bytes short of a frame's end")
    return decode_frame(body)
