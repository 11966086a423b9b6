"""Phase-1 contract: digits data, the CNN, ONNX export and its check."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from converters.digits import DigitsCNN, DigitsData, Split, load_digits_data, train_digits
from converters.errors import ConversionError, DatasetError, TrainingError
from converters.onnx_export import check_onnx, export_onnx, onnx_accuracy, ort_session, run_onnx


def test_splits_are_stratified_disjoint_and_scaled(digits: DigitsData) -> None:
    sizes = [len(digits.train), len(digits.val), len(digits.test)]
    assert sum(sizes) == 1797
    assert sizes[0] / 1797 == pytest.approx(0.7, abs=0.01)
    assert sizes[1] / 1797 == pytest.approx(0.1, abs=0.01)
    for split in (digits.train, digits.val, digits.test):
        assert split.x.dtype == np.float32 and split.x.shape[1:] == (1, 8, 8)
        assert split.y.dtype == np.int64
        assert split.x.min() >= 0.0 and split.x.max() <= 1.0
        assert set(np.unique(split.y)) == set(range(10))
    train_rows = {row.tobytes() for row in digits.train.x}
    overlap = sum(row.tobytes() in train_rows for row in digits.test.x)
    assert overlap <= 5  # the raw data set itself holds a few duplicate images


def test_split_is_reproducible_by_seed() -> None:
    a, b, c = load_digits_data(3), load_digits_data(3), load_digits_data(4)
    assert np.array_equal(a.test.y, b.test.y) and np.array_equal(a.test.x, b.test.x)
    assert not np.array_equal(a.test.x, c.test.x)


def test_split_rejects_bad_arrays() -> None:
    with pytest.raises(DatasetError):
        Split(np.zeros((2, 8, 8), np.float32), np.zeros(2, np.int64))
    with pytest.raises(DatasetError):
        Split(np.zeros((2, 1, 8, 8), np.float32), np.zeros(3, np.int64))


def test_training_reaches_accuracy_and_reports_epochs(digits: DigitsData) -> None:
    seen: list[tuple[int, float, float]] = []
    model, acc = train_digits(digits, epochs=8, seed=1, on_epoch=lambda *a: seen.append(a))
    assert acc >= 0.93
    assert [e for e, _, _ in seen] == list(range(1, 9))
    assert seen[-1][1] < seen[0][1]  # the loss goes down
    out = model(torch.from_numpy(digits.test.x[:3]))
    assert out.shape == (3, 10)


def test_training_rejects_zero_epochs(digits: DigitsData) -> None:
    with pytest.raises(TrainingError):
        train_digits(digits, epochs=0)


def test_export_matches_torch_and_batch_is_dynamic(
    trained: tuple[DigitsCNN, float], digits: DigitsData, digits_onnx: Path
) -> None:
    model, acc = trained
    assert acc >= 0.93
    proto = onnx.load(str(digits_onnx))
    assert [i.name for i in proto.graph.input] == ["image"]
    assert [o.name for o in proto.graph.output] == ["logits"]
    assert not proto.graph.input[0].type.tensor_type.shape.dim[0].HasField("dim_value")
    assert not list(digits_onnx.parent.glob("*.data"))  # self-contained
    assert check_onnx(model, digits_onnx, digits.test.x) < 1e-4
    session = ort_session(digits_onnx)
    for batch in (1, 7, 360):
        assert run_onnx(session, digits.test.x[:batch]).shape == (batch, 10)
    assert onnx_accuracy(digits_onnx, digits.test) == pytest.approx(acc, abs=1 / 360)


def test_check_fails_on_a_different_model(digits: DigitsData, digits_onnx: Path) -> None:
    torch.manual_seed(99)
    with pytest.raises(ConversionError, match="differs"):
        check_onnx(DigitsCNN(), digits_onnx, digits.test.x[:16])


def test_corrupt_file_is_a_conversion_error(
    tmp_path: Path, digits: DigitsData, digits_onnx: Path
) -> None:
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(digits_onnx.read_bytes()[:1000])
    with pytest.raises(ConversionError):
        onnx_accuracy(bad, digits.test)


def test_failed_export_leaves_no_file(tmp_path: Path) -> None:
    out = tmp_path / "m.onnx"
    with pytest.raises(ConversionError):
        export_onnx(DigitsCNN(), np.zeros((2, 3, 8, 8), np.float32), out)  # wrong channel count
    assert list(tmp_path.iterdir()) == []


def test_package_import_stays_light() -> None:
    code = "import sys, converters, converters.errors; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
