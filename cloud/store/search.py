"""Device search and the fleet overview, answered by the database for 10,000 devices.

Every filter is a WHERE clause over ``devices`` (labels and reported skills
through correlated subqueries), so a page costs a count, one keyset-ordered
page of ids and a fixed number of queries for the page's rows, however many
devices match. JSON columns (a device's profile, its reported skills) are
read with the dialect's JSON functions; a ``LIKE`` on the canonical text
the store writes discards most rows first.

Presence has three values here, by :func:`cloud.presence.fleet_presence`:
``online``, ``stale`` (quiet without a goodbye) and ``offline``.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from sqlalchemy import (
    ColumnElement,
    Connection,
    FromClause,
    Row,
    and_,
    case,
    cast,
    exists,
    func,
    literal,
    not_,
    select,
    true,
)
from sqlalchemy.dialects.postgresql import JSONB

from cloud.errors import StoreError, ValidationError
from cloud.presence import PRESENCES, FleetPresence, fleet_presence, online_clause
from cloud.selectors import parse_selector
from cloud.store.base import StoreBase
from cloud.store.desired import selector_clause
from cloud.store.devices import device_record
from cloud.store.drift_schema import drift_incidents
from cloud.store.records import DeviceStateRecord, ReportedRecord, SkillStatusRecord
from cloud.store.schema import (
    deployments,
    desired_states,
    device_groups,
    device_labels,
    devices,
    reported_states,
    rollouts,
)

__all__ = [
    "PRESENCES",
    "DeviceFilter",
    "DriftAlertRecord",
    "FailedInstallRecord",
    "FleetPresence",
    "GroupPresenceRecord",
    "OverviewRecord",
    "RolloutAlertRecord",
    "SearchTables",
    "VersionCountRecord",
    "fleet_presence",
    "presence_clause",
]


#: Rollout phases an operator must look at (``paused`` is stored over a running phase).
_ALERT_PHASES: Final = ("paused", "aborted", "rolled_back")


def _online(now_ms: int) -> ColumnElement[bool]:
    c = devices.c
    return online_clause(c.last_seen_ms, c.heartbeat_ms, c.online, now_ms)


def presence_clause(which: str, now_ms: int) -> ColumnElement[bool]:
    """The rule of :func:`fleet_presence` as a WHERE clause on ``devices`` (one value)."""
    online = _online(now_ms)
    if which == "online":
        return online
    if which == "stale":
        return and_(devices.c.online, not_(online))
    return not_(devices.c.online)


def _presence_case(now_ms: int) -> ColumnElement[str]:
    online = _online(now_ms)
    return case((online, literal("online")), (devices.c.online, literal("stale")), else_="offline")


@dataclass(frozen=True)
class DeviceFilter:
    """What a device must have to be listed; every set field must hold (None: any)."""

    project: str | None = None
    group_selector: Mapping[str, str] | None = None
    labels: Mapping[str, str] | None = None
    board: str | None = None
    presence: str | None = None
    skill: str | None = None
    version: str | None = None
    seen_before_ms: int | None = None
    seen_after_ms: int | None = None
    text: str | None = None


def _like(fragment: str) -> str:
    """A LIKE pattern containing ``fragment`` literally (escape character ``\\``)."""
    escaped = fragment.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_")
    return f"%{escaped}%"


class _Json:
    """The dialect's JSON functions over the text columns the store writes canonically."""

    def __init__(self, dialect: str) -> None:
        self.pg = dialect == "postgresql"

    def field(self, document: Any, key: str) -> ColumnElement[Any]:
        if self.pg:
            return func.jsonb_extract_path_text(cast(document, JSONB), key)
        return func.json_extract(document, f"$.{key}")

    def elements(self, array: Any) -> FromClause:
        """The elements of a JSON array column, one row each (column ``value``)."""
        if self.pg:
            return func.jsonb_array_elements(cast(array, JSONB)).table_valued("value")
        return func.json_each(array).table_valued("value")


def _skill_clause(json: _Json, skill: str | None, version: str | None) -> ColumnElement[bool]:
    """Devices whose last report lists a skill of that name and/or version (any state)."""
    each = json.elements(reported_states.c.skills).alias("reported_skill")
    wanted = []
    text_checks = []
    if skill is not None:
        wanted.append(json.field(each.c.value, "name") == skill)
        text_checks.append(
            reported_states.c.skills.like(_like(f'"name": {_dumps(skill)}'), escape="\\")
        )
    if version is not None:
        wanted.append(json.field(each.c.value, "version") == version)
        text_checks.append(
            reported_states.c.skills.like(_like(f'"version": {_dumps(version)}'), escape="\\")
        )
    matching = exists(select(literal(1)).select_from(each).where(*wanted))
    return exists(
        select(literal(1))
        .where(reported_states.c.device_id == devices.c.device_id, *text_checks, matching)
        .correlate(devices)
    )


def _dumps(value: str) -> str:
    return json.dumps(value)


