"""What the fleet shows a rollout: its targets, their reports, presence and KPIs.

Read in one transaction for the leader's rollout loop, which turns it into
rollout engine events (:mod:`cloud.rollout_loop`). A plan's
``baseline_since_ms`` keeps the baseline versions' telemetry windows that
ended before it out of their KPIs (the new version's are never cut).

The leader reads a rollout's facts every second, and between two reads few of
its targets' rows change: a read given the last one (``last``) compares the raw rows,
takes the unchanged devices' facts from it and says which devices changed
(:attr:`RolloutFacts.changed`). Given the fleet stamp it was read at, it skips
reading the rows at all while the stamp says no write could have changed them,
and reads only the rows of the reports stored lately while it says only
reports moved (:mod:`cloud.store.fleet_stamp`).
"""

from __future__ import annotations

import functools
import json
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, and_, case, func, or_, select

from cloud.errors import StoreError, ValidationError
from cloud.rollout.plan import plan_from_dict
from cloud.store.base import IDS_PER_QUERY
from cloud.store.fleet_stamp import REPORT_MARGIN_MS, Moved, Stamp, moved
from cloud.store.records import DeploymentRecord, SkillStatusRecord
from cloud.store.schema import devices, fleet_controls, reported_states, rollouts, telemetry
from protos.envelope import now_ms

__all__ = [
    "FLEET_ROW",
    "KPI_COMMIT_LAG_S",
    "KPI_LOOKBACK_MS",
    "DeviceRow",
    "KpiTally",
    "RolloutFacts",
    "read_facts",
]

#: Telemetry older than this before a deployment was made is no baseline for it.
KPI_LOOKBACK_MS = 3600 * 1000
#: The id of the one ``fleet_controls`` row.
FLEET_ROW = 1


#: A target's row as the driver reads it: ``(device, last_seen_ms, heartbeat_ms, connected,
#: reported_ms, skills)``, the last two None when it never reported (``connected`` may
#: come as 0 or 1).
DeviceRow = tuple[str, int, int, bool, int | None, str | None]


@dataclass(frozen=True)
class RolloutFacts:
    """What the fleet shows a rollout now.

    ``targets``: each device the group selects, with ``(last_seen_ms,
    heartbeat_ms, connected)``. ``reports``: each target's report time and
    status of the skill (when it reported it). ``kpis``: ``(device, version,
    inferences, labelled, correct, errors, p95_ms, at_ms)`` totals of the skill's
    telemetry. ``fleet_stop``: the switch and when it last changed. ``rows``:
    each target's row as read. ``changed``: the targets whose row differs from
    the last read's (new targets included), or None when read without one.
    ``stamp``: the fleet stamp ``rows`` were read at (None: unknown).
    ``read_ms``: the hub's time (wall clock, ms) when they were read or found
    unchanged. ``whole``: every row was read now (not kept from the last read on
    the stamp's word).
    """

    targets: Mapping[str, tuple[int, int, bool]]
    reports: Mapping[str, tuple[int, SkillStatusRecord]]
    kpis: tuple[tuple[str, str, int, int, int, int, float, int], ...]
    fleet_stop: tuple[bool, int]
    rows: Mapping[str, DeviceRow] = field(default_factory=dict)
    changed: frozenset[str] | None = None
    stamp: Stamp | None = None
    read_ms: int = 0
    whole: bool = True


