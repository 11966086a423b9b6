"""Training jobs: a spec, a work folder, and a process that can be killed and resumed.

A job's folder holds ``spec.json`` (what to train), ``checkpoint.pt`` (rewritten
atomically after each epoch), ``metrics.jsonl`` (one line per finished epoch),
``status.json`` and, when done, ``model.pt``, ``model.onnx`` and ``result.json``.
Run a job in-process with :func:`run_job`, or as a child process with
:func:`start_job` (``python -m converters.training <folder>``); starting either
again on the same folder resumes from the last checkpoint.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from torch import nn

from converters._files import atomic_write_bytes
from converters._loop import accuracy
from converters.datasets import ImageDataset, load_dataset
from converters.digits import DigitsCNN
from converters.errors import ConverterError, TrainingError
from converters.fit import EpochMetrics, TrainConfig, fit, load_checkpoint_metrics
from converters.mobilenet import MobileNet, MobileNetConfig
from converters.models import ARCHITECTURES, save_model
from converters.onnx_export import check_onnx, export_onnx

__all__ = [
    "JobResult",
    "JobSpec",
    "JobStatus",
    "main",
    "read_metrics",
    "read_status",
    "run_job",
    "start_job",
]

MAX_SPEC_BYTES = 64 * 1024
MAX_PAUSE_S = 60.0


@dataclass(frozen=True)
class JobSpec:
    """What a training job trains.

    Attributes:
        arch: ``"digits-cnn"`` or ``"mobilenet"``.
        dataset: A built-in data set name (``"digits"``) or a folder-per-class path.
        width: Width multiplier of the MobileNet.
        image_size: Side folder images are resized to (the digits CNN needs 8).
        train: Hyper-parameters.
        split_seed: Seed of the train / val / test split.
        pause_s: Sleep after each epoch, to leave CPU to others (tests use it to kill mid-job).
    """

    arch: str = "mobilenet"
    dataset: str = "digits"
    width: float = 1.0
    image_size: int = 8
    train: TrainConfig = field(default_factory=TrainConfig)
    split_seed: int = 0
    pause_s: float = 0.0

    def __post_init__(self) -> None:
        if self.arch not in ARCHITECTURES:
            raise TrainingError(
                f"arch must be one of {', '.join(ARCHITECTURES)}, not {self.arch!r}"
            )
        if not 0.05 <= self.width <= 4.0:
            raise TrainingError(f"width must be in 0.05..4, got {self.width}")
        if not 4 <= self.image_size <= 512:
            raise TrainingError(f"image_size must be in 4..512, got {self.image_size}")
        if self.arch == "digits-cnn" and self.image_size != 8:
            raise TrainingError("the digits CNN takes 8x8 images (image_size=8)")
        if not 0 <= self.pause_s <= MAX_PAUSE_S:
            raise TrainingError(f"pause_s must be in 0..{MAX_PAUSE_S}")

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-able form."""
        return asdict(self)

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> JobSpec:
        """Parse :meth:`to_dict`'s output.

        Raises:
            TrainingError: Unknown keys or invalid values.
        """
        unknown = set(raw) - set(cls.__dataclass_fields__)
        if unknown:
            raise TrainingError(f"unknown job options: {', '.join(sorted(unknown))}")
        values = dict(raw)
        values["train"] = TrainConfig.from_dict(dict(values.get("train", {})))
        try:
            return cls(**values)
        except TypeError as exc:
            raise TrainingError(f"bad job spec: {exc}") from exc


@dataclass(frozen=True)
class JobStatus:
    """What ``status.json`` says: ``state`` is ``running``, ``completed`` or ``failed``."""

    state: str
    epoch: int
    epochs: int
    pid: int
    error: str | None = None


