"""Compression reports: a compressed variant against its float model on a held-out split."""

from __future__ import annotations

import gzip
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from converters.backends import available_backends, measure_latency_ms, open_runner
from converters.digits import Split
from converters.errors import CompressionError

__all__ = [
    "BAR_PT",
    "CompressionReport",
    "Evaluation",
    "artifacts_for",
    "build_report",
    "evaluate_artifacts",
]

BAR_PT = 1.0
"""Largest accuracy loss, in percentage points, at which a variant is good enough."""


@dataclass(frozen=True)
class Evaluation:
    """One model's measurements.

    Attributes:
        accuracy: Top-1 accuracy on the split, per backend.
        predictions: Top-1 classes of the primary backend (the first in ``artifacts``).
        latency_ms: Median batch-1 latency per backend (empty when not measured).
        size_bytes: Size of the primary artefact.
        gzip_bytes: Size of the primary artefact after gzip (shows unstructured sparsity).
    """

    accuracy: dict[str, float]
    predictions: np.ndarray
    latency_ms: dict[str, float]
    size_bytes: int
    gzip_bytes: int


@dataclass(frozen=True)
class CompressionReport:
    """How a variant compares with its float model.

    ``size_ratio`` is float size / variant size (bigger is better); ``latency_ratio``
    is float latency / variant latency per backend (speed-up, bigger is better).
    ``meets_bar`` is ``accuracy_loss_pt <= bar_pt``.
    """

    model: str
    variant: str
    accuracy: float
    float_accuracy: float
    accuracy_loss_pt: float
    agreement: float
    size_bytes: int
    float_size_bytes: int
    size_ratio: float
    gzip_bytes: int
    latency_ms: dict[str, float] = field(default_factory=dict)
    float_latency_ms: dict[str, float] = field(default_factory=dict)
    latency_ratio: dict[str, float] = field(default_factory=dict)
    accuracy_by_backend: dict[str, float] = field(default_factory=dict)
    bar_pt: float = BAR_PT
    meets_bar: bool = False

    def to_row(self) -> dict[str, Any]:
        """A flat JSON-able row: the scalar fields plus ``latency_ms_<backend>`` columns."""
        row = {k: v for k, v in asdict(self).items() if not isinstance(v, dict)}
        for backend, ms in self.latency_ms.items():
            row[f"latency_ms_{backend}"] = round(ms, 4)
        for backend, acc in self.accuracy_by_backend.items():
            row[f"accuracy_{backend}"] = acc
        return row


def artifacts_for(onnx: Path | None = None, tflite: Path | None = None) -> dict[str, Path]:
    """Map each backend present here to the file it should run (ONNX first)."""
    present = available_backends()
    chosen: dict[str, Path] = {}
    if onnx is not None:
        chosen.update({b: onnx for b in ("onnxruntime", "openvino") if b in present})
    if tflite is not None and "litert" in present:
        chosen["litert"] = tflite
    return chosen


def evaluate_artifacts(
    artifacts: Mapping[str, Path], split: Split, *, latency: bool = True
) -> Evaluation:
    """Accuracy on ``split`` and batch-1 latency of each artefact.

    Raises:
        CompressionError: ``artifacts`` is empty or the split is empty.
        ConversionError: A file does not load or run.
    """
    if not artifacts or len(split) == 0:
        raise CompressionError("need at least one artefact and a non-empty split")
    accuracy: dict[str, float] = {}
    latency_ms: dict[str, float] = {}
    predictions = np.zeros(0, np.int64)
    for i, (backend, path) in enumerate(artifacts.items()):
        runner = open_runner(path, backend)
        pred = runner(split.x).argmax(axis=1)
        accuracy[backend] = float(np.mean(pred == split.y))
        if i == 0:
            predictions = pred
        if latency:
            latency_ms[backend] = measure_latency_ms(runner, split.x[:1])
    primary = next(iter(artifacts.values()))
    data = primary.read_bytes()
    return Evaluation(accuracy, predictions, latency_ms, len(data), len(gzip.compress(data, 9)))


def build_report(
    model: str,
    variant: str,
    reference: Evaluation,
    candidate: Evaluation,
    *,
    bar_pt: float = BAR_PT,
) -> CompressionReport:
    """Compare a variant's evaluation with its float model's (same split, same backends).

    Raises:
        CompressionError: The two were evaluated on different backends or splits.
    """
    if next(iter(candidate.accuracy)) != next(iter(reference.accuracy)):
        raise CompressionError("reference and candidate must share their primary backend")
    if candidate.predictions.shape != reference.predictions.shape:
        raise CompressionError("reference and candidate were evaluated on different splits")
    acc, float_acc = (
        next(iter(candidate.accuracy.values())),
        next(iter(reference.accuracy.values())),
    )
    loss_pt = round((float_acc - acc) * 100.0, 4)
    ratios = {
        b: reference.latency_ms[b] / ms
        for b, ms in candidate.latency_ms.items()
        if b in reference.latency_ms and ms > 0
    }
    return CompressionReport(
        model=model,
        variant=variant,
        accuracy=acc,
        float_accuracy=float_acc,
        accuracy_loss_pt=loss_pt,
        agreement=float(np.mean(candidate.predictions == reference.predictions)),
        size_bytes=candidate.size_bytes,
        float_size_bytes=reference.size_bytes,
        size_ratio=reference.size_bytes / max(candidate.size_bytes, 1),
        gzip_bytes=candidate.gzip_bytes,
        latency_ms=dict(candidate.latency_ms),
        float_latency_ms=dict(reference.latency_ms),
        latency_ratio=ratios,
        accuracy_by_backend=dict(candidate.accuracy),
        bar_pt=bar_pt,
        meets_bar=loss_pt <= bar_pt,
    )