def device_clause(f: DeviceFilter, dialect: str, now_ms: int) -> ColumnElement[bool]:
    """The WHERE clause on ``devices`` of a filter (presence judged at ``now_ms``)."""
    json_ = _Json(dialect)
    c = devices.c
    clauses: list[ColumnElement[bool]] = [true()]
    if f.project is not None:
        clauses.append(c.project == f.project)
    for selector in (f.group_selector, f.labels):
        if selector:
            clauses.append(selector_clause(selector))
    if f.board is not None:
        clauses.append(c.profile.like(_like(f'"board":{_dumps(f.board)}'), escape="\\"))
        clauses.append(json_.field(c.profile, "board") == f.board)
    if f.presence is not None:
        clauses.append(presence_clause(f.presence, now_ms))
    if f.skill is not None or f.version is not None:
        clauses.append(_skill_clause(json_, f.skill, f.version))
    if f.seen_before_ms is not None:
        clauses.append(c.last_seen_ms < f.seen_before_ms)
    if f.seen_after_ms is not None:
        clauses.append(c.last_seen_ms >= f.seen_after_ms)
    if f.text:
        clauses.append(func.lower(c.device_id).like(_like(f.text.lower()), escape="\\"))
    return and_(*clauses)


@dataclass(frozen=True)
class GroupPresenceRecord:
    """How many of the devices a group selects are online, stale and offline."""

    group: str
    selector: str
    online: int
    stale: int
    offline: int

    @property
    def devices(self) -> int:
        """How many devices the group selects."""
        return self.online + self.stale + self.offline


@dataclass(frozen=True)
class VersionCountRecord:
    """How many devices report a skill at a version (in any state)."""

    skill: str
    version: str
    devices: int


@dataclass(frozen=True)
class FailedInstallRecord:
    """Devices whose last report says a skill version failed; ``first_device`` by id."""

    skill: str
    version: str
    devices: int
    first_device: str


@dataclass(frozen=True)
class DriftAlertRecord:
    """An open drift incident."""

    incident_id: int
    skill: str
    version: str
    group: str
    stage: str
    reason: str
    opened_ms: int


@dataclass(frozen=True)
class RolloutAlertRecord:
    """The newest deployment of a skill on a group, paused, aborted or rolled back."""

    deployment_id: int
    skill: str
    version: str
    group: str
    #: The rollout's phase, or the deployment's state when it has no rollout.
    phase: str


@dataclass(frozen=True)
class OverviewRecord:
    """Everything the fleet overview shows, read in one transaction."""

    totals: GroupPresenceRecord
    groups: tuple[GroupPresenceRecord, ...]
    versions: tuple[VersionCountRecord, ...]
    failed: tuple[FailedInstallRecord, ...]
    drift: tuple[DriftAlertRecord, ...]
    rollouts: tuple[RolloutAlertRecord, ...]


def _counts(conn: Connection, where: ColumnElement[bool], now_ms: int) -> dict[str, int]:
    which = _presence_case(now_ms).label("presence")
    query = select(which, func.count()).select_from(devices).where(where).group_by(which)
    rows = conn.execute(query)
    return {str(row[0]): int(row[1]) for row in rows}


def _group_presence(
    conn: Connection, name: str, selector: str, where: ColumnElement[bool], now_ms: int
) -> GroupPresenceRecord:
    n = _counts(conn, where, now_ms)
    return GroupPresenceRecord(
        name, selector, n.get("online", 0), n.get("stale", 0), n.get("offline", 0)
    )


def _decode_report(row: Row[Any]) -> ReportedRecord:
    try:
        skills = tuple(SkillStatusRecord(**item) for item in json.loads(row.skills))
    except (ValueError, TypeError) as exc:
        raise StoreError(f"stored report of {row.device_id!r} is corrupt: {exc}") from exc
    return ReportedRecord(row.device_id, row.generation, skills, row.reported_ms)


