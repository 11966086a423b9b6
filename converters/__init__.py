"""Model training, ONNX export, compression and per-target conversion.

Imports nothing else of ours. Submodules pull torch, so the public names are
loaded lazily: ``import converters.errors`` stays cheap.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from converters.errors import (
    ConversionError,
    ConverterError,
    DatasetError,
    ToolMissingError,
    TrainingError,
)

if TYPE_CHECKING:
    from converters.digits import (
        DigitsCNN,
        DigitsData,
        Split,
        evaluate_accuracy,
        load_digits_data,
        train_digits,
    )
    from converters.onnx_export import check_onnx, export_onnx, onnx_accuracy

_LAZY = {
    "DigitsCNN": "converters.digits",
    "DigitsData": "converters.digits",
    "Split": "converters.digits",
    "evaluate_accuracy": "converters.digits",
    "load_digits_data": "converters.digits",
    "train_digits": "converters.digits",
    "check_onnx": "converters.onnx_export",
    "export_onnx": "converters.onnx_export",
    "onnx_accuracy": "converters.onnx_export",
}

__all__ = [
    "ConversionError",
    "ConverterError",
    "DatasetError",
    "DigitsCNN",
    "DigitsData",
    "Split",
    "ToolMissingError",
    "TrainingError",
    "check_onnx",
    "evaluate_accuracy",
    "export_onnx",
    "load_digits_data",
    "onnx_accuracy",
    "train_digits",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'converters' has no attribute {name!r}")
    return getattr(importlib.import_module(module), name)
