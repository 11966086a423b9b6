"""Encode the tensors that cross a split-inference cut, for the agent and the hub alike.

Three codecs: ``fp32`` (exact), ``fp16`` (half the bytes; exact for values
representable in half precision) and ``int8`` (a quarter; per-tensor affine
``x ≈ (q - zero_point) * scale`` with 0 inside the range, so the zero point fits
in int8 and the error is at most ``scale / 2``).

Two wire forms (values little-endian):

- :func:`encode_protos` / :func:`decode_protos`: ``TensorProto`` messages for
  ``InferRequest.inputs`` and ``InferResponse.outputs``. Each names its graph
  tensor (``name``); an int8 one carries its ``scale`` and ``zero_point`` in
  their own fields, its ``data`` being the int8 values alone.
- :func:`encode` / :func:`decode`: a self-describing byte string with names
  (``ESTC``, version, codec, count, then per tensor its name, shape and payload,
  int8 putting ``scale`` float32 and ``zero_point`` int32 in front of the
  values), for anything that stores or carries plain bytes.

Everything read from outside is checked against :class:`CodecLimits` before any
array is allocated (the caps live in :mod:`skills.codec_limits`, which needs no
numpy). Needs numpy only.
"""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from protos import edgeskill_pb2 as pb
from skills.codec_limits import (
    BYTES_PER_FP32,
    CODECS,
    DEFAULT_LIMITS,
    MAX_INFER_BYTES,
    WIRE_LIMITS,
    CodecLimits,
)
from skills.errors import TensorCodecError

__all__ = [
    "BYTES_PER_FP32",
    "CODECS",
    "DEFAULT_LIMITS",
    "MAX_INFER_BYTES",
    "WIRE_LIMITS",
    "CodecLimits",
    "decode",
    "decode_protos",
    "dequantize_int8",
    "encode",
    "encode_protos",
    "quantize_int8",
]

_DTYPES: dict[str, np.dtype[Any]] = {
    "fp32": np.dtype("<f4"),
    "fp16": np.dtype("<f2"),
    "int8": np.dtype("i1"),
}
_PROTO_DTYPES = {"fp32": "float32", "fp16": "float16", "int8": "int8"}
_MAGIC = b"ESTC"
_VERSION = 1
_HEAD = struct.Struct("<4sBBH")  # magic, version, codec index, tensor count
_INT8_PARAMS = struct.Struct("<fi")  # scale, zero point
_U16 = struct.Struct("<H")
_U32 = struct.Struct("<I")
_FP16_MAX = float(np.finfo(np.float16).max)
_QMIN, _QMAX = -128, 127
_SMALLEST_SCALE = float(np.finfo(np.float32).tiny)


def quantize_int8(x: np.ndarray) -> tuple[np.ndarray, float, int]:
    """Per-tensor affine int8 quantisation over ``[min(x, 0), max(x, 0)]``.

    Returns:
        ``(q, scale, zero_point)`` with ``q`` int8 and ``scale`` exactly a float32.

    Raises:
        TensorCodecError: ``x`` holds NaN or infinity.
    """
    if x.size == 0:
        return np.zeros(x.shape, np.int8), 1.0, 0
    lo, hi = min(float(x.min()), 0.0), max(float(x.max()), 0.0)
    if not (math.isfinite(lo) and math.isfinite(hi)):
        raise TensorCodecError("int8 codec needs finite values")
    scale = float(np.float32((hi - lo) / (_QMAX - _QMIN))) or 1.0
    # A subnormal scale loses bits; values that small all round to zero at this one.
    scale = max(scale, _SMALLEST_SCALE)
    zero_point = int(np.clip(round(_QMIN - lo / scale), _QMIN, _QMAX))
    q = np.rint(x / np.float32(scale)) + np.float32(zero_point)
    return np.clip(q, _QMIN, _QMAX).astype(np.int8), scale, zero_point


