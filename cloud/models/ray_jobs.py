"""The Ray job backend: the same worker entry point, run as a task on a Ray cluster.

Needs the optional ``ray`` extra (``pip install 'edgeskill[ray]'``); ``ray`` is
imported only here and only when a :class:`RayBackend` is made, so the hub
imports without it. The task calls :func:`cloud.models.worker.run_job_here`:
the same training code, the same job folder (checkpoint, metrics, lock,
``worker.log``) and the same store as a local worker, so a job resumes from
its last checkpoint on either backend.

What the cluster's nodes need: this package installed (or shipped with a
``runtime_env``), the hub home at the same path (one machine, or a shared
file system with ``flock``), and the hub's store reachable from them
(PostgreSQL; SQLite only where every node sees the same file). The tasks
belong to this process's Ray driver: they end when it ends, as local workers
do when their runner is interrupted.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from cloud.models.errors import JobError
from cloud.models.job_backends import JobBackend, JobLaunch, JobOutcome, JobRun, describe_exit

__all__ = ["RAY_EXTRA_HINT", "RayBackend", "RayRun", "import_ray"]

RAY_EXTRA_HINT = "pip install 'edgeskill[ray]'"
_POLL_S = 0.05


def import_ray() -> Any:
    """The ``ray`` module.

    Raises:
        JobError: It is not installed (the message names the extra).
    """
    try:
        import ray  # noqa: PLC0415 - the optional extra, never imported by the hub itself
    except ImportError as exc:
        raise JobError(
            f"the ray job backend needs the optional 'ray' extra ({RAY_EXTRA_HINT}): {exc}"
        ) from exc
    return ray


def _job_task(home: str, job_id: int, pause_s: float, threads: int, log: str) -> int:
    # Runs in a Ray worker; pickled by reference, so the node imports it from this package.
    from cloud.models.worker import run_job_here  # noqa: PLC0415 - torch, on the node only

    return run_job_here(
        Path(home), job_id, pause_s=pause_s, threads=threads, backend=RayBackend.name,
        log=Path(log),
    )  # fmt: skip


class RayRun(JobRun):
    """A job's worker running as a Ray task."""

    backend = "ray"

    def __init__(self, ray: Any, ref: Any, *, cancel_grace_s: float = 3.0) -> None:
        """Follow the task whose result is the object ``ref``."""
        self._ray = ray
        self.ref = ref
        self.cancel_grace_s = cancel_grace_s

    @property
    def ident(self) -> str:
        """``task <hex id>``."""
        return f"task {self.ref.task_id().hex()}"

    def poll(self) -> JobOutcome | None:
        """The task's outcome once it ended.

        Raises:
            JobError: Ray cannot be asked (the cluster is gone).
        """
        try:
            ready, _ = self._ray.wait([self.ref], timeout=0)
        except self._ray.exceptions.RayError as exc:
            raise JobError(f"cannot ask Ray about the job's task: {exc}") from exc
        return self._outcome() if ready else None

    def _outcome(self) -> JobOutcome:
        errors = self._ray.exceptions
        try:
            code = int(self._ray.get(self.ref))
        except errors.TaskCancelledError:
            return JobOutcome(None, "the job's Ray task was cancelled")
        except errors.WorkerCrashedError:
            return JobOutcome(None, "the job's Ray worker died")
        except errors.RayTaskError as exc:
            return JobOutcome(None, f"the job's Ray task raised {type(exc.cause).__name__}")
        except errors.RayError as exc:
            return JobOutcome(None, f"the job's Ray task was lost ({type(exc).__name__})")
        return JobOutcome(code, f"the job's Ray task {describe_exit(code)}")

    def cancel(self, grace_s: float | None = None) -> JobOutcome:
        """``ray.cancel`` the task, then end its worker process after ``grace_s``.

        The polite cancel raises KeyboardInterrupt in the task between two Python
        steps, which a worker blocked in a long call (the pause after an epoch)
        only sees when the call returns; the forced one kills the worker process,
        which the job survives as it survives any kill (its last checkpoint stays).

        Raises:
            JobError: Ray cannot be asked.
        """
        outcome = self.poll()
        if outcome is not None:
            return outcome
        try:
            self._ray.cancel(self.ref, force=False)
            outcome = self._await(self.cancel_grace_s if grace_s is None else grace_s)
            if outcome is None:  # it ignores the interrupt: end its worker process
                self._ray.cancel(self.ref, force=True)
                outcome = self._await(None)
        except self._ray.exceptions.RayError as exc:
            raise JobError(f"cannot cancel the job's Ray task: {exc}") from exc
        assert outcome is not None
        return outcome

    def _await(self, timeout_s: float | None) -> JobOutcome | None:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while deadline is None or time.monotonic() < deadline:
            outcome = self.poll()
            if outcome is not None:
                return outcome
            time.sleep(_POLL_S)
        return None