@dataclass(frozen=True)
class JobResult:
    """A finished job.

    Attributes:
        test_accuracy: Accuracy of the final model on the held-out test split.
        dataset_hash: Content hash of the data the job trained on.
        resumed_from_epoch: Last epoch found in a checkpoint at start (0 if none).
        metrics: Every epoch's metrics.
        model_path: Saved weights (:func:`converters.models.load_model`).
        onnx_path: The exported, checked ONNX model.
    """

    test_accuracy: float
    dataset_hash: str
    resumed_from_epoch: int
    metrics: tuple[EpochMetrics, ...]
    model_path: Path
    onnx_path: Path


def build_for(spec: JobSpec, dataset: ImageDataset) -> nn.Module:
    """The untrained model a spec asks for, shaped for the data set."""
    channels, classes = int(dataset.x.shape[1]), len(dataset.classes)
    if spec.arch == "digits-cnn":
        return DigitsCNN(in_channels=channels, num_classes=classes)
    config = MobileNetConfig.scaled(spec.width, in_channels=channels, num_classes=classes)
    return MobileNet(config)


def _write_json(path: Path, value: object) -> None:
    atomic_write_bytes(path, json.dumps(value, indent=1).encode())


def _write_status(
    workdir: Path, state: str, epoch: int, spec: JobSpec, error: str | None = None
) -> None:
    status = JobStatus(state, epoch, spec.train.epochs, os.getpid(), error)
    _write_json(workdir / "status.json", asdict(status))


