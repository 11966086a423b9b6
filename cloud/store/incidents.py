"""Drift incidents and per-group drift settings in the store.

An incident's row keeps its stage, links (job, model, skill version,
deployment), the fleet numbers that opened it and a ``detail`` map the drift
loop fills in (training data used, accuracy before and after on the shifted
hold-out); each stage it entered is a row of ``drift_incident_stages``. The
pure :class:`~cloud.drift.incident.IncidentState` decides the transitions;
the store writes the result with :meth:`IncidentTables.save_drift_incident`
only if the stored stage is still the one the caller read, so two passes (or
two processes) can never move one incident twice. Each change writes its
event (kind ``drift``) in the same transaction.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, Row, insert, select, update

from cloud.drift.incident import IncidentState, Stage, StageChange
from cloud.errors import NotFoundError, StoreError, ValidationError
from cloud.store import checks as check
from cloud.store.base import StoreBase
from cloud.store.drift_schema import drift_incident_stages, drift_incidents, drift_policies
from cloud.store.events import EVENT_DRIFT, NewEvent, insert_events
from cloud.store.schema import device_groups

__all__ = ["MAX_INCIDENT_ROWS", "IncidentRecord", "IncidentTables"]

MAX_INCIDENT_ROWS = 10_000
MAX_JSON_BYTES = 64 * 1024


@dataclass(frozen=True)
class IncidentRecord:
    """A stored drift incident.

    Attributes:
        state: The incident as the pure state machine sees it (with its history).
        numbers: The fleet numbers that opened it.
        detail: What the drift loop recorded on the way (data, accuracies, reasons).
    """

    state: IncidentState
    numbers: Mapping[str, Any] = field(default_factory=dict)
    detail: Mapping[str, Any] = field(default_factory=dict)

    @property
    def id(self) -> int:
        """The incident's id."""
        return self.state.id


