"""INT8 post-training static quantisation with ONNX Runtime (QDQ format, per-channel weights)."""

from __future__ import annotations

import contextlib
import logging
import tempfile
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from converters._files import atomic_write_bytes
from converters.errors import ConversionError

if TYPE_CHECKING:
    import onnx

__all__ = ["MAX_CALIBRATION_IMAGES", "quantize_int8"]

MAX_CALIBRATION_IMAGES = 2000


class _Reader:
    """Feeds calibration batches to ONNX Runtime's calibrator."""

    def __init__(self, input_name: str, images: np.ndarray, batch: int = 32) -> None:
        self._batches = [
            {input_name: np.ascontiguousarray(images[i : i + batch], dtype=np.float32)}
            for i in range(0, images.shape[0], batch)
        ]
        self._next = 0

    def get_next(self) -> dict[str, np.ndarray] | None:
        if self._next >= len(self._batches):
            return None
        self._next += 1
        return self._batches[self._next - 1]

    def rewind(self) -> None:
        self._next = 0


def quantize_int8(
    onnx_in: Path,
    onnx_out: Path,
    calibration: np.ndarray,
    *,
    per_channel: bool = True,
    max_images: int = 500,
    reduce_range: bool = True,
) -> Path:
    """Quantise weights and activations to INT8, calibrated on real inputs.

    The model is first pre-processed (shape inference, batch-norm folding), then
    quantised with MinMax calibration into QDQ form, which ONNX Runtime, OpenVINO
    and TensorRT all run as INT8.

    Args:
        onnx_in: Float ONNX model.
        onnx_out: Where the INT8 model is written (atomically).
        calibration: Representative inputs ``[N, ...]`` float32; at most ``max_images``
            are used.
        per_channel: One scale per output channel of each weight.
        max_images: Cap on calibration images (at most :data:`MAX_CALIBRATION_IMAGES`).
        reduce_range: Keep weights in 7 bits (``[-64, 64]``). ONNX Runtime's integer
            convolution on x86 CPUs without VNNI (AVX2, AVX-512 before Cascade Lake)
            multiplies with ``VPMADDUBSW``, whose 16-bit sums of two products
            saturate with full-range weights; the same file then scores worse there
            (a 4-epoch digits CNN: 5 of 360 test images) than on VNNI CPUs, ARM or
            OpenVINO. With 7-bit weights every CPU computes the same results.

    Returns:
        ``onnx_out``.

    Raises:
        ConversionError: Bad input model or calibration data, or quantisation failed.
    """
    from onnxruntime.quantization import (  # noqa: PLC0415
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )
    from onnxruntime.quantization.shape_inference import quant_pre_process  # noqa: PLC0415

    images = _calibration_set(calibration, max_images)
    input_name = _input_name(onnx_in)
    with tempfile.TemporaryDirectory(prefix="edgeskill-int8-") as tmp:
        prepared, quantized = Path(tmp) / "prepared.onnx", Path(tmp) / "int8.onnx"
        try:
            with _quiet():
                quant_pre_process(str(onnx_in), str(prepared), skip_symbolic_shape=True)
                quantize_static(
                    str(prepared),
                    str(quantized),
                    _Reader(input_name, images),
                    quant_format=QuantFormat.QDQ,
                    per_channel=per_channel,
                    reduce_range=reduce_range,
                    activation_type=QuantType.QInt8,
                    weight_type=QuantType.QInt8,
                    calibrate_method=CalibrationMethod.MinMax,
                    extra_options={"ActivationSymmetric": False, "WeightSymmetric": True},
                )
        except Exception as exc:  # onnxruntime.quantization raises many unrelated types
            raise ConversionError(f"INT8 quantisation of {onnx_in.name} failed: {exc}") from exc
        slim = _drop_zero_points(_load(quantized))
        atomic_write_bytes(onnx_out, slim.SerializeToString())
    return onnx_out


def _load(path: Path) -> onnx.ModelProto:
    import onnx  # noqa: PLC0415

    try:
        return onnx.load(str(path), load_external_data=False)
    except Exception as exc:  # onnx raises DecodeError, OSError...
        raise ConversionError(f"cannot read ONNX model {path.name}: {exc}") from exc


def _drop_zero_points(model: onnx.ModelProto) -> onnx.ModelProto:
    """Remove all-zero zero points of weight and bias DequantizeLinear nodes.

    The quantiser stores one int32 zero per bias channel and one int8 zero per
    weight channel; the operator defaults to zero of the input's type, so they
    only make the file larger (about 3 % of a MobileNet).
    """
    from onnx import numpy_helper  # noqa: PLC0415

    inits = {i.name: i for i in model.graph.initializer}
    for node in model.graph.node:
        if node.op_type != "DequantizeLinear" or len(node.input) != 3:
            continue
        source, zero_point = node.input[0], node.input[2]
        zero = zero_point in inits and not numpy_helper.to_array(inits[zero_point]).any()
        if source in inits and zero:
            del node.input[2]
    used = {name for node in model.graph.node for name in node.input}
    kept = [i for i in model.graph.initializer if i.name in used]
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept)
    return model


def _calibration_set(calibration: np.ndarray, max_images: int) -> np.ndarray:
    if not 1 <= max_images <= MAX_CALIBRATION_IMAGES:
        raise ConversionError(f"max_images must be in 1..{MAX_CALIBRATION_IMAGES}")
    if calibration.ndim < 2 or calibration.shape[0] == 0:
        raise ConversionError(
            f"calibration data must be a non-empty batch, got {calibration.shape}"
        )
    if not np.all(np.isfinite(calibration)):
        raise ConversionError("calibration data holds NaN or infinite values")
    return calibration[:max_images].astype(np.float32)


def _input_name(onnx_path: Path) -> str:
    model = _load(onnx_path)
    if len(model.graph.input) != 1:
        raise ConversionError(f"{onnx_path.name} must have one input, has {len(model.graph.input)}")
    return str(model.graph.input[0].name)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Silence the quantiser's progress logging and its advisory warnings."""
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        root.setLevel(level)
