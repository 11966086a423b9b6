"""TFLite → ONNX for float convolutional networks, with numpy and ``onnx`` only.

A ``.tflite`` file is a FlatBuffer (TensorFlow Lite's ``schema.fbs``). This
module reads the few tables a float CNN needs with a small bounds-checked
reader — every offset is checked against the file, so a hostile or truncated
file raises :class:`ConversionError` and nothing else — and writes the same
graph with ``onnx.helper``.

Layout: TFLite is NHWC, ONNX's convolutions are NCHW. The ONNX graph keeps the
model's own inputs and outputs, names, shapes and NHWC layout (control code
feeds both variants the same arrays) and runs NCHW inside: one ``Transpose``
after each 4-D input, before each 4-D output, and around a reshape of a 4-D
tensor. Weights are transposed once, at conversion.

Supported: float32 graphs with static shapes and one subgraph; float16
constants are widened to float32, as LiteRT's ``DEQUANTIZE`` does; operators
:data:`SUPPORTED_OPS` with fused activations none, ReLU, ReLU6 and ReLU(-1, 1).
Anything else — int8 models, control flow, an operator outside the set — is
refused with the list of what is missing, never converted approximately.

:func:`convert_tflite_onnx` checks the result against LiteRT on a seeded random
input when LiteRT is installed, so a conversion that does not match its source
is never written.
"""

from __future__ import annotations

import dataclasses
import math
import struct
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from converters._files import atomic_write_bytes
from converters.errors import ConversionError

__all__ = [
    "MAX_TFLITE_BYTES",
    "SUPPORTED_OPS",
    "TfliteModel",
    "convert_tflite_onnx",
    "read_tflite",
    "tflite_to_onnx",
]

#: The largest ``.tflite`` file read (256 MiB): a model from a package, still capped.
MAX_TFLITE_BYTES = 256 << 20
_MAX_ITEMS = 1 << 20  # tensors, operators, buffers in one vector (byte arrays: the file caps them)
_OPSET = 17
_IDENTIFIER = b"TFL3"

# BuiltinOperator codes (schema.fbs) of the operators converted.
_ADD, _CONCATENATION, _CONV_2D, _DEPTHWISE_CONV_2D, _DEQUANTIZE = 0, 2, 3, 4, 6
_MAX_POOL_2D, _RELU, _RESHAPE, _RESIZE_BILINEAR, _PAD, _PRELU = 17, 19, 22, 23, 34, 54
#: The operators converted, by TFLite name.
SUPPORTED_OPS = {
    _ADD: "ADD",
    _CONCATENATION: "CONCATENATION",
    _CONV_2D: "CONV_2D",
    _DEPTHWISE_CONV_2D: "DEPTHWISE_CONV_2D",
    _DEQUANTIZE: "DEQUANTIZE",
    _MAX_POOL_2D: "MAX_POOL_2D",
    _PAD: "PAD",
    _PRELU: "PRELU",
    _RELU: "RELU",
    _RESHAPE: "RESHAPE",
    _RESIZE_BILINEAR: "RESIZE_BILINEAR",
}
# Names of other operators often met, for the refusal's message (schema.fbs).
_OTHER_OPS = {
    1: "AVERAGE_POOL_2D",
    5: "DEPTH_TO_SPACE",
    9: "FULLY_CONNECTED",
    14: "LOGISTIC",
    18: "MUL",
    20: "RELU_N1_TO_1",
    21: "RELU6",
    25: "SOFTMAX",
    28: "TANH",
    39: "TRANSPOSE",
    40: "MEAN",
    41: "SUB",
    114: "QUANTIZE",
    124: "DENSIFY",
}
# TensorType codes to numpy dtypes (the ones a float CNN's tensors and constants use).
_DTYPES: dict[int, np.dtype[Any]] = {
    0: np.dtype("<f4"),
    1: np.dtype("<f2"),
    2: np.dtype("<i4"),
    3: np.dtype("u1"),
    4: np.dtype("<i8"),
    9: np.dtype("i1"),
}
_TYPE_NAMES = {0: "float32", 1: "float16", 2: "int32", 3: "uint8", 4: "int64", 9: "int8"}
_NHWC_TO_NCHW = (0, 3, 1, 2)
_NCHW_TO_NHWC = (0, 2, 3, 1)


# --- the FlatBuffer reader ---------------------------------------------------------


