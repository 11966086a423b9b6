"""The model factory on a hub home: data sets, training jobs, compression, conversion, lineage.

Open it with :meth:`ModelFactory.for_hub` (or from a home and a store). Files go
to the home's content-addressed blob store; records to the store's model tables
(:class:`cloud.store.models.ModelTables`). Each step builds everything in a
temporary folder first and records it in one transaction, so a failed step (a
corrupt model, a failed check, a missing tool) leaves no record behind.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from cloud.errors import ConflictError, NotFoundError, ValidationError
from cloud.models.blobs import BlobStore
from cloud.models.errors import FactoryError
from cloud.models.job_backends import JobBackend
from cloud.models.jobs import JobRunner, ProgressFn
from cloud.store import checks as check
from cloud.store.model_records import (
    JOB_SUCCEEDED,
    ArtifactRecord,
    DatasetRecord,
    JobRecord,
    Lineage,
    ModelRecord,
    VariantDraft,
    VariantMetrics,
    VariantRecord,
)
from cloud.store.models import ModelTables
from protos.envelope import now_ms

if TYPE_CHECKING:
    from cloud.hub import Hub
    from cloud.models._build import VariantFn
    from cloud.store import Store
    from converters.digits import DigitsData
    from converters.pipeline import CompressOptions
    from skills.drift_reference import DriftReference

__all__ = ["BLOBS_DIR", "ModelFactory"]

BLOBS_DIR = "blobs"
MAX_CHECK_SAMPLES = 256


class ModelFactory:
    """Trains, compresses and converts models of one hub, recording their lineage."""

    def __init__(self, home: Path, store: Store, *, job_backend: JobBackend | None = None) -> None:
        """Use the hub home ``home`` and its open ``store``; run jobs on ``job_backend``.

        Args:
            home: The hub home.
            store: Its open store.
            job_backend: Where training jobs run by default (a local worker process if None).
        """
        self.home = home
        self.tables = ModelTables(store.engine)
        self.blobs = BlobStore(home / BLOBS_DIR)
        self.jobs = JobRunner(home, self.tables, job_backend)

    @classmethod
    def for_hub(cls, hub: Hub) -> ModelFactory:
        """The factory of an opened hub."""
        return cls(hub.home, hub.store)

    # data sets

    def add_builtin_dataset(self, name: str = "digits") -> DatasetRecord:
        """Record a built-in data set version.

        Raises:
            FactoryError: Unknown name.
            StoreError: The database failed.
        """
        from cloud.models.datasets import register_builtin  # noqa: PLC0415 - torch

        return register_builtin(self.tables, name)

    def add_folder_dataset(self, folder: Path, *, name: str | None = None) -> DatasetRecord:
        """Snapshot and record a folder-per-class data set version.

        Raises:
            ValidationError: A malformed name.
            FactoryError: A bad layout, a cap exceeded, or an image that does not decode.
            StoreError: The database failed.
        """
        from cloud.models.datasets import register_folder  # noqa: PLC0415 - torch

        return register_folder(self.tables, self.home, folder, name=name)

    def _split(self, dataset_id: int, image_size: int, seed: int) -> DigitsData:
        from cloud.models.datasets import load_split  # noqa: PLC0415 - torch

        dataset = self.tables.get_dataset(dataset_id)
        return load_split(self.home, dataset, image_size=image_size, seed=seed)

    # training

    def submit_training(
        self,
        dataset_id: int,
        *,
        arch: str = "digits-cnn",
        epochs: int = 8,
        lr: float = 0.01,
        batch_size: int = 64,
        seed: int = 0,
        width: float = 1.0,
        image_size: int | None = None,
        split_seed: int = 0,
        model_name: str | None = None,
    ) -> JobRecord:
        """Queue a training job; run it with ``self.jobs.run(job.id)``.

        ``image_size`` defaults to 8 for the built-in digits and the digits CNN, 32 otherwise.

        Raises:
            ValidationError: Bad options.
            NotFoundError: No such data set version.
            ConflictError: The model name is taken.
            StoreError: The database failed.
        """
        from converters.errors import TrainingError  # noqa: PLC0415
        from converters.fit import TrainConfig  # noqa: PLC0415
        from converters.training import JobSpec  # noqa: PLC0415

        dataset = self.tables.get_dataset(dataset_id)
        if image_size is None:
            image_size = 8 if arch == "digits-cnn" or dataset.kind == "builtin" else 32
        try:
            config = TrainConfig(epochs=epochs, lr=lr, batch_size=batch_size, seed=seed)
            spec = JobSpec(
                arch=arch, dataset=dataset.location, width=width, image_size=image_size,
                train=config, split_seed=split_seed,
            )  # fmt: skip
        except TrainingError as exc:
            raise ValidationError(str(exc)) from exc
        return self.jobs.submit(dataset, spec.to_dict(), model_name=model_name)

    def train(
        self,
        job_id: int,
        *,
        on_progress: ProgressFn | None = None,
        pause_s: float = 0.0,
        threads: int = 1,
        backend: JobBackend | None = None,
    ) -> tuple[JobRecord, ModelRecord | None]:
        """Run (or resume) a job on a backend (default: the factory's) and wait for it.

        Returns:
            The job's final record and, when it succeeded, its model.

        Raises:
            As :meth:`JobRunner.run`.
        """
        job = self.jobs.run(
            job_id, on_progress=on_progress, pause_s=pause_s, threads=threads, backend=backend
        )
        model = self.tables.get_model(job.model_name) if job.status == JOB_SUCCEEDED else None
        return job, model

    # models

    def import_model(
        self,
        path: Path,
        *,
        name: str,
        dataset_id: int | None = None,
        image_size: int = 8,
        split_seed: int = 0,
    ) -> ModelRecord:
        """Register a model file trained elsewhere (an EdgeSkill ``.pt`` or an ``.onnx``).

        The file is checked (it loads, exports or runs, and matches its ONNX form)
        before anything is stored or recorded.

        Raises:
            ValidationError: A malformed name.
            NotFoundError: No such data set version.
            ConflictError: The name is taken.
            FactoryError: Unsupported format, or a corrupt or unrunnable file.
            StoreError: The database failed.
        """
        from cloud.models._build import import_file  # noqa: PLC0415 - torch

        check.name(name, "model name")
        self._name_free(name)
        data = None if dataset_id is None else self._split(dataset_id, image_size, split_seed)
        draft = import_file(self.blobs, path, name=name, data=data, image_size=image_size)
        draft = replace(draft, dataset_id=dataset_id, split_seed=split_seed)
        return self.tables.add_model(draft, now_ms=now_ms())

    def _name_free(self, name: str) -> None:
        try:
            self.tables.get_model(name)
        except NotFoundError:
            return
        raise ConflictError(f"model name {name!r} is taken")

    def _model_data(self, model: ModelRecord) -> DigitsData | None:
        if model.dataset_id is None:
            return None
        return self._split(model.dataset_id, model.image_size, model.split_seed)

    def compress(
        self,
        ref: int | str,
        variants: Sequence[str],
        *,
        options: CompressOptions | None = None,
        on_variant: VariantFn | None = None,
    ) -> list[VariantRecord]:
        """Build compressed variants of a model and record them with their reports.

        The ``float`` variant (the reference of every report) is recorded the first time.

        Raises:
            ValidationError: Unknown variant names.
            NotFoundError: No such model.
            ConflictError: The model already has one of the requested variants.
            FactoryError: No data set or torch weights, a corrupt model, or a failed step.
            StoreError: The database failed.
        """
        from cloud.models._build import compress  # noqa: PLC0415 - torch
        from converters.pipeline import VARIANTS  # noqa: PLC0415

        unknown = sorted(set(variants) - set(VARIANTS))
        if unknown or not variants:
            raise ValidationError(
                f"unknown variants {', '.join(unknown) or '(none given)'}; "
                f"known: {', '.join(VARIANTS)}"
            )
        model = self.tables.get_model(ref)
        have = frozenset(v.name for v in self.tables.variants_of(model.id))
        clash = sorted(have & (set(variants) - {"float"}))
        if clash:
            raise ConflictError(f"model {model.name} already has variants {', '.join(clash)}")
        data = self._model_data(model)
        if data is None:
            raise FactoryError(f"model {model.name} has no data set to calibrate and measure on")
        drafts = compress(
            self.blobs, model, data, variants, options=options, on_variant=on_variant, skip=have
        )
        if not drafts:
            return []
        return self.tables.add_variants(model.id, drafts, now_ms=now_ms())

    def convert(
        self,
        ref: int | str,
        target: str,
        *,
        variant: str = "float",
        samples: int = 8,
        engine: bool | None = None,
    ) -> ArtifactRecord:
        """Convert a variant for a device target, check it, and record the artefact.

        A model with no ``float`` variant gets one first. Converting again for the
        same target returns the recorded artefact.

        Raises:
            ValidationError: Unknown target or a bad sample count.
            NotFoundError: No such model or variant.
            FactoryError: A corrupt source, a failed check, or a missing tool.
            StoreError: The database failed.
        """
        from cloud.models._build import convert_variant  # noqa: PLC0415 - torch
        from cloud.store import model_codec as codec  # noqa: PLC0415

        codec.target(target)
        codec.small_int(samples, "sample count", 1, MAX_CHECK_SAMPLES)
        model = self.tables.get_model(ref)
        chosen = self._variant(model, variant)
        for artifact in self.tables.artifacts_of(chosen.id):
            if artifact.target == target:
                return artifact
        data = self._model_data(model)
        sample = data.test.x[:samples] if data is not None else None
        draft = convert_variant(self.blobs, model, chosen, target, sample, engine=engine)
        return self.tables.add_artifact(chosen.id, draft, now_ms=now_ms())

    def _variant(self, model: ModelRecord, name: str) -> VariantRecord:
        for found in self.tables.variants_of(model.id):
            if found.name == name:
                return found
        if name != "float":
            raise NotFoundError(f"model {model.name} has no variant {name!r}; compress it first")
        if model.weights_sha256 is None or model.dataset_id is None:
            return self._imported_float(model)
        from converters.pipeline import CompressOptions  # noqa: PLC0415

        self.compress(model.id, ["float"], options=CompressOptions(tflite=False, latency=False))
        return self._variant(model, name)

    def _imported_float(self, model: ModelRecord) -> VariantRecord:
        # Without weights or data there is nothing to compress or measure: the float
        # variant is the model itself, its own reference.
        accuracy = model.test_accuracy if model.test_accuracy is not None else 0.0
        size = model.onnx_size
        metrics = VariantMetrics(
            accuracy, accuracy, 0.0, 1.0, size, size, 1.0, size, meets_bar=True
        )
        draft = VariantDraft(
            "float", False, model.onnx_sha256, size, metrics, weights_sha256=model.weights_sha256
        )
        return self.tables.add_variants(model.id, [draft], now_ms=now_ms())[0]

    def drift_reference(self, ref: int | str) -> DriftReference | None:
        """The drift reference of a model: its ONNX export's answers on its held-out data.

        See :mod:`cloud.models.references`; the bundles built from the model ship it.

        Returns:
            The reference, or ``None`` for a model without a data set (imported alone).

        Raises:
            NotFoundError: No such model.
            FactoryError: The data set no longer loads, or the model does not run.
            BlobError: The model's ONNX blob is missing or corrupt.
            StoreError: The database failed.
        """
        from cloud.models.references import held_out_reference  # noqa: PLC0415 - torch

        model = self.tables.get_model(ref)
        data = self._model_data(model)
        if data is None:
            return None
        with tempfile.TemporaryDirectory(prefix="edgeskill-reference-") as tmp:
            onnx = self.blobs.export(model.onnx_sha256, Path(tmp) / "model.onnx")
            return held_out_reference(onnx, data)

    # lineage and blobs

    def lineage(self, ref: int | str) -> Lineage:
        """Everything a model came from and everything made from it.

        Raises:
            NotFoundError: No such model.
            StoreError: The database failed.
        """
        return self.tables.lineage(ref)

    def link_skill_version(self, skill: str, version: str) -> list[ArtifactRecord]:
        """Link a published skill version to the artefacts its bundle ships.

        Raises:
            NotFoundError: No such skill version.
            StoreError: The database failed.
        """
        return self.tables.link_skill_version(skill, version)

    def export_blob(self, sha256: str, dest: Path) -> Path:
        """Copy a verified model file out of the blob store.

        Raises:
            BlobError: Missing or corrupt blob, or ``dest`` cannot be written.
        """
        return self.blobs.export(sha256, dest)
