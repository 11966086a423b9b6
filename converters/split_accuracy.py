"""What compressing the tensors at a cut costs: bytes saved against predictions changed.

The codecs live in :mod:`skills.tensor_codec` (the agent and the hub both need
them), which this package may not import; callers pass each codec in as a
:data:`Roundtrip`. The codec is applied per sample, as the device would send one
request at a time, so int8 gets its own scale for every image.

With labels (the digits) the result is an accuracy loss in points; without
(EfficientNet on a handful of photos) it is only the top-1 agreement with the
uncompressed split, and must be reported as such.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import onnx

from converters.errors import ConversionError
from converters.split import Cut, Segment, open_segments, run_segments, split_at

if TYPE_CHECKING:
    import onnxruntime as ort

__all__ = ["CodecCost", "Roundtrip", "codec_costs"]

Roundtrip = Callable[[Mapping[str, np.ndarray]], tuple[dict[str, np.ndarray], int]]
"""Encode then decode one sample's cut tensors: returns the decoded arrays and the encoded size."""


@dataclass(frozen=True)
class CodecCost:
    """One codec at one cut.

    Attributes:
        cut: The cut's name.
        codec: The codec's name.
        bytes_ratio: Encoded bytes over the cut's float32 bytes (mean per sample).
        agreement: Fraction of samples whose top-1 equals the uncompressed split's.
        accuracy_loss_pt: Top-1 accuracy without the codec minus with it, in
            percentage points; ``None`` when no labels were given.
    """

    cut: str
    codec: str
    bytes_ratio: float
    agreement: float
    accuracy_loss_pt: float | None


def _apply(
    codec: Roundtrip, env: Mapping[str, np.ndarray], names: Sequence[str], count: int
) -> tuple[dict[str, np.ndarray], float]:
    decoded: dict[str, list[np.ndarray]] = {name: [] for name in names}
    ratios = []
    for i in range(count):
        sample = {name: np.ascontiguousarray(env[name][i : i + 1]) for name in names}
        out, size = codec(sample)
        for name in names:
            decoded[name].append(out[name])
        ratios.append(size / sum(x.size * 4 for x in sample.values()))
    stacked = {name: np.concatenate(parts, axis=0) for name, parts in decoded.items()}
    return stacked, float(np.mean(ratios))


def codec_costs(
    model: onnx.ModelProto,
    x: np.ndarray,
    cuts: Sequence[Cut],
    codecs: Mapping[str, Roundtrip],
    labels: np.ndarray | None = None,
) -> list[CodecCost]:
    """Measure every codec at every cut over a batch of inputs.

    Args:
        model: A single-input classifier.
        x: Its inputs, batch on axis 0.
        cuts: Cuts of ``model`` whose tensors are float32 with the batch on axis 0.
        codecs: Codec name to round trip.
        labels: True classes of ``x``, if known.

    Returns:
        One :class:`CodecCost` per cut and codec, cut-major.

    Raises:
        ConversionError: The model has several inputs, a cut tensor is not a
            float32 batch, or a split fails to run.
    """
    if len(model.graph.input) != 1:
        raise ConversionError("codec_costs needs a single-input model")
    feeds = {model.graph.input[0].name: np.ascontiguousarray(x, dtype=np.float32)}
    count = x.shape[0]
    results = []
    for cut in cuts:
        pieces = split_at(model, cut)
        sessions = open_segments(pieces)
        env = run_segments(sessions, pieces, feeds, stop=1)
        for name in cut.tensors:
            if env[name].dtype != np.float32 or env[name].shape[:1] != (count,):
                raise ConversionError(f"cut tensor {name!r} is not a float32 batch")
        reference = _top1(sessions, pieces, env)
        for codec_name, codec in codecs.items():
            decoded, ratio = _apply(codec, env, cut.tensors, count)
            top1 = _top1(sessions, pieces, {**feeds, **decoded})
            loss = None
            if labels is not None:
                loss = 100.0 * float(np.mean(reference == labels) - np.mean(top1 == labels))
            agreement = float(np.mean(top1 == reference))
            results.append(CodecCost(cut.name, codec_name, ratio, agreement, loss))
    return results


def _top1(
    sessions: Sequence[ort.InferenceSession],
    pieces: Sequence[Segment],
    env: Mapping[str, np.ndarray],
) -> np.ndarray:
    out = run_segments(sessions, pieces, env, start=1)
    return np.asarray(out[pieces[1].outputs[0]]).argmax(axis=1)