def dequantize_int8(q: np.ndarray, scale: float, zero_point: int) -> np.ndarray:
    """``(q - zero_point) * scale`` as float32."""
    return (q.astype(np.float32) - np.float32(zero_point)) * np.float32(scale)


def _payload(x: np.ndarray, codec: str) -> bytes:
    if codec == "fp32":
        return x.astype("<f4").tobytes()
    if codec == "fp16":
        finite = x[np.isfinite(x)]
        if finite.size and float(np.abs(finite).max()) > _FP16_MAX:
            raise TensorCodecError("a value is outside the fp16 range; use fp32 or int8")
        return x.astype("<f2").tobytes()
    q, scale, zero_point = quantize_int8(x)
    return _INT8_PARAMS.pack(scale, zero_point) + q.tobytes()


def _check_tensors(tensors: Mapping[str, np.ndarray], limits: CodecLimits) -> None:
    if len(tensors) > limits.max_tensors:
        raise TensorCodecError(f"{len(tensors)} tensors, over the cap of {limits.max_tensors}")
    elements = 0
    for name, x in tensors.items():
        _check_name(name.encode(), limits)
        if not isinstance(x, np.ndarray) or x.dtype != np.float32:
            raise TensorCodecError(f"tensor {name!r} must be a float32 numpy array")
        if x.ndim > limits.max_ndim or any(d > 0xFFFFFFFF for d in x.shape):
            raise TensorCodecError(f"tensor {name!r} has a shape over the caps: {x.shape}")
        elements += x.size
    if elements > limits.max_elements:
        raise TensorCodecError(f"{elements} values, over the cap of {limits.max_elements}")


def _check_codec(codec: str) -> None:
    if codec not in _DTYPES:
        raise TensorCodecError(f"unknown codec {codec!r}; expected one of {CODECS}")


def _check_name(raw: bytes, limits: CodecLimits) -> str:
    if not 0 < len(raw) <= limits.max_name_bytes:
        raise TensorCodecError(f"tensor name length {len(raw)} outside 1..{limits.max_name_bytes}")
    try:
        return raw.decode()
    except UnicodeDecodeError as exc:
        raise TensorCodecError("tensor name is not UTF-8") from exc


def encode(
    tensors: Mapping[str, np.ndarray], codec: str, limits: CodecLimits = DEFAULT_LIMITS
) -> bytes:
    """Encode named float32 arrays into one self-describing byte string.

    Raises:
        TensorCodecError: Unknown codec, a cap is exceeded, an array is not
            float32, or a value cannot be represented by the codec.
    """
    _check_codec(codec)
    _check_tensors(tensors, limits)
    parts = [_HEAD.pack(_MAGIC, _VERSION, CODECS.index(codec), len(tensors))]
    for name, x in tensors.items():
        raw = name.encode()
        parts += [_U16.pack(len(raw)), raw, bytes([x.ndim])]
        parts += [_U32.pack(d) for d in x.shape]
        parts.append(_payload(x, codec))
    data = b"".join(parts)
    if len(data) > limits.max_bytes:
        raise TensorCodecError(f"payload of {len(data)} bytes, over the cap of {limits.max_bytes}")
    return data


class _Reader:
    """Bounds-checked reads from a payload; every shortfall is a TensorCodecError."""

    def __init__(self, data: bytes) -> None:
        self.view = memoryview(data)
        self.pos = 0

    def take(self, n: int) -> memoryview:
        if n > len(self.view) - self.pos:
            raise TensorCodecError(f"payload truncated: need {n} bytes at offset {self.pos}")
        chunk = self.view[self.pos : self.pos + n]
        self.pos += n
        return chunk

    def unpack(self, fmt: struct.Struct) -> tuple[object, ...]:
        return fmt.unpack(self.take(fmt.size))


def _elements(shape: Sequence[int], limits: CodecLimits, budget: int) -> int:
    if len(shape) > limits.max_ndim:
        raise TensorCodecError(f"{len(shape)} dimensions, over the cap of {limits.max_ndim}")
    count = 1
    for dim in shape:
        if dim < 0:
            raise TensorCodecError(f"negative dimension in shape {list(shape)}")
        count *= dim
        if count > budget:  # checked as it grows, so a huge shape never becomes a huge int
            raise TensorCodecError(f"shape {list(shape)} is over the cap of {limits.max_elements}")
    return count


