"""Desired and reported device state, one device or the whole fleet at a time."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from sqlalchemy import Connection, Row, func, select

from cloud.errors import NotFoundError, StoreError
from cloud.selectors import check_labels
from cloud.store import checks as check
from cloud.store.base import IDS_PER_QUERY, StoreBase
from cloud.store.desired import decode_skills, selector_clause
from cloud.store.devices import device_record
from cloud.store.events import NewEvent, insert_timed_events, skill_transitions
from cloud.store.fleet_stamp import bump
from cloud.store.records import (
    DesiredRecord,
    DeviceStateRecord,
    ReportedRecord,
    SkillStatusRecord,
)
from cloud.store.schema import (
    desired_states,
    device_labels,
    devices,
    director_instructions,
    reported_states,
)
from protos.envelope import now_ms

__all__ = ["StateTables", "TargetRecord"]

#: The columns a newer report replaces.
REPORT_COLUMNS = ("generation", "skills", "reported_ms", "stored_ms")


@dataclass(frozen=True)
class TargetRecord:
    """What deployment status needs of a device: its presence facts and its last report."""

    device_id: str
    last_seen_ms: int
    heartbeat_ms: int
    #: False once the hub saw the device's connection end (see :mod:`cloud.presence`).
    connected: bool
    #: The skills of its last report (empty when it never reported).
    skills: tuple[SkillStatusRecord, ...]


class StateTables(StoreBase):
    """Transactional access to what the hub wants on devices and what they report."""

    def desired_for(self, device_id: str) -> DesiredRecord:
        """Return what the hub wants on a device (generation 0 and nothing if unknown).

        Raises:
            StoreError: The database failed or holds corrupt data.
        """
        query = select(desired_states).where(desired_states.c.device_id == device_id)
        with self._tx() as conn:
            row = conn.execute(query).first()
        if row is None:
            return DesiredRecord(device_id, 0, ())
        return DesiredRecord(device_id, row.generation, decode_skills(row.skills))

    def desired_generations(self) -> dict[str, int]:
        """Every registered device's desired generation (0 when nothing was ever desired).

        One query for the whole fleet, so a hub can poll it for changes.

        Raises:
            StoreError: The database failed.
        """
        joined = devices.outerjoin(
            desired_states, desired_states.c.device_id == devices.c.device_id
        )
        generation = func.coalesce(desired_states.c.generation, 0)
        query = select(devices.c.device_id, generation).select_from(joined)
        with self._tx() as conn:
            # Every row at once, unpacked as it comes: the notifier reads this after each
            # rollout pass that moved devices (11 ms at 10,000 devices against 19 ms
            # fetching a row at a time and reading its fields by name).
            return dict(conn.execute(query).all())

    def desired_fingerprint(self) -> tuple[int, ...]:
        """Numbers that change whenever a device registers or goes, or its desired state or
        signed instruction changes: counts and sums of the ever-growing counters.

        One query reading no rows out, so a hub can ask it often and read
        :meth:`desired_generations` only when it moved. Two changes that cancel out
        (a device removed and another registered with generations summing the same)
        leave it the same: a reader still reads everything now and then.

        Raises:
            StoreError: The database failed.
        """
        d, i = desired_states.c, director_instructions.c
        columns = (
            select(func.count()).select_from(devices),
            select(func.count()).select_from(desired_states),
            select(func.coalesce(func.sum(d.generation), 0)),
            select(func.count()).select_from(director_instructions),
            select(func.coalesce(func.sum(i.counter), 0)),
        )
        query = select(*(c.scalar_subquery() for c in columns))
        with self._tx() as conn:
            row = conn.execute(query).one()
        return tuple(int(v) for v in row)

    def desired_many(self, device_ids: Sequence[str]) -> list[DesiredRecord]:
        """Return the desired state of several devices, in one query per 500 ids.

        Devices with no stored desired state get generation 0 and no skills.

        Raises:
            StoreError: The database failed or holds corrupt data.
        """
        ids = list(dict.fromkeys(device_ids))
        found: dict[str, DesiredRecord] = {}
        with self._tx() as conn:
            for start in range(0, len(ids), 500):
                batch = ids[start : start + 500]
                query = select(desired_states).where(desired_states.c.device_id.in_(batch))
                for row in conn.execute(query):
                    found[row.device_id] = DesiredRecord(
                        row.device_id, row.generation, decode_skills(row.skills)
                    )
        return [found.get(d, DesiredRecord(d, 0, ())) for d in ids]

    def save_report(
        self,
        device_id: str,
        generation: int,
        skills: Sequence[SkillStatusRecord],
        *,
        now_ms: int,
    ) -> None:
        """Store a device's report of its skills, replacing an older one.

        ``now_ms`` is when the device made the report. A report that arrives late
        (redelivered after a newer one) changes nothing: it replaces the stored one
        only when it answers a newer desired generation, or the same one and was
        made no earlier.

        Raises:
            ValidationError: A malformed id, generation, time or status.
            NotFoundError: The device never registered.
            StoreError: The database failed.
        """
        item: ReportItem = (device_id, generation, skills, now_ms)
        checked = [(item, _checked_report(*item))]
        with self._tx(write=True) as conn:
            if _apply_reports(self._dialect, conn, checked) == [None]:
                raise NotFoundError(f"no device {device_id!r}")

    def check_report(self, item: ReportItem) -> None:
        """Raise ``ValidationError`` when :meth:`save_reports_many` would refuse ``item``."""
        _checked_report(*item)

    def save_reports_many(self, items: Sequence[ReportItem]) -> list[bool]:
        """:meth:`save_report` for reports of many devices, in one transaction.

        ``items`` are ``(device_id, generation, skills, made_ms)``, applied in
        order (two reports of one device keep theirs).

        Returns:
            Per item: True when it replaced the stored report, False when it
            changed nothing (it arrived late, or the device is not registered).

        Raises:
            ValidationError: An item is malformed; nothing is written.
            StoreError: The database failed; nothing is written.
        """
        checked = [(item, _checked_report(*item)) for item in items]
        with self._tx(write=True) as conn:
            return [bool(done) for done in _apply_reports(self._dialect, conn, checked)]

    def reported_for(self, device_id: str) -> ReportedRecord | None:
        """Return a device's latest report, or None if it never reported.

        Raises:
            StoreError: The database failed or holds corrupt data.
        """
        query = select(reported_states).where(reported_states.c.device_id == device_id)
        with self._tx() as conn:
            row = conn.execute(query).first()
        return None if row is None else _report_record(row)

    def device_states(
        self,
        selector: Mapping[str, str] | None = None,
        *,
        device_id: str | None = None,
        project: str | None = None,
    ) -> list[DeviceStateRecord]:
        """Return the devices ``selector`` selects with their desired generation and last report.

        One transaction and a fixed number of queries, however many devices there are.
        With ``device_id``, only that device (if the selector selects it); with
        ``project``, only devices of that project.

        Raises:
            ValidationError: The selector is malformed.
            StoreError: The database failed or holds corrupt data.
        """
        where = selector_clause(check_labels(selector or {}))
        if device_id is not None:
            where = where & (devices.c.device_id == device_id)
        if project is not None:
            where = where & (devices.c.project == project)
        ids = select(devices.c.device_id).where(where)
        with self._tx() as conn:
            labels: dict[str, dict[str, str]] = {}
            for row in conn.execute(
                select(device_labels).where(device_labels.c.device_id.in_(ids))
            ):
                labels.setdefault(row.device_id, {})[row.key] = row.value
            generations = {
                row.device_id: int(row.generation)
                for row in conn.execute(
                    select(desired_states.c.device_id, desired_states.c.generation).where(
                        desired_states.c.device_id.in_(ids)
                    )
                )
            }
            reports = {
                row.device_id: _report_record(row)
                for row in conn.execute(
                    select(reported_states).where(reported_states.c.device_id.in_(ids))
                )
            }
            rows = conn.execute(select(devices).where(where).order_by(devices.c.device_id)).all()
        return [
            DeviceStateRecord(
                device_record(row, labels.get(row.device_id, {})),
                generations.get(row.device_id, 0),
                reports.get(row.device_id),
            )
            for row in rows
        ]

    def deployment_targets(
        self, selector: Mapping[str, str] | None = None, *, project: str | None = None
    ) -> list[TargetRecord]:
        """The devices ``selector`` selects (of ``project``), by id, with their last report.

        One query for the whole group, reading only what deployment status needs
        (no labels, profiles or desired state, unlike :meth:`device_states`).

        Raises:
            ValidationError: The selector is malformed.
            StoreError: The database failed or holds corrupt data.
        """
        where = selector_clause(check_labels(selector or {}))
        if project is not None:
            where = where & (devices.c.project == project)
        c = devices.c
        query = (
            select(c.device_id, c.last_seen_ms, c.heartbeat_ms, c.online, reported_states.c.skills)
            .select_from(
                devices.outerjoin(reported_states, reported_states.c.device_id == c.device_id)
            )
            .where(where)
            .order_by(c.device_id)
        )
        with self._tx() as conn:
            rows = conn.execute(query).all()
        return [
            TargetRecord(
                row.device_id,
                int(row.last_seen_ms),
                int(row.heartbeat_ms),
                bool(row.online),
                _decode_statuses(row.device_id, row.skills) if row.skills else (),
            )
            for row in rows
        ]


def _decode_statuses(device_id: str, text: str) -> tuple[SkillStatusRecord, ...]:
    try:
        return tuple(SkillStatusRecord(**item) for item in json.loads(text))
    except (ValueError, TypeError) as exc:
        raise StoreError(f"stored report of {device_id!r} is corrupt: {exc}") from exc


def _previous(device_id: str, text: str | None) -> tuple[SkillStatusRecord, ...]:
    """The report being replaced; a corrupt one must not block the new one (nothing to diff)."""
    try:
        return _decode_statuses(device_id, text) if text else ()
    except StoreError:
        return ()


def _report_record(row: Row[Any]) -> ReportedRecord:
    skills = _decode_statuses(row.device_id, row.skills)
    return ReportedRecord(row.device_id, row.generation, skills, row.reported_ms)


#: Device ids per query when reading many devices' reports.

#: A report as :meth:`StateTables.save_reports_many` takes it:
#: ``(device_id, generation, skills, made_ms)``.
ReportItem = tuple[str, int, Sequence[SkillStatusRecord], int]


def _checked_report(
    device_id: str, generation: int, skills: Sequence[SkillStatusRecord], now_ms: int
) -> str:
    """Check a report; its skills as stored (JSON text)."""
    check.device_id(device_id)
    check.counter(generation, "generation")
    check.counter(now_ms, "now_ms")
    return json.dumps([asdict(s) for s in check.statuses(skills)], sort_keys=True)


def _apply_reports(
    dialect: Any, conn: Connection, checked: Sequence[tuple[ReportItem, str]]
) -> list[bool | None]:
    """Store checked reports of many devices in ``conn``'s transaction, in a few statements.

    A report replaces the stored one when it answers a newer desired generation,
    or the same one and was made no earlier; one that arrived late changes
    nothing. That is judged on the rows read (and, on PostgreSQL, locked in
    device order) at the start: the devices' rows stay locked to the end, so no
    other writer changes a report in between. Each skill transition a report
    shows is logged once, with it.

    Returns:
        Per item: True when it replaced the stored report, False when it arrived
        late, None when the device is not registered.
    """
    ids = sorted({item[0] for item, _ in checked})
    stored: dict[str, tuple[int, int, str] | None] = {}
    r = reported_states.c
    joined = devices.outerjoin(reported_states, r.device_id == devices.c.device_id)
    for start in range(0, len(ids), IDS_PER_QUERY):
        query = (
            select(devices.c.device_id, r.generation, r.reported_ms, r.skills)
            .select_from(joined)
            .where(devices.c.device_id.in_(ids[start : start + IDS_PER_QUERY]))
            .order_by(devices.c.device_id)
            .with_for_update(of=devices)
        )
        for row in conn.execute(query):
            has = row.generation is not None
            stored[row.device_id] = (row.generation, row.reported_ms, row.skills) if has else None
    results: list[bool | None] = []
    latest: dict[str, dict[str, Any]] = {}
    events: list[tuple[NewEvent, int]] = []
    for (device_id, generation, skills, made_ms), encoded in checked:
        if device_id not in stored:
            results.append(None)  # not registered
            continue
        before = stored[device_id]
        if before is not None and (before[0], before[1]) > (generation, made_ms):
            results.append(False)  # late: answers an older generation, or was made earlier
            continue
        changes = skill_transitions(device_id, _previous(device_id, before and before[2]), skills)
        events += [(change, made_ms) for change in changes]
        stored[device_id] = (generation, made_ms, encoded)
        latest[device_id] = {
            "device_id": device_id,
            "generation": generation,
            "skills": encoded,
            "reported_ms": made_ms,
        }
        results.append(True)
    if latest:
        # Taken with the rows locked, shortly before the commit: a rollout pass that
        # finds only reports moved reads those stored since a little before its last read.
        stored_ms = now_ms()
        for value in latest.values():
            value["stored_ms"] = stored_ms
        upsert = dialect.insert(reported_states)
        upsert = upsert.on_conflict_do_update(
            index_elements=["device_id"],
            set_={c: upsert.excluded[c] for c in REPORT_COLUMNS},
        )
        conn.execute(upsert, list(latest.values()))
    insert_timed_events(conn, events)
    if latest:
        bump(conn, report=True)
    return results
