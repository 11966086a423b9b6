"""Where a training job's work runs: the :class:`JobBackend` interface and the local process.

A backend starts the worker entry point (:mod:`cloud.models.worker`) for one
job and hands back a :class:`JobRun` to poll and cancel; it knows nothing of
the store. Everything a run leaves behind is in the job's folder (checkpoint,
metrics, lock, log) and the store (status, epochs, model), written by the
worker itself, so the :class:`cloud.models.jobs.JobRunner` follows every
backend the same way and a job started on one backend resumes on any other.

:class:`LocalProcessBackend` (the default) runs the worker as a child process
of this one; ``ray`` (:mod:`cloud.models.ray_jobs`, the optional ``ray``
extra) runs it as a task on a Ray cluster. :func:`backend_named` turns a
setting into a backend.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

from cloud.errors import ValidationError
from cloud.models.errors import JobError

__all__ = [
    "BACKENDS",
    "WORKER_MODULE",
    "JobBackend",
    "JobLaunch",
    "JobOutcome",
    "JobRun",
    "LocalProcessBackend",
    "LocalRun",
    "backend_named",
    "describe_exit",
]

BACKENDS = ("local", "ray")
WORKER_MODULE = "cloud.models.worker"
"""The worker entry point every backend runs: ``python -m`` it, or call its ``run_job_here``."""
_STOP_GRACE_S = 10.0


@dataclass(frozen=True)
class JobLaunch:
    """What a backend needs to start a job's work.

    Attributes:
        home: The hub home (the worker reads its ``hub.toml`` and store from there).
        job_id: The job.
        workdir: The job's folder: checkpoint, metrics, lock and ``worker.log``.
        pause_s: Seconds the worker sleeps after each epoch (to leave CPU to others).
        threads: Torch threads of the worker (on Ray also the CPUs the task asks for).
    """

    home: Path
    job_id: int
    workdir: Path
    pause_s: float = 0.0
    threads: int = 1


@dataclass(frozen=True)
class JobOutcome:
    """How one run of a job's work ended, as its backend saw it.

    Attributes:
        code: The worker's exit code, or None when it never returned one
            (killed, cancelled, its machine lost).
        how: What happened, as the subject of a sentence ("the job process
            was killed by SIGKILL").
    """

    code: int | None
    how: str


class JobRun(ABC):
    """One start of a job's work on a backend."""

    backend: ClassVar[str]

    @property
    @abstractmethod
    def ident(self) -> str:
        """Which run this is, in the backend's words (a pid, a Ray task id)."""

    @abstractmethod
    def poll(self) -> JobOutcome | None:
        """The outcome once the work has ended; None while it runs (never blocks).

        Raises:
            JobError: The backend cannot be asked.
        """

    @abstractmethod
    def cancel(self, grace_s: float | None = None) -> JobOutcome:
        """Stop the work (politely, then by force after ``grace_s``) and wait until it ended.

        The job keeps its last checkpoint: starting it again resumes from there.
        ``grace_s`` None is the backend's own grace.

        Raises:
            JobError: The backend cannot be asked.
        """


class JobBackend(ABC):
    """Starts a job's work somewhere: a local process, a cluster."""

    name: ClassVar[str]

    @abstractmethod
    def describe(self) -> str:
        """Where this backend runs jobs, for people ("this machine", "ray at auto")."""

    @abstractmethod
    def start(self, launch: JobLaunch) -> JobRun:
        """Start (or resume) the job's work; returns at once.

        Raises:
            JobError: The work cannot be started.
        """


def describe_exit(code: int | None) -> str:
    """A process exit status in words ("exited with code 1", "was killed by SIGKILL")."""
    if code is None:
        return "is still running"
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-code).name}"
        return f"was killed by signal {-code}"
    return f"exited with code {code}"


class LocalRun(JobRun):
    """The job's worker as a child process of this one."""

    backend = "local"

    def __init__(self, proc: subprocess.Popen[bytes]) -> None:
        """Follow the started worker process ``proc``."""
        self.proc = proc

    @property
    def pid(self) -> int:
        """The worker's process id."""
        return self.proc.pid

    @property
    def ident(self) -> str:
        """``pid <n>``."""
        return f"pid {self.proc.pid}"

    def poll(self) -> JobOutcome | None:
        """The worker's exit, once it exited."""
        code = self.proc.poll()
        return None if code is None else self._outcome(code)

    def cancel(self, grace_s: float | None = None) -> JobOutcome:
        """SIGTERM the worker, SIGKILL it after ``grace_s`` (default 10 s), and reap it."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=_STOP_GRACE_S if grace_s is None else grace_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self._outcome(self.proc.returncode)

    @staticmethod
    def _outcome(code: int) -> JobOutcome:
        return JobOutcome(code, f"the job process {describe_exit(code)}")


class LocalProcessBackend(JobBackend):
    """Runs each job as ``python -m cloud.models.worker`` on this machine (the default)."""

    name = "local"

    def describe(self) -> str:
        """``this machine``."""
        return "this machine"

    def start(self, launch: JobLaunch) -> LocalRun:
        """Start the worker process; its output goes to ``worker.log`` in the job's folder.

        Raises:
            JobError: The process cannot start.
        """
        launch.workdir.mkdir(parents=True, exist_ok=True)
        argv = [
            sys.executable, "-m", WORKER_MODULE, str(launch.home), str(launch.job_id),
            "--pause", repr(float(launch.pause_s)), "--backend", self.name,
        ]  # fmt: skip
        env = {
            **os.environ,
            "OMP_NUM_THREADS": str(launch.threads),
            "EDGESKILL_TRAIN_THREADS": str(launch.threads),
        }
        try:
            with (launch.workdir / "worker.log").open("ab") as log:
                proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env)
        except OSError as exc:
            raise JobError(f"cannot start the worker of job {launch.job_id}: {exc}") from exc
        return LocalRun(proc)


def backend_named(name: str, *, ray_address: str | None = None) -> JobBackend:
    """The backend a setting names: ``local``, or ``ray`` on the cluster at ``ray_address``.

    ``ray_address`` is ``auto`` (the cluster this machine belongs to), ``host:port``
    (its GCS), ``ray://host:port`` (Ray Client), or None: a Ray instance started
    in this process for as long as it lives. The local backend ignores it, so a
    hub configured for Ray can still run one job locally.

    Raises:
        ValidationError: An unknown name.
        JobError: ``ray`` without the optional ``ray`` extra installed.
    """
    if name == LocalProcessBackend.name:
        return LocalProcessBackend()
    if name == "ray":
        from cloud.models.ray_jobs import RayBackend  # noqa: PLC0415 - an optional extra

        return RayBackend(ray_address)
    raise ValidationError(f"job backend must be one of {', '.join(BACKENDS)}, not {name!r}")
