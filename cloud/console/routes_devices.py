"""``/devices``: search the fleet, one device's whole story, its labels and telemetry."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Path, Query
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from cloud.console.auth import Caller
from cloud.console.routing import (
    MAX_PAGE,
    Fleet,
    Labeller,
    Labels,
    Name,
    Reader,
    Search,
    TimeMs,
    Version,
    record,
    reply,
)
from cloud.errors import NotFoundError, PermissionDeniedError
from cloud.selectors import MAX_LABELS, parse_labels
from cloud.service import DeviceView, FleetService, TelemetryWindowView
from cloud.service.search import DevicePage, DeviceSearch
from protos import limits

__all__ = ["DeviceFilter", "LabelsBody", "router", "search_devices", "visible_device"]

router = APIRouter(tags=["devices"])

#: Most ``label=k=v`` filters one search takes.
MAX_LABEL_FILTERS = 16
#: Most telemetry windows one read returns.
MAX_WINDOWS = 10_000
#: Telemetry windows of a device read to summarise its latest latency and accuracy.
_DETAIL_WINDOWS = 50

DevicePath = Annotated[
    str,
    Path(
        min_length=1, max_length=limits.MAX_DEVICE_ID_CHARS, pattern=f"^{limits.DEVICE_ID_PATTERN}$"
    ),
]
LabelFilter = Annotated[
    list[Annotated[str, Field(min_length=3, max_length=130)]] | None,
    Query(max_length=MAX_LABEL_FILTERS, description="A label k=v the devices carry; repeatable."),
]
ShortText = Annotated[str | None, Query(min_length=1, max_length=64)]


class DeviceFilter(BaseModel):
    """Which devices: every condition must hold (absent ones hold for all)."""

    model_config = ConfigDict(extra="forbid")

    labels: Annotated[Labels, Field(max_length=MAX_LABELS)] = {}
    board: Annotated[str | None, Field(min_length=1, max_length=64)] = None
    presence: Literal["online", "stale", "offline"] | None = None
    skill: Name | None = None
    version: Version | None = None
    seen_before_ms: Annotated[int | None, Field(ge=0, le=2**62)] = None
    seen_after_ms: Annotated[int | None, Field(ge=0, le=2**62)] = None
    text: Annotated[str | None, Field(min_length=1, max_length=64)] = None


class LabelsBody(BaseModel):
    """A device's new labels (they replace the old ones)."""

    model_config = ConfigDict(extra="forbid")

    labels: Annotated[Labels, Field(max_length=MAX_LABELS)]


def search_devices(
    search: DeviceSearch,
    caller: Caller,
    wanted: DeviceFilter,
    *,
    limit: int = 50,
    cursor: str | None = None,
) -> DevicePage:
    """One page of the devices ``wanted`` selects within the caller's reach.

    Raises:
        ValidationError: A bad filter or cursor.
        StoreError: The store failed.
    """
    return search.search(
        caller.project,
        group_selector=dict(caller.selector) if caller.selector is not None else None,
        labels=wanted.labels or None,
        profile=wanted.board,
        presence=wanted.presence,
        skill=wanted.skill,
        version=wanted.version,
        seen_before_ms=wanted.seen_before_ms,
        seen_after_ms=wanted.seen_after_ms,
        text=wanted.text,
        limit=limit,
        cursor=cursor,
    )


def visible_device(fleet: FleetService, caller: Caller, device_id: str) -> DeviceView:
    """A device the caller may see.

    Raises:
        NotFoundError: No such device in the caller's project and group scope.
        StoreError: The store failed.
    """
    device = fleet.devices.get(device_id, project=caller.project)
    if not caller.sees_labels(device.labels):
        raise NotFoundError(f"no device {device_id!r}")
    return device


@router.get("/devices", summary="Search devices")
def list_devices(
    search: Search,
    caller: Reader,
    label: LabelFilter = None,
    board: ShortText = None,
    presence: Literal["online", "stale", "offline"] | None = None,
    skill: Annotated[Name | None, Query()] = None,
    version: Annotated[Version | None, Query()] = None,
    seen_before: TimeMs = None,
    seen_after: TimeMs = None,
    q: ShortText = None,
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 50,
    cursor: Annotated[str | None, Query(min_length=1, max_length=256)] = None,
) -> JSONResponse:
    """Devices by labels, board, presence, skill and version, last seen, and id text."""
    wanted = DeviceFilter(
        labels=parse_labels(label or []),
        board=board,
        presence=presence,
        skill=skill,
        version=version,
        seen_before_ms=seen_before,
        seen_after_ms=seen_after,
        text=q,
    )
    return reply(search_devices(search, caller, wanted, limit=limit, cursor=cursor))


def _latest_per_skill(windows: list[TelemetryWindowView]) -> dict[str, dict[str, object]]:
    latest: dict[str, dict[str, object]] = {}
    for w in windows:  # oldest first: the last one of each skill wins
        accuracy = w.correct / w.labelled if w.labelled else w.metrics.get("drift.accuracy")
        drift = {k: v for k, v in w.metrics.items() if k.startswith("drift.")}
        latest[w.skill] = {
            "version": w.version,
            "window_end_ms": w.window_end_ms,
            "latency_p50_ms": w.latency_p50_ms,
            "latency_p95_ms": w.latency_p95_ms,
            "latency_p99_ms": w.latency_p99_ms,
            "inferences": w.inferences,
            "errors": w.errors,
            "accuracy": accuracy,
            "drift": drift,
        }
    return latest


@router.get("/devices/{device_id}", summary="One device")
def get_device(fleet: Fleet, caller: Reader, device_id: DevicePath) -> JSONResponse:
    """Skills desired and reported, variants, health, latency, accuracy, drift, recent events."""
    visible_device(fleet, caller, device_id)
    detail = fleet.devices.show(device_id, project=caller.project)
    windows = fleet.telemetry.windows(device_id, limit=_DETAIL_WINDOWS)
    return reply({"detail": detail, "latest": _latest_per_skill(windows)})


@router.put("/devices/{device_id}/labels", summary="Replace a device's labels")
def put_labels(
    fleet: Fleet, caller: Labeller, device_id: DevicePath, body: LabelsBody
) -> JSONResponse:
    """Replace a device's labels; its desired state follows at once."""
    before = visible_device(fleet, caller, device_id)
    if not caller.sees_labels(body.labels):
        raise PermissionDeniedError(
            f"these labels would take {device_id} out of group {caller.group!r}, "
            "which this token is limited to"
        )
    after = fleet.devices.label(device_id, body.labels, project=caller.project)
    record(
        fleet,
        caller,
        "devices.label",
        f"device/{device_id}",
        {"labels": before.labels},
        {"labels": after.labels},
        project=after.project,
    )
    return reply(after)


@router.get("/devices/{device_id}/telemetry", summary="A device's telemetry windows")
def device_telemetry(
    fleet: Fleet,
    caller: Reader,
    device_id: DevicePath,
    since: TimeMs = None,
    skill: Annotated[Name | None, Query()] = None,
    limit: Annotated[int, Query(ge=1, le=MAX_WINDOWS)] = 1000,
) -> JSONResponse:
    """The device's latest telemetry windows (of one skill), oldest first."""
    visible_device(fleet, caller, device_id)
    windows = fleet.telemetry.windows(device_id, skill, limit=limit)
    return reply([w for w in windows if since is None or w.window_end_ms >= since])