class RayBackend(JobBackend):
    """Runs each job as a Ray task (one CPU per torch thread, one task per worker process)."""

    name = "ray"

    def __init__(
        self,
        address: str | None = None,
        *,
        runtime_env: Mapping[str, Any] | None = None,
        local_cpus: int | None = None,
        cancel_grace_s: float = 3.0,
    ) -> None:
        """Run jobs on the cluster at ``address``, connecting when the first job starts.

        Args:
            address: ``auto``, ``host:port`` (the GCS), ``ray://host:port`` (Ray Client),
                or None: start a Ray instance in this process. A process already
                connected to Ray keeps that connection.
            runtime_env: Ray runtime environment of the driver (e.g. ``py_modules``
                shipping this package to a cluster that lacks it).
            local_cpus: CPUs of the instance started when ``address`` is None.
            cancel_grace_s: How long a cancelled task has to stop before its worker is killed.

        Raises:
            JobError: The ``ray`` extra is not installed.
        """
        self._ray = import_ray()
        self.address = address
        self.runtime_env = dict(runtime_env) if runtime_env is not None else None
        self.local_cpus = local_cpus
        self.cancel_grace_s = cancel_grace_s

    def describe(self) -> str:
        """``ray at <address>``, or ``ray on this machine`` for a local instance."""
        return f"ray at {self.address}" if self.address else "ray on this machine"

    def connect(self) -> None:
        """Join the cluster (once per process); starting a job does this itself.

        Raises:
            JobError: The cluster cannot be reached.
        """
        if self._ray.is_initialized():
            return
        options: dict[str, Any] = {"log_to_driver": False, "runtime_env": self.runtime_env}
        if self.address is None:
            options |= {"num_cpus": self.local_cpus, "include_dashboard": False}
        try:
            self._ray.init(address=self.address, **options)
        except (ConnectionError, RuntimeError, ValueError, TimeoutError) as exc:
            raise JobError(
                f"cannot reach the Ray cluster ({self.describe()}): {exc} (a cluster with "
                "token authentication needs RAY_AUTH_MODE=token and its token here)"
            ) from exc

    def start(self, launch: JobLaunch) -> RayRun:
        """Submit the job's task; it runs once a node has ``launch.threads`` CPUs free.

        Raises:
            JobError: The cluster cannot be reached or refuses the task.
        """
        self.connect()
        launch.workdir.mkdir(parents=True, exist_ok=True)
        # One worker process per job (max_calls=1): torch's threads and memory go with it.
        task = self._ray.remote(max_calls=1, max_retries=0)(_job_task)
        home = launch.home.resolve()
        try:
            ref = task.options(
                num_cpus=max(1, launch.threads), name=f"edgeskill-job-{launch.job_id}"
            ).remote(
                str(home), launch.job_id, float(launch.pause_s), launch.threads,
                str(launch.workdir.resolve() / "worker.log"),
            )  # fmt: skip
        except (ValueError, self._ray.exceptions.RayError) as exc:
            raise JobError(f"Ray refused job {launch.job_id}'s task: {exc}") from exc
        return RayRun(self._ray, ref, cancel_grace_s=self.cancel_grace_s)
