"""The director's signed instructions and the security events devices report.

Each device has one stored instruction, the latest the director signed for
it. Every hub process signs through :meth:`DirectorTables.save_instruction`,
a compare-and-set on the counter: two processes that sign at once cannot both
win, so a device never sees two different instructions under one counter.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Row, func, insert, select, update
from sqlalchemy.exc import IntegrityError

from cloud.errors import ValidationError
from cloud.store import checks as check
from cloud.store.base import StoreBase
from cloud.store.records import InstructionRecord, SecurityEventRecord
from cloud.store.schema import device_security_events, director_instructions

__all__ = ["MAX_EVENT_DETAIL_BYTES", "MAX_EVENT_ROWS", "DirectorTables"]

MAX_EVENT_DETAIL_BYTES = 2000
MAX_EVENT_SUBJECT_BYTES = 255
MAX_EVENT_ROWS = 10_000
_BATCH = 500


def _instruction(row: Row[Any]) -> InstructionRecord:
    return InstructionRecord(
        row.device_id,
        int(row.counter),
        int(row.generation),
        int(row.expires_ms),
        int(row.signed_ms),
        row.payload_sha256,
        bytes(row.instruction),
    )


class DirectorTables(StoreBase):
    """Transactional access to signed instructions and security events."""

    def instruction_for(self, device_id: str) -> InstructionRecord | None:
        """The latest signed instruction of a device, or None if none was signed.

        Raises:
            StoreError: The database failed.
        """
        query = select(director_instructions).where(director_instructions.c.device_id == device_id)
        with self._tx() as conn:
            row = conn.execute(query).first()
        return None if row is None else _instruction(row)

    def instructions_many(self, device_ids: Sequence[str]) -> dict[str, InstructionRecord]:
        """The latest signed instructions of several devices (absent ones are left out).

        Raises:
            StoreError: The database failed.
        """
        ids = list(dict.fromkeys(device_ids))
        found: dict[str, InstructionRecord] = {}
        with self._tx() as conn:
            for start in range(0, len(ids), _BATCH):
                batch = ids[start : start + _BATCH]
                query = select(director_instructions).where(
                    director_instructions.c.device_id.in_(batch)
                )
                found.update((row.device_id, _instruction(row)) for row in conn.execute(query))
        return found

    def instruction_index(self) -> dict[str, tuple[int, int, int]]:
        """``(counter, generation, expires_ms)`` of every device's instruction, in one query.

        Raises:
            StoreError: The database failed.
        """
        t = director_instructions.c
        query = select(t.device_id, t.counter, t.generation, t.expires_ms)
        with self._tx() as conn:
            return {
                row.device_id: (int(row.counter), int(row.generation), int(row.expires_ms))
                for row in conn.execute(query)
            }

    def save_instruction(self, record: InstructionRecord, *, previous: int) -> bool:
        """Store ``record`` if the device's stored counter is still ``previous`` (0: none).

        Returns:
            True when stored; False when another signer got there first (read again).

        Raises:
            ValidationError: A malformed record, or a counter that does not grow.
            StoreError: The database failed.
        """
        check.device_id(record.device_id)
        check.sha256(record.payload_sha256)
        if record.counter <= previous:
            raise ValidationError(f"counter {record.counter} does not grow past {previous}")
        for value, what in ((record.counter, "counter"), (record.generation, "generation")):
            check.counter(value, what)
        values = {
            "counter": record.counter,
            "generation": record.generation,
            "expires_ms": record.expires_ms,
            "signed_ms": record.signed_ms,
            "payload_sha256": record.payload_sha256,
            "instruction": record.instruction,
        }
        t = director_instructions.c
        with self._tx(write=True) as conn:
            if previous == 0:
                if conn.execute(select(t.counter).where(t.device_id == record.device_id)).first():
                    return False
                conn.execute(
                    insert(director_instructions).values(device_id=record.device_id, **values)
                )
                return True
            stmt = (
                update(director_instructions)
                .where(t.device_id == record.device_id, t.counter == previous)
                .values(**values)
            )
            return conn.execute(stmt).rowcount == 1

    # security events

    def add_security_event(self, msg_id: str, device_id: str, event: SecurityEventRecord) -> bool:
        """Store one reported security event unless its message id was seen before.

        ``detail`` and ``subject`` are cut to their caps; the record's ``device_id``
        is ignored in favour of the authenticated ``device_id``.

        Returns:
            True when stored, False for a duplicate.

        Raises:
            ValidationError: A malformed id, kind, reason or count.
            StoreError: The database failed.
        """
        row = {
            "msg_id": check.msg_id(msg_id),
            "device_id": check.device_id(device_id),
            "kind": check.name(event.kind, "event kind"),
            "reason": check.name(event.reason, "event reason"),
            "subject": _cut(event.subject, MAX_EVENT_SUBJECT_BYTES),
            "detail": _cut(event.detail, MAX_EVENT_DETAIL_BYTES),
            "count": check.counter(event.count, "event count"),
            "received_ms": check.counter(event.received_ms, "received_ms"),
        }
        t = device_security_events.c
        try:
            with self._tx(write=True) as conn:
                if conn.execute(select(t.id).where(t.msg_id == msg_id)).first():
                    return False
                conn.execute(insert(device_security_events).values(**row))
        except IntegrityError:  # pragma: no cover - a concurrent duplicate (PostgreSQL)
            return False
        return True

    def security_events(
        self, device_id: str | None = None, *, limit: int = 1000
    ) -> list[SecurityEventRecord]:
        """The latest ``limit`` security events (of one device), oldest first.

        Raises:
            ValidationError: ``limit`` is not in 1..10000.
            StoreError: The database failed.
        """
        if not 1 <= limit <= MAX_EVENT_ROWS:
            raise ValidationError(f"limit must be in 1..{MAX_EVENT_ROWS}")
        t = device_security_events.c
        query = select(device_security_events).order_by(t.id.desc()).limit(limit)
        if device_id is not None:
            query = query.where(t.device_id == device_id)
        with self._tx() as conn:
            rows = conn.execute(query).all()
        events = []
        for row in reversed(rows):
            r = row._mapping  # "count" would be the tuple method on the row itself
            events.append(
                SecurityEventRecord(
                    r["device_id"],
                    r["kind"],
                    r["reason"],
                    r["subject"],
                    r["detail"],
                    int(r["count"]),
                    int(r["received_ms"]),
                )
            )
        return events

    def security_event_totals(self) -> dict[tuple[str, str], int]:
        """Occurrences reported by the whole fleet, by ``(kind, reason)``.

        Raises:
            StoreError: The database failed.
        """
        t = device_security_events.c
        query = select(t.kind, t.reason, func.sum(t.count)).group_by(t.kind, t.reason)
        with self._tx() as conn:
            return {(k, r): int(n or 0) for k, r, n in conn.execute(query)}


def _cut(value: str, max_bytes: int) -> str:
    return value.encode("utf-8", "replace")[:max_bytes].decode("utf-8", "ignore")
