"""Per-target conversion: every target available here round-trips; the others fail clearly."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from converters.backends import open_runner
from converters.digits import DigitsCNN, DigitsData
from converters.errors import ConversionError, ToolMissingError
from converters.quantize import quantize_int8
from converters.targets import TOLERANCES, convert
from converters.tflite import litert_torch_available


@pytest.mark.parametrize(
    "target", ["onnx-cpu", "onnx-cuda", "onnx-cann", "onnx-tensorrt", "openvino"]
)
def test_onnx_and_openvino_targets_round_trip(
    target: str, digits: DigitsData, digits_onnx: Path, tmp_path: Path
) -> None:
    sample = digits.test.x[:16]
    result = convert(digits_onnx, target, tmp_path, sample=sample, name="digits")
    assert result.max_abs_diff <= result.tolerance == TOLERANCES[target]
    main = result.artifacts[0]
    assert main.parent == tmp_path and main.exists()
    backend = "openvino" if target == "openvino" else "onnxruntime"
    expected = open_runner(digits_onnx, "onnxruntime")(sample)
    np.testing.assert_allclose(open_runner(main, backend)(sample), expected, atol=1e-4)
    if target == "openvino":
        assert {p.suffix for p in result.artifacts} == {".xml", ".bin"}
    if target == "onnx-tensorrt" and shutil.which("trtexec") is None:
        assert any("trtexec" in note for note in result.notes)


def test_torch_source_is_exported_and_checked(
    trained: tuple[DigitsCNN, float], digits: DigitsData, tmp_path: Path
) -> None:
    model, _ = trained
    result = convert(model, "openvino", tmp_path, sample=digits.test.x[:8])
    assert result.max_abs_diff < 1e-4 and result.checked_with == "openvino"


@pytest.mark.slow
@pytest.mark.skipif(not litert_torch_available(), reason="litert-torch extra not installed")
def test_tflite_round_trips_in_litert(
    trained: tuple[DigitsCNN, float], digits: DigitsData, tmp_path: Path
) -> None:
    model, _ = trained
    result = convert(model, "tflite", tmp_path, sample=digits.test.x[:1], name="digits")
    assert result.artifacts == (tmp_path / "digits.tflite",)
    assert result.max_abs_diff < 1e-4 and result.checked_with == "litert"
    logits = open_runner(result.artifacts[0], "litert")(digits.test.x)
    assert float(np.mean(logits.argmax(axis=1) == digits.test.y)) > 0.93


def test_tflite_from_onnx_is_refused(digits: DigitsData, digits_onnx: Path, tmp_path: Path) -> None:
    with pytest.raises(ConversionError, match="torch model"):
        convert(digits_onnx, "tflite", tmp_path / "out", sample=digits.test.x[:1])
    assert not (tmp_path / "out").exists()


def test_int8_source_converts_within_the_quantised_tolerance(
    digits: DigitsData, digits_onnx: Path, tmp_path: Path
) -> None:
    int8 = quantize_int8(digits_onnx, tmp_path / "int8.onnx", digits.train.x[:200])
    result = convert(int8, "openvino", tmp_path / "ov", sample=digits.test.x[:32])
    assert result.max_abs_diff <= result.tolerance
    assert result.tolerance > TOLERANCES["openvino"]  # INT8 kernels round differently


@pytest.mark.skipif(shutil.which("atc") is not None, reason="the CANN toolkit is installed")
def test_om_without_cann_names_the_toolkit(
    digits: DigitsData, digits_onnx: Path, tmp_path: Path
) -> None:
    with pytest.raises(ToolMissingError, match="CANN"):
        convert(digits_onnx, "om", tmp_path / "out", sample=digits.test.x[:1])
    assert not (tmp_path / "out").exists()


@pytest.mark.skipif(shutil.which("trtexec") is not None, reason="TensorRT is installed")
def test_required_tensorrt_engine_without_trtexec(
    digits: DigitsData, digits_onnx: Path, tmp_path: Path
) -> None:
    with pytest.raises(ToolMissingError, match="trtexec"):
        convert(
            digits_onnx, "onnx-tensorrt", tmp_path / "out", sample=digits.test.x[:1], engine=True
        )
    assert not (tmp_path / "out").exists()


def test_corrupted_model_fails_and_writes_nothing(
    digits: DigitsData, digits_onnx: Path, tmp_path: Path
) -> None:
    corrupt = tmp_path / "corrupt.onnx"
    data = bytearray(digits_onnx.read_bytes())
    corrupt.write_bytes(bytes(data[: len(data) // 2]))
    out = tmp_path / "out"
    for target in ("onnx-cpu", "openvino"):
        with pytest.raises(ConversionError):
            convert(corrupt, target, out, sample=digits.test.x[:1])
    keras = tmp_path / "model.h5"
    keras.write_bytes(b"HDF")
    with pytest.raises(ConversionError, match="unsupported source format"):
        convert(keras, "onnx-cpu", out, sample=digits.test.x[:1])
    with pytest.raises(ConversionError, match="unknown target"):
        convert(digits_onnx, "coreml", out, sample=digits.test.x[:1])
    assert not out.exists()


def test_outputs_beyond_tolerance_fail_and_write_nothing(
    digits: DigitsData, digits_onnx: Path, tmp_path: Path
) -> None:
    with pytest.raises(ConversionError, match="differ"):
        convert(
            digits_onnx, "openvino", tmp_path / "out", sample=digits.test.x[:16], tolerance=1e-12
        )
    assert not (tmp_path / "out").exists()


def test_wrong_sample_shape_is_a_conversion_error(digits_onnx: Path, tmp_path: Path) -> None:
    with pytest.raises(ConversionError):
        convert(
            digits_onnx, "onnx-cpu", tmp_path / "out", sample=np.zeros((1, 3, 8, 8), np.float32)
        )
