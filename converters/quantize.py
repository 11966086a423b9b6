"""INT8 post-training static quantisation with ONNX Runtime (QDQ format, per-channel weights)."""

from __future__ import annotations

import logging
import tempfile
import warnings
from pathlib import Path

import numpy as np

from converters.errors import ConversionError
from converters.onnx_export import atomic_write_bytes

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
                    activation_type=QuantType.QInt8,
                    weight_type=QuantType.QInt8,
                    calibrate_method=CalibrationMethod.MinMax,
                    extra_options={"ActivationSymmetric": False, "WeightSymmetric": True},
                )
        except Exception as exc:  # onnxruntime.quantization raises many unrelated types
            raise ConversionError(f"INT8 quantisation of {onnx_in.name} failed: {exc}") from exc
        atomic_write_bytes(onnx_out, quantized.read_bytes())
    return onnx_out


def _calibration_set(calibration: np.ndarray, max_images: int) -> np.ndarray:
    if not 1 <= max_images <= MAX_CALIBRATION_IMAGES:
        raise ConversionError(f"max_images must be in 1..{MAX_CALIBRATION_IMAGES}")
    if calibration.ndim < 2 or calibration.shape[0] == 0:
        raise ConversionError(f"calibration data must be a non-empty batch, got {calibration.shape}")
    if not np.all(np.isfinite(calibration)):
        raise ConversionError("calibration data holds NaN or infinite values")
    return calibration[:max_images].astype(np.float32)


def _input_name(onnx_path: Path) -> str:
    import onnx  # noqa: PLC0415

    try:
        model = onnx.load(str(onnx_path), load_external_data=False)
    except Exception as exc:  # onnx raises DecodeError, OSError...
        raise ConversionError(f"cannot read ONNX model {onnx_path.name}: {exc}") from exc
    if len(model.graph.input) != 1:
        raise ConversionError(f"{onnx_path.name} must have one input, has {len(model.graph.input)}")
    return str(model.graph.input[0].name)


class _quiet:  # noqa: N801  (used like a function)
    """Silence the quantiser's progress logging and its advisory warnings."""

    def __enter__(self) -> None:
        self._level = logging.getLogger().level
        logging.getLogger().setLevel(logging.ERROR)
        self._warnings = warnings.catch_warnings()
        self._warnings.__enter__()
        warnings.simplefilter("ignore")

    def __exit__(self, *exc: object) -> None:
        self._warnings.__exit__(None, None, None)
        logging.getLogger().setLevel(self._level)
