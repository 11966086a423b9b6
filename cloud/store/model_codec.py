"""Checks on model factory input, and rows to records (private)."""

from __future__ import annotations

import dataclasses
import json
import math
import re
from collections.abc import Mapping, Sequence
from typing import Any

from sqlalchemy import Row

from cloud.errors import StoreError, ValidationError
from cloud.store import checks as check
from cloud.store.model_records import (
    ArtifactDraft,
    ArtifactFile,
    ArtifactRecord,
    DatasetRecord,
    EpochRecord,
    JobRecord,
    ModelDraft,
    ModelRecord,
    VariantDraft,
    VariantMetrics,
    VariantRecord,
)
from skills.manifest import KNOWN_TARGETS

MAX_CLASSES = 1000
MAX_JSON_BYTES = 64 * 1024
MAX_ERROR_BYTES = 4096
MAX_EPOCHS = 1000
MAX_FILES = 8
MAX_SIDE = 4096
_TAG_RE = re.compile(r"[a-z0-9][a-z0-9+_-]{0,31}")
_HASH_RE = re.compile(r"sha256:[0-9a-f]{64}")
_LOCATION_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,254}")
_FILE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def tag(value: str, what: str) -> str:
    """Raises: ValidationError: not 1-32 of ``[a-z0-9+_-]`` (variant, arch, runtime)."""
    if not isinstance(value, str) or not _TAG_RE.fullmatch(value):
        raise ValidationError(f"bad {what} {value!r}")
    return value


def target(value: str) -> str:
    """Raises: ValidationError: not one of the skill manifest's targets."""
    if value not in KNOWN_TARGETS:
        raise ValidationError(f"unknown target {value!r}; known: {', '.join(KNOWN_TARGETS)}")
    return value


def content_hash(value: str) -> str:
    """Raises: ValidationError: not ``sha256:<64 hex>``."""
    if not isinstance(value, str) or not _HASH_RE.fullmatch(value):
        raise ValidationError(f"bad content hash {value!r}")
    return value


def location(value: str) -> str:
    """Raises: ValidationError: not a relative path without ``..``."""
    if not isinstance(value, str) or not _LOCATION_RE.fullmatch(value):
        raise ValidationError(f"bad data set location {value!r}")
    if ".." in value.split("/"):
        raise ValidationError(f"bad data set location {value!r}")
    return value


def small_int(value: int, what: str, low: int = 0, high: int = 2**31 - 1) -> int:
    """Raises: ValidationError: not an int in ``[low, high]``."""
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValidationError(f"bad {what} {value!r} (expected {low}..{high})")
    return value


