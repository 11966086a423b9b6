"""``/telemetry`` and ``/drift``: what skills did, drift incidents, series for plots, settings."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from cloud.console.auth import Caller
from cloud.console.routing import (
    DriftSetter,
    Fleet,
    Name,
    Now,
    Reader,
    TimeMs,
    record,
    reply,
)
from cloud.errors import NotFoundError
from cloud.selectors import matches, parse_selector
from cloud.service import FleetService, IncidentView, TelemetryWindowView

__all__ = ["DriftSettingsBody", "router"]

router = APIRouter(tags=["telemetry and drift"])

GroupPath = Annotated[
    str, Path(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
]
IncidentPath = Annotated[int, Path(ge=0, le=2**62)]
SettingKey = Annotated[str, StringConstraints(min_length=1, max_length=64, pattern=r"^[a-z_]+$")]
SettingValue = bool | int | float | Annotated[str, StringConstraints(max_length=64)]
#: The default span of a drift series: the last day.
_DAY_MS = 86_400_000
#: Most points a series has; windows are averaged into buckets of equal time.
MAX_BUCKETS = 500


class DriftSettingsBody(BaseModel):
    """Drift settings to change; the others keep their values."""

    model_config = ConfigDict(extra="forbid")

    settings: Annotated[dict[SettingKey, SettingValue], Field(min_length=1, max_length=32)]


def _visible_devices(fleet: FleetService, caller: Caller) -> dict[str, dict[str, str]]:
    """Labels of every device the caller may see, by id."""
    devices = fleet.devices.list(project=caller.project)
    return {d.device_id: dict(d.labels) for d in devices if caller.sees_labels(d.labels)}


def _visible_groups(fleet: FleetService, caller: Caller) -> set[str]:
    groups = fleet.groups.list(project=caller.project)
    return {g.name for g in groups if caller.group in (None, g.name)}


def _visible_incident(fleet: FleetService, caller: Caller, incident_id: int) -> IncidentView:
    found = fleet.drift.show(incident_id)
    if found.state.group not in _visible_groups(fleet, caller):
        raise NotFoundError(f"no drift incident {incident_id}")
    return found


@router.get("/telemetry/summary", summary="Telemetry per device and skill")
def telemetry_summary(fleet: Fleet, caller: Reader) -> JSONResponse:
    """What each skill did on each device, summed over every window."""
    seen = _visible_devices(fleet, caller)
    return reply([s for s in fleet.telemetry.summary() if s.device_id in seen])


@router.get("/drift/incidents", summary="Drift incidents")
def list_incidents(
    fleet: Fleet, caller: Reader, everything: Annotated[bool, Query(alias="all")] = False
) -> JSONResponse:
    """The open drift incidents (all of them with ``all=true``), oldest first."""
    groups = _visible_groups(fleet, caller)
    found = fleet.drift.incidents(everything=everything)
    return reply([i for i in found if i.state.group in groups])


@router.get("/drift/incidents/{incident_id}", summary="One drift incident")
def get_incident(fleet: Fleet, caller: Reader, incident_id: IncidentPath) -> JSONResponse:
    """An incident's stages, links (job, model, version, canary) and detail."""
    return reply(_visible_incident(fleet, caller, incident_id))


def _bucketed(
    windows: list[TelemetryWindowView], since: int, until: int, buckets: int
) -> list[dict[str, Any]]:
    width = max(1, -(-(until - since) // buckets))
    sums: dict[int, dict[str, float]] = {}
    for w in windows:
        slot = (w.window_end_ms - since) // width
        acc = sums.setdefault(slot, {"windows": 0.0, "labelled": 0.0, "correct": 0.0})
        acc["windows"] += 1
        acc["labelled"] += w.labelled
        acc["correct"] += w.correct
        for key in ("drift.psi_class", "drift.psi_confidence", "drift.alarms", "drift.n"):
            if key in w.metrics:
                acc[key] = acc.get(key, 0.0) + w.metrics[key]
                acc[f"{key}#"] = acc.get(f"{key}#", 0.0) + 1
    points = []
    for slot, acc in sorted(sums.items()):
        point: dict[str, Any] = {
            "t_ms": since + slot * width,
            "windows": int(acc["windows"]),
            "accuracy": acc["correct"] / acc["labelled"] if acc["labelled"] else None,
        }
        for key in ("drift.psi_class", "drift.psi_confidence"):
            count = acc.get(f"{key}#", 0.0)
            point[key.removeprefix("drift.")] = acc[key] / count if count else None
        point["alarms"] = int(acc.get("drift.alarms", 0.0))
        points.append(point)
    return points


@router.get("/drift/series", summary="Accuracy and drift over time")
def drift_series(
    fleet: Fleet,
    caller: Reader,
    skill: Annotated[Name | None, Query()] = None,
    group: Annotated[Name | None, Query()] = None,
    since: TimeMs = None,
    buckets: Annotated[int, Query(ge=1, le=MAX_BUCKETS)] = 120,
    *,
    now: Now,
) -> JSONResponse:
    """Accuracy and drift statistics of the windows since ``since``, in equal time buckets."""
    start = now - _DAY_MS if since is None else min(since, now)
    devices = _visible_devices(fleet, caller)
    if group is not None:
        caller.check_group(group)
        selector = parse_selector(fleet.groups.get(group, project=caller.project).selector)
        devices = {d: labels for d, labels in devices.items() if matches(selector, labels)}
    windows = [
        w
        for w in fleet.drift.windows(start)
        if w.device_id in devices and (skill is None or w.skill == skill)
    ]
    points = _bucketed(windows, start, max(now, start + 1), buckets)
    return reply({"since_ms": start, "until_ms": max(now, start + 1), "points": points})


@router.get("/drift/settings/{group}", summary="A group's drift settings")
def get_settings(fleet: Fleet, caller: Reader, group: GroupPath) -> JSONResponse:
    """The group's drift settings (the defaults where none were set)."""
    caller.check_group(group)
    fleet.groups.get(group, project=caller.project)
    return reply({"group": group, "settings": fleet.drift.settings(group).to_dict()})


@router.put("/drift/settings/{group}", summary="Change a group's drift settings")
def put_settings(
    fleet: Fleet, caller: DriftSetter, group: GroupPath, body: DriftSettingsBody
) -> JSONResponse:
    """Change some of a group's drift settings; the rest keep their values."""
    caller.check_group(group)
    found = fleet.groups.get(group, project=caller.project)
    before = fleet.drift.settings(group).to_dict()
    after = fleet.drift.set_settings(group, **body.settings).to_dict()
    record(fleet, caller, "drift.settings", f"group/{group}", before, after, project=found.project)
    return reply({"group": group, "settings": after})