def _values(raw: memoryview | bytes, codec: str, shape: tuple[int, ...], count: int) -> np.ndarray:
    """Decode one payload whose length was already checked."""
    dtype = _DTYPES[codec]
    if codec != "int8":
        return np.frombuffer(raw, dtype, count).astype(np.float32).reshape(shape)
    scale, zero_point = _INT8_PARAMS.unpack(raw[: _INT8_PARAMS.size])
    if not (math.isfinite(scale) and scale > 0 and _QMIN <= zero_point <= _QMAX):
        raise TensorCodecError(f"bad int8 parameters: scale {scale}, zero point {zero_point}")
    q = np.frombuffer(raw, dtype, count, offset=_INT8_PARAMS.size)
    return dequantize_int8(q, scale, zero_point).reshape(shape)


def _payload_size(codec: str, count: int) -> int:
    extra = _INT8_PARAMS.size if codec == "int8" else 0
    return extra + count * _DTYPES[codec].itemsize


def decode(data: bytes, limits: CodecLimits = DEFAULT_LIMITS) -> dict[str, np.ndarray]:
    """Decode :func:`encode`'s output into float32 arrays.

    Raises:
        TensorCodecError: The payload is malformed, truncated, has trailing
            bytes, or exceeds a cap.
    """
    if len(data) > limits.max_bytes:
        raise TensorCodecError(f"payload of {len(data)} bytes, over the cap of {limits.max_bytes}")
    reader = _Reader(data)
    magic, version, codec_index, count = reader.unpack(_HEAD)
    if magic != _MAGIC or version != _VERSION:
        raise TensorCodecError(f"not a version-{_VERSION} tensor payload")
    assert isinstance(codec_index, int) and isinstance(count, int)
    if codec_index >= len(CODECS):
        raise TensorCodecError(f"unknown codec number {codec_index}")
    if count > limits.max_tensors:
        raise TensorCodecError(f"{count} tensors, over the cap of {limits.max_tensors}")
    codec = CODECS[codec_index]
    budget = limits.max_elements
    out: dict[str, np.ndarray] = {}
    for _ in range(count):
        (name_len,) = reader.unpack(_U16)
        assert isinstance(name_len, int)
        name = _check_name(bytes(reader.take(name_len)), limits)
        if name in out:
            raise TensorCodecError(f"tensor {name!r} appears twice")
        ndim = reader.take(1)[0]
        if ndim > limits.max_ndim:
            raise TensorCodecError(f"{ndim} dimensions, over the cap of {limits.max_ndim}")
        shape = tuple(_U32.unpack(reader.take(_U32.size))[0] for _ in range(ndim))
        elements = _elements(shape, limits, budget)
        budget -= elements
        out[name] = _values(reader.take(_payload_size(codec, elements)), codec, shape, elements)
    if reader.pos != len(data):
        raise TensorCodecError(f"{len(data) - reader.pos} trailing bytes after the last tensor")
    return out


def _proto(name: str, x: np.ndarray, codec: str) -> pb.TensorProto:
    if codec != "int8":
        return pb.TensorProto(
            name=name, dtype=_PROTO_DTYPES[codec], shape=list(x.shape), data=_payload(x, codec)
        )
    q, scale, zero_point = quantize_int8(x)
    return pb.TensorProto(
        name=name,
        dtype="int8",
        shape=list(x.shape),
        data=q.tobytes(),
        scale=scale,
        zero_point=zero_point,
    )