def read_facts(
    conn: Connection,
    dep: DeploymentRecord,
    where: Any,
    tally: KpiTally | None = None,
    last: RolloutFacts | None = None,
    *,
    stamp: Stamp | None = None,
    refreshes_moot: bool = False,
    reread: bool = False,
    kpis_due: bool = True,
) -> RolloutFacts:
    """Read the facts of ``dep``'s rollout; ``where`` keeps the devices its group selects.

    ``tally``: the leader's running KPI totals of this rollout (read on, not summed
    again). ``last``: the facts of the last read with that tally (or without one);
    its unchanged devices are taken from it, and its KPIs when no total moved.
    ``stamp``: the fleet stamp, read in this transaction before anything else;
    when it says no write changed the rows since ``last`` read them (refreshes
    aside when ``refreshes_moot``, see :func:`cloud.store.fleet_stamp.moved`),
    they are not read again, and when only reports moved, only the rows of the
    reports stored since shortly before ``last`` are; unless ``reread``.
    ``kpis_due``: False takes ``last``'s KPIs as they are, without reading the
    telemetry (for a plan that only shows them, between the reads that keep its
    status current); they are read when the targets changed all the same.

    Raises:
        StoreError: Stored data is corrupt.
    """
    changed: frozenset[str] | None
    read_ms = now_ms()
    news = Moved.ROWS
    if not reread and last is not None:
        news = moved(last.stamp, stamp, refreshes_moot=refreshes_moot)
    if last is not None and news is Moved.NOTHING:
        # The rows are last's, so is the stamp they were read at: refreshes skipped
        # here are still news to a later read to which they are not moot.
        targets, reports = last.targets, last.reports
        rows, changed, stamp = last.rows, frozenset(), last.stamp
    elif (
        last is not None and last.stamp is not None and stamp is not None and news is Moved.REPORTS
    ):
        margin = REPORT_MARGIN_MS.get(conn.dialect.name, max(REPORT_MARGIN_MS.values()))
        targets, reports, rows, changed = _read_reports(
            conn, dep.skill, where, last, last.read_ms - margin
        )
        # The stamp moves on with the reports only: refreshes skipped stay news.
        stamp = (last.stamp[0], last.stamp[1], stamp[2])
    else:
        targets, reports, rows, changed = _read_devices(conn, dep.skill, where, last)
    since = dep.created_ms - KPI_LOOKBACK_MS
    cut = _baseline_since(conn, dep.id)
    baseline = since if cut is None else max(since, cut)
    ids = select(devices.c.device_id).where(where)
    kept = last.kpis if last is not None and targets.keys() == last.targets.keys() else None
    if kept is not None and not kpis_due:
        kpis = kept
    else:
        kpis = _kpis(conn, ids, targets, dep, since, baseline, tally, kept)
    switch = conn.execute(select(fleet_controls).where(fleet_controls.c.id == FLEET_ROW)).first()
    flag = (bool(switch.stopped), int(switch.changed_ms)) if switch else (False, -1)
    whole = news is Moved.ROWS
    return RolloutFacts(targets, reports, kpis, flag, rows, changed, stamp, read_ms, whole)


def _read_devices(
    conn: Connection, skill: str, where: Any, last: RolloutFacts | None
) -> tuple[
    dict[str, tuple[int, int, bool]],
    dict[str, tuple[int, SkillStatusRecord]],
    Mapping[str, DeviceRow],
    frozenset[str] | None,
]:
    """The targets, reports and rows read now, and which changed since ``last``."""
    with conn.execute(_device_rows(where)) as result:
        # The driver's own tuples: SQLAlchemy rows compare field by field in Python,
        # and the rows are compared with the last read's every pass.
        rows: dict[str, DeviceRow] = {r[0]: r for r in result.cursor.fetchall()}
    if last is None:
        return *_device_facts(rows.values(), skill, {}, {}), rows, None
    held = last.rows
    fresh = [r for d, r in rows.items() if held.get(d) != r]
    gone = held.keys() - rows.keys()
    changed = frozenset(r[0] for r in fresh)
    return *_device_facts(fresh, skill, last.targets, last.reports, gone), rows, changed


def _read_reports(
    conn: Connection, skill: str, where: Any, last: RolloutFacts, since_ms: int
) -> tuple[
    dict[str, tuple[int, int, bool]],
    dict[str, tuple[int, SkillStatusRecord]],
    dict[str, DeviceRow],
    frozenset[str],
]:
    """``last``'s facts with the rows of the reports stored since ``since_ms`` read again.

    Only reports moved the stamp since ``last``: the targets are ``last``'s, and
    every other row is as it read it.
    """
    # The ids first, by the index on the time: joined at once, a planner without
    # statistics walks every target and looks each one's report up.
    r = reported_states.c
    ids = sorted(conn.execute(select(r.device_id).where(r.stored_ms >= since_ms)).scalars())
    fresh = []
    for start in range(0, len(ids), IDS_PER_QUERY):
        chosen = and_(devices.c.device_id.in_(ids[start : start + IDS_PER_QUERY]), where)
        with conn.execute(_device_rows(chosen)) as result:
            fresh += [r for r in result.cursor.fetchall() if last.rows.get(r[0]) != r]
    rows = dict(last.rows)
    rows.update((r[0], r) for r in fresh)
    changed = frozenset(r[0] for r in fresh)
    return *_device_facts(fresh, skill, last.targets, last.reports), rows, changed


