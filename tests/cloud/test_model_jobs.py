"""Training jobs run in worker processes: progress and metrics in the registry, the model's
blobs and record on success, failures recorded, and a SIGKILLed job resuming from its
last checkpoint when started again.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from cloud.errors import ConflictError
from cloud.hub import Hub
from cloud.models import (
    JOB_FAILED,
    JOB_QUEUED,
    JOB_RUNNING,
    JOB_SUCCEEDED,
    EpochRecord,
    JobError,
    ModelFactory,
)
from converters.fit import load_checkpoint_metrics
from converters.onnx_export import ort_session
from tests.support import wait_until


@pytest.fixture
def factory(tmp_path: Path, store_url: str) -> Iterator[ModelFactory]:
    """A factory on a real hub home (the worker opens the home's configured store)."""
    hub = Hub.init(tmp_path / "hub", store_url)
    try:
        yield ModelFactory.for_hub(hub)
    finally:
        hub.close()


@pytest.fixture
def sqlite_factory(tmp_path: Path) -> Iterator[ModelFactory]:
    hub = Hub.init(tmp_path / "hub")
    try:
        yield ModelFactory.for_hub(hub)
    finally:
        hub.close()


def test_a_job_trains_in_a_worker_and_records_its_model(factory: ModelFactory) -> None:
    dataset = factory.add_builtin_dataset("digits")
    job = factory.submit_training(dataset.id, epochs=2, lr=5e-3, model_name="digits-small")
    assert job.status == JOB_QUEUED and job.spec["train"]["epochs"] == 2
    seen: list[list[int]] = []

    def progress(epochs: Sequence[EpochRecord]) -> None:
        seen.append([e.epoch for e in epochs])

    done, model = factory.train(job.id, on_progress=progress)
    assert done.status == JOB_SUCCEEDED, done.error
    assert done.pid is not None and done.pid != os.getpid()
    assert seen[-1] == [1, 2]
    assert model is not None and model.name == "digits-small" and model.job_id == job.id
    assert model.test_accuracy is not None and model.test_accuracy > 0.5
    assert model.weights_sha256 is not None
    onnx = factory.blobs.verify(model.onnx_sha256)
    assert ort_session(onnx).get_inputs()[0].shape[1:] == [1, 8, 8]
    factory.blobs.verify(model.weights_sha256)
    lineage = factory.lineage(model.id)
    assert lineage.dataset == dataset and lineage.job == done
    assert [e.epoch for e in lineage.epochs] == [1, 2]
    with pytest.raises(ConflictError, match="succeeded"):
        factory.jobs.start(job.id)


def wait_for_epochs(factory: ModelFactory, job_id: int, count: int, timeout: float = 90) -> None:
    wait_until(
        lambda: len(factory.tables.job_epochs(job_id)) >= count,
        timeout,
        f"the worker to record {count} epoch(s)",
        interval_s=0.05,
    )


@pytest.mark.slow
def test_a_killed_job_resumes_from_its_last_checkpoint(sqlite_factory: ModelFactory) -> None:
    factory = sqlite_factory
    dataset = factory.add_builtin_dataset("digits")
    job = factory.submit_training(dataset.id, epochs=3, lr=5e-3, batch_size=32)
    proc = factory.jobs.start(job.id, pause_s=30.0)  # the pause keeps it inside epoch 2
    wait_for_epochs(factory, job.id, 1)
    running = factory.tables.get_job(job.id)
    assert running.status == JOB_RUNNING and running.pid == proc.pid
    assert factory.jobs.is_alive(job.id)
    with pytest.raises(JobError, match="running"):
        factory.jobs.start(job.id)

    os.kill(proc.pid, signal.SIGKILL)
    failed = factory.jobs.wait(job.id, proc)
    assert failed.status == JOB_FAILED and failed.error is not None
    assert "SIGKILL" in failed.error and "resume" in failed.error
    checkpoint = factory.jobs.workdir(job.id) / "checkpoint.pt"
    done_at_kill = [m.epoch for m in load_checkpoint_metrics(checkpoint)]
    assert done_at_kill == [1]
    assert factory.tables.list_models() == []

    resumed, model = factory.train(job.id)
    assert resumed.status == JOB_SUCCEEDED, resumed.error
    assert resumed.resumed_from_epoch == 1
    assert [e.epoch for e in factory.tables.job_epochs(job.id)] == [1, 2, 3]
    assert model is not None and model.job_id == job.id


def test_a_job_whose_data_went_missing_fails_and_records_no_model(
    sqlite_factory: ModelFactory, tmp_path: Path
) -> None:
    import numpy as np  # noqa: PLC0415
    from PIL import Image  # noqa: PLC0415

    factory = sqlite_factory
    for name in ("cat", "dog"):
        (tmp_path / "pets" / name).mkdir(parents=True)
        for i in range(5):
            pixels = np.full((8, 8), 40 * i, dtype=np.uint8)
            Image.fromarray(pixels).save(tmp_path / "pets" / name / f"{i}.png")
    dataset = factory.add_folder_dataset(tmp_path / "pets")
    job = factory.submit_training(dataset.id, epochs=1)
    for image in (factory.jobs.home / dataset.location / "cat").iterdir():
        image.unlink()  # the snapshot is damaged behind the hub's back
    failed, model = factory.train(job.id)
    assert model is None and failed.status == JOB_FAILED
    assert failed.error is not None and "cat" in failed.error
    assert factory.tables.list_models() == []
    assert factory.jobs.refresh(job.id) == failed