def run_job(
    spec: JobSpec, workdir: Path, *, on_epoch: Callable[[EpochMetrics], None] | None = None
) -> JobResult:
    """Run (or resume, or just report) a training job in this process.

    Args:
        spec: What to train; written to ``spec.json`` if that is absent.
        workdir: The job's folder.
        on_epoch: Called after each epoch's checkpoint and metrics are on disk.

    Returns:
        The result; a job already completed in ``workdir`` is not trained again.

    Raises:
        TrainingError: Training failed or the folder belongs to a different spec.
        DatasetError: The data set is invalid.
        ConversionError: The trained model did not export or check.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    _claim(spec, workdir)
    if (workdir / "result.json").exists():
        return _read_result(workdir)
    try:
        return _train(spec, workdir, on_epoch)
    except ConverterError as exc:
        _write_status(workdir, "failed", len(read_metrics(workdir)), spec, str(exc))
        raise


def _claim(spec: JobSpec, workdir: Path) -> None:
    spec_path = workdir / "spec.json"
    if not spec_path.exists():
        _write_json(spec_path, spec.to_dict())
    elif replace(_read_spec(workdir), pause_s=0.0) != replace(spec, pause_s=0.0):
        # pause_s only paces the run; any other difference would change the result.
        raise TrainingError(f"{workdir.name} holds a different job")


def _train(
    spec: JobSpec, workdir: Path, on_epoch: Callable[[EpochMetrics], None] | None
) -> JobResult:
    dataset = load_dataset(spec.dataset, size=(spec.image_size, spec.image_size))
    data = dataset.split(seed=spec.split_seed)
    torch.manual_seed(spec.train.seed)  # initial weights are part of what the spec fixes
    model = build_for(spec, dataset)
    checkpoint = workdir / "checkpoint.pt"
    done = load_checkpoint_metrics(checkpoint) if checkpoint.exists() else []
    if done:  # the kill may have come between the checkpoint and the metrics file
        _write_metrics(workdir, done)
    resumed = len(done)
    _write_status(workdir, "running", resumed, spec)

    def after_epoch(metrics: EpochMetrics) -> None:
        _write_metrics(workdir, [*done, metrics])
        done.append(metrics)
        _write_status(workdir, "running", metrics.epoch, spec)
        if on_epoch is not None:
            on_epoch(metrics)
        time.sleep(spec.pause_s)

    history = fit(model, data, spec.train, on_epoch=after_epoch, checkpoint=checkpoint)
    model_path = save_model(model, workdir / "model.pt")
    onnx_path = export_onnx(model, data.test.x[:2], workdir / "model.onnx")
    check_onnx(model, onnx_path, data.test.x[:64])
    result = JobResult(
        test_accuracy=accuracy(model, data.test.x, data.test.y),
        dataset_hash=dataset.content_hash,
        resumed_from_epoch=resumed,
        metrics=tuple(history),
        model_path=model_path,
        onnx_path=onnx_path,
    )
    _write_json(workdir / "result.json", _result_to_dict(result))
    _write_status(workdir, "completed", len(history), spec)
    return result


def _write_metrics(workdir: Path, history: list[EpochMetrics]) -> None:
    # Rewritten whole from the checkpoint's history, so a resumed epoch never appears twice.
    lines = "".join(json.dumps(m.to_dict()) + "\n" for m in history)
    atomic_write_bytes(workdir / "metrics.jsonl", lines.encode())


def read_metrics(workdir: Path) -> list[EpochMetrics]:
    """Per-epoch metrics written so far (empty if none).

    Raises:
        TrainingError: The metrics file is malformed.
    """
    path = workdir / "metrics.jsonl"
    if not path.exists():
        return []
    try:
        return [EpochMetrics(**json.loads(line)) for line in path.read_text().splitlines() if line]
    except (ValueError, TypeError) as exc:
        raise TrainingError(f"malformed {path.name}: {exc}") from exc


def read_status(workdir: Path) -> JobStatus | None:
    """The job's last written status, or ``None`` before it started.

    Raises:
        TrainingError: The status file is malformed.
    """
    path = workdir / "status.json"
    if not path.exists():
        return None
    try:
        return JobStatus(**json.loads(path.read_text()))
    except (ValueError, TypeError) as exc:
        raise TrainingError(f"malformed {path.name}: {exc}") from exc


def _read_spec(workdir: Path) -> JobSpec:
    path = workdir / "spec.json"
    try:
        if path.stat().st_size > MAX_SPEC_BYTES:
            raise TrainingError(f"{path.name} is over {MAX_SPEC_BYTES} bytes")
        raw = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise TrainingError(f"cannot read {path}: {exc}") from exc
    if not isinstance(raw, dict):
        raise TrainingError(f"{path.name} is not a JSON object")
    return JobSpec.from_dict(raw)


def _result_to_dict(result: JobResult) -> dict[str, Any]:
    raw = asdict(result)
    raw["model_path"] = result.model_path.name
    raw["onnx_path"] = result.onnx_path.name
    return raw


def _read_result(workdir: Path) -> JobResult:
    try:
        raw = json.loads((workdir / "result.json").read_text())
        raw["metrics"] = tuple(EpochMetrics(**m) for m in raw["metrics"])
        raw["model_path"] = workdir / raw["model_path"]
        raw["onnx_path"] = workdir / raw["onnx_path"]
        return JobResult(**raw)
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise TrainingError(f"malformed result.json in {workdir.name}: {exc}") from exc


def start_job(spec: JobSpec, workdir: Path, *, threads: int = 1) -> subprocess.Popen[bytes]:
    """Start (or resume) a job in a child process; its output goes to ``log.txt``.

    Args:
        spec: What to train.
        workdir: The job's folder.
        threads: Torch threads the child may use.

    Raises:
        TrainingError: ``workdir`` holds a different job.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    _claim(spec, workdir)
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "EDGESKILL_TRAIN_THREADS": str(threads)}
    with (workdir / "log.txt").open("ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "converters.training", str(workdir)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``python -m converters.training <job folder>``; returns the exit code."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        sys.stderr.write("usage: python -m converters.training <job folder>\n")
        return 2
    workdir = Path(args[0])
    torch.set_num_threads(max(1, int(os.environ.get("EDGESKILL_TRAIN_THREADS", "1"))))
    try:
        result = run_job(_read_spec(workdir), workdir)
    except ConverterError as exc:
        sys.stderr.write(f"training failed: {exc}\n")
        return 1
    sys.stdout.write(f"done: test accuracy {result.test_accuracy:.4f}\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
