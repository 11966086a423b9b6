"""The training worker: ``python -m cloud.models.worker HOME JOB_ID [--pause S] [--backend B]``.

Every job backend runs this entry point: the local one as a process, the Ray one
by calling :func:`run_job_here` in a Ray worker. It holds the job folder's lock,
marks the job running, records the run (backend, host, pid) in the folder's
run log, trains with the
converters package (a checkpoint every epoch, resuming from the last one),
copies each epoch's metrics into the model tables, and finally stores the model's
blobs and records the model and the job's success in one transaction. A
failure is recorded on the job; a kill leaves the job ``running`` until the
runner (or anyone calling :meth:`JobRunner.refresh`) notices the lock is free.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import socket
import sys
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

from cloud.errors import ConflictError, HubError
from cloud.hub_config import CONFIG_FILE, HubConfig
from cloud.models.blobs import BlobStore
from cloud.models.datasets import dataset_source
from cloud.models.errors import FactoryError
from cloud.models.jobs import JOBS_DIR, LOCK_BUSY_EXIT, JobRunEntry, job_lock, record_run
from cloud.store import open_store
from cloud.store.model_records import EpochRecord, JobRecord, ModelDraft
from cloud.store.models import ModelTables
from protos.envelope import now_ms

if TYPE_CHECKING:
    from converters.fit import EpochMetrics

__all__ = ["main", "run_job_here", "run_worker"]

BLOBS_DIR = "blobs"


def _epochs(metrics: Iterable[EpochMetrics]) -> list[EpochRecord]:
    return [EpochRecord(m.epoch, m.train_loss, m.val_accuracy, m.seconds) for m in metrics]


def run_job_here(
    home: Path,
    job_id: int,
    *,
    pause_s: float = 0.0,
    threads: int = 1,
    backend: str = "local",
    log: Path | None = None,
) -> int:
    """Set torch's threads and run one job in this process (the entry point of every backend).

    Args:
        home: The hub home.
        job_id: The job.
        pause_s: Seconds to sleep after each epoch.
        threads: Torch threads.
        backend: The backend running this, for the job's run log.
        log: A file this run's messages are appended to (a process backend
            redirects the whole process's output instead).

    Returns:
        The exit code, as :func:`run_worker`.
    """
    import torch  # noqa: PLC0415

    torch.set_num_threads(max(1, threads))
    if log is None:
        return run_worker(home, job_id, pause_s=pause_s, backend=backend)
    with (
        log.open("a", encoding="utf-8") as out,
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(out),
    ):
        return run_worker(home, job_id, pause_s=pause_s, backend=backend)


def run_worker(home: Path, job_id: int, *, pause_s: float = 0.0, backend: str = "local") -> int:
    """Run one job to its end in this process; returns the exit code.

    0: succeeded; 1: failed (recorded on the job); 2: the job cannot run (already
    succeeded, unknown); :data:`LOCK_BUSY_EXIT`: another process runs it.
    """
    try:
        config = HubConfig.load(home / CONFIG_FILE)
        store = open_store(config.store_url)
    except HubError as exc:
        sys.stderr.write(f"cannot open the hub at {home}: {exc}\n")
        return 2
    try:
        tables = ModelTables(store.engine)
        with job_lock(home / JOBS_DIR / str(job_id)) as held:
            if not held:
                sys.stderr.write(f"training job {job_id} is running in another process\n")
                return LOCK_BUSY_EXIT
            try:
                job = tables.mark_running(job_id, pid=os.getpid(), now_ms=now_ms())
            except HubError as exc:
                sys.stderr.write(f"training job {job_id} cannot run: {exc}\n")
                return 2
            entry = JobRunEntry(backend, socket.gethostname(), os.getpid(), job.started_ms or 0)
            record_run(home / JOBS_DIR / str(job_id), entry)
            return _train(home, tables, job, pause_s)
    finally:
        store.close()


def _train(home: Path, tables: ModelTables, job: JobRecord, pause_s: float) -> int:
    # Imported here: torch loads only in the worker, never in a process that only watches.
    from converters.errors import ConverterError  # noqa: PLC0415
    from converters.training import JobSpec, read_metrics, run_job  # noqa: PLC0415

    workdir = home / JOBS_DIR / str(job.id)
    try:
        dataset = tables.get_dataset(job.dataset_id)
        spec = JobSpec.from_dict(
            {**job.spec, "dataset": dataset_source(home, dataset), "pause_s": pause_s}
        )
        result = run_job(
            spec,
            workdir,
            on_epoch=lambda _m: tables.replace_epochs(job.id, _epochs(read_metrics(workdir))),
        )
        if result.dataset_hash != dataset.content_hash:
            raise FactoryError(f"data set {dataset.name} v{dataset.version} changed on disk")
        blobs = BlobStore(home / BLOBS_DIR)
        weights, _ = blobs.put_file(result.model_path)
        onnx, onnx_size = blobs.put_file(result.onnx_path)
        draft = ModelDraft(
            name=job.model_name, arch=spec.arch, onnx_sha256=onnx, onnx_size=onnx_size,
            image_size=spec.image_size, weights_sha256=weights,
            test_accuracy=result.test_accuracy, dataset_id=dataset.id,
            split_seed=spec.split_seed,
        )  # fmt: skip
        model = tables.finish_job(
            job.id, draft, epochs=_epochs(result.metrics),
            resumed_from_epoch=result.resumed_from_epoch, now_ms=now_ms(),
        )  # fmt: skip
    except (ConverterError, HubError) as exc:
        return _record_failure(tables, job.id, exc)
    sys.stdout.write(f"job {job.id}: model {model.id} ({model.name}) recorded\n")
    return 0


def _record_failure(tables: ModelTables, job_id: int, exc: Exception) -> int:
    try:
        tables.fail_job(job_id, f"{type(exc).__name__}: {exc}", now_ms=now_ms())
    except (ConflictError, HubError) as store_exc:
        sys.stderr.write(
            f"training job {job_id} failed ({exc}); recording it failed: {store_exc}\n"
        )
        return 1
    sys.stderr.write(f"training job {job_id} failed: {exc}\n")
    return 1


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit code."""
    parser = argparse.ArgumentParser(prog="python -m cloud.models.worker")
    parser.add_argument("home", type=Path)
    parser.add_argument("job_id", type=int)
    parser.add_argument("--pause", type=float, default=0.0)
    parser.add_argument("--backend", default="local")
    args = parser.parse_args(argv)
    threads = int(os.environ.get("EDGESKILL_TRAIN_THREADS", "1"))
    return run_job_here(
        args.home, args.job_id, pause_s=args.pause, threads=threads, backend=args.backend
    )


if __name__ == "__main__":
    raise SystemExit(main())
