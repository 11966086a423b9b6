"""What the fleet shows a rollout: its targets, their reports, presence and KPIs.

Read in one transaction for the leader's rollout loop, which turns it into
rollout engine events (:mod:`cloud.rollout_loop`). A plan's
``baseline_since_ms`` keeps the baseline versions' telemetry windows that
ended before it out of their KPIs (the new version's are never cut).
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, and_, case, func, or_, select

from cloud.errors import StoreError, ValidationError
from cloud.rollout.plan import plan_from_dict
from cloud.store.records import DeploymentRecord, SkillStatusRecord
from cloud.store.schema import devices, fleet_controls, reported_states, rollouts, telemetry

__all__ = ["FLEET_ROW", "KPI_LOOKBACK_MS", "RolloutFacts", "read_facts"]

#: Telemetry older than this before a deployment was made is no baseline for it.
KPI_LOOKBACK_MS = 3600 * 1000
#: The id of the one ``fleet_controls`` row.
FLEET_ROW = 1


@dataclass(frozen=True)
class RolloutFacts:
    """What the fleet shows a rollout now.

    ``targets``: each device the group selects, with ``(last_seen_ms,
    heartbeat_ms, connected)``. ``reports``: each target's report time and
    status of the skill (when it reported it). ``kpis``: ``(device, version,
    inferences, labelled, correct, errors, p95_ms, at_ms)`` totals of the skill's
    telemetry. ``fleet_stop``: the switch and when it last changed.
    """

    targets: Mapping[str, tuple[int, int, bool]]
    reports: Mapping[str, tuple[int, SkillStatusRecord]]
    kpis: tuple[tuple[str, str, int, int, int, int, float, int], ...]
    fleet_stop: tuple[bool, int]


def read_facts(conn: Connection, dep: DeploymentRecord, where: Any) -> RolloutFacts:
    """Read the facts of ``dep``'s rollout; ``where`` keeps the devices its group selects.

    Raises:
        StoreError: Stored data is corrupt.
    """
    ids = select(devices.c.device_id).where(where)
    cols = (devices.c.device_id, devices.c.last_seen_ms, devices.c.heartbeat_ms, devices.c.online)
    targets = {
        r.device_id: (int(r.last_seen_ms), int(r.heartbeat_ms), bool(r.online))
        for r in conn.execute(select(*cols).where(where))
    }
    reports: dict[str, tuple[int, SkillStatusRecord]] = {}
    for row in conn.execute(select(reported_states).where(reported_states.c.device_id.in_(ids))):
        status = _skill_status(row.device_id, row.skills, dep.skill)
        if status is not None:
            reports[row.device_id] = (int(row.reported_ms), status)
    since = dep.created_ms - KPI_LOOKBACK_MS
    cut = _baseline_since(conn, dep.id)
    kpis = _kpis(conn, ids, dep, since, since if cut is None else max(since, cut))
    switch = conn.execute(select(fleet_controls).where(fleet_controls.c.id == FLEET_ROW)).first()
    flag = (bool(switch.stopped), int(switch.changed_ms)) if switch else (False, -1)
    return RolloutFacts(targets, reports, kpis, flag)


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


def _kpis(
    conn: Connection, ids: Any, dep: DeploymentRecord, since_ms: int, baseline_since_ms: int
) -> tuple[tuple[str, str, int, int, int, int, float, int], ...]:
    """Each target's telemetry totals per version; its p95 is the mean of its windows' p95.

    Windows count from ``since_ms`` on, those of versions other than the
    deployment's from ``baseline_since_ms`` on. A window without a p95 (from
    an agent older than the field) counts with its p99.
    """
    t = telemetry.c
    recent = or_(
        and_(t.version == dep.version, t.window_end_ms >= since_ms),
        t.window_end_ms >= baseline_since_ms,
    )
    query = (
        select(
            t.device_id,
            t.version,
            func.sum(t.inferences),
            func.sum(t.labelled),
            func.sum(t.correct),
            func.sum(t.errors),
            func.avg(case((t.latency_p95_ms > 0, t.latency_p95_ms), else_=t.latency_p99_ms)),
            func.max(t.received_ms),
        )
        .where(and_(t.skill == dep.skill, recent, t.device_id.in_(ids)))
        .group_by(t.device_id, t.version)
    )
    return tuple(
        (
            r[0],
            r[1],
            int(r[2] or 0),
            int(r[3] or 0),
            int(r[4] or 0),
            int(r[5] or 0),
            float(r[6] or 0),
            int(r[7]),
        )
        for r in conn.execute(query)
    )
