"""Training jobs: submit, start on a backend, watch, cancel, resume.

A job's record lives in the store's model tables; its work folder ``<home>/jobs/<id>/``
holds the converters package's checkpoint (rewritten every epoch), metrics and
outputs. The work runs on a :class:`~cloud.models.job_backends.JobBackend`: a
local worker process by default, a Ray task with the optional ``ray`` extra.
Either way the worker (:mod:`cloud.models.worker`) holds an exclusive lock on
``<folder>/.lock`` while it runs, which is how anyone can tell a live job from
one whose work died, and appends the backend, host and pid of each run to
``<folder>/runs.jsonl`` (:meth:`JobRunner.runs`). Starting a failed (or dead)
job again, on any backend, resumes it from its last checkpoint.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from cloud.errors import ConflictError, ValidationError
from cloud.models.errors import JobError
from cloud.models.job_backends import (
    JobBackend,
    JobLaunch,
    JobOutcome,
    JobRun,
    LocalProcessBackend,
)
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
    "JobRunEntry",
    "JobRunner",
    "ProgressFn",
    "job_lock",
    "read_runs",
    "record_run",
    "spec_options",
]

JOBS_DIR = "jobs"
LOCK_BUSY_EXIT = 75
"""Exit code of a worker that found another process running the same job."""
RUNS_FILE = "runs.jsonl"
MAX_RUNS_BYTES = 1 << 20
"""Cap on the run log read back; a job is started a handful of times, not thousands."""
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


@dataclass(frozen=True)
class JobRunEntry:
    """One run of a job's work, as its worker recorded it when it took the job."""

    backend: str
    host: str
    pid: int
    started_ms: int


