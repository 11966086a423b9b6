"""Shared fixtures: one trained digits model per test session (training takes about a second)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from converters.digits import DigitsCNN, DigitsData, load_digits_data, train_digits
from converters.onnx_export import export_onnx


@pytest.fixture(scope="session")
def digits() -> DigitsData:
    return load_digits_data(seed=0)


@pytest.fixture(scope="session")
def trained(digits: DigitsData) -> tuple[DigitsCNN, float]:
    torch.manual_seed(0)
    return train_digits(digits, epochs=8, seed=0)


@pytest.fixture(scope="session")
def digits_onnx(
    trained: tuple[DigitsCNN, float], digits: DigitsData, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    model, _ = trained
    return export_onnx(model, digits.test.x[:4], tmp_path_factory.mktemp("onnx") / "digits.onnx")