def _read(fmt: str, buf: bytes, pos: int) -> Any:
    if pos < 0 or pos + struct.calcsize(fmt) > len(buf):
        raise ConversionError(f"not a TFLite model: a field at byte {pos} is outside the file")
    return struct.unpack_from(fmt, buf, pos)[0]


class _Table:
    """One FlatBuffer table: a position and its vtable, every read bounds-checked."""

    __slots__ = ("_buf", "_pos", "_vt", "_vt_len")

    def __init__(self, buf: bytes, pos: int) -> None:
        self._buf = buf
        self._pos = pos
        self._vt = pos - _read("<i", buf, pos)
        self._vt_len = _read("<H", buf, self._vt)

    def _field(self, index: int) -> int:
        slot = 4 + 2 * index
        if slot + 2 > self._vt_len:
            return 0
        offset = _read("<H", self._buf, self._vt + slot)
        return self._pos + offset if offset else 0

    def scalar(self, index: int, fmt: str, default: Any) -> Any:
        at = self._field(index)
        return _read(fmt, self._buf, at) if at else default

    def _target(self, index: int) -> int | None:
        at = self._field(index)
        return at + _read("<I", self._buf, at) if at else None

    def _vector(self, index: int, item_size: int) -> tuple[int, int]:
        at = self._target(index)
        if at is None:
            return 0, 0
        count = _read("<I", self._buf, at)
        if at + 4 + count * item_size > len(self._buf):
            raise ConversionError(f"not a TFLite model: a vector of {count} runs past the file")
        return at + 4, count

    def table(self, index: int) -> _Table | None:
        at = self._target(index)
        return None if at is None else _Table(self._buf, at)

    def tables(self, index: int) -> list[_Table]:
        start, count = self._vector(index, 4)
        if count > _MAX_ITEMS:
            raise ConversionError(f"a vector of {count} tables is over {_MAX_ITEMS}")
        slots = (start + 4 * i for i in range(count))
        return [_Table(self._buf, at + _read("<I", self._buf, at)) for at in slots]

    def array(self, index: int, dtype: str) -> np.ndarray:
        kind = np.dtype(dtype)
        start, count = self._vector(index, kind.itemsize)
        return np.frombuffer(self._buf, kind, count, start).copy()

    def string(self, index: int) -> str:
        start, count = self._vector(index, 1)
        try:
            return self._buf[start : start + count].decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ConversionError(f"not a TFLite model: a name is not UTF-8: {exc}") from exc


# --- the model, as read ------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Tensor:
    name: str
    shape: tuple[int, ...]
    type: int
    data: np.ndarray | None  # a constant's value, in its file dtype


@dataclasses.dataclass(frozen=True)
class _Op:
    code: int
    inputs: tuple[int, ...]  # -1: an optional input left out
    outputs: tuple[int, ...]
    options: _Table | None


@dataclasses.dataclass(frozen=True)
class TfliteModel:
    """A TFLite model's one subgraph, as :func:`read_tflite` read it."""

    tensors: tuple[_Tensor, ...]
    ops: tuple[_Op, ...]
    inputs: tuple[int, ...]
    outputs: tuple[int, ...]

    def op_codes(self) -> set[int]:
        """The builtin operator codes the graph uses."""
        return {op.code for op in self.ops}


def _buffer(buf: bytes, table: _Table) -> np.ndarray | None:
    data = table.array(0, "u1")
    if data.size:
        return data
    offset, size = table.scalar(1, "<Q", 0), table.scalar(2, "<Q", 0)
    if offset <= 1:  # 0: no data; 1: the "offset not set" marker of large models
        return None
    if offset + size > len(buf):
        raise ConversionError("not a TFLite model: a weight buffer runs past the file")
    return np.frombuffer(buf, np.uint8, size, offset).copy()