def encode_protos(
    tensors: Mapping[str, np.ndarray],
    names: Sequence[str],
    codec: str,
    limits: CodecLimits = DEFAULT_LIMITS,
) -> list[pb.TensorProto]:
    """Encode named float32 arrays as ``TensorProto`` messages, in the order of ``names``.

    Each message carries its tensor's name; int8 ones their scale and zero point.

    Args:
        tensors: The arrays by name; must hold exactly ``names``.
        names: The order to send them in (a cut's tensor order).
        codec: One of :data:`CODECS`.
        limits: Caps.

    Raises:
        TensorCodecError: The names do not match, or as :func:`encode`.
    """
    _check_codec(codec)
    if sorted(tensors) != sorted(names) or len(set(names)) != len(names):
        raise TensorCodecError(f"tensors {sorted(tensors)} do not match the cut {list(names)}")
    _check_tensors(tensors, limits)
    protos = [_proto(n, tensors[n], codec) for n in names]
    total = sum(len(p.data) for p in protos)
    if total > limits.max_bytes:
        raise TensorCodecError(f"payload of {total} bytes, over the cap of {limits.max_bytes}")
    return protos


def _by_name(
    protos: Sequence[pb.TensorProto], names: Sequence[str]
) -> list[tuple[str, pb.TensorProto]]:
    """Pair each expected name with its message: by the messages' names, or by order
    when none is named (a sender from before tensors carried names)."""
    given = [p.name for p in protos]
    if not any(given):
        return list(zip(names, protos, strict=True))
    if not all(given) or sorted(given) != sorted(names) or len(set(given)) != len(given):
        shown = [g[:64] for g in given[:8]]
        raise TensorCodecError(f"tensors {shown} do not match the expected {list(names)[:8]}")
    found = dict(zip(given, protos, strict=True))
    return [(n, found[n]) for n in names]


def _int8_params(name: str, proto: pb.TensorProto) -> tuple[float, int]:
    scale, zero_point = float(proto.scale), int(proto.zero_point)
    if not (math.isfinite(scale) and scale > 0 and _QMIN <= zero_point <= _QMAX):
        raise TensorCodecError(
            f"tensor {name!r}: bad int8 parameters: scale {scale}, zero point {zero_point}"
        )
    return scale, zero_point


def decode_protos(
    protos: Sequence[pb.TensorProto], names: Sequence[str], limits: CodecLimits = DEFAULT_LIMITS
) -> dict[str, np.ndarray]:
    """Decode ``TensorProto`` messages into float32 arrays, keyed and ordered by ``names``.

    Messages are matched to ``names`` by their ``name`` fields (in any order), or by
    position when no message is named.

    Raises:
        TensorCodecError: The tensors are not exactly ``names``, a dtype is unknown, a
            shape does not match its data length, int8 parameters are invalid, or a
            cap is exceeded.
    """
    if len(protos) != len(names) or len(names) > limits.max_tensors:
        raise TensorCodecError(f"got {len(protos)} tensors for a cut of {len(names)}")
    codecs = {dtype: codec for codec, dtype in _PROTO_DTYPES.items()}
    if sum(len(p.data) for p in protos) > limits.max_bytes:
        raise TensorCodecError(f"tensor data over the cap of {limits.max_bytes} bytes")
    budget = limits.max_elements
    out: dict[str, np.ndarray] = {}
    for name, proto in _by_name(protos, names):
        if proto.dtype not in codecs:
            raise TensorCodecError(f"tensor {name!r} has unknown dtype {proto.dtype[:32]!r}")
        codec = codecs[proto.dtype]
        shape = tuple(int(d) for d in proto.shape[: limits.max_ndim + 1])
        elements = _elements(shape, limits, budget)
        budget -= elements
        if len(proto.data) != elements * _DTYPES[codec].itemsize:
            raise TensorCodecError(
                f"tensor {name!r}: {len(proto.data)} data bytes do not fit shape {list(shape)}"
            )
        if codec == "int8":
            q = np.frombuffer(proto.data, np.int8, elements)
            out[name] = dequantize_int8(q, *_int8_params(name, proto)).reshape(shape)
        else:
            out[name] = np.frombuffer(proto.data, _DTYPES[codec], elements)
            out[name] = out[name].astype(np.float32).reshape(shape)
    return out
