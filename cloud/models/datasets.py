"""Data set versions: a built-in data set, or a snapshot of a folder-per-class data set.

A folder is copied into ``<home>/datasets/<content hash>/`` and decoded there
before it is recorded, so a version is immutable: later changes to the user's
folder make a new version, and training always reads exactly what was hashed.
"""

from __future__ import annotations

import contextlib
import shutil
import tempfile
from pathlib import Path

from cloud.errors import ValidationError
from cloud.models.errors import FactoryError
from cloud.store import checks as check
from cloud.store.model_records import DatasetRecord
from cloud.store.models import ModelTables
from converters.datasets import (
    BUILTIN_DATASETS,
    DatasetCaps,
    ImageDataset,
    builtin_dataset,
    list_image_folder,
    load_dataset,
    load_image_folder,
)
from converters.digits import DigitsData
from converters.errors import ConverterError
from protos.envelope import now_ms

__all__ = ["DATASETS_DIR", "dataset_source", "load_split", "register_builtin", "register_folder"]

DATASETS_DIR = "datasets"


def register_builtin(tables: ModelTables, name: str) -> DatasetRecord:
    """Record a built-in data set (``digits``) as a version.

    Raises:
        FactoryError: Unknown built-in name.
        StoreError: The database failed.
    """
    try:
        data = builtin_dataset(name)
    except ConverterError as exc:
        raise FactoryError(str(exc)) from exc
    return tables.add_dataset(
        name, kind="builtin", location=name, content_hash=data.content_hash,
        classes=data.classes, samples=len(data.y), now_ms=now_ms(),
    )  # fmt: skip


def register_folder(
    tables: ModelTables,
    home: Path,
    folder: Path,
    *,
    name: str | None = None,
    caps: DatasetCaps | None = None,
) -> DatasetRecord:
    """Snapshot a folder-per-class data set into the hub home and record it as a version.

    Every image is decoded before anything is recorded; registering the same
    content again returns the existing version.

    Args:
        tables: Where the version is recorded.
        home: The hub home.
        folder: ``<folder>/<class>/<image>``.
        name: Data set name (default: the folder's name).
        caps: Limits on files, sizes and classes.

    Raises:
        ValidationError: The name is malformed.
        FactoryError: The folder breaks the layout or a cap, or an image does not decode.
        StoreError: The database failed.
    """
    name = name or folder.name
    check.name(name, "data set name (pass another with --name)")
    if name in BUILTIN_DATASETS:
        raise ValidationError(f"{name!r} is a built-in data set; name the folder differently")
    try:
        snapshot, data = _snapshot(folder, home / DATASETS_DIR, caps)
    except ConverterError as exc:
        raise FactoryError(f"data set {folder}: {exc}") from exc
    except OSError as exc:
        raise FactoryError(f"cannot copy data set {folder}: {exc}") from exc
    return tables.add_dataset(
        name, kind="folder", location=snapshot.relative_to(home).as_posix(),
        content_hash=data.content_hash, classes=data.classes, samples=len(data.y),
        now_ms=now_ms(),
    )  # fmt: skip


def _snapshot(folder: Path, root: Path, caps: DatasetCaps | None) -> tuple[Path, ImageDataset]:
    """Copy and decode ``folder`` under ``root``; a refused folder leaves nothing behind."""
    entries = list_image_folder(folder, caps)
    made_root = not root.exists()
    root.mkdir(parents=True, exist_ok=True)
    try:
        stage = Path(tempfile.mkdtemp(dir=root, prefix=".stage-"))
    except BaseException:
        _drop_if_empty(root, made_root)
        raise
    try:
        for class_name, path in entries:
            (stage / class_name).mkdir(exist_ok=True)
            shutil.copyfile(path, stage / class_name / path.name)
        # Decoding the copy checks every image and hashes exactly what is kept.
        data = load_image_folder(stage, size=(8, 8), caps=caps)
        final = root / data.content_hash.removeprefix("sha256:")
        if final.is_dir():
            shutil.rmtree(stage)
        else:
            stage.rename(final)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        _drop_if_empty(root, made_root)
        raise
    return final, data


def _drop_if_empty(root: Path, made: bool) -> None:
    """Remove the data set folder this call made, unless another snapshot landed in it."""
    if made:
        with contextlib.suppress(OSError):
            root.rmdir()


def dataset_source(home: Path, dataset: DatasetRecord) -> str:
    """What the converters package loads for a version: a built-in name or a folder path."""
    if dataset.kind == "builtin":
        return dataset.location
    return str(home / dataset.location)


def load_split(home: Path, dataset: DatasetRecord, *, image_size: int, seed: int) -> DigitsData:
    """Load a version at ``image_size`` and split it as training did.

    Raises:
        FactoryError: The data no longer decodes or no longer matches its hash.
    """
    try:
        data = load_dataset(dataset_source(home, dataset), size=(image_size, image_size))
    except ConverterError as exc:
        raise FactoryError(f"data set {dataset.name} v{dataset.version}: {exc}") from exc
    if data.content_hash != dataset.content_hash:
        raise FactoryError(
            f"data set {dataset.name} v{dataset.version} changed on disk "
            f"({data.content_hash[:19]} is not {dataset.content_hash[:19]})"
        )
    try:
        return data.split(seed=seed)
    except ConverterError as exc:
        raise FactoryError(f"cannot split data set {dataset.name}: {exc}") from exc
