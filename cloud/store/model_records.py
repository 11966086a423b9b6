"""Immutable records of the model factory, and the drafts that create them."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

__all__ = [
    "JOB_FAILED",
    "JOB_QUEUED",
    "JOB_RUNNING",
    "JOB_STATES",
    "JOB_SUCCEEDED",
    "ArtifactDraft",
    "ArtifactFile",
    "ArtifactRecord",
    "DatasetRecord",
    "EpochRecord",
    "JobRecord",
    "Lineage",
    "ModelDraft",
    "ModelRecord",
    "VariantDraft",
    "VariantMetrics",
    "VariantRecord",
]

JOB_QUEUED = "queued"
JOB_RUNNING = "running"
JOB_SUCCEEDED = "succeeded"
JOB_FAILED = "failed"
JOB_STATES = (JOB_QUEUED, JOB_RUNNING, JOB_SUCCEEDED, JOB_FAILED)


@dataclass(frozen=True)
class DatasetRecord:
    """One content-hashed version of a data set.

    Attributes:
        kind: ``"builtin"`` (``location`` is its name) or ``"folder"`` (``location``
            is the snapshot folder, relative to the hub home).
        content_hash: ``"sha256:<hex>"`` of the data, as the converters package computes it.
    """

    id: int
    name: str
    version: int
    kind: str
    location: str
    content_hash: str
    classes: tuple[str, ...]
    samples: int
    created_ms: int


@dataclass(frozen=True)
class EpochRecord:
    """Metrics of one finished training epoch."""

    epoch: int
    train_loss: float
    val_accuracy: float
    seconds: float


@dataclass(frozen=True)
class JobRecord:
    """A training job.

    Attributes:
        spec: The training options (the converters ``JobSpec`` without data set and pacing).
        status: One of :data:`JOB_STATES`.
        pid: Process that last ran the job.
        resumed_from_epoch: Epochs a successful run found in a checkpoint at its start.
    """

    id: int
    dataset_id: int
    model_name: str
    arch: str
    spec: dict[str, Any]
    epochs: int
    status: str
    pid: int | None
    error: str | None
    resumed_from_epoch: int | None
    created_ms: int
    started_ms: int | None
    finished_ms: int | None


@dataclass(frozen=True)
class ModelDraft:
    """What is needed to register a model; blobs are stored before this is recorded."""

    name: str
    arch: str
    onnx_sha256: str
    onnx_size: int
    image_size: int
    weights_sha256: str | None = None
    test_accuracy: float | None = None
    dataset_id: int | None = None
    split_seed: int = 0


@dataclass(frozen=True)
class ModelRecord:
    """A trained (or imported) float model.

    Attributes:
        weights_sha256: Blob of the torch weights (``None`` for an imported ONNX file).
        onnx_sha256: Blob of the checked ONNX export.
        image_size: Side the data set's images are resized to for this model.
        split_seed: Seed of the train / val / test split the metrics refer to.
    """

    id: int
    name: str
    arch: str
    job_id: int | None
    dataset_id: int | None
    weights_sha256: str | None
    onnx_sha256: str
    onnx_size: int
    test_accuracy: float | None
    image_size: int
    split_seed: int
    created_ms: int


@dataclass(frozen=True)
class VariantMetrics:
    """A variant measured against its float model (the converters ``CompressionReport``).

    ``size_ratio`` and ``latency_ratio`` are float / variant (bigger is better);
    ``meets_bar`` is ``accuracy_loss_pt <= bar_pt``.
    """

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
    bar_pt: float = 1.0
    meets_bar: bool = False

    @classmethod
    def from_report(cls, report: object) -> VariantMetrics:
        """Take the numbers of a ``converters.report.CompressionReport``.

        Raises:
            TypeError: ``report`` is not a dataclass with the report's fields.
        """
        if not dataclasses.is_dataclass(report) or isinstance(report, type):
            raise TypeError("expected a CompressionReport")
        raw = dataclasses.asdict(report)
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in raw.items() if k in names})


@dataclass(frozen=True)
class VariantDraft:
    """A compressed variant to register; its blobs are already stored."""

    name: str
    quantized: bool
    onnx_sha256: str
    onnx_size: int
    metrics: VariantMetrics
    tflite_sha256: str | None = None
    weights_sha256: str | None = None


@dataclass(frozen=True)
class VariantRecord:
    """One compressed (or the float) variant of a model.

    Attributes:
        weights_sha256: Torch weights of a float variant (needed for TFLite export).
    """

    id: int
    model_id: int
    name: str
    quantized: bool
    onnx_sha256: str
    onnx_size: int
    tflite_sha256: str | None
    weights_sha256: str | None
    metrics: VariantMetrics
    created_ms: int


@dataclass(frozen=True)
class ArtifactFile:
    """One stored file of an artefact (OpenVINO IR has two)."""

    name: str
    sha256: str
    size: int


@dataclass(frozen=True)
class ArtifactDraft:
    """A checked conversion to register; its files are already stored as blobs."""

    target: str
    files: tuple[ArtifactFile, ...]
    max_abs_diff: float
    tolerance: float
    checked_with: str
    notes: tuple[str, ...] = ()


@dataclass(frozen=True)
class ArtifactRecord:
    """A variant converted for one device target and checked against its source.

    Attributes:
        files: The files, main one first.
        max_abs_diff: Largest output difference from the source on the check samples.
        tolerance: Bound the check used.
        skills: ``(skill, version)`` pairs whose bundles ship this artefact.
    """

    id: int
    variant_id: int
    target: str
    files: tuple[ArtifactFile, ...]
    max_abs_diff: float
    tolerance: float
    checked_with: str
    notes: tuple[str, ...]
    created_ms: int
    skills: tuple[tuple[str, str], ...] = ()

    @property
    def sha256(self) -> str:
        """Hash of the main file."""
        return self.files[0].sha256


@dataclass(frozen=True)
class Lineage:
    """Everything a model came from and everything made from it."""

    model: ModelRecord
    dataset: DatasetRecord | None
    job: JobRecord | None
    epochs: tuple[EpochRecord, ...]
    variants: tuple[VariantRecord, ...]
    artifacts: tuple[ArtifactRecord, ...]