def _json(value: Mapping[str, Any], what: str) -> str:
    try:
        text = json.dumps(dict(value), sort_keys=True, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValidationError(f"incident {what} is not plain JSON: {exc}") from exc
    if len(text.encode()) > MAX_JSON_BYTES:
        raise ValidationError(f"incident {what} over {MAX_JSON_BYTES} bytes")
    return text


def _loads(text: str, what: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise StoreError(f"corrupt incident {what}: {exc}") from exc
    if not isinstance(value, dict):
        raise StoreError(f"corrupt incident {what}: not a table")
    return value


def _record(row: Row[Any], stages: list[Row[Any]]) -> IncidentRecord:
    history = tuple(StageChange(Stage(s.stage), int(s.at_ms), s.note) for s in stages)
    try:
        state = IncidentState(
            id=int(row.id),
            skill=row.skill,
            version=row.version,
            group=row.group_name,
            opened_ms=int(row.opened_ms),
            reason=row.reason,
            stage=Stage(row.stage),
            closed_ms=row.closed_ms,
            job_id=row.job_id,
            model_id=row.model_id,
            skill_version=row.skill_version,
            deployment_id=row.deployment_id,
            outcome=row.outcome,
            history=history,
        )
    except ValueError as exc:  # ValidationError too: a row the transitions cannot make
        raise StoreError(f"drift incident {row.id} is corrupt: {exc}") from exc
    return IncidentRecord(state, _loads(row.numbers, "numbers"), _loads(row.detail, "detail"))


def _event(state: IncidentState, note: str) -> NewEvent:
    where = f"{state.skill} {state.version} on {state.group}"
    return NewEvent(EVENT_DRIFT, f"drift incident {state.id} ({where}): {note}", "", state.skill)


class IncidentTables(StoreBase):
    """Drift incidents, their stages, and each group's drift settings."""

    def open_drift_incident(
        self,
        skill: str,
        version: str,
        group: str,
        reason: str,
        numbers: Mapping[str, Any],
        *,
        now_ms: int,
    ) -> IncidentRecord | None:
        """Open an incident unless one is open for the skill version and group.

        Returns:
            The new incident, or None when one is open already (nothing changed).

        Raises:
            ValidationError: A malformed name, time or numbers.
            StoreError: The database failed.
        """
        check.name(skill, "skill name")
        check.version(version)
        check.name(group, "group name")
        check.counter(now_ms, "now_ms")
        reason = check.text(reason, "reason", 4000)
        t = drift_incidents.c
        with self._tx(write=True) as conn:
            live = conn.execute(
                select(t.id).where(
                    t.skill == skill,
                    t.version == version,
                    t.group_name == group,
                    t.closed_ms.is_(None),
                )
            ).first()
            if live is not None:
                return None
            row = {
                "skill": skill,
                "version": version,
                "group_name": group,
                "stage": Stage.OPEN.value,
                "reason": reason,
                "numbers": _json(numbers, "numbers"),
                "detail": "{}",
                "opened_ms": now_ms,
                "outcome": "",
            }
            new_id = int(
                conn.execute(insert(drift_incidents).values(**row).returning(t.id)).scalar_one()
            )
            conn.execute(
                insert(drift_incident_stages).values(
                    incident_id=new_id, seq=0, stage=Stage.OPEN.value, at_ms=now_ms, note=""
                )
            )
            found = self._incident(conn, new_id)
            insert_events(conn, [_event(found.state, f"opened: {reason}")], at_ms=now_ms)
        return found

    def save_drift_incident(
        self,
        new: IncidentState,
        *,
        expected: Stage,
        detail: Mapping[str, Any] | None = None,
        now_ms: int,
    ) -> bool:
        """Store an incident's new stage (and links), if it is still at ``expected``.

        Args:
            new: The incident after one or more transitions of the stored one.
            expected: The stage the caller read; nothing is written if it changed.
            detail: Keys to add to (or replace in) the incident's detail.
            now_ms: The time of the write (for the event log).

        Returns:
            Whether it was written.

        Raises:
            ValidationError: Detail that is not plain JSON or too large, or a
                history that does not extend the stored one.
            NotFoundError: No such incident.
            StoreError: The database failed.
        """
        check.counter(now_ms, "now_ms")
        t = drift_incidents.c
        with self._tx(write=True) as conn:
            old = self._incident(conn, new.id)
            if old.state.stage is not expected:
                return False
            known = len(old.state.history)
            if new.history[:known] != old.state.history:
                raise ValidationError(f"incident {new.id}: the new history rewrites the stored one")
            merged = {**old.detail, **(detail or {})}
            values = {
                "stage": new.stage.value,
                "closed_ms": new.closed_ms,
                "job_id": new.job_id,
                "model_id": new.model_id,
                "skill_version": new.skill_version,
                "deployment_id": new.deployment_id,
                "outcome": new.outcome,
                "detail": _json(merged, "detail"),
            }
            changed = conn.execute(
                update(drift_incidents)
                .where(t.id == new.id, t.stage == expected.value)
                .values(**values)
            ).rowcount
            if not changed:
                return False
            added = list(enumerate(new.history))[known:]
            if added:
                conn.execute(
                    insert(drift_incident_stages),
                    [
                        {
                            "incident_id": new.id,
                            "seq": i,
                            "stage": c.stage.value,
                            "at_ms": c.at_ms,
                            "note": c.note,
                        }
                        for i, c in added
                    ],
                )
            news = [
                _event(new, f"{c.stage.value}{': ' + c.note if c.note else ''}") for _, c in added
            ]
            insert_events(conn, news, at_ms=now_ms)
        return True

    def get_drift_incident(self, incident_id: int) -> IncidentRecord:
        """One incident.

        Raises:
            NotFoundError: No such incident.
            StoreError: The database failed or holds corrupt data.
        """
        with self._tx() as conn:
            return self._incident(conn, incident_id)

    def list_drift_incidents(
        self, *, closed_since_ms: int | None = None, everything: bool = False, limit: int = 1000
    ) -> list[IncidentRecord]:
        """Incidents, oldest first: the open ones, those closed since a time, or all.

        Raises:
            ValidationError: ``limit`` outside 1..10000.
            StoreError: The database failed or holds corrupt data.
        """
        if not 1 <= limit <= MAX_INCIDENT_ROWS:
            raise ValidationError(f"limit must be in 1..{MAX_INCIDENT_ROWS}, not {limit}")
        t = drift_incidents.c
        query = select(drift_incidents).order_by(t.id.desc()).limit(limit)
        if not everything:
            since = closed_since_ms
            query = query.where(
                t.closed_ms.is_(None)
                if since is None
                else (t.closed_ms.is_(None) | (t.closed_ms >= since))
            )
        with self._tx() as conn:
            rows = conn.execute(query).all()
            stages = self._stages(conn, [int(r.id) for r in rows])
        return [_record(r, stages.get(int(r.id), [])) for r in reversed(rows)]

    @staticmethod
    def _stages(conn: Connection, ids: list[int]) -> dict[int, list[Row[Any]]]:
        out: dict[int, list[Row[Any]]] = {}
        if not ids:
            return out
        s = drift_incident_stages.c
        query = (
            select(drift_incident_stages)
            .where(s.incident_id.in_(ids))
            .order_by(s.incident_id, s.seq)
        )
        for row in conn.execute(query):
            out.setdefault(int(row.incident_id), []).append(row)
        return out

    def _incident(self, conn: Connection, incident_id: int) -> IncidentRecord:
        row = conn.execute(
            select(drift_incidents).where(drift_incidents.c.id == incident_id)
        ).first()
        if row is None:
            raise NotFoundError(f"no drift incident {incident_id}")
        return _record(row, self._stages(conn, [incident_id]).get(incident_id, []))

    # settings

    def drift_settings(self) -> dict[str, dict[str, Any]]:
        """Every group's stored drift settings, by group.

        Raises:
            StoreError: The database failed or holds corrupt data.
        """
        with self._tx() as conn:
            rows = conn.execute(select(drift_policies)).all()
        return {r.group_name: _loads(r.settings, "settings") for r in rows}

    def set_drift_settings(self, group: str, settings: Mapping[str, Any], *, now_ms: int) -> None:
        """Store a group's drift settings (replacing what it had).

        Raises:
            ValidationError: A malformed group name or settings that are not plain JSON.
            NotFoundError: No such group.
            StoreError: The database failed.
        """
        check.name(group, "group name")
        check.counter(now_ms, "now_ms")
        text = _json(settings, "settings")
        stmt = self._dialect.insert(drift_policies).values(
            group_name=group, settings=text, updated_ms=now_ms
        )
        stmt = stmt.on_conflict_do_update(
            index_elements=["group_name"], set_={"settings": text, "updated_ms": now_ms}
        )
        with self._tx(write=True) as conn:
            known = select(device_groups.c.name).where(device_groups.c.name == group)
            if conn.execute(known).first() is None:
                raise NotFoundError(f"no group {group!r}")
            conn.execute(stmt)
            note = NewEvent(EVENT_DRIFT, f"drift settings of group {group} set: {text}", "", group)
            insert_events(conn, [note], at_ms=now_ms)