def _tensor(index: int, table: _Table, buffers: Sequence[np.ndarray | None]) -> _Tensor:
    shape = tuple(int(d) for d in table.array(0, "<i4"))
    kind = table.scalar(1, "<b", 0)
    signature = table.array(7, "<i4")
    if any(d < 0 for d in shape) or any(d < 0 for d in signature):
        raise ConversionError(f"tensor {index} has a dynamic shape; only static shapes convert")
    which = table.scalar(2, "<I", 0)
    if which >= len(buffers):
        raise ConversionError(f"tensor {index} names buffer {which} of {len(buffers)}")
    raw = buffers[which]
    data = None
    if raw is not None and table.table(6) is None:  # sparse constants stay unread: DENSIFY
        dtype = _DTYPES.get(kind)
        if dtype is None:
            raise ConversionError(f"tensor {index} is a constant of type code {kind}")
        if raw.size != math.prod(shape) * dtype.itemsize:
            raise ConversionError(f"tensor {index}: {raw.size} bytes for shape {list(shape)}")
        data = raw.view(dtype).reshape(shape)
    return _Tensor(table.string(3) or f"tensor_{index}", shape, kind, data)


def read_tflite(data: bytes) -> TfliteModel:
    """A ``.tflite`` file's graph: tensors (constants with their values), operators, I/O.

    Raises:
        ConversionError: The bytes are not a TFLite model, or hold more than one subgraph.
    """
    if len(data) > MAX_TFLITE_BYTES:
        raise ConversionError(f"a TFLite model of {len(data)} bytes is over {MAX_TFLITE_BYTES}")
    if data[4:8] != _IDENTIFIER:
        raise ConversionError("not a TFLite model: no 'TFL3' file identifier")
    root = _Table(data, _read("<I", data, 0))
    codes = [max(t.scalar(0, "<b", 0), t.scalar(3, "<i", 0)) for t in root.tables(1)]
    subgraphs = root.tables(2)
    if len(subgraphs) != 1:
        raise ConversionError(
            f"{len(subgraphs)} subgraphs (a streaming or control-flow model); only "
            "single-graph models convert"
        )
    buffers = [_buffer(data, b) for b in root.tables(4)]
    graph = subgraphs[0]
    tensors = tuple(_tensor(i, t, buffers) for i, t in enumerate(graph.tables(0)))
    ops = []
    for op in graph.tables(3):
        which = op.scalar(0, "<I", 0)
        if which >= len(codes):
            raise ConversionError(f"an operator names opcode {which} of {len(codes)}")
        ins = tuple(int(i) for i in op.array(1, "<i4"))
        outs = tuple(int(i) for i in op.array(2, "<i4"))
        if any(i < -1 or i >= len(tensors) for i in ins) or any(
            i < 0 or i >= len(tensors) for i in outs
        ):
            raise ConversionError("an operator names a tensor the graph does not have")
        ops.append(_Op(codes[which], ins, outs, op.table(4)))
    ends = (graph.array(1, "<i4"), graph.array(2, "<i4"))
    if any(i < 0 or i >= len(tensors) for end in ends for i in end):
        raise ConversionError("the graph's inputs or outputs name tensors it does not have")
    return TfliteModel(tensors, tuple(ops), tuple(map(int, ends[0])), tuple(map(int, ends[1])))


# --- the ONNX graph ----------------------------------------------------------------


