"""The cut-tensor codec: round trips, error bounds, and hostile payloads refused within caps."""

from __future__ import annotations

import contextlib
import struct
import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from protos import edgeskill_pb2 as pb
from skills.errors import TensorCodecError
from skills.tensor_codec import (
    CODECS,
    CodecLimits,
    decode,
    decode_protos,
    encode,
    encode_protos,
    quantize_int8,
)

_shapes = hnp.array_shapes(min_dims=0, max_dims=4, min_side=0, max_side=6)
_finite = st.floats(-1e4, 1e4, width=32, allow_nan=False)
_arrays = hnp.arrays(np.float32, _shapes, elements=_finite)
_names = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), min_size=1, max_size=12)
_tensor_dicts = st.dictionaries(_names, _arrays, max_size=4)


@settings(max_examples=150, deadline=None)
@given(_tensor_dicts)
def test_fp32_round_trip_is_exact_with_names_and_shapes(tensors: dict[str, np.ndarray]) -> None:
    out = decode(encode(tensors, "fp32"))

    assert list(out) == list(tensors)
    for name, x in tensors.items():
        assert out[name].dtype == np.float32
        np.testing.assert_array_equal(out[name], x)


@settings(max_examples=100, deadline=None)
@given(hnp.arrays(np.float16, _shapes, elements=st.floats(width=16, allow_nan=False)))
def test_fp16_is_exact_for_values_half_precision_represents(half: np.ndarray) -> None:
    x = half.astype(np.float32)

    out = decode(encode({"t": x}, "fp16"))["t"]

    np.testing.assert_array_equal(out, x)


@settings(max_examples=150, deadline=None)
@given(_arrays)
def test_int8_error_is_at_most_half_a_step(x: np.ndarray) -> None:
    _, scale, zero_point = quantize_int8(x)

    out = decode(encode({"t": x}, "int8"))["t"]

    assert -128 <= zero_point <= 127
    assert out.shape == x.shape
    if x.size:
        bound = scale / 2 * (1 + 1e-4) + 1e-6 * float(np.abs(x).max())
        assert float(np.max(np.abs(out - x))) <= bound


def test_int8_keeps_zero_exact_and_spans_the_range() -> None:
    x = np.array([[-1.0, 0.0, 0.5, 3.0]], np.float32)
    q, scale, zero_point = quantize_int8(x)

    assert scale == pytest.approx(4.0 / 255, rel=1e-6)
    assert zero_point == -64  # round(-128 + 1 / scale)
    assert q.min() == -128 and q.max() == 127
    assert decode(encode({"t": x}, "int8"))["t"][0, 1] == 0.0
    assert np.all(decode(encode({"t": np.zeros(5, np.float32)}, "int8"))["t"] == 0)


def test_sizes_shrink_by_codec() -> None:
    tensors = {"a": np.ones((1, 64, 32, 32), np.float32)}
    sizes = {codec: len(encode(tensors, codec)) for codec in CODECS}

    raw = 64 * 32 * 32
    assert raw * 4 < sizes["fp32"] < raw * 4 + 64
    assert raw * 2 < sizes["fp16"] < raw * 2 + 64
    assert raw < sizes["int8"] < raw + 64


@settings(max_examples=60, deadline=None)
@given(_tensor_dicts, st.sampled_from(CODECS))
def test_protos_round_trip_in_the_cut_order(tensors: dict[str, np.ndarray], codec: str) -> None:
    order = sorted(tensors, reverse=True)
    protos = encode_protos(tensors, order, codec)
    wire = [pb.TensorProto.FromString(p.SerializeToString()) for p in protos]

    out = decode_protos(wire, order)

    assert list(out) == order
    for name in order:
        assert out[name].shape == tensors[name].shape
        if codec == "fp32":
            np.testing.assert_array_equal(out[name], tensors[name])


def test_encoding_refuses_what_it_cannot_represent() -> None:
    limits = CodecLimits(max_tensors=2, max_elements=100, max_bytes=1000)
    cases = [
        ({"t": np.zeros(3, np.float64)}, "fp32"),
        ({"t": np.array([1e6], np.float32)}, "fp16"),
        ({"t": np.array([np.nan], np.float32)}, "int8"),
        ({"t": np.array([np.inf], np.float32)}, "int8"),
        ({"t": np.zeros(3, np.float32)}, "bf16"),
        ({"": np.zeros(3, np.float32)}, "fp32"),
        ({str(i): np.zeros(1, np.float32) for i in range(3)}, "fp32"),
        ({"t": np.zeros(101, np.float32)}, "fp32"),
        ({"t": np.zeros((1,) * 9, np.float32)}, "fp32"),
    ]
    for tensors, codec in cases:
        with pytest.raises(TensorCodecError):
            encode(tensors, codec, limits)
    with pytest.raises(TensorCodecError):
        encode_protos({"a": np.zeros(1, np.float32)}, ["b"], "fp32")


def _header(codec: int = 0, count: int = 1) -> bytes:
    return struct.pack("<4sBBH", b"ESTC", 1, codec, count)


