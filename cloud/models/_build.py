"""The torch-side steps of the factory: import, compress and convert (private).

Every step works in a temporary folder and returns drafts whose files are
already blobs; the caller records the drafts in one transaction. A step that
fails raises before anything is recorded.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
from torch import nn

from cloud.models.blobs import BlobStore
from cloud.models.errors import FactoryError
from cloud.store.model_records import (
    ArtifactDraft,
    ArtifactFile,
    ModelDraft,
    ModelRecord,
    VariantDraft,
    VariantMetrics,
    VariantRecord,
)
from converters.digits import DigitsData
from converters.errors import ConverterError
from converters.models import MAX_MODEL_FILE_BYTES, architecture_of, load_model, save_model
from converters.onnx_export import check_onnx, export_onnx, onnx_accuracy, ort_session, run_onnx
from converters.pipeline import CompressOptions, Variant, compress_model
from converters.targets import MAX_ONNX_SOURCE_BYTES, convert

VariantFn = Callable[[str, VariantMetrics], None]
"""Called as each compressed variant is done."""

IMPORT_SUFFIXES = (".pt", ".onnx")
DEFAULT_SAMPLES = 8
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def is_quantized(variant: str) -> bool:
    """Whether a pipeline variant name is an INT8 one."""
    return variant == "int8" or variant.endswith("+int8")


def _load_weights(blobs: BlobStore, sha256: str, work: Path) -> nn.Module:
    path = blobs.export(sha256, work / "weights.pt")
    try:
        return load_model(path)
    except ConverterError as exc:
        raise FactoryError(f"stored weights {sha256[:12]} do not load: {exc}") from exc


def compress(
    blobs: BlobStore,
    model: ModelRecord,
    data: DigitsData,
    variants: Sequence[str],
    *,
    options: CompressOptions | None,
    on_variant: VariantFn | None,
    skip: frozenset[str],
) -> list[VariantDraft]:
    """Build the requested variants (``float`` always) and store their files as blobs.

    Raises:
        FactoryError: The model does not load, or a compression step or check failed.
        BlobError: A file could not be stored.
    """
    if model.weights_sha256 is None:
        raise FactoryError(
            f"model {model.name} has no torch weights (imported ONNX): cannot compress"
        )

    def report(variant: Variant) -> None:
        if on_variant is not None:
            on_variant(variant.name, VariantMetrics.from_report(variant.report))

    with tempfile.TemporaryDirectory(prefix="edgeskill-compress-") as tmp:
        work = Path(tmp)
        source = _load_weights(blobs, model.weights_sha256, work)
        try:
            built = compress_model(
                model.name, source, data, work / "out",
                variants=[v for v in variants if v != "float"], options=options,
                on_variant=report,
            )  # fmt: skip
        except ConverterError as exc:
            raise FactoryError(f"compressing {model.name} failed: {exc}") from exc
        return [_draft(blobs, model, v, work) for v in built if v.name not in skip]


def _draft(blobs: BlobStore, model: ModelRecord, variant: Variant, work: Path) -> VariantDraft:
    quantized = is_quantized(variant.name)
    onnx, onnx_size = blobs.put_file(variant.onnx)
    tflite = blobs.put_file(variant.tflite)[0] if variant.tflite is not None else None
    weights = None
    if variant.name == "float":
        weights = model.weights_sha256
    elif not quantized and variant.model is not None:
        stem = _UNSAFE.sub("_", variant.name)
        weights = blobs.put_file(save_model(variant.model, work / f"{stem}.pt"))[0]
    return VariantDraft(
        name=variant.name, quantized=quantized, onnx_sha256=onnx, onnx_size=onnx_size,
        metrics=VariantMetrics.from_report(variant.report), tflite_sha256=tflite,
        weights_sha256=weights,
    )  # fmt: skip


def convert_variant(
    blobs: BlobStore,
    model: ModelRecord,
    variant: VariantRecord,
    target: str,
    sample: np.ndarray | None,
    *,
    engine: bool | None = None,
) -> ArtifactDraft:
    """Convert a variant for a target, check it, and store its files as blobs.

    The source is the variant's torch weights when it has them (float variants;
    TFLite needs them), its ONNX file otherwise. ``sample`` defaults to random
    inputs shaped like the ONNX input.

    Raises:
        FactoryError: The source is corrupt, the conversion or its check failed,
            or a tool the target needs is missing (the message says which).
        BlobError: A file could not be stored.
    """
    name = _UNSAFE.sub("_", f"{model.name}-{variant.name}")[:100]
    with tempfile.TemporaryDirectory(prefix="edgeskill-convert-") as tmp:
        work = Path(tmp)
        onnx = blobs.export(variant.onnx_sha256, work / "source.onnx")
        source: nn.Module | Path = onnx
        if variant.weights_sha256 is not None and not variant.quantized:
            source = _load_weights(blobs, variant.weights_sha256, work)
        inputs = sample if sample is not None else random_sample(onnx, DEFAULT_SAMPLES)
        try:
            result = convert(source, target, work / "out", sample=inputs, name=name, engine=engine)
        except ConverterError as exc:
            raise FactoryError(
                f"{target} conversion of {model.name}/{variant.name}: {exc}"
            ) from exc
        files = tuple(ArtifactFile(p.name, *blobs.put_file(p)) for p in result.artifacts)
    return ArtifactDraft(
        target, files, result.max_abs_diff, result.tolerance, result.checked_with, result.notes
    )


def random_sample(onnx: Path, count: int, seed: int = 0) -> np.ndarray:
    """Uniform ``[0, 1)`` inputs shaped like a model's first input (batch ``count``).

    Raises:
        FactoryError: The model is unreadable or has dynamic dimensions besides the batch.
    """
    try:
        shape = ort_session(onnx).get_inputs()[0].shape
    except ConverterError as exc:
        raise FactoryError(f"{onnx.name}: {exc}") from exc
    dims = [int(d) if isinstance(d, int) else -1 for d in shape[1:]]
    if len(shape) < 2 or min(dims) < 1:
        raise FactoryError(
            f"input shape {shape} is not fixed beyond the batch; give the model a data set"
        )
    rng = np.random.default_rng(seed)
    return rng.random((count, *dims), dtype=np.float32)


def import_file(
    blobs: BlobStore,
    path: Path,
    *,
    name: str,
    data: DigitsData | None,
    image_size: int,
) -> ModelDraft:
    """Check a model file (an EdgeSkill ``.pt`` or an ``.onnx``) and store it as blobs.

    Raises:
        FactoryError: Unsupported format, or a corrupt, oversized or unrunnable file.
        BlobError: A file could not be stored.
    """
    suffix = path.suffix.lower()
    if suffix not in IMPORT_SUFFIXES:
        raise FactoryError(
            f"unsupported model format {suffix or path.name!r}: give an EdgeSkill .pt "
            "(converters.models.save_model) or an .onnx file"
        )
    cap = MAX_MODEL_FILE_BYTES if suffix == ".pt" else MAX_ONNX_SOURCE_BYTES
    with tempfile.TemporaryDirectory(prefix="edgeskill-import-") as tmp:
        work = Path(tmp)
        copy = work / f"import{suffix}"
        try:
            if path.stat().st_size > cap:
                raise FactoryError(f"{path.name} is over the cap of {cap} bytes")
            shutil.copyfile(path, copy)  # checked and stored from one copy that cannot change
        except OSError as exc:
            raise FactoryError(f"cannot read {path}: {exc}") from exc
        try:
            if suffix == ".pt":
                return _import_torch(blobs, copy, name, data, image_size)
            return _import_onnx(blobs, copy, name, data, image_size)
        except ConverterError as exc:
            raise FactoryError(f"{path.name} is corrupt or unsupported: {exc}") from exc


def _import_torch(
    blobs: BlobStore, copy: Path, name: str, data: DigitsData | None, image_size: int
) -> ModelDraft:
    model = load_model(copy)
    arch, layout = architecture_of(model)
    if data is not None:
        sample = data.test.x[:64]
    else:
        shape = (DEFAULT_SAMPLES, int(layout["in_channels"]), image_size, image_size)
        sample = np.random.default_rng(0).random(shape, dtype=np.float32)
    onnx = export_onnx(model, sample[:2], copy.with_name("model.onnx"))
    check_onnx(model, onnx, sample)
    accuracy = onnx_accuracy(onnx, data.test) if data is not None else None
    weights, _ = blobs.put_file(copy)
    onnx_sha, onnx_size = blobs.put_file(onnx)
    return ModelDraft(
        name=name, arch=arch, onnx_sha256=onnx_sha, onnx_size=onnx_size,
        image_size=image_size, weights_sha256=weights, test_accuracy=accuracy,
    )  # fmt: skip


def _import_onnx(
    blobs: BlobStore, copy: Path, name: str, data: DigitsData | None, image_size: int
) -> ModelDraft:
    import onnx  # noqa: PLC0415

    try:
        onnx.checker.check_model(str(copy))
    except Exception as exc:  # onnx raises ValidationError, DecodeError, OSError...
        raise FactoryError(f"{name}: not a valid ONNX model: {exc}") from exc
    sample = data.test.x[:DEFAULT_SAMPLES] if data is not None else random_sample(copy, 2)
    logits = run_onnx(ort_session(copy), sample)
    if logits.ndim != 2 or logits.shape[0] != sample.shape[0]:
        raise FactoryError(f"{name}: expected [batch, classes] output, got {logits.shape}")
    accuracy = onnx_accuracy(copy, data.test) if data is not None else None
    onnx_sha, onnx_size = blobs.put_file(copy)
    return ModelDraft(
        name=name, arch="onnx", onnx_sha256=onnx_sha, onnx_size=onnx_size,
        image_size=int(sample.shape[-1]) if data is None else image_size,
        test_accuracy=accuracy,
    )  # fmt: skip