def _same_pads(size: int, kernel: int, stride: int, dilation: int) -> tuple[int, int]:
    """TFLite's SAME padding of one axis: the odd one goes after, as TensorFlow's."""
    out = -(-size // stride)
    total = max((out - 1) * stride + (kernel - 1) * dilation + 1 - size, 0)
    return total // 2, total - total // 2


class _Builder:
    """The ONNX nodes of one TFLite graph, with each tensor's ONNX name and layout."""

    def __init__(self, model: TfliteModel) -> None:
        import onnx  # noqa: PLC0415 - hub only
        from onnx import helper, numpy_helper  # noqa: PLC0415

        self.onnx, self.helper, self.numpy_helper = onnx, helper, numpy_helper
        self.model = model
        self.nodes: list[Any] = []
        self.inits: list[Any] = []
        self.names: dict[int, str] = {}
        self.nchw: set[int] = set()  # tensors whose ONNX value is NCHW (their TFLite one NHWC)
        self.consts: dict[int, np.ndarray] = {}
        for i, tensor in enumerate(model.tensors):
            if tensor.data is not None:
                self.consts[i] = tensor.data
        self._count = 0

    # small helpers

    def fresh(self, stem: str) -> str:
        self._count += 1
        return f"{stem}_{self._count}"

    def const(self, value: np.ndarray, stem: str = "c") -> str:
        name = self.fresh(stem)
        self.inits.append(self.numpy_helper.from_array(np.ascontiguousarray(value), name))
        return name

    def node(self, kind: str, inputs: Sequence[str], out: str | None = None, **attrs: Any) -> str:
        name = out or self.fresh(kind.lower())
        self.nodes.append(self.helper.make_node(kind, list(inputs), [name], **attrs))
        return name

    def tensor(self, index: int) -> _Tensor:
        return self.model.tensors[index]

    def value(self, index: int) -> str:
        """The ONNX name of a tensor (a constant becomes an initializer, as stored)."""
        if index in self.names:
            return self.names[index]
        if index in self.consts:
            self.names[index] = self.const(self.float_const(index), "w")
            return self.names[index]
        raise ConversionError(
            f"tensor {index} ({self.tensor(index).name}) is used before it is made"
        )

    def float_const(self, index: int) -> np.ndarray:
        value = self.consts[index]
        return value.astype(np.float32) if value.dtype.kind == "f" else value

    def activation(self, index: int) -> str:
        """A computed (non-constant) float tensor's ONNX name, NCHW when it is 4-D."""
        if index in self.consts:
            raise ConversionError(f"tensor {index} is a constant where an activation was expected")
        return self.value(index)

    def nhwc(self, index: int) -> str:
        """A tensor's ONNX name in TFLite's own layout."""
        name = self.activation(index)
        if index in self.nchw:
            return self.node("Transpose", [name], perm=list(_NCHW_TO_NHWC))
        return name

    def fused(self, value: str, code: int, out: int) -> None:
        """Apply a fused activation (0 none, 1 ReLU, 2 ReLU(-1, 1), 3 ReLU6) and name ``out``."""
        if code == 1:
            value = self.node("Relu", [value])
        elif code in (2, 3):
            low, high = (-1.0, 1.0) if code == 2 else (0.0, 6.0)
            bounds = [self.const(np.array(low, np.float32)), self.const(np.array(high, np.float32))]
            value = self.node("Clip", [value, *bounds])
        elif code != 0:
            raise ConversionError(f"fused activation {code} is not supported")
        self.names[out] = value

    def spatial_pads(
        self,
        index: int,
        kernel: tuple[int, int],
        stride: tuple[int, int],
        dil: tuple[int, int],
        same: bool,
    ) -> list[int]:
        _, height, width, _ = self.tensor(index).shape
        if not same:
            return [0, 0, 0, 0]
        top, bottom = _same_pads(height, kernel[0], stride[0], dil[0])
        left, right = _same_pads(width, kernel[1], stride[1], dil[1])
        return [top, left, bottom, right]

    def four_d(self, index: int, what: str) -> None:
        if len(self.tensor(index).shape) != 4 or index not in self.nchw:
            raise ConversionError(f"{what} of a tensor that is not a 4-D NHWC activation")


def _opts(op: _Op) -> _Table:
    if op.options is None:
        raise ConversionError(f"operator {SUPPORTED_OPS[op.code]} carries no options")
    return op.options


def _conv(b: _Builder, op: _Op, depthwise: bool) -> None:
    opts = _opts(op)
    x, w, bias = op.inputs[0], op.inputs[1], op.inputs[2] if len(op.inputs) > 2 else -1
    b.four_d(x, "a convolution")
    if w not in b.consts:
        raise ConversionError("a convolution whose weights are not constant")
    weights = b.float_const(w)
    if weights.ndim != 4:
        raise ConversionError(f"convolution weights of shape {list(weights.shape)}, not 4-D")
    channels = b.tensor(x).shape[3]
    if depthwise:  # padding, stride_w, stride_h, depth_multiplier, activation, dilation_w, _h
        stride, dil = (
            (opts.scalar(2, "<i", 1), opts.scalar(1, "<i", 1)),
            (
                opts.scalar(6, "<i", 1),
                opts.scalar(5, "<i", 1),
            ),
        )
        activation = opts.scalar(4, "<b", 0)
        kernel = np.transpose(weights, (3, 0, 1, 2))  # [1, kh, kw, C*m] -> [C*m, 1, kh, kw]
        group = channels
    else:  # padding, stride_w, stride_h, activation, dilation_w, dilation_h
        stride = (opts.scalar(2, "<i", 1), opts.scalar(1, "<i", 1))
        dil = (opts.scalar(5, "<i", 1), opts.scalar(4, "<i", 1))
        activation = opts.scalar(3, "<b", 0)
        kernel = np.transpose(weights, _NHWC_TO_NCHW)  # [O, kh, kw, I] -> [O, I, kh, kw]
        if channels % kernel.shape[1]:
            raise ConversionError(f"{channels} input channels for weights of {kernel.shape[1]}")
        group = channels // kernel.shape[1]
    pads = b.spatial_pads(x, kernel.shape[2:], stride, dil, opts.scalar(0, "<b", 0) == 0)
    inputs = [b.activation(x), b.const(kernel, "kernel")]
    if bias >= 0:
        inputs.append(b.value(bias))
    conv = b.node(
        "Conv",
        inputs,
        kernel_shape=list(kernel.shape[2:]),
        strides=list(stride),
        dilations=list(dil),
        pads=pads,
        group=group,
    )
    b.nchw.add(op.outputs[0])
    b.fused(conv, activation, op.outputs[0])


def _max_pool(b: _Builder, op: _Op) -> None:
    opts = _opts(op)  # padding, stride_w, stride_h, filter_width, filter_height, activation
    x = op.inputs[0]
    b.four_d(x, "a pooling")
    stride = (opts.scalar(2, "<i", 1), opts.scalar(1, "<i", 1))
    kernel = (opts.scalar(4, "<i", 1), opts.scalar(3, "<i", 1))
    pads = b.spatial_pads(x, kernel, stride, (1, 1), opts.scalar(0, "<b", 0) == 0)
    pool = b.node(
        "MaxPool", [b.activation(x)], kernel_shape=list(kernel), strides=list(stride), pads=pads
    )
    b.nchw.add(op.outputs[0])
    b.fused(pool, opts.scalar(5, "<b", 0), op.outputs[0])


def _broadcast_operand(b: _Builder, index: int, like: int) -> str:
    """A constant operand of an element-wise op on ``like``, in ``like``'s ONNX layout."""
    if index not in b.consts:
        if (index in b.nchw) != (like in b.nchw):
            raise ConversionError("an element-wise op between a 4-D and a lower-rank activation")
        return b.activation(index)
    value = b.float_const(index)
    if like in b.nchw:  # NHWC broadcasting, right-aligned, becomes NCHW
        value = np.transpose(value.reshape((1,) * (4 - value.ndim) + value.shape), _NHWC_TO_NCHW)
    return b.const(value, "operand")


def _add(b: _Builder, op: _Op) -> None:
    left, right = op.inputs[:2]
    if left in b.consts:
        left, right = right, left
    activation = op.options.scalar(0, "<b", 0) if op.options is not None else 0
    total = b.node("Add", [b.activation(left), _broadcast_operand(b, right, left)])
    if left in b.nchw:
        b.nchw.add(op.outputs[0])
    b.fused(total, activation, op.outputs[0])


def _prelu(b: _Builder, op: _Op) -> None:
    x, alpha = op.inputs[:2]
    if alpha not in b.consts:
        raise ConversionError("a PRELU whose slopes are not constant")
    out = b.node("PRelu", [b.activation(x), _broadcast_operand(b, alpha, x)])
    if x in b.nchw:
        b.nchw.add(op.outputs[0])
    b.names[op.outputs[0]] = out


def _pad(b: _Builder, op: _Op) -> None:
    x, widths = op.inputs[:2]
    if widths not in b.consts:
        raise ConversionError("a PAD whose paddings are not constant")
    table = b.consts[widths].astype(np.int64).reshape(-1, 2)
    if x in b.nchw:
        table = table[list(_NHWC_TO_NCHW)]
        b.nchw.add(op.outputs[0])
    pads = np.concatenate([table[:, 0], table[:, 1]])
    b.names[op.outputs[0]] = b.node("Pad", [b.activation(x), b.const(pads, "pads")])


def _reshape(b: _Builder, op: _Op) -> None:
    x, out = op.inputs[0], op.outputs[0]
    shape = b.tensor(out).shape
    flat = b.node("Reshape", [b.nhwc(x), b.const(np.array(shape, np.int64), "shape")])
    if len(shape) == 4:
        flat = b.node("Transpose", [flat], perm=list(_NHWC_TO_NCHW))
        b.nchw.add(out)
    b.names[out] = flat


def _concat(b: _Builder, op: _Op) -> None:
    opts = _opts(op)  # axis, activation
    parts = op.inputs
    rank = len(b.tensor(parts[0]).shape)
    axis = opts.scalar(0, "<i", 0) % rank
    layouts = {p in b.nchw for p in parts}
    if len(layouts) != 1:
        names = [b.nhwc(p) for p in parts]
    else:
        names = [b.activation(p) if p not in b.consts else b.value(p) for p in parts]
        if layouts == {True}:
            axis = _NHWC_TO_NCHW.index(axis)
            b.nchw.add(op.outputs[0])
    joined = b.node("Concat", names, axis=axis)
    b.fused(joined, opts.scalar(1, "<b", 0), op.outputs[0])


def _relu(b: _Builder, op: _Op) -> None:
    x = op.inputs[0]
    if x in b.nchw:
        b.nchw.add(op.outputs[0])
    b.names[op.outputs[0]] = b.node("Relu", [b.activation(x)])


def _dequantize(b: _Builder, op: _Op) -> None:
    x, out = op.inputs[0], op.outputs[0]
    if x not in b.consts or b.consts[x].dtype != np.float16:
        raise ConversionError("DEQUANTIZE of anything but a float16 constant (a quantised model)")
    b.consts[out] = b.consts[x].astype(np.float32)


def _resize(b: _Builder, op: _Op) -> None:
    opts = _opts(op)  # new_height, new_width (unused), align_corners, half_pixel_centers
    x, size = op.inputs[:2]
    b.four_d(x, "a resize")
    if size not in b.consts:
        raise ConversionError("a RESIZE_BILINEAR whose size is not constant")
    height, width = (int(v) for v in b.consts[size].reshape(-1)[:2])
    batch, _, _, channels = b.tensor(x).shape
    if opts.scalar(2, "<B", 0):
        mode = "align_corners"
    elif opts.scalar(3, "<B", 0):
        mode = "half_pixel"
    else:
        mode = "asymmetric"
    sizes = b.const(np.array([batch, channels, height, width], np.int64), "sizes")
    b.names[op.outputs[0]] = b.node(
        "Resize",
        [b.activation(x), "", "", sizes],
        mode="linear",
        coordinate_transformation_mode=mode,
    )
    b.nchw.add(op.outputs[0])


_CONVERT: dict[int, Callable[[_Builder, _Op], None]] = {
    _ADD: _add,
    _CONCATENATION: _concat,
    _CONV_2D: lambda b, op: _conv(b, op, depthwise=False),
    _DEPTHWISE_CONV_2D: lambda b, op: _conv(b, op, depthwise=True),
    _DEQUANTIZE: _dequantize,
    _MAX_POOL_2D: _max_pool,
    _PAD: _pad,
    _PRELU: _prelu,
    _RELU: _relu,
    _RESHAPE: _reshape,
    _RESIZE_BILINEAR: _resize,
}


def _io(b: _Builder, index: int) -> Any:
    tensor = b.tensor(index)
    if tensor.type != 0:
        raise ConversionError(
            f"'{tensor.name}' is {_TYPE_NAMES.get(tensor.type, tensor.type)}; only float32 "
            "models convert"
        )
    return b.helper.make_tensor_value_info(tensor.name, b.onnx.TensorProto.FLOAT, tensor.shape)


def tflite_to_onnx(model: TfliteModel, name: str = "tflite") -> Any:
    """The ONNX model (``onnx.ModelProto``) of a read TFLite graph.

    Raises:
        ConversionError: The graph uses an operator, type or layout this converter does
            not handle; the message lists every unsupported operator.
    """
    missing = sorted(_OTHER_OPS.get(c, f"code {c}") for c in model.op_codes() - set(_CONVERT))
    if missing:
        raise ConversionError(
            f"operators not supported: {', '.join(missing)} "
            f"(supported: {', '.join(sorted(SUPPORTED_OPS.values()))})"
        )
    b = _Builder(model)
    names = [model.tensors[i].name for i in (*model.inputs, *model.outputs)]
    if len(set(names)) != len(names):
        raise ConversionError(f"the graph's input and output names repeat: {names}")
    inputs = [_io(b, i) for i in model.inputs]
    for index in model.inputs:
        tensor = b.tensor(index)
        if len(tensor.shape) == 4:
            b.names[index] = b.node("Transpose", [tensor.name], perm=list(_NHWC_TO_NCHW))
            b.nchw.add(index)
        else:
            b.names[index] = tensor.name
    for op in model.ops:
        for out in op.outputs:
            if b.tensor(out).type not in (0, 1) and op.code != _DEQUANTIZE:
                raise ConversionError(f"'{b.tensor(out).name}' is not a float tensor")
        try:
            _CONVERT[op.code](b, op)
        except (ValueError, IndexError, TypeError) as exc:  # numpy on shapes the file gave
            raise ConversionError(
                f"operator {SUPPORTED_OPS[op.code]} does not fit its tensors: {exc}"
            ) from exc
    outputs = [_io(b, i) for i in model.outputs]
    for index in model.outputs:
        b.node("Identity", [b.nhwc(index)], out=b.tensor(index).name)
    graph = b.helper.make_graph(b.nodes, name, inputs, outputs, b.inits)
    onnx_model = b.helper.make_model(
        graph, opset_imports=[b.helper.make_opsetid("", _OPSET)], producer_name="edgeskill"
    )
    try:
        b.onnx.checker.check_model(onnx_model)
    except b.onnx.checker.ValidationError as exc:
        raise ConversionError(f"the converted graph is not valid ONNX: {exc}") from exc
    return onnx_model


def _litert_outputs(source: Path, feed: dict[str, np.ndarray]) -> dict[str, np.ndarray] | None:
    try:
        from ai_edge_litert.interpreter import Interpreter  # noqa: PLC0415 - optional
    except ImportError:
        return None
    interpreter = Interpreter(model_path=str(source))
    interpreter.allocate_tensors()
    for detail in interpreter.get_input_details():
        interpreter.set_tensor(detail["index"], feed[detail["name"]])
    interpreter.invoke()
    return {d["name"]: interpreter.get_tensor(d["index"]) for d in interpreter.get_output_details()}


def _check_against(
    blob: bytes, feed: dict[str, np.ndarray], expected: dict[str, np.ndarray], tolerance: float
) -> None:
    """Raise unless ONNX Runtime's outputs of ``blob`` match ``expected`` within ``tolerance``."""
    import onnxruntime as ort  # noqa: PLC0415 - hub only

    try:
        session = ort.InferenceSession(blob, providers=["CPUExecutionProvider"])
        names = [o.name for o in session.get_outputs()]
        got = dict(zip(names, session.run(None, feed), strict=True))
    except (RuntimeError, ValueError) as exc:  # ORT's Fail, InvalidGraph, ... are RuntimeErrors
        raise ConversionError(f"ONNX Runtime cannot run the converted model: {exc}") from exc
    for key, want in expected.items():
        if key not in got or got[key].shape != want.shape:
            raise ConversionError(f"the ONNX model's '{key}' is missing or of another shape")
        scale = max(float(np.abs(want).max()), 1e-6)
        error = float(np.abs(got[key] - want).max()) / scale
        if not error < tolerance:
            raise ConversionError(
                f"the ONNX model's '{key}' differs from LiteRT's by {error:.2g} of its "
                f"range (tolerance {tolerance})"
            )


def convert_tflite_onnx(source: Path, out: Path, *, tolerance: float = 1e-3) -> Path:
    """Convert a float ``.tflite`` model to ONNX at ``out``, checked against LiteRT.

    The check feeds both a seeded random input (uniform in [-1, 1]) and compares every
    output: the largest difference over the output's largest magnitude must stay under
    ``tolerance``. Without LiteRT installed the check is left out. ``out`` is written
    only when the conversion passed.

    Raises:
        ConversionError: The file is not a TFLite model, uses what this converter does
            not handle, or the converted model does not match it.
    """
    try:
        data = source.read_bytes()
    except OSError as exc:
        raise ConversionError(f"cannot read {source.name}: {exc}") from exc
    model = read_tflite(data)
    onnx_model = tflite_to_onnx(model, source.stem)
    blob = onnx_model.SerializeToString()
    rng = np.random.default_rng(0)
    feed = {
        model.tensors[i].name: rng.uniform(-1, 1, model.tensors[i].shape).astype(np.float32)
        for i in model.inputs
    }
    try:
        expected = _litert_outputs(source, feed)
    except (ValueError, RuntimeError, KeyError) as exc:  # LiteRT refused the file itself
        raise ConversionError(f"LiteRT cannot run {source.name}: {exc}") from exc
    if expected is not None:
        _check_against(blob, feed, expected, tolerance)
    try:
        atomic_write_bytes(out, blob)
    except OSError as exc:
        raise ConversionError(f"cannot write {out}: {exc}") from exc
    return out