def _device_rows(where: Any) -> Any:
    """Each target's presence and report in one read: a join costs less than two."""
    d, r = devices.c, reported_states.c
    cols = (d.device_id, d.last_seen_ms, d.heartbeat_ms, d.online, r.reported_ms, r.skills)
    joined = devices.outerjoin(reported_states, r.device_id == d.device_id)
    return select(*cols).select_from(joined).where(where)


def _device_facts(
    rows: Iterable[Any],
    skill: str,
    targets: Mapping[str, tuple[int, int, bool]],
    reports: Mapping[str, tuple[int, SkillStatusRecord]],
    gone: Iterable[str] = (),
) -> tuple[dict[str, tuple[int, int, bool]], dict[str, tuple[int, SkillStatusRecord]]]:
    """``targets`` and ``reports`` with ``rows``' devices read again and ``gone`` left out."""
    targets, reports = dict(targets), dict(reports)
    for device in gone:
        del targets[device]
        reports.pop(device, None)
    for device, seen_ms, heartbeat_ms, connected, reported_ms, skills in rows:
        targets[device] = (int(seen_ms), int(heartbeat_ms), bool(connected))
        status = None if skills is None else _skill_status(device, skills, skill)
        if status is None:
            reports.pop(device, None)
        else:
            reports[device] = (int(reported_ms), status)
    return targets, reports


def _skill_status(device_id: str, text: str, skill: str) -> SkillStatusRecord | None:
    try:
        return _status_in(text, skill)
    except (ValueError, TypeError, AttributeError) as exc:
        raise StoreError(f"stored report of {device_id!r} is corrupt: {exc}") from exc


@functools.lru_cache(maxsize=1024)
def _status_in(text: str, skill: str) -> SkillStatusRecord | None:
    """``skill``'s status in a stored report, parsed once per text: a fleet's devices
    mostly report the same text (the same skills in the same states), and the leader
    reads every target's report every pass. The record is immutable; a failure is
    not kept."""
    items = json.loads(text)
    return next((SkillStatusRecord(**i) for i in items if i.get("name") == skill), None)


def _baseline_since(conn: Connection, deployment_id: int) -> int | None:
    """The ``baseline_since_ms`` of the deployment's stored plan (None: unset, or no plan)."""
    text = conn.execute(
        select(rollouts.c.plan).where(rollouts.c.deployment_id == deployment_id)
    ).scalar()
    if text is None:
        return None
    try:
        return plan_from_dict(json.loads(text)).baseline_since_ms
    except (ValueError, ValidationError) as exc:
        raise StoreError(f"stored plan of deployment {deployment_id} is corrupt: {exc}") from exc


#: Longest a telemetry row may stay uncommitted after it took its id. On PostgreSQL the ids
#: come from a sequence, and hub processes writing at once commit out of order; SQLite
#: has one writer at a time, so its ids commit in order.
KPI_COMMIT_LAG_S = 10.0

#: One device's totals of one version: inferences, labelled, correct, errors, the sum of
#: its windows' p95 (p99 where a window has none), the windows, the newest received time.
_Totals = list[int | float]


@dataclass
class KpiTally:
    """A rollout's telemetry totals, kept between passes by the leader and read on.

    Telemetry rows are only ever added, so each pass reads the rows added since
    the last one (by id) instead of summing every window since the lookback
    again: an hour of windows from 10,000 devices is 600,000 rows, and summing
    them took longer than the rest of the pass. Rows at or under ``floor`` are
    settled; those above it already counted are in ``above``. On a database whose
    ids may commit out of order, the floor trails the highest id seen by
    :data:`KPI_COMMIT_LAG_S` (``marks``: when each pass saw which highest id), so a
    row committed late is still read; until the first mark is that old, a new
    leader sums in full. ``clock``: monotonic seconds.
    """

    clock: Callable[[], float] = time.monotonic
    key: tuple[int, str, str, int, int] | None = None
    totals: dict[tuple[str, str], _Totals] = field(default_factory=dict)
    floor: int | None = None
    above: set[int] = field(default_factory=set)
    marks: deque[tuple[float, int]] = field(default_factory=deque)

    def settle(self, lag_s: float) -> int | None:
        """The highest id seen at least ``lag_s`` ago (every row under it is committed)."""
        settled = None
        now = self.clock()
        while self.marks and self.marks[0][0] <= now - lag_s:
            settled = self.marks.popleft()[1]
        return settled