def record_run(workdir: Path, entry: JobRunEntry) -> None:
    """Append a run to the job folder's run log (one JSON line, one ``write``)."""
    line = json.dumps(asdict(entry), sort_keys=True).encode() + b"\n"
    fd = os.open(workdir / RUNS_FILE, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def read_runs(workdir: Path) -> list[JobRunEntry]:
    """The runs a job folder's log records, oldest first; lines that do not parse are skipped."""
    try:
        with (workdir / RUNS_FILE).open("rb") as fh:
            data = fh.read(MAX_RUNS_BYTES)
    except FileNotFoundError:
        return []
    runs = []
    for line in data.splitlines():
        try:
            fields = json.loads(line)
            backend, host = str(fields["backend"]), str(fields["host"])
            runs.append(JobRunEntry(backend, host, int(fields["pid"]), int(fields["started_ms"])))
        except (ValueError, KeyError, TypeError):
            continue  # a torn last line of a killed worker
    return runs


def spec_options(spec: dict[str, object]) -> dict[str, object]:
    """The part of a converters ``JobSpec`` a job record keeps: not the data set, not pacing."""
    return {k: v for k, v in spec.items() if k not in {"dataset", "pause_s"}}


class JobRunner:
    """Starts training jobs on a backend and follows them."""

    def __init__(self, home: Path, tables: ModelTables, backend: JobBackend | None = None) -> None:
        """Run jobs of the hub at ``home`` recorded in ``tables``, on ``backend`` by default.

        Args:
            home: The hub home.
            tables: Its model tables.
            backend: Where jobs run unless a call names another; a local process if None.
        """
        self.home = home
        self.tables = tables
        self.backend = backend if backend is not None else LocalProcessBackend()

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
        """Whether a worker, on any backend of this machine's file system, holds the job's lock."""
        if not self.workdir(job_id).is_dir():
            return False
        with job_lock(self.workdir(job_id)) as free:
            return not free

    def runs(self, job_id: int) -> list[JobRunEntry]:
        """Every run of the job's work so far (which backend, host and pid), oldest first."""
        return read_runs(self.workdir(job_id))

    def start(
        self,
        job_id: int,
        *,
        pause_s: float = 0.0,
        threads: int = 1,
        backend: JobBackend | None = None,
    ) -> JobRun:
        """Start (or resume) a job; its worker's output goes to ``worker.log``.

        Args:
            job_id: The job.
            pause_s: Seconds the worker sleeps after each epoch (to leave CPU to others).
            threads: Torch threads of the worker.
            backend: Where to run it (default: the runner's backend).

        Raises:
            NotFoundError: No such job.
            ConflictError: The job already succeeded.
            JobError: A worker is running it now, or the backend cannot start it.
        """
        job = self.tables.get_job(job_id)
        if job.status == JOB_SUCCEEDED:
            raise ConflictError(f"training job {job_id} already succeeded")
        if self.is_alive(job_id):
            where = [f"on {r.backend} ({r.host}, pid {r.pid})" for r in self.runs(job_id)[-1:]]
            raise JobError(f"training job {job_id} is running {''.join(where) or 'elsewhere'}")
        launch = JobLaunch(self.home, job_id, self.workdir(job_id), float(pause_s), threads)
        return (backend or self.backend).start(launch)

    def wait(
        self,
        job_id: int,
        run: JobRun,
        *,
        on_progress: ProgressFn | None = None,
        poll_s: float = 0.2,
    ) -> JobRecord:
        """Follow a started job until its work ends; report epochs as they are recorded.

        Interrupting the wait (Ctrl-C) cancels the work; the job can be resumed.

        Returns:
            The job's final record (``succeeded`` or ``failed``).

        Raises:
            JobError: Another process was already running the job, or the backend failed.
            StoreError: The database failed.
        """
        seen = 0
        try:
            while True:
                outcome = run.poll()
                epochs = self.tables.job_epochs(job_id)
                if on_progress is not None and len(epochs) != seen:
                    seen = len(epochs)
                    on_progress(epochs)
                if outcome is not None:
                    break
                time.sleep(poll_s)
        except BaseException:
            self._settle(job_id, run.cancel())
            raise
        return self._settle(job_id, outcome)

    def cancel(self, job_id: int, run: JobRun) -> JobRecord:
        """Stop a started job and wait until its work ended; it keeps its last checkpoint.

        Returns:
            The job's record: ``failed`` (resumable), or ``succeeded`` if it finished first.

        Raises:
            JobError: The backend failed.
            StoreError: The database failed.
        """
        return self._settle(job_id, run.cancel())

    def run(
        self,
        job_id: int,
        *,
        on_progress: ProgressFn | None = None,
        pause_s: float = 0.0,
        threads: int = 1,
        backend: JobBackend | None = None,
    ) -> JobRecord:
        """:meth:`start` then :meth:`wait`.

        Raises:
            As :meth:`start` and :meth:`wait`.
        """
        started = self.start(job_id, pause_s=pause_s, threads=threads, backend=backend)
        return self.wait(job_id, started, on_progress=on_progress)

    def refresh(self, job_id: int) -> JobRecord:
        """A job's record, with a ``running`` job whose worker is gone marked failed.

        Raises:
            NotFoundError: No such job.
            StoreError: The database failed.
        """
        return self._settle(job_id, None)

    def _settle(self, job_id: int, outcome: JobOutcome | None) -> JobRecord:
        if outcome is not None and outcome.code == LOCK_BUSY_EXIT:
            raise JobError(f"training job {job_id} was already running in another process")
        if outcome is not None:
            self._await_release(job_id)
        job = self.tables.get_job(job_id)
        if job.status != JOB_RUNNING or self.is_alive(job_id):
            return job
        done = len(self.tables.job_epochs(job_id))
        how = outcome.how if outcome is not None else "the job process is gone"
        message = (
            f"{how} after {done} of {job.epochs} epochs; "
            "start the job again (on any backend) to resume from its last checkpoint "
            f"(its log: {self.workdir(job_id) / 'worker.log'})"
        )
        try:
            return self.tables.fail_job(job_id, message, now_ms=now_ms())
        except ConflictError:  # it succeeded in the meantime
            return self.tables.get_job(job_id)

    def _await_release(self, job_id: int) -> None:
        # A worker killed on a cluster can be reported dead a moment before its
        # process is, and with it the lock, is gone.
        deadline = time.monotonic() + _STOP_GRACE_S
        while self.is_alive(job_id) and time.monotonic() < deadline:
            time.sleep(0.05)