def _tensor(name: bytes, shape: list[int], payload: bytes = b"") -> bytes:
    dims = b"".join(struct.pack("<I", d) for d in shape)
    return struct.pack("<H", len(name)) + name + bytes([len(shape)]) + dims + payload


HOSTILE = {
    "empty": b"",
    "bad magic": b"XXXX" + _header()[4:],
    "bad version": struct.pack("<4sBBH", b"ESTC", 9, 0, 0),
    "unknown codec": _header(codec=7, count=0),
    "too many tensors": _header(count=1000),
    "truncated name": _header() + struct.pack("<H", 50) + b"abc",
    "empty name": _header() + _tensor(b"", [1], b"\0" * 4),
    "bad utf-8": _header() + _tensor(b"\xff\xfe", [1], b"\0" * 4),
    "too many dims": _header() + _tensor(b"t", [1] * 30),
    "huge shape, tiny payload": _header() + _tensor(b"t", [0xFFFFFFFF, 0xFFFFFFFF], b"\0" * 8),
    "shape over element cap": _header() + _tensor(b"t", [4096, 4097], b""),
    "payload short": _header() + _tensor(b"t", [4], b"\0" * 15),
    "trailing bytes": _header() + _tensor(b"t", [1], b"\0" * 4) + b"x",
    "duplicate name": _header(count=2) + _tensor(b"t", [1], b"\0" * 4) * 2,
    "int8 zero scale": _header(codec=2) + _tensor(b"t", [1], struct.pack("<fi", 0.0, 0) + b"\0"),
    "int8 nan scale": _header(codec=2)
    + _tensor(b"t", [1], struct.pack("<fi", float("nan"), 0) + b"\0"),
    "int8 zero point": _header(codec=2) + _tensor(b"t", [1], struct.pack("<fi", 1.0, 999) + b"\0"),
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_hostile_payloads_raise_without_allocating_past_the_caps(name: str) -> None:
    limits = CodecLimits(max_elements=4096 * 4096)
    tracemalloc.start()
    try:
        with pytest.raises(TensorCodecError):
            decode(HOSTILE[name], limits)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1024 * 1024


def test_payload_over_the_byte_cap_is_refused_before_parsing() -> None:
    data = encode({"t": np.zeros(300, np.float32)}, "fp32")
    with pytest.raises(TensorCodecError, match="over the cap"):
        decode(data, CodecLimits(max_bytes=1000))


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_random_bytes_never_raise_anything_else(data: bytes) -> None:
    with contextlib.suppress(TensorCodecError):
        decode(_header() + data, CodecLimits(max_elements=10_000))


def test_hostile_protos_are_refused() -> None:
    limits = CodecLimits(max_elements=1000)
    good = encode_protos({"t": np.zeros(4, np.float32)}, ["t"], "fp32")[0]
    cases = [
        [pb.TensorProto(dtype="float64", shape=[1], data=b"\0" * 8)],
        [pb.TensorProto(dtype="float32", shape=[5], data=good.data)],
        [pb.TensorProto(dtype="float32", shape=[-1], data=b"")],
        [pb.TensorProto(dtype="float32", shape=[2**40, 2**40], data=b"\0" * 16)],
        [pb.TensorProto(dtype="float32", shape=[1] * 20, data=b"\0" * 4)],
        [pb.TensorProto(dtype="int8", shape=[1], data=b"\0")],
        [good, good],
    ]
    for protos in cases:
        with pytest.raises(TensorCodecError):
            decode_protos(protos, ["t"], limits)


def test_protos_carry_names_and_int8_parameters_in_their_own_fields() -> None:
    x = np.array([[-1.0, 0.0, 0.5, 3.0]], np.float32)
    (proto,) = encode_protos({"act": x}, ["act"], "int8")

    assert proto.name == "act" and proto.dtype == "int8"
    assert len(proto.data) == x.size  # the values alone: no header in front
    assert proto.scale == pytest.approx(4.0 / 255, rel=1e-6) and proto.zero_point == -64
    out = decode_protos([pb.TensorProto.FromString(proto.SerializeToString())], ["act"])
    assert np.max(np.abs(out["act"] - x)) <= proto.scale / 2 + 1e-6


def test_named_protos_decode_by_name_in_any_order() -> None:
    tensors = {"a": np.ones((1, 2), np.float32), "b": np.zeros((1, 3), np.float32)}
    protos = encode_protos(tensors, ["b", "a"], "fp16")

    out = decode_protos(protos, ["a", "b"])

    assert list(out) == ["a", "b"]
    assert out["a"].shape == (1, 2) and out["b"].shape == (1, 3)
    renamed = [pb.TensorProto(name="c", dtype="float32", shape=[1], data=b"\0" * 4)]
    with pytest.raises(TensorCodecError, match="do not match"):
        decode_protos(renamed, ["a"])
    half_named = [protos[0], pb.TensorProto(dtype="float16", shape=[1, 2], data=b"\0" * 4)]
    with pytest.raises(TensorCodecError, match="do not match"):
        decode_protos(half_named, ["a", "b"])
