"""The pipe protocol between the agent and a skill's control process.

A frame is a 4-byte big-endian length followed by that many bytes of UTF-8
JSON. Numpy arrays travel as ``{"__ndarray__": dtype, "shape": [...], "b64": ...}``
and numpy scalars as plain numbers. Both directions cap frames at
:data:`MAX_FRAME_BYTES`; the decoder trusts nothing it reads, since the other
end runs a bundle author's code.

Split and joint inference add three frames (see :mod:`edge_agent.split.runtime`):

* up, before ``ready``: ``{"op": "profile", "model": m, "segment_ms": [...]}``,
  the control process's timing of each segment of split model ``m``;
* up, only while a ``process`` request is in flight: ``{"op": "tail", "id": t,
  "item": n, "model": m, "split": cut, "tensors": {name: array}}``, asking the
  agent to have the hub finish model ``m`` from ``cut`` for item ``n``;
* down, the answer to it: ``{"op": "tail-reply", "id": t, "ok": bool,
  "outputs": {name: array}, "error": str, "plan": str}``.

The ``process`` request carries ``"plan": {model: cut | "device" | "joint"}``
and its reply ``"infers": [{"model", "path", "cut", "fallback", "device_ms"}, ...]``.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import IO, TYPE_CHECKING, Any

from edge_agent.errors import SandboxError

if TYPE_CHECKING:
    import numpy as np

__all__ = [
    "INFER_PATHS",
    "MAX_FRAME_BYTES",
    "MAX_INFERS_PER_ITEM",
    "MAX_TAILS_PER_ITEM",
    "InferRecord",
    "PipeProtocolError",
    "TailAnswer",
    "TailRequest",
    "decode_frame",
    "encode_frame",
    "parse_infers",
    "parse_profile",
    "parse_tail_reply",
    "parse_tail_request",
    "read_frame",
    "tail_reply",
    "write_frame",
]

MAX_FRAME_BYTES = 16 * 1024 * 1024
_HEADER = struct.Struct(">I")
_MAX_NDIM = 32
_ARRAY_KEY = "__ndarray__"
_ARRAY_KINDS = frozenset("biufc")
#: Tail requests one item may make; more are refused without reaching the hub.
MAX_TAILS_PER_ITEM = 16
#: Inference records one reply may carry; more are dropped.
MAX_INFERS_PER_ITEM = 256
#: A reported device time above this (an hour, in ms) is not believed.
_MAX_DEVICE_MS = 3_600_000.0
#: The paths an inference record may name (as :data:`skills.sdk.INFER_PATHS`).
INFER_PATHS = frozenset({"device", "split", "hub", "joint-device", "joint-hub"})
_MAX_NAME_CHARS = 128
_MAX_TENSORS = 16
_MAX_SEGMENTS = 1024


class PipeProtocolError(SandboxError, ValueError):
    """A frame is malformed, too large, or cannot be encoded."""


def _to_json(value: Any) -> Any:
    """``json.dumps``'s hook for what JSON cannot hold natively."""
    import numpy as np  # noqa: PLC0415 - an idle agent (no skill) sends no array

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
    import numpy as np  # noqa: PLC0415 - only a running skill sends arrays

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


@dataclass(frozen=True)
class TailRequest:
    """A control process's request for the hub to finish a model, checked for shape only.

    Whether the model is the skill's own and the cut and tensors fit its plan is the
    agent's business (:mod:`edge_agent.split.runtime`); nothing here is trusted.

    Attributes:
        id: The request's id, echoed in the reply.
        item: The id of the ``process`` request it belongs to.
        model: The model named (a name in the skill's own manifest, or refused).
        split: The cut, ``input`` or ``joint``.
        tensors: The tensors to send, by name.
    """

    id: int
    item: int
    model: str
    split: str
    tensors: dict[str, np.ndarray]


@dataclass(frozen=True)
class TailAnswer:
    """The agent's answer to a tail request.

    Attributes:
        outputs: The hub's outputs by name, or ``None`` when the hub was not asked,
            refused, failed or missed the deadline.
        error: Why there are no outputs (empty on success).
        plan: The agent's plan for the model after this request, if it says.
    """

    outputs: Mapping[str, np.ndarray] | None
    error: str = ""
    plan: str | None = None


def tail_reply(tail_id: int, answer: TailAnswer) -> dict[str, Any]:
    """The ``tail-reply`` frame for ``answer``."""
    ok = answer.outputs is not None
    reply: dict[str, Any] = {"op": "tail-reply", "id": tail_id, "ok": ok}
    if ok:
        reply["outputs"] = dict(answer.outputs or {})
    else:
        reply["error"] = answer.error or "refused"
    if answer.plan is not None:
        reply["plan"] = answer.plan
    return reply


