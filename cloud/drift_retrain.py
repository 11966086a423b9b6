"""Retraining for a drift incident: data, job, hold-out check and the next skill version.

The slow, blocking half of the drift loop (:mod:`cloud.drift_loop` runs it in
a worker thread). Everything goes through the model factory's and the fleet
service's public methods:

* **Data.** The running version's model is found by lineage (the artefacts
  its bundle ships). Its data set is written out as a folder per class, and
  the incident's drift samples are added to it: with the label that came back
  from the device, else with the answer of the group's *teacher* (a bigger
  hub model named in the drift settings), else not at all, since a model's own
  answers teach it nothing. Every fourth usable sample (by id) is kept out of
  training as the shifted hold-out. The folder is registered as a data set
  version and a job is submitted with the running model's training options.
* **Check.** The job's model and the running one answer the hold-out; the
  new one must beat the old by the settings' ``min_gain`` points.
* **Build.** Like ``edgeskill demo``: an INT8 variant, ``onnx-cpu``
  artefacts of both, a bundle from the skill's source folder at the next
  patch version, published (signed) through the skill service.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

import skills
from cloud.models.errors import FactoryError
from protos import pb
from skills.errors import TensorCodecError
from skills.tensor_codec import decode_protos

if TYPE_CHECKING:
    from cloud.drift.incident import IncidentState
    from cloud.drift.settings import DriftSettings
    from cloud.service import FleetService
    from cloud.store.drift import StoredSample
    from cloud.store.model_records import JobRecord, ModelRecord

__all__ = ["HOLDOUT_EVERY", "LIBRARY", "Labelled", "Retrainer", "next_patch"]

LIBRARY = Path(skills.__file__).resolve().parent / "library"
#: One usable sample in this many (by id) is kept out of training to judge the new model.
HOLDOUT_EVERY = 4
#: Most samples one retraining uses (the newest).
MAX_RETRAIN_SAMPLES = 2000
#: Shifted samples are repeated so they make about this share of the training data.
SHIFTED_SHARE = 0.3
MAX_REPEAT = 20


def next_patch(version: str, taken: set[str]) -> str:
    """The next free patch version after ``version`` (``1.0.0`` -> ``1.0.1``)."""
    parts = version.split("+", 1)[0].split("-", 1)[0].split(".")
    major, minor, patch = (int(p) if p.isdigit() else 0 for p in [*parts, "0", "0", "0"][:3])
    while True:
        patch += 1
        candidate = f"{major}.{minor}.{patch}"
        if candidate not in taken:
            return candidate


@dataclass(frozen=True)
class Labelled:
    """Usable drift samples: images, their labels, and where the labels came from."""

    ids: tuple[int, ...]
    x: np.ndarray
    y: np.ndarray
    teacher_labelled: int

    def part(self, holdout: bool) -> Labelled:
        """The hold-out part (every ``HOLDOUT_EVERY``-th) or the training part."""
        keep = np.array(
            [(i % HOLDOUT_EVERY == 0) == holdout for i in range(len(self.ids))], dtype=bool
        )
        ids = tuple(i for i, k in zip(self.ids, keep, strict=True) if k)
        return Labelled(ids, self.x[keep], self.y[keep], self.teacher_labelled)


def _image(sample: StoredSample, side: int) -> np.ndarray | None:
    try:
        proto = pb.TensorProto.FromString(sample.tensor)
        x = decode_protos([proto], [proto.name or "input"])[proto.name or "input"]
    except (TensorCodecError, ValueError):
        return None
    if x.size != side * side:
        return None  # not a one-channel image of the model's size
    return np.clip(x.reshape(1, side, side), 0.0, 1.0).astype(np.float32)


def _predict(onnx: Path, x: np.ndarray) -> np.ndarray:
    from converters.errors import ConversionError  # noqa: PLC0415 - torch
    from converters.onnx_export import ort_session, run_onnx  # noqa: PLC0415

    try:
        return np.asarray(run_onnx(ort_session(onnx), x)).argmax(axis=1)
    except ConversionError as exc:
        raise FactoryError(f"cannot run {onnx.name}: {exc}") from exc


class Retrainer:
    """Retrains, checks and builds for drift incidents on one hub (blocking calls).

    Args:
        fleet: The hub's fleet service.
        sources: Skill source folders by skill name (default: the built-in library's).
        epochs: Training epochs, over the running model's own (tests use few).
    """

    def __init__(
        self,
        fleet: FleetService,
        *,
        sources: Mapping[str, Path] | None = None,
        epochs: int | None = None,
    ) -> None:
        self._fleet = fleet
        self._sources = dict(sources or {})
        self._epochs = epochs

    # models

    def running_model(self, skill: str, version: str) -> ModelRecord | None:
        """The model whose artefacts the skill version ships (None: not built by this hub).

        Raises:
            StoreError: The store failed.
        """
        tables = self._fleet.models.tables
        for model in reversed(tables.list_models()):
            lineage = tables.lineage(model.id)
            if any((skill, version) in a.skills for a in lineage.artifacts):
                return model
        return None

    def _model_file(self, model: ModelRecord, folder: Path) -> Path:
        return self._fleet.models.export_blob(model.onnx_sha256, folder / f"{model.id}.onnx")

    # data

    def usable(self, incident: IncidentState, settings: DriftSettings) -> Labelled:
        """The incident's samples that can be trained on, with their labels.

        Only samples seen from the start of the window that opened the incident count.

        Raises:
            FactoryError: No running model, or the teacher does not run.
            NotFoundError: The teacher named in the settings does not exist.
            StoreError: The store failed.
        """
        model = self._need_model(incident)
        since = settings.policy.shift_start_ms(incident.opened_ms)
        stored = [
            s
            for s in self._fleet.drift.samples(incident.skill, incident.version)
            if s.seen_at_ms >= since
        ][-MAX_RETRAIN_SAMPLES:]
        kept = [(s, img) for s in stored if (img := _image(s, model.image_size)) is not None]
        labels = np.array([s.label for s, _ in kept], dtype=np.int64)
        x = np.stack([img for _, img in kept]) if kept else np.zeros((0, 1, 1, 1), np.float32)
        taught = 0
        if settings.teacher and (labels < 0).any():
            teacher = self._fleet.models.tables.get_model(settings.teacher)
            with tempfile.TemporaryDirectory(prefix="edgeskill-teacher-") as tmp:
                guess = _predict(self._model_file(teacher, Path(tmp)), x[labels < 0])
            taught = int((labels < 0).sum())
            labels[labels < 0] = guess
        keep = labels >= 0
        ids = tuple(s.id for (s, _), k in zip(kept, keep, strict=True) if k)
        return Labelled(ids, x[keep], labels[keep], taught)

    def _need_model(self, incident: IncidentState) -> ModelRecord:
        return self._trained(incident)[0]

    def _trained(self, incident: IncidentState) -> tuple[ModelRecord, int, int]:
        """The running model, its data set and its job."""
        model = self.running_model(incident.skill, incident.version)
        if model is None or model.dataset_id is None or model.job_id is None:
            raise FactoryError(
                f"{incident.skill} {incident.version} ships no model this hub trained"
            )
        return model, model.dataset_id, model.job_id

    def submit(
        self, incident: IncidentState, data: Labelled, *, now_ms: int
    ) -> tuple[int, dict[str, Any]]:
        """Register the data set (original + shifted training part) and queue the job.

        Returns:
            The job's id and what to record about the data.

        Raises:
            FactoryError: No running model, or the data set cannot be written or read.
            StoreError: The store failed.
        """
        model, dataset_id, job_id = self._trained(incident)
        factory = self._fleet.models
        source = factory.tables.get_dataset(dataset_id)
        train = data.part(holdout=False)
        with tempfile.TemporaryDirectory(prefix="edgeskill-drift-data-") as tmp:
            folder = Path(tmp) / f"{incident.skill}-drift{incident.id}"
            repeat = _write_folder(factory.home, source, model.image_size, train, folder)
            dataset = factory.add_folder_dataset(folder)
        spec = factory.tables.get_job(job_id).spec
        options = {k: spec[k] for k in ("arch", "lr", "batch_size", "seed", "width") if k in spec}
        job = factory.submit_training(
            dataset.id, epochs=self._epochs or int(spec.get("epochs", 8)),
            image_size=model.image_size, model_name=f"{incident.skill}-drift{incident.id}-{now_ms}",
            **options,
        )  # fmt: skip
        detail = {
            "running_model": model.id, "dataset": dataset.id, "shifted_train": len(train.ids),
            "shifted_repeat": repeat, "holdout": len(data.part(holdout=True).ids),
            "labels": "device+teacher" if data.teacher_labelled else "device",
            "teacher_labelled": data.teacher_labelled,
        }  # fmt: skip
        return job.id, detail

    # training and checking

    def train(self, job_id: int) -> tuple[JobRecord, ModelRecord | None] | None:
        """Run (or resume) the job and wait; None while another process runs it.

        Raises:
            JobError: The backend cannot start it.
            StoreError: The store failed.
        """
        factory = self._fleet.models
        job = factory.jobs.refresh(job_id)
        if job.status == "succeeded":
            return job, factory.tables.get_model(job.model_name)
        if factory.jobs.is_alive(job_id):
            return None
        return factory.train(job_id)

    def check(self, incident: IncidentState, data: Labelled, new: ModelRecord) -> dict[str, Any]:
        """Accuracy of the running and the new model on the shifted hold-out.

        Raises:
            FactoryError: No running model, or a model does not run.
            BlobError: A model file is missing or corrupt.
        """
        old = self._need_model(incident)
        holdout = data.part(holdout=True)
        if not holdout.ids:
            raise FactoryError("no shifted samples left for a hold-out")
        with tempfile.TemporaryDirectory(prefix="edgeskill-holdout-") as tmp:
            before = _predict(self._model_file(old, Path(tmp)), holdout.x)
            after = _predict(self._model_file(new, Path(tmp)), holdout.x)
        return {
            "holdout": len(holdout.ids),
            "accuracy_before": round(float((before == holdout.y).mean()), 4),
            "accuracy_after": round(float((after == holdout.y).mean()), 4),
            "new_model_test_accuracy": new.test_accuracy,
        }

    # building

    def build(self, incident: IncidentState, new: ModelRecord, work: Path) -> str:
        """Compress, convert, package and publish the next version; its version.

        A model already shipped by a version of the skill (a build cut short
        after publishing) gives that version again.

        Raises:
            FactoryError: No source folder for the skill, or a failed step.
            HubError: Publishing failed.
        """
        from cloud.models.bundles import package_skill  # noqa: PLC0415 - torch
        from converters.pipeline import CompressOptions  # noqa: PLC0415 - torch

        factory = self._fleet.models
        for artifact in factory.lineage(new.id).artifacts:
            shipped = [v for s, v in artifact.skills if s == incident.skill]
            if shipped:
                return shipped[0]
        source = self._sources.get(incident.skill, LIBRARY / incident.skill)
        if not (source / "skill.toml").is_file():
            raise FactoryError(f"no skill source folder for {incident.skill} (looked in {source})")
        if "int8" not in {v.name for v in factory.tables.variants_of(new.id)}:
            factory.compress(new.id, ["int8"], options=CompressOptions(tflite=False, latency=False))
        artifacts = [factory.convert(new.id, "onnx-cpu", variant=v) for v in ("float", "int8")]
        known = self._fleet.skills.list(incident.skill)
        version = next_patch(incident.version, {v.version for v in known})
        bundle = package_skill(factory, source, version, artifacts, work)
        # The next version belongs to the project the skill is in.
        project = known[0].project if known else "default"
        self._fleet.skills.publish(bundle, project=project)
        return version


def _write_folder(home: Path, source: Any, side: int, shifted: Labelled, folder: Path) -> int:
    """The original data set plus the shifted samples as PNGs, a folder per class; the repeat.

    Raises:
        FactoryError: The original data set no longer loads, or a file cannot be written.
    """
    from PIL import Image  # noqa: PLC0415

    from cloud.models.datasets import dataset_source  # noqa: PLC0415 - torch
    from converters.datasets import load_dataset  # noqa: PLC0415
    from converters.errors import ConverterError  # noqa: PLC0415

    try:
        data = load_dataset(dataset_source(home, source), size=(side, side))
    except ConverterError as exc:
        raise FactoryError(f"cannot load data set {source.name}: {exc}") from exc
    classes = list(data.classes)
    repeat = 1
    if len(shifted.ids):
        repeat = max(1, min(MAX_REPEAT, round(SHIFTED_SHARE * len(data.y) / len(shifted.ids))))
    try:
        for name in classes:
            (folder / name).mkdir(parents=True)
        for i, (x, y) in enumerate(zip(data.x, data.y, strict=True)):
            _png(Image, x, folder / classes[int(y)] / f"o{i:06d}.png")
        for sid, x, y in zip(shifted.ids, shifted.x, shifted.y, strict=True):
            if not 0 <= int(y) < len(classes):
                continue  # a label the model has no class for
            for r in range(repeat):
                _png(Image, x, folder / classes[int(y)] / f"s{sid:09d}-{r:02d}.png")
    except OSError as exc:
        raise FactoryError(f"cannot write the retraining data: {exc}") from exc
    return repeat


def _png(image: Any, x: np.ndarray, path: Path) -> None:
    pixels = (np.clip(x[0], 0.0, 1.0) * 255.0).round().astype(np.uint8)
    image.fromarray(pixels).save(path, format="PNG")
