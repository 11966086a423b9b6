"""Model training, ONNX export, compression and per-target conversion.

Imports nothing else of ours. Submodules pull torch, so the public names are
loaded lazily: ``import converters.errors`` stays cheap.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from converters.errors import (
    CompressionError,
    ConversionError,
    ConverterError,
    DatasetError,
    ToolMissingError,
    TrainingError,
)

if TYPE_CHECKING:
    from converters.backends import available_backends, measure_latency_ms, open_runner
    from converters.datasets import (
        DatasetCaps,
        ImageDataset,
        builtin_dataset,
        hash_image_folder,
        load_dataset,
        load_image_folder,
    )
    from converters.digits import (
        DigitsCNN,
        DigitsData,
        Split,
        evaluate_accuracy,
        load_digits_data,
        split_dataset,
        train_digits,
    )
    from converters.distill import DistillResult, distill, make_student
    from converters.fit import EpochMetrics, TrainConfig, fit
    from converters.mobilenet import MobileNet, MobileNetConfig
    from converters.models import load_model, save_model
    from converters.onnx_export import check_onnx, export_onnx, onnx_accuracy
    from converters.pipeline import VARIANTS, CompressOptions, Variant, compress_model
    from converters.prune import PruneResult, channel_prune, magnitude_prune
    from converters.quantize import quantize_int8
    from converters.report import CompressionReport, build_report, evaluate_artifacts
    from converters.targets import TARGETS, ConversionResult, convert
    from converters.tflite import export_tflite, quantize_tflite_int8
    from converters.training import (
        JobResult,
        JobSpec,
        JobStatus,
        read_metrics,
        read_status,
        run_job,
        start_job,
    )

_LAZY = {
    "available_backends": "backends",
    "measure_latency_ms": "backends",
    "open_runner": "backends",
    "DatasetCaps": "datasets",
    "ImageDataset": "datasets",
    "builtin_dataset": "datasets",
    "hash_image_folder": "datasets",
    "load_dataset": "datasets",
    "load_image_folder": "datasets",
    "DigitsCNN": "digits",
    "DigitsData": "digits",
    "Split": "digits",
    "evaluate_accuracy": "digits",
    "load_digits_data": "digits",
    "split_dataset": "digits",
    "train_digits": "digits",
    "DistillResult": "distill",
    "distill": "distill",
    "make_student": "distill",
    "EpochMetrics": "fit",
    "TrainConfig": "fit",
    "fit": "fit",
    "MobileNet": "mobilenet",
    "MobileNetConfig": "mobilenet",
    "load_model": "models",
    "save_model": "models",
    "check_onnx": "onnx_export",
    "export_onnx": "onnx_export",
    "onnx_accuracy": "onnx_export",
    "VARIANTS": "pipeline",
    "CompressOptions": "pipeline",
    "Variant": "pipeline",
    "compress_model": "pipeline",
    "PruneResult": "prune",
    "channel_prune": "prune",
    "magnitude_prune": "prune",
    "quantize_int8": "quantize",
    "CompressionReport": "report",
    "build_report": "report",
    "evaluate_artifacts": "report",
    "TARGETS": "targets",
    "ConversionResult": "targets",
    "convert": "targets",
    "export_tflite": "tflite",
    "quantize_tflite_int8": "tflite",
    "JobResult": "training",
    "JobSpec": "training",
    "JobStatus": "training",
    "read_metrics": "training",
    "read_status": "training",
    "run_job": "training",
    "start_job": "training",
}

__all__ = [
    "TARGETS",
    "VARIANTS",
    "CompressOptions",
    "CompressionError",
    "CompressionReport",
    "ConversionError",
    "ConversionResult",
    "ConverterError",
    "DatasetCaps",
    "DatasetError",
    "DigitsCNN",
    "DigitsData",
    "DistillResult",
    "EpochMetrics",
    "ImageDataset",
    "JobResult",
    "JobSpec",
    "JobStatus",
    "MobileNet",
    "MobileNetConfig",
    "PruneResult",
    "Split",
    "ToolMissingError",
    "TrainConfig",
    "TrainingError",
    "Variant",
    "available_backends",
    "build_report",
    "builtin_dataset",
    "channel_prune",
    "check_onnx",
    "compress_model",
    "convert",
    "distill",
    "evaluate_accuracy",
    "evaluate_artifacts",
    "export_onnx",
    "export_tflite",
    "fit",
    "hash_image_folder",
    "load_dataset",
    "load_digits_data",
    "load_image_folder",
    "load_model",
    "magnitude_prune",
    "make_student",
    "measure_latency_ms",
    "onnx_accuracy",
    "open_runner",
    "quantize_int8",
    "quantize_tflite_int8",
    "read_metrics",
    "read_status",
    "run_job",
    "save_model",
    "split_dataset",
    "start_job",
    "train_digits",
]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'converters' has no attribute {name!r}")
    return getattr(importlib.import_module(f"converters.{module}"), name)
