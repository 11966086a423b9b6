"""Drift samples and drift telemetry in the store.

A ``DriftSamples`` envelope is stored once by its message id: the id goes into
``drift_sample_messages`` with ``INSERT ... ON CONFLICT DO NOTHING``, and only
when that row is new are the samples written, in the same transaction. So a
resend (a lost ack, a hub restart, another hub process) is a duplicate even
after its samples were dropped for newer ones. Each skill version keeps at
most ``keep`` samples; the oldest go first.

Drift windows are the telemetry windows whose metrics carry ``drift.n``; the
drift loop reads the recent ones with :meth:`DriftTables.drift_windows`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Integer, Row, delete, func, insert, select

from cloud.errors import ValidationError
from cloud.store import checks as check
from cloud.store.base import StoreBase
from cloud.store.drift_schema import drift_sample_messages, drift_samples
from cloud.store.records import TelemetryRecord
from cloud.store.schema import telemetry
from cloud.store.telemetry import select_telemetry

__all__ = [
    "KEEP_MESSAGE_IDS_MS",
    "KEEP_SAMPLES",
    "MAX_DRIFT_WINDOWS",
    "DriftTables",
    "StoredSample",
]

#: Samples kept per skill version by default.
KEEP_SAMPLES = 5000
#: How long a stored envelope's id is remembered (agents resend long before this).
KEEP_MESSAGE_IDS_MS = 7 * 24 * 3600 * 1000
#: Most drift windows one read returns.
MAX_DRIFT_WINDOWS = 100_000
MAX_SAMPLE_ROWS = 100_000


@dataclass(frozen=True)
class StoredSample:
    """One stored drift sample.

    Attributes:
        tensor: The input's serialised ``TensorProto``, as the device sent it.
        label: The true class, or -1 when none came back.
    """

    id: int
    device_id: str
    skill: str
    version: str
    label: int
    predicted: int
    confidence: float
    seen_at_ms: int
    received_ms: int
    shape: tuple[int, ...]
    tensor: bytes


def _sample(row: Row[Any]) -> StoredSample:
    return StoredSample(
        int(row.id),
        row.device_id,
        row.skill,
        row.version,
        int(row.label),
        int(row.predicted),
        float(row.confidence),
        int(row.seen_at_ms),
        int(row.received_ms),
        tuple(json.loads(row.shape)),
        bytes(row.tensor),
    )


class DriftTables(StoreBase):
    """Drift samples from devices and the telemetry windows that carry drift."""

    def add_drift_samples(
        self,
        msg_id: str,
        device_id: str,
        batch: Any,
        *,
        now_ms: int,
        keep: int = KEEP_SAMPLES,
    ) -> bool:
        """Store one envelope's checked samples unless its message id was stored before.

        Args:
            msg_id: The envelope's id.
            device_id: The sending device.
            batch: A :class:`cloud.drift_samples.SampleBatch` (checked on arrival).
            now_ms: The time received.
            keep: Samples kept per skill version; the oldest beyond it are deleted.

        Returns:
            True when stored, False for a duplicate (nothing changed).

        Raises:
            ValidationError: A malformed id, time or cap.
            StoreError: The database failed; nothing is stored.
        """
        check.msg_id(msg_id)
        check.device_id(device_id)
        check.counter(now_ms, "now_ms")
        if not 1 <= keep <= MAX_SAMPLE_ROWS:
            raise ValidationError(f"keep must be in 1..{MAX_SAMPLE_ROWS}, not {keep}")
        rows = [
            {
                "msg_id": msg_id,
                "device_id": device_id,
                "skill": batch.skill,
                "version": batch.version,
                "label": s.label,
                "predicted": s.predicted,
                "confidence": s.confidence,
                "seen_at_ms": s.seen_at_ms,
                "received_ms": now_ms,
                "shape": json.dumps(list(s.shape)),
                "tensor": s.tensor,
            }
            for s in batch.samples
        ]
        with self._tx(write=True) as conn:
            if not self._claim(conn, msg_id, device_id, len(rows), now_ms):
                return False
            conn.execute(insert(drift_samples), rows)
            _keep_newest(conn, batch.skill, batch.version, keep)
            conn.execute(
                delete(drift_sample_messages).where(
                    drift_sample_messages.c.received_ms < now_ms - KEEP_MESSAGE_IDS_MS
                )
            )
        return True

    def _claim(self, conn: Connection, msg_id: str, device_id: str, count: int, at: int) -> bool:
        stmt = (
            self._dialect.insert(drift_sample_messages)
            .values(msg_id=msg_id, device_id=device_id, samples=count, received_ms=at)
            .on_conflict_do_nothing(index_elements=["msg_id"])
            .returning(drift_sample_messages.c.msg_id)
        )
        return conn.execute(stmt).first() is not None

    def drift_samples(
        self, skill: str, version: str, *, limit: int = KEEP_SAMPLES
    ) -> list[StoredSample]:
        """The newest ``limit`` samples of a skill version, oldest first.

        Raises:
            ValidationError: ``limit`` outside 1..100000.
            StoreError: The database failed.
        """
        if not 1 <= limit <= MAX_SAMPLE_ROWS:
            raise ValidationError(f"limit must be in 1..{MAX_SAMPLE_ROWS}, not {limit}")
        t = drift_samples.c
        query = (
            select(drift_samples)
            .where(t.skill == skill, t.version == version)
            .order_by(t.id.desc())
            .limit(limit)
        )
        with self._tx() as conn:
            rows = conn.execute(query).all()
        return [_sample(r) for r in reversed(rows)]

    def count_drift_samples(self, skill: str, version: str) -> tuple[int, int]:
        """How many samples a skill version has, and how many of them are labelled.

        Raises:
            StoreError: The database failed.
        """
        t = drift_samples.c
        labelled = func.sum((t.label >= 0).cast(Integer()))
        query = select(func.count(), labelled).where(t.skill == skill, t.version == version)
        with self._tx() as conn:
            total, with_label = conn.execute(query).one()
        return int(total), int(with_label or 0)

    def drift_windows(self, since_ms: int, *, limit: int = 20_000) -> list[TelemetryRecord]:
        """Telemetry windows ending at or after ``since_ms`` that carry drift, oldest first.

        Raises:
            ValidationError: A negative time or ``limit`` outside 1..100000.
            StoreError: The database failed or holds corrupt data.
        """
        check.counter(since_ms, "since_ms")
        if not 1 <= limit <= MAX_DRIFT_WINDOWS:
            raise ValidationError(f"limit must be in 1..{MAX_DRIFT_WINDOWS}, not {limit}")
        t = telemetry.c
        where = (t.window_end_ms >= since_ms) & t.metrics.contains('"drift.n"')
        with self._tx() as conn:
            return select_telemetry(conn, None, None, limit, where=where)


def _keep_newest(conn: Connection, skill: str, version: str, keep: int) -> None:
    t = drift_samples.c
    cutoff = conn.execute(
        select(t.id)
        .where(t.skill == skill, t.version == version)
        .order_by(t.id.desc())
        .offset(keep)
        .limit(1)
    ).first()
    if cutoff is not None:
        conn.execute(
            delete(drift_samples).where(
                t.skill == skill, t.version == version, t.id <= int(cutoff.id)
            )
        )