def finite(value: float, what: str) -> float:
    """Raises: ValidationError: not a finite number."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValidationError(f"bad {what} {value!r}")
    return float(value)


def optional_sha(value: str | None) -> str | None:
    """Raises: ValidationError: neither ``None`` nor 64 lower-case hex digits."""
    return None if value is None else check.sha256(value)


def dumps(value: object, what: str) -> str:
    """Canonical JSON, capped.

    Raises:
        ValidationError: Not plain JSON (NaN included) or over the cap.
    """
    try:
        text = json.dumps(value, sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValidationError(f"{what} is not plain JSON: {exc}") from exc
    return check.text(text, what, MAX_JSON_BYTES)


def loads(text: str, what: str) -> Any:
    """Raises: StoreError: the stored JSON is corrupt."""
    try:
        return json.loads(text)
    except ValueError as exc:
        raise StoreError(f"stored {what} is corrupt: {exc}") from exc


def classes(values: Sequence[str]) -> str:
    """Raises: ValidationError: no, too many or malformed class names."""
    if not 1 <= len(values) <= MAX_CLASSES:
        raise ValidationError(f"a data set needs 1..{MAX_CLASSES} classes, got {len(values)}")
    for value in values:
        check.text(value, "class name", 255)
    return dumps(list(values), "class names")


def error_text(value: str) -> str:
    """Cut an error message to the stored length."""
    return value.encode("utf-8", "replace")[:MAX_ERROR_BYTES].decode("utf-8", "ignore")


def epochs(values: Sequence[EpochRecord]) -> list[dict[str, Any]]:
    """Raises: ValidationError: too many, repeated or malformed epochs."""
    if len(values) > MAX_EPOCHS:
        raise ValidationError(f"more than {MAX_EPOCHS} epochs")
    if len({e.epoch for e in values}) != len(values):
        raise ValidationError("an epoch appears twice")
    rows = []
    for e in values:
        small_int(e.epoch, "epoch", 1, MAX_EPOCHS)
        rows.append(
            {
                "epoch": e.epoch,
                "train_loss": finite(e.train_loss, "train loss"),
                "val_accuracy": finite(e.val_accuracy, "val accuracy"),
                "seconds": finite(e.seconds, "epoch seconds"),
            }
        )
    return rows


def model_row(draft: ModelDraft) -> dict[str, Any]:
    """Raises: ValidationError: a malformed draft."""
    accuracy = draft.test_accuracy
    return {
        "name": check.name(draft.name, "model name"),
        "arch": tag(draft.arch, "architecture"),
        "dataset_id": draft.dataset_id,
        "weights_sha256": optional_sha(draft.weights_sha256),
        "onnx_sha256": check.sha256(draft.onnx_sha256),
        "onnx_size": check.counter(draft.onnx_size, "ONNX size"),
        "test_accuracy": None if accuracy is None else finite(accuracy, "test accuracy"),
        "image_size": small_int(draft.image_size, "image size", 1, MAX_SIDE),
        "split_seed": small_int(draft.split_seed, "split seed"),
    }


def variant_row(draft: VariantDraft) -> dict[str, Any]:
    """Raises: ValidationError: a malformed draft."""
    metrics = draft.metrics
    if not isinstance(metrics, VariantMetrics):
        raise ValidationError("variant metrics must be VariantMetrics")
    return {
        "name": tag(draft.name, "variant name"),
        "quantized": bool(draft.quantized),
        "onnx_sha256": check.sha256(draft.onnx_sha256),
        "onnx_size": check.counter(draft.onnx_size, "ONNX size"),
        "tflite_sha256": optional_sha(draft.tflite_sha256),
        "weights_sha256": optional_sha(draft.weights_sha256),
        "accuracy": finite(metrics.accuracy, "accuracy"),
        "accuracy_loss_pt": finite(metrics.accuracy_loss_pt, "accuracy loss"),
        "size_ratio": finite(metrics.size_ratio, "size ratio"),
        "meets_bar": bool(metrics.meets_bar),
        "report": dumps(dataclasses.asdict(metrics), "compression report"),
    }


def artifact_row(draft: ArtifactDraft) -> dict[str, Any]:
    """Raises: ValidationError: a malformed draft."""
    if not 1 <= len(draft.files) <= MAX_FILES:
        raise ValidationError(f"an artefact has 1..{MAX_FILES} files")
    for f in draft.files:
        if not _FILE_RE.fullmatch(f.name):
            raise ValidationError(f"bad artefact file name {f.name!r}")
        check.sha256(f.sha256)
        check.counter(f.size, "file size")
    diff, tol = finite(draft.max_abs_diff, "max diff"), finite(draft.tolerance, "tolerance")
    if diff > tol:
        raise ValidationError(f"an artefact off by {diff:.3g} > {tol:.3g} failed its check")
    return {
        "target": target(draft.target),
        "sha256": draft.files[0].sha256,
        "files": dumps([dataclasses.asdict(f) for f in draft.files], "artefact files"),
        "max_abs_diff": diff,
        "tolerance": tol,
        "checked_with": tag(draft.checked_with, "runtime"),
        "notes": dumps(list(draft.notes), "artefact notes"),
    }


def dataset_record(row: Row[Any]) -> DatasetRecord:
    """Turn a ``dataset_versions`` row into a record."""
    names = tuple(str(c) for c in loads(row.classes, "class names"))
    return DatasetRecord(
        row.id, row.name, row.version, row.kind, row.location, row.content_hash,
        names, row.samples, row.created_ms,
    )  # fmt: skip


def job_record(row: Row[Any]) -> JobRecord:
    """Turn a ``training_jobs`` row into a record."""
    spec = loads(row.spec, "job spec")
    if not isinstance(spec, dict):
        raise StoreError(f"stored spec of job {row.id} is not an object")
    return JobRecord(
        row.id, row.dataset_id, row.model_name, row.arch, spec, row.epochs, row.status,
        row.pid, row.error, row.resumed_from_epoch, row.created_ms, row.started_ms,
        row.finished_ms,
    )  # fmt: skip


def epoch_record(row: Row[Any]) -> EpochRecord:
    """Turn a ``training_epochs`` row into a record."""
    return EpochRecord(row.epoch, row.train_loss, row.val_accuracy, row.seconds)


def model_record(row: Row[Any]) -> ModelRecord:
    """Turn a ``models`` row into a record."""
    return ModelRecord(
        row.id, row.name, row.arch, row.job_id, row.dataset_id, row.weights_sha256,
        row.onnx_sha256, row.onnx_size, row.test_accuracy, row.image_size, row.split_seed,
        row.created_ms,
    )  # fmt: skip


def variant_record(row: Row[Any]) -> VariantRecord:
    """Turn a ``model_variants`` row into a record."""
    raw = loads(row.report, "compression report")
    try:
        metrics = VariantMetrics(**raw)
    except TypeError as exc:
        raise StoreError(f"stored report of variant {row.id} is corrupt: {exc}") from exc
    return VariantRecord(
        row.id, row.model_id, row.name, row.quantized, row.onnx_sha256, row.onnx_size,
        row.tflite_sha256, row.weights_sha256, metrics, row.created_ms,
    )  # fmt: skip


def artifact_record(row: Row[Any], skills: Mapping[int, list[tuple[str, str]]]) -> ArtifactRecord:
    """Turn a ``model_artifacts`` row into a record, with the skill versions that ship it."""
    try:
        files = tuple(ArtifactFile(**f) for f in loads(row.files, "artefact files"))
    except TypeError as exc:
        raise StoreError(f"stored files of artefact {row.id} are corrupt: {exc}") from exc
    notes = tuple(str(n) for n in loads(row.notes, "artefact notes"))
    return ArtifactRecord(
        row.id, row.variant_id, row.target, files, row.max_abs_diff, row.tolerance,
        row.checked_with, notes, row.created_ms, tuple(skills.get(row.id, ())),
    )  # fmt: skip