def _recent(dep: DeploymentRecord, since_ms: int, baseline_since_ms: int) -> Any:
    t = telemetry.c
    return and_(
        t.skill == dep.skill,
        or_(
            and_(t.version == dep.version, t.window_end_ms >= since_ms),
            t.window_end_ms >= baseline_since_ms,
        ),
    )


def _p95() -> Any:
    t = telemetry.c
    return case((t.latency_p95_ms > 0, t.latency_p95_ms), else_=t.latency_p99_ms)


def _summed(conn: Connection, where: Any) -> dict[tuple[str, str], _Totals]:
    """The totals of the rows ``where`` selects, summed by the database."""
    t = telemetry.c
    query = (
        select(
            t.device_id,
            t.version,
            func.sum(t.inferences),
            func.sum(t.labelled),
            func.sum(t.correct),
            func.sum(t.errors),
            func.sum(_p95()),
            func.count(),
            func.max(t.received_ms),
        )
        .where(where)
        .group_by(t.device_id, t.version)
    )
    return {
        (r[0], r[1]): [int(v or 0) for v in r[2:6]] + [float(r[6] or 0), *r[7:]]
        for r in conn.execute(query)
    }


def _kpis(
    conn: Connection,
    ids: Any,
    targets: Mapping[str, Any],
    dep: DeploymentRecord,
    since_ms: int,
    baseline_since_ms: int,
    tally: KpiTally | None,
    kept: tuple[tuple[str, str, int, int, int, int, float, int], ...] | None = None,
) -> tuple[tuple[str, str, int, int, int, int, float, int], ...]:
    """Each target's telemetry totals per version; its p95 is the mean of its windows' p95.

    ``ids`` selects the same devices as ``targets`` holds, as a subquery. Windows
    count from ``since_ms`` on, those of versions other than the deployment's from
    ``baseline_since_ms`` on. A window without a p95 (from an agent older than the
    field) counts with its p99. With a ``tally``, only the rows added since its
    last read are read (see :class:`KpiTally`), and ``kept``, what that read
    returned for the same targets, is returned again when no total moved.
    """
    recent = _recent(dep, since_ms, baseline_since_ms)
    if tally is None:
        totals = _summed(conn, and_(recent, telemetry.c.device_id.in_(ids)))
    else:
        key = (dep.id, dep.skill, dep.version, since_ms, baseline_since_ms)
        totals, moved = _tallied(conn, recent, tally, key)
        if kept is not None and not moved:
            return kept
    return tuple(
        (device, version, int(v[0]), int(v[1]), int(v[2]), int(v[3]), v[4] / v[5], int(v[6]))
        for (device, version), v in totals.items()
        if device in targets
    )


def _tallied(
    conn: Connection, recent: Any, tally: KpiTally, key: tuple[int, str, str, int, int]
) -> tuple[dict[tuple[str, str], _Totals], bool]:
    """The tally's totals read on, and whether any of them moved (or were summed again)."""
    t = telemetry.c
    if tally.key != key:  # another deployment, or its plan moved the baseline cut: start over
        tally.key, tally.totals, tally.floor, tally.above = key, {}, None, set()
        tally.marks.clear()
    lag_s = 0.0 if conn.dialect.name == "sqlite" else KPI_COMMIT_LAG_S
    top = int(conn.execute(select(func.max(t.id))).scalar() or 0)
    tally.marks.append((tally.clock(), top))
    settled = tally.settle(lag_s)
    if tally.floor is None:
        if settled is None:  # no row is known to be committed yet: sum them all this once
            return _summed(conn, recent), True
        tally.totals, tally.floor = _summed(conn, and_(recent, t.id <= settled)), settled
        moved = True
    else:
        moved = False
    cols = (t.id, t.device_id, t.version, t.inferences, t.labelled, t.correct, t.errors)
    for r in conn.execute(select(*cols, _p95(), t.received_ms).where(recent, t.id > tally.floor)):
        if r[0] in tally.above:
            continue
        tally.above.add(r[0])
        moved = True
        v = tally.totals.setdefault((r[1], r[2]), [0, 0, 0, 0, 0.0, 0, 0])
        v[0], v[1], v[2], v[3] = v[0] + r[3], v[1] + r[4], v[2] + r[5], v[3] + r[6]
        v[4], v[5], v[6] = v[4] + float(r[7]), v[5] + 1, max(v[6], r[8])
    if settled is not None and settled > tally.floor:
        tally.floor = settled
        tally.above = {i for i in tally.above if i > settled}
    return tally.totals, moved
