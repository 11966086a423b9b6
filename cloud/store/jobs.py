"""Data set versions, training jobs and their epochs: the first half of the model tables.

:class:`cloud.store.models.ModelTables` adds models, variants, artefacts
and skill links on top. Every public method is one transaction.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Connection, Engine, delete, func, insert, select, update
from sqlalchemy.exc import IntegrityError, SQLAlchemyError

from cloud.errors import ConflictError, NotFoundError, StoreError, ValidationError
from cloud.store import checks as check
from cloud.store import model_codec as codec
from cloud.store.engine import IMMEDIATE
from cloud.store.model_records import (
    JOB_FAILED,
    JOB_QUEUED,
    JOB_RUNNING,
    JOB_SUCCEEDED,
    DatasetRecord,
    EpochRecord,
    JobRecord,
)
from cloud.store.models_schema import dataset_versions, models, training_epochs, training_jobs

__all__ = ["DATASET_KINDS", "JobTables"]

DATASET_KINDS = ("builtin", "folder")


class JobTables:
    """Transactional access to data set versions and training jobs."""

    def __init__(self, engine: Engine) -> None:
        """Wrap an engine whose schema is migrated (``Store.engine``)."""
        self._engine = engine

    @contextmanager
    def _tx(self, *, write: bool = False) -> Iterator[Connection]:
        try:
            with self._engine.connect() as conn:
                if write:  # BEGIN IMMEDIATE on SQLite: writers queue instead of failing
                    conn.execution_options(**{IMMEDIATE: True})
                with conn.begin():
                    yield conn
        except IntegrityError as exc:
            # A concurrent writer won a race the checks inside the transaction could not see.
            raise ConflictError(f"conflicting change: {str(exc.orig).splitlines()[0]}") from exc
        except SQLAlchemyError as exc:
            raise StoreError(f"store transaction failed: {exc}") from exc

    # data sets

    def add_dataset(
        self,
        name: str,
        *,
        kind: str,
        location: str,
        content_hash: str,
        classes: Sequence[str],
        samples: int,
        now_ms: int,
    ) -> DatasetRecord:
        """Record a data set version; the same name and content give the existing version.

        Raises:
            ValidationError: A malformed field.
            StoreError: The database failed.
        """
        check.name(name, "data set name")
        if kind not in DATASET_KINDS:
            raise ValidationError(f"data set kind must be one of {DATASET_KINDS}, not {kind!r}")
        row = {
            "name": name,
            "kind": kind,
            "location": codec.location(location),
            "content_hash": codec.content_hash(content_hash),
            "classes": codec.classes(classes),
            "samples": codec.small_int(samples, "sample count", 1),
            "created_ms": check.counter(now_ms, "now_ms"),
        }
        same = (dataset_versions.c.name == name) & (dataset_versions.c.content_hash == content_hash)
        with self._tx(write=True) as conn:
            found = conn.execute(select(dataset_versions).where(same)).first()
            if found is not None:
                return codec.dataset_record(found)
            latest = conn.execute(
                select(func.max(dataset_versions.c.version)).where(dataset_versions.c.name == name)
            ).scalar()
            row["version"] = int(latest or 0) + 1
            new_id = conn.execute(
                insert(dataset_versions).values(**row).returning(dataset_versions.c.id)
            ).scalar_one()
            return codec.dataset_record(self._dataset_row(conn, new_id))

    def get_dataset(self, dataset_id: int) -> DatasetRecord:
        """Return one data set version.

        Raises:
            NotFoundError: No such version.
            StoreError: The database failed.
        """
        with self._tx() as conn:
            return codec.dataset_record(self._dataset_row(conn, dataset_id))

    def list_datasets(self) -> list[DatasetRecord]:
        """Return every data set version, by name then version.

        Raises:
            StoreError: The database failed.
        """
        query = select(dataset_versions).order_by(
            dataset_versions.c.name, dataset_versions.c.version
        )
        with self._tx() as conn:
            return [codec.dataset_record(r) for r in conn.execute(query)]

    @staticmethod
    def _dataset_row(conn: Connection, dataset_id: int) -> Any:
        query = select(dataset_versions).where(dataset_versions.c.id == dataset_id)
        row = conn.execute(query).first()
        if row is None:
            raise NotFoundError(f"no data set version {dataset_id}")
        return row

    # jobs

    def create_job(
        self,
        dataset_id: int,
        *,
        arch: str,
        spec: Mapping[str, Any],
        epochs: int,
        now_ms: int,
        model_name: str | None = None,
    ) -> JobRecord:
        """Queue a training job; the model it makes is named ``model_name`` (default
        ``<data set>-<arch>-<job id>``).

        Raises:
            ValidationError: A malformed field.
            NotFoundError: No such data set version.
            ConflictError: A model or another job already has that model name.
            StoreError: The database failed.
        """
        row = {
            "dataset_id": dataset_id,
            "arch": codec.tag(arch, "architecture"),
            "spec": codec.dumps(dict(spec), "job spec"),
            "epochs": codec.small_int(epochs, "epochs", 1, codec.MAX_EPOCHS),
            "status": JOB_QUEUED,
            "created_ms": check.counter(now_ms, "now_ms"),
            "model_name": check.name(model_name, "model name") if model_name else "pending",
        }
        with self._tx(write=True) as conn:
            dataset = self._dataset_row(conn, dataset_id)
            if model_name:
                self._check_model_name_free(conn, model_name)
            job_id = conn.execute(
                insert(training_jobs).values(**row).returning(training_jobs.c.id)
            ).scalar_one()
            if not model_name:
                stem = arch if arch.startswith(dataset.name) else f"{dataset.name[:40]}-{arch[:12]}"
                default = f"{stem}-{job_id}"
                self._check_model_name_free(conn, default)
                self._set(conn, job_id, model_name=default)
            return codec.job_record(self._job_row(conn, job_id))

    @staticmethod
    def _check_model_name_free(conn: Connection, name: str) -> None:
        # A job reserves its model's name from the start, so a resumed job never finds it taken.
        for query in (
            select(models.c.id).where(models.c.name == name),
            select(training_jobs.c.id).where(training_jobs.c.model_name == name),
        ):
            if conn.execute(query).first() is not None:
                raise ConflictError(f"model name {name!r} is taken")

    def get_job(self, job_id: int) -> JobRecord:
        """Return one job.

        Raises:
            NotFoundError: No such job.
            StoreError: The database failed or holds corrupt data.
        """
        with self._tx() as conn:
            return codec.job_record(self._job_row(conn, job_id))

    def list_jobs(self) -> list[JobRecord]:
        """Return every job, oldest first.

        Raises:
            StoreError: The database failed or holds corrupt data.
        """
        with self._tx() as conn:
            rows = conn.execute(select(training_jobs).order_by(training_jobs.c.id)).all()
        return [codec.job_record(r) for r in rows]

    def mark_running(self, job_id: int, *, pid: int, now_ms: int) -> JobRecord:
        """Record that a process took the job (a failed or stale running job restarts).

        Raises:
            ValidationError: A malformed pid or time.
            NotFoundError: No such job.
            ConflictError: The job already succeeded.
            StoreError: The database failed.
        """
        codec.small_int(pid, "pid", 1)
        check.counter(now_ms, "now_ms")
        with self._tx(write=True) as conn:
            self._expect(conn, job_id, (JOB_QUEUED, JOB_FAILED, JOB_RUNNING))
            self._set(conn, job_id, status=JOB_RUNNING, pid=pid, error=None, started_ms=now_ms)
            return codec.job_record(self._job_row(conn, job_id))

    def fail_job(self, job_id: int, error: str, *, now_ms: int) -> JobRecord:
        """Mark a queued or running job failed; it may be started again to resume.

        Raises:
            NotFoundError: No such job.
            ConflictError: The job already succeeded.
            StoreError: The database failed.
        """
        check.counter(now_ms, "now_ms")
        text = codec.error_text(str(error) or "failed")
        with self._tx(write=True) as conn:
            self._expect(conn, job_id, (JOB_QUEUED, JOB_RUNNING, JOB_FAILED))
            self._set(conn, job_id, status=JOB_FAILED, error=text, finished_ms=now_ms)
            return codec.job_record(self._job_row(conn, job_id))

    def replace_epochs(self, job_id: int, epochs: Sequence[EpochRecord]) -> None:
        """Store a job's whole epoch history so far (a resumed run re-reports earlier epochs).

        Raises:
            ValidationError: Malformed or repeated epochs.
            NotFoundError: No such job.
            ConflictError: The job already succeeded.
            StoreError: The database failed.
        """
        rows = [{"job_id": job_id, **r} for r in codec.epochs(epochs)]
        with self._tx(write=True) as conn:
            self._expect(conn, job_id, (JOB_QUEUED, JOB_RUNNING, JOB_FAILED))
            conn.execute(delete(training_epochs).where(training_epochs.c.job_id == job_id))
            if rows:
                conn.execute(insert(training_epochs), rows)

    def job_epochs(self, job_id: int) -> list[EpochRecord]:
        """Return the stored epochs of a job, in order (empty for an unknown job).

        Raises:
            StoreError: The database failed.
        """
        query = (
            select(training_epochs)
            .where(training_epochs.c.job_id == job_id)
            .order_by(training_epochs.c.epoch)
        )
        with self._tx() as conn:
            return [codec.epoch_record(r) for r in conn.execute(query)]

    @staticmethod
    def _job_row(conn: Connection, job_id: int) -> Any:
        row = conn.execute(select(training_jobs).where(training_jobs.c.id == job_id)).first()
        if row is None:
            raise NotFoundError(f"no training job {job_id}")
        return row

    def _expect(self, conn: Connection, job_id: int, states: tuple[str, ...]) -> Any:
        row = self._job_row(conn, job_id)
        if row.status not in states:
            raise ConflictError(f"training job {job_id} is {row.status}")
        return row

    @staticmethod
    def _set(conn: Connection, job_id: int, **values: Any) -> None:
        conn.execute(update(training_jobs).where(training_jobs.c.id == job_id).values(**values))

    def _finish(self, conn: Connection, job_id: int, resumed_from: int, now_ms: int) -> Any:
        row = self._expect(conn, job_id, (JOB_RUNNING,))
        self._set(
            conn, job_id, status=JOB_SUCCEEDED, error=None, finished_ms=now_ms,
            resumed_from_epoch=resumed_from,
        )  # fmt: skip
        return row
