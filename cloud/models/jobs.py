"""Training jobs as separate processes: submit, start, watch, resume.

A job's record lives in the store's model tables; its work folder ``<home>/jobs/<id>/``
holds the converters package's checkpoint (rewritten every epoch), metrics and
outputs. The worker process (:mod:`cloud.models.worker`) holds an exclusive
lock on ``<folder>/.lock`` while it runs, which is how anyone can tell a live
job from one whose process died. Starting a failed (or dead) job again resumes
it from its last checkpoint.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from cloud.errors import ConflictError, ValidationError
from cloud.models.errors import JobError
from cloud.store.model_records import (
    JOB_RUNNING,
    JOB_SUCCEEDED,
    DatasetRecord,
    EpochRecord,
    JobRecord,
)
from cloud.store.models import ModelTables
from protos.envelope import now_ms

__all__ = [
    "JOBS_DIR",
    "LOCK_BUSY_EXIT",
    "JobRunner",
    "ProgressFn",
    "job_lock",
    "spec_options",
]

JOBS_DIR = "jobs"
LOCK_BUSY_EXIT = 75
"""Exit code of a worker that found another process running the same job."""
_LOCK_FILE = ".lock"
_STOP_GRACE_S = 10.0

ProgressFn = Callable[[Sequence[EpochRecord]], None]
"""Called with the epochs recorded so far, whenever there are more."""


@contextlib.contextmanager
def job_lock(workdir: Path) -> Iterator[bool]:
    """Hold the job folder's lock for the block; yields False when another process has it."""
    workdir.mkdir(parents=True, exist_ok=True)
    fd = os.open(workdir / _LOCK_FILE, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)  # closing releases the lock


def spec_options(spec: dict[str, object]) -> dict[str, object]:
    """The part of a converters ``JobSpec`` a job record keeps: not the data set, not pacing."""
    return {k: v for k, v in spec.items() if k not in {"dataset", "pause_s"}}


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "is still running"
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-code).name}"
        return f"was killed by signal {-code}"
    return f"exited with code {code}"


class JobRunner:
    """Starts training jobs in worker processes and follows them."""

    def __init__(self, home: Path, tables: ModelTables) -> None:
        """Run jobs of the hub at ``home`` recorded in ``tables``."""
        self.home = home
        self.tables = tables

    def workdir(self, job_id: int) -> Path:
        """The job's work folder."""
        return self.home / JOBS_DIR / str(int(job_id))

    def submit(
        self,
        dataset: DatasetRecord,
        spec: dict[str, object],
        *,
        model_name: str | None = None,
    ) -> JobRecord:
        """Queue a job that trains ``spec`` (a converters ``JobSpec.to_dict()``) on ``dataset``.

        Raises:
            ValidationError: The spec lacks an architecture or epoch count.
            NotFoundError: The data set version does not exist.
            ConflictError: The model name is taken.
            StoreError: The database failed.
        """
        options = spec_options(spec)
        train = options.get("train")
        if not isinstance(train, dict) or not isinstance(options.get("arch"), str):
            raise ValidationError("a job spec needs 'arch' and 'train' options")
        return self.tables.create_job(
            dataset.id, arch=str(options["arch"]), spec=options,
            epochs=int(train.get("epochs", 0)), now_ms=now_ms(), model_name=model_name,
        )  # fmt: skip

    def is_alive(self, job_id: int) -> bool:
        """Whether a worker process holds the job's lock right now."""
        if not self.workdir(job_id).is_dir():
            return False
        with job_lock(self.workdir(job_id)) as free:
            return not free

    def start(
        self, job_id: int, *, pause_s: float = 0.0, threads: int = 1
    ) -> subprocess.Popen[bytes]:
        """Start (or resume) a job in a worker process; its output goes to ``worker.log``.

        Args:
            job_id: The job.
            pause_s: Seconds the worker sleeps after each epoch (to leave CPU to others).
            threads: Torch threads of the worker.

        Raises:
            NotFoundError: No such job.
            ConflictError: The job already succeeded.
            JobError: A process is running it now, or the worker cannot start.
        """
        job = self.tables.get_job(job_id)
        if job.status == JOB_SUCCEEDED:
            raise ConflictError(f"training job {job_id} already succeeded")
        if self.is_alive(job_id):
            raise JobError(f"training job {job_id} is running in process {job.pid}")
        workdir = self.workdir(job_id)
        workdir.mkdir(parents=True, exist_ok=True)
        argv = [
            sys.executable, "-m", "cloud.models.worker", str(self.home), str(job_id),
            "--pause", repr(float(pause_s)),
        ]  # fmt: skip
        env = {
            **os.environ,
            "OMP_NUM_THREADS": str(threads),
            "EDGESKILL_TRAIN_THREADS": str(threads),
        }
        try:
            with (workdir / "worker.log").open("ab") as log:
                return subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
        except OSError as exc:
            raise JobError(f"cannot start the worker of job {job_id}: {exc}") from exc

    def wait(
        self,
        job_id: int,
        proc: subprocess.Popen[bytes],
        *,
        on_progress: ProgressFn | None = None,
        poll_s: float = 0.2,
    ) -> JobRecord:
        """Follow a started job until its process ends; report epochs as they are recorded.

        Interrupting the wait (Ctrl-C) stops the worker; the job can be resumed.

        Returns:
            The job's final record (``succeeded`` or ``failed``).

        Raises:
            JobError: Another process was already running the job.
            StoreError: The database failed.
        """
        seen = 0
        try:
            while True:
                code = proc.poll()
                epochs = self.tables.job_epochs(job_id)
                if on_progress is not None and len(epochs) != seen:
                    seen = len(epochs)
                    on_progress(epochs)
                if code is not None:
                    break
                time.sleep(poll_s)
        except BaseException:
            _stop(proc)
            self._settle(job_id, proc.returncode)
            raise
        return self._settle(job_id, code)

    def run(
        self,
        job_id: int,
        *,
        on_progress: ProgressFn | None = None,
        pause_s: float = 0.0,
        threads: int = 1,
    ) -> JobRecord:
        """:meth:`start` then :meth:`wait`.

        Raises:
            As :meth:`start` and :meth:`wait`.
        """
        proc = self.start(job_id, pause_s=pause_s, threads=threads)
        return self.wait(job_id, proc, on_progress=on_progress)

    def refresh(self, job_id: int) -> JobRecord:
        """A job's record, with a ``running`` job whose process is gone marked failed.

        Raises:
            NotFoundError: No such job.
            StoreError: The database failed.
        """
        return self._settle(job_id, None)

    def _settle(self, job_id: int, code: int | None) -> JobRecord:
        if code == LOCK_BUSY_EXIT:
            raise JobError(f"training job {job_id} was already running in another process")
        job = self.tables.get_job(job_id)
        if job.status != JOB_RUNNING or self.is_alive(job_id):
            return job
        done = len(self.tables.job_epochs(job_id))
        how = _describe_exit(code) if code is not None else "is gone"
        message = (
            f"the job process {how} after {done} of {job.epochs} epochs; "
            "start the job again to resume from its last checkpoint "
            f"(its log: {self.workdir(job_id) / 'worker.log'})"
        )
        try:
            return self.tables.fail_job(job_id, message, now_ms=now_ms())
        except ConflictError:  # it succeeded in the meantime
            return self.tables.get_job(job_id)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=_STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