def parse_tail_reply(reply: Mapping[str, Any]) -> TailAnswer:
    """The answer in a ``tail-reply`` frame; anything malformed reads as a failure."""
    outputs, plan = reply.get("outputs"), reply.get("plan")
    plan_text = plan[:_MAX_NAME_CHARS] if isinstance(plan, str) else None
    if reply.get("ok") is not True or not isinstance(outputs, dict):
        return TailAnswer(None, str(reply.get("error", "refused"))[:4000], plan_text)
    import numpy as np  # noqa: PLC0415 - only a split skill's control process reads replies

    arrays = {str(k): v for k, v in outputs.items() if isinstance(v, np.ndarray)}
    return TailAnswer(arrays, "", plan_text)


@dataclass(frozen=True)
class InferRecord:
    """One ``ctx.infer`` call as the control process reported it."""

    model: str
    path: str
    cut: str
    fallback: bool
    #: Time the model's segments ran on the device (0 when not reported or not believable).
    device_ms: float = 0.0


def _name(message: Mapping[str, Any], key: str) -> str:
    value = message.get(key)
    if not isinstance(value, str) or not 0 < len(value) <= _MAX_NAME_CHARS:
        raise PipeProtocolError(f"{key!r} must be a name of 1 to {_MAX_NAME_CHARS} characters")
    return value


def _int(message: Mapping[str, Any], key: str) -> int:
    value = message.get(key)
    if type(value) is not int:
        raise PipeProtocolError(f"{key!r} must be an integer")
    return value


def parse_tail_request(message: Mapping[str, Any]) -> TailRequest:
    """Check a ``tail`` frame's fields and sizes.

    Raises:
        PipeProtocolError: A field is missing, of the wrong type, or over a cap.
    """
    tensors = message.get("tensors")
    if not isinstance(tensors, dict) or not 0 < len(tensors) <= _MAX_TENSORS:
        raise PipeProtocolError(f"'tensors' must map 1 to {_MAX_TENSORS} names to arrays")
    import numpy as np  # noqa: PLC0415 - only a split skill asks for tails

    for key, value in tensors.items():
        if len(key) > _MAX_NAME_CHARS or not isinstance(value, np.ndarray):
            raise PipeProtocolError(f"tensor {key[:_MAX_NAME_CHARS]!r} is not a named array")
    return TailRequest(
        id=_int(message, "id"),
        item=_int(message, "item"),
        model=_name(message, "model"),
        split=_name(message, "split"),
        tensors=dict(tensors),
    )


def parse_profile(message: Mapping[str, Any]) -> tuple[str, tuple[float, ...]]:
    """A ``profile`` frame's model and per-segment times (ms).

    Raises:
        PipeProtocolError: The model is not a name, or the times are not a list of
            finite, non-negative numbers (at most 1024).
    """
    model = _name(message, "model")
    times = message.get("segment_ms")
    if not isinstance(times, list) or not 0 < len(times) <= _MAX_SEGMENTS:
        raise PipeProtocolError(f"'segment_ms' must list 1 to {_MAX_SEGMENTS} times")
    if not all(type(t) in (int, float) and math.isfinite(t) and t >= 0 for t in times):
        raise PipeProtocolError("'segment_ms' must hold finite times >= 0")
    return model, tuple(float(t) for t in times)


def parse_infers(value: object) -> list[InferRecord]:
    """The inference records of a ``process`` reply; malformed entries are skipped.

    At most :data:`MAX_INFERS_PER_ITEM` are kept.
    """
    if not isinstance(value, list):
        return []
    records = []
    for entry in value[:MAX_INFERS_PER_ITEM]:
        if not isinstance(entry, dict) or entry.get("path") not in INFER_PATHS:
            continue
        model, cut, device_ms = entry.get("model"), entry.get("cut"), entry.get("device_ms")
        believable = (
            type(device_ms) in (int, float)
            and math.isfinite(device_ms)  # type: ignore[arg-type]
            and 0 <= device_ms <= _MAX_DEVICE_MS  # type: ignore[operator]
        )
        records.append(
            InferRecord(
                model=model[:_MAX_NAME_CHARS] if isinstance(model, str) else "",
                path=str(entry["path"]),
                cut=cut[:_MAX_NAME_CHARS] if isinstance(cut, str) else "",
                fallback=entry.get("fallback") is True,
                device_ms=float(device_ms) if believable else 0.0,  # type: ignore[arg-type]
            )
        )
    return records
