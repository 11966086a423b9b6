"""Shared fixtures: one trained digits model per test session (training takes about a second).

Tests train on one torch thread: these models are tiny, and two spinning threads on a
machine shared with other test processes make training many times slower.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from converters.digits import DigitsCNN, DigitsData, load_digits_data, train_digits
from converters.onnx_export import export_onnx


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


@pytest.fixture(autouse=True)
def _single_torch_thread() -> Iterator[None]:
    with one_thread():
        yield


@pytest.fixture(scope="session")
def digits() -> DigitsData:
    return load_digits_data(seed=0)


@pytest.fixture(scope="session")
def trained(digits: DigitsData) -> tuple[DigitsCNN, float]:
    with one_thread():
        return train_digits(digits, epochs=8, seed=0)


@pytest.fixture(scope="session")
def digits_onnx(
    trained: tuple[DigitsCNN, float], digits: DigitsData, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    model, _ = trained
    return export_onnx(model, digits.test.x[:4], tmp_path_factory.mktemp("onnx") / "digits.onnx")


@pytest.fixture(scope="session")
def efficientnet_onnx(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """EfficientNet-Lite0 exported once per session (about 10 s)."""
    from converters.efficientnet import export_efficientnet_lite0  # noqa: PLC0415

    with one_thread():
        return export_efficientnet_lite0(tmp_path_factory.mktemp("efficientnet"))
