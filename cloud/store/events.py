"""The hub's event log: what happened in the fleet, newest last, for people to read.

Events are written inside the transaction that makes the change they describe
(a deployment, a device's report), so the log never tells of a change that
was rolled back, and a change is never stored without its event. Writing
one costs one INSERT in that transaction, no extra round trip.

Retention: the newest :data:`KEEP_EVENTS` events, none older than
:data:`MAX_EVENT_AGE_MS` (30 days). The log prunes itself about every
:data:`PRUNE_EVERY` events, in the transaction that writes the event whose
id is a multiple of it; :meth:`EventTables.prune_events` does it at once.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Row, delete, func, insert, select

from cloud.errors import ValidationError
from cloud.store import checks as check
from cloud.store.base import StoreBase
from cloud.store.records import EventRecord, SkillStatusRecord
from cloud.store.schema import hub_events

__all__ = [
    "EVENT_DEPLOYMENT",
    "EVENT_DEVICE",
    "EVENT_DRIFT",
    "EVENT_SECURITY",
    "EVENT_SKILL",
    "KEEP_EVENTS",
    "MAX_EVENT_AGE_MS",
    "MAX_EVENT_MESSAGE_BYTES",
    "MAX_EVENT_ROWS",
    "PRUNE_EVERY",
    "EventTables",
    "NewEvent",
    "insert_events",
    "insert_timed_events",
    "skill_transitions",
]

#: A skill changed state or version on a device.
EVENT_SKILL = "skill"
#: A device registered (connected) or was enrolled.
EVENT_DEVICE = "device"
#: A deployment was created, aborted, superseded or made active again.
EVENT_DEPLOYMENT = "deployment"
#: A device reported something it refused or contained.
EVENT_SECURITY = "security"
#: A drift incident opened, moved a stage (retraining, built, canary) or ended.
EVENT_DRIFT = "drift"

MAX_EVENT_MESSAGE_BYTES = 4000
MAX_EVENT_SUBJECT_BYTES = 255
MAX_EVENT_ROWS = 10_000
KEEP_EVENTS = 100_000
MAX_EVENT_AGE_MS = 30 * 24 * 3600 * 1000
PRUNE_EVERY = 1000


@dataclass(frozen=True)
class NewEvent:
    """An event to write: what kind, which device ('' for none), about what, and what happened."""

    kind: str
    message: str
    device_id: str = ""
    subject: str = ""


def _cut(value: str, max_bytes: int) -> str:
    return value.encode("utf-8", "replace")[:max_bytes].decode("utf-8", "ignore")


def _row(event: NewEvent, at_ms: int) -> dict[str, object]:
    check.name(event.kind, "event kind")
    if event.device_id:
        check.device_id(event.device_id)
    return {
        "at_ms": at_ms,
        "kind": event.kind,
        "device_id": event.device_id,
        "subject": _cut(event.subject, MAX_EVENT_SUBJECT_BYTES),
        "message": _cut(event.message, MAX_EVENT_MESSAGE_BYTES),
    }


def insert_events(
    conn: Connection,
    events: Sequence[NewEvent],
    *,
    at_ms: int,
    keep: int = KEEP_EVENTS,
    max_age_ms: int = MAX_EVENT_AGE_MS,
    prune_every: int = PRUNE_EVERY,
) -> list[int]:
    """Write events inside the caller's transaction; return their ids.

    Long messages and subjects are cut to their caps. When an id is a
    multiple of ``prune_every``, events past the retention are deleted too.

    Raises:
        ValidationError: A malformed kind or device id; nothing is written.
        StoreError: (from the caller's transaction) the database failed.
    """
    rows = [_row(event, at_ms) for event in events]
    ids = [
        int(conn.execute(insert(hub_events).values(**row).returning(hub_events.c.id)).scalar_one())
        for row in rows
    ]
    if any(i % prune_every == 0 for i in ids):
        prune(conn, newest_id=max(ids), now_ms=at_ms, keep=keep, max_age_ms=max_age_ms)
    return ids


def insert_timed_events(
    conn: Connection,
    timed: Sequence[tuple[NewEvent, int]],
    *,
    keep: int = KEEP_EVENTS,
    max_age_ms: int = MAX_EVENT_AGE_MS,
    prune_every: int = PRUNE_EVERY,
) -> None:
    """Write ``(event, at_ms)`` pairs in one statement inside the caller's transaction.

    :func:`insert_events` for many events of different times (a batch of device
    reports) that need no ids back. Pruning runs when the new ids pass a multiple of
    ``prune_every``, judged from the newest id after the insert.

    Raises:
        ValidationError: A malformed kind or device id; nothing is written.
        StoreError: (from the caller's transaction) the database failed.
    """
    rows = [_row(event, at_ms) for event, at_ms in timed]
    if not rows:
        return
    conn.execute(insert(hub_events), rows)
    newest = int(conn.execute(select(func.max(hub_events.c.id))).scalar_one() or 0)
    if newest // prune_every != (newest - len(rows)) // prune_every:
        now = max(at_ms for _, at_ms in timed)
        prune(conn, newest_id=newest, now_ms=now, keep=keep, max_age_ms=max_age_ms)


def prune(conn: Connection, *, newest_id: int, now_ms: int, keep: int, max_age_ms: int) -> int:
    """Delete events older than ``max_age_ms`` or more than ``keep`` ids behind ``newest_id``.

    Returns:
        How many events were deleted.
    """
    t = hub_events.c
    stmt = delete(hub_events).where((t.id <= newest_id - keep) | (t.at_ms < now_ms - max_age_ms))
    return int(conn.execute(stmt).rowcount or 0)


def _first_line(text: str) -> str:
    return next((line.strip() for line in text.splitlines() if line.strip()), "")


def _outcome(status: SkillStatusRecord) -> tuple[str, str, str]:
    return (status.version, status.state, status.desired_version)


def _describe(before: SkillStatusRecord | None, after: SkillStatusRecord) -> str:
    old = (before.version if before else "") or "none"
    new = after.desired_version or after.version or "none"
    text = f"{after.name} {old} -> {new}: {after.state}"
    if after.state == "rolled_back" and after.version:
        text += f" to {after.version}"
    return f"{text}: {after.error}" if after.error else text


def skill_transitions(
    device_id: str,
    before: Sequence[SkillStatusRecord],
    after: Sequence[SkillStatusRecord],
) -> list[NewEvent]:
    """The events that turn a device's previous report into its new one (pure).

    A skill makes an event when its version, state or wanted version changed,
    when it first appears, and when it disappears. The same failure reported
    again (a retry that failed the same way) makes none.
    """
    old = {s.name: s for s in before}
    new = {s.name: s for s in after}
    events = [
        NewEvent(EVENT_SKILL, _describe(old.get(name), status), device_id, name)
        for name, status in sorted(new.items())
        if name not in old or _outcome(old[name]) != _outcome(status)
    ]
    for name in sorted(old.keys() - new.keys()):
        removed = f"{name} {old[name].version or 'none'} -> none: removed"
        events.append(NewEvent(EVENT_SKILL, removed, device_id, name))
    return events


def _record(row: Row[Any]) -> EventRecord:
    return EventRecord(
        int(row.id), int(row.at_ms), row.kind, row.device_id, row.subject, row.message
    )


class EventTables(StoreBase):
    """Transactional access to the hub's event log."""

    def record_event(self, event: NewEvent, *, now_ms: int) -> int:
        """Append one event in its own transaction (for changes made outside the store).

        Returns:
            The event's id.

        Raises:
            ValidationError: A malformed kind, device id or time.
            StoreError: The database failed.
        """
        check.counter(now_ms, "now_ms")
        with self._tx(write=True) as conn:
            return insert_events(conn, [event], at_ms=now_ms)[0]

    def events(
        self,
        *,
        device_id: str | None = None,
        kind: str | None = None,
        subject: str | None = None,
        after_id: int | None = None,
        limit: int = 100,
    ) -> list[EventRecord]:
        """Events, oldest first: the newest ``limit``, or the first ``limit`` after ``after_id``.

        Args:
            device_id: Only this device's events.
            kind: Only events of this kind (``skill``, ``device``, ``deployment``, ``security``).
            subject: Only events about this subject (a skill name, a deployment).
            after_id: Only events with a larger id, the oldest of them first; for following
                the log, pass the id of the last event seen.
            limit: At most this many, 1..10000.

        Raises:
            ValidationError: ``limit`` is out of range or ``after_id`` negative.
            StoreError: The database failed.
        """
        if not 1 <= limit <= MAX_EVENT_ROWS:
            raise ValidationError(f"limit must be in 1..{MAX_EVENT_ROWS}, not {limit}")
        t = hub_events.c
        query = select(hub_events)
        if device_id is not None:
            query = query.where(t.device_id == device_id)
        if kind is not None:
            query = query.where(t.kind == kind)
        if subject is not None:
            query = query.where(t.subject == subject)
        if after_id is not None:
            check.counter(after_id, "after_id")
            query = query.where(t.id > after_id).order_by(t.id).limit(limit)
        else:
            query = query.order_by(t.id.desc()).limit(limit)
        with self._tx() as conn:
            rows = conn.execute(query).all()
        records = [_record(row) for row in rows]
        return records if after_id is not None else records[::-1]

    def prune_events(
        self, *, now_ms: int, keep: int = KEEP_EVENTS, max_age_ms: int = MAX_EVENT_AGE_MS
    ) -> int:
        """Delete events past the retention now (the log also does it every so often).

        Returns:
            How many events were deleted.

        Raises:
            ValidationError: A negative time, count or age.
            StoreError: The database failed.
        """
        for value, what in ((now_ms, "now_ms"), (keep, "keep"), (max_age_ms, "max_age_ms")):
            check.counter(value, what)
        with self._tx(write=True) as conn:
            newest = conn.execute(select(hub_events.c.id).order_by(hub_events.c.id.desc())).first()
            if newest is None:
                return 0
            return prune(
                conn, newest_id=int(newest.id), now_ms=now_ms, keep=keep, max_age_ms=max_age_ms
            )