class SearchTables(StoreBase):
    """Read-only queries of the console over devices, groups, reports and rollouts."""

    def search_devices(
        self, f: DeviceFilter, *, now_ms: int, after: str | None, limit: int
    ) -> tuple[list[DeviceStateRecord], int]:
        """The first ``limit`` devices matching ``f`` with ids above ``after``, and how many match.

        Raises:
            StoreError: The database failed or holds corrupt data.
        """
        where = device_clause(f, self.dialect, now_ms)
        page_where = where if after is None else and_(where, devices.c.device_id > after)
        with self._tx() as conn:
            total = int(
                conn.execute(select(func.count()).select_from(devices).where(where)).scalar_one()
            )
            ids = select(devices.c.device_id).where(page_where)
            ids = ids.order_by(devices.c.device_id).limit(limit)
            page = list(conn.execute(ids).scalars()) if total else []
            return self._states(conn, page), total

    @staticmethod
    def _states(conn: Connection, ids: Sequence[str]) -> list[DeviceStateRecord]:
        if not ids:
            return []
        labels: dict[str, dict[str, str]] = {}
        for row in conn.execute(select(device_labels).where(device_labels.c.device_id.in_(ids))):
            labels.setdefault(row.device_id, {})[row.key] = row.value
        gens = {
            row.device_id: int(row.generation)
            for row in conn.execute(
                select(desired_states.c.device_id, desired_states.c.generation).where(
                    desired_states.c.device_id.in_(ids)
                )
            )
        }
        reports = {
            row.device_id: _decode_report(row)
            for row in conn.execute(
                select(reported_states).where(reported_states.c.device_id.in_(ids))
            )
        }
        rows = conn.execute(
            select(devices).where(devices.c.device_id.in_(ids)).order_by(devices.c.device_id)
        )
        return [
            DeviceStateRecord(
                device_record(row, labels.get(row.device_id, {})),
                gens.get(row.device_id, 0),
                reports.get(row.device_id),
            )
            for row in rows
        ]

    def overview(self, project: str | None, *, now_ms: int) -> OverviewRecord:
        """Presence per group, versions in the field and what needs attention, in one go.

        Raises:
            StoreError: The database failed or holds corrupt data.
        """
        mine = true() if project is None else devices.c.project == project
        groups_q = select(device_groups).order_by(device_groups.c.name)
        if project is not None:
            groups_q = groups_q.where(device_groups.c.project == project)
        with self._tx() as conn:
            totals = _group_presence(conn, "", "", mine, now_ms)
            groups = []
            for g in conn.execute(groups_q).all():
                where = and_(mine, selector_clause(_selector(g.name, g.selector)))
                groups.append(_group_presence(conn, g.name, g.selector, where, now_ms))
            versions, failed = self._field(conn, mine)
            drift = self._drift(conn, project)
            alerts = self._rollout_alerts(conn, project)
        return OverviewRecord(totals, tuple(groups), versions, failed, drift, alerts)

    def _field(
        self, conn: Connection, mine: ColumnElement[bool]
    ) -> tuple[tuple[VersionCountRecord, ...], tuple[FailedInstallRecord, ...]]:
        """Versions in the field and failed installs, counted from the reports' JSON.

        Devices of a fleet mostly report the very same text (same skills, versions
        and states), so the reports are grouped by their text first and each
        distinct text is parsed once, weighted by how many devices sent it: the
        same counts as parsing every report, at a fraction of the cost on SQLite.
        """
        r = reported_states.c
        distinct = (
            select(
                r.skills.label("skills"),
                func.count().label("n"),
                func.min(r.device_id).label("first_device"),
            )
            .select_from(reported_states.join(devices, devices.c.device_id == r.device_id))
            .where(mine)
            .group_by(r.skills)
            .subquery("distinct_report")
        )
        json_ = _Json(self.dialect)
        each = json_.elements(distinct.c.skills).alias("reported_skill")
        name = json_.field(each.c.value, "name").label("skill")
        version = json_.field(each.c.value, "version").label("version")
        is_failed = json_.field(each.c.value, "state") == "failed"
        failed = func.sum(case((is_failed, distinct.c.n), else_=0))
        first_failed = func.min(case((is_failed, distinct.c.first_device)))
        query = (
            select(name, version, func.sum(distinct.c.n), failed, first_failed)
            .select_from(distinct.join(each, true()))
            .group_by(name, version)
            .order_by(name, version)
        )
        counts, failures = [], []
        for row in conn.execute(query):
            counts.append(VersionCountRecord(str(row[0]), str(row[1] or ""), int(row[2])))
            if row[3]:
                failures.append(
                    FailedInstallRecord(str(row[0]), str(row[1] or ""), int(row[3]), str(row[4]))
                )
        return tuple(counts), tuple(failures)

    @staticmethod
    def _drift(conn: Connection, project: str | None) -> tuple[DriftAlertRecord, ...]:
        d = drift_incidents.c
        query = select(drift_incidents).where(d.closed_ms.is_(None)).order_by(d.id)
        if project is not None:
            mine = select(device_groups.c.name).where(device_groups.c.project == project)
            query = query.where(d.group_name.in_(mine))
        return tuple(
            DriftAlertRecord(
                int(r.id), r.skill, r.version, r.group_name, r.stage, r.reason, int(r.opened_ms)
            )
            for r in conn.execute(query)
        )

    @staticmethod
    def _rollout_alerts(conn: Connection, project: str | None) -> tuple[RolloutAlertRecord, ...]:
        t = deployments.c
        newest = select(func.max(t.id)).group_by(t.skill, t.group_name)
        if project is not None:
            newest = newest.where(t.project == project)
        query = (
            select(t.id, t.skill, t.version, t.group_name, t.state, rollouts.c.phase)
            .select_from(deployments.outerjoin(rollouts, rollouts.c.deployment_id == t.id))
            .where(
                t.id.in_(newest),
                (t.state == "aborted") | rollouts.c.phase.in_(_ALERT_PHASES),
            )
            .order_by(t.id)
        )
        return tuple(
            RolloutAlertRecord(int(r.id), r.skill, r.version, r.group_name, r.phase or r.state)
            for r in conn.execute(query)
        )


def _selector(group: str, text: str) -> dict[str, str]:
    try:
        return parse_selector(text)
    except ValidationError as exc:
        raise StoreError(f"group {group!r} has a corrupt selector: {exc}") from exc
