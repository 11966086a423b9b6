"""``/fleet`` and ``/bulk``: the overview, the fleet-wide stop switch, bulk labelling."""

from __future__ import annotations

import dataclasses
from typing import Annotated

from fastapi import APIRouter
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from cloud.console.auth import Caller
from cloud.console.routes_devices import DeviceFilter, search_devices
from cloud.console.routing import (
    Bulk,
    Fleet,
    LabelKey,
    Labels,
    Reader,
    Search,
    Stopper,
    record,
    reply,
)
from cloud.errors import PermissionDeniedError, ValidationError
from cloud.selectors import MAX_LABELS, check_labels
from cloud.service import DeviceView
from cloud.service.search import DeviceSearch

__all__ = ["MAX_BULK_DEVICES", "BulkLabelBody", "StopBody", "router"]

router = APIRouter(tags=["fleet"])

#: Most devices one bulk action changes; a wider filter is refused before any change.
MAX_BULK_DEVICES = 1000
_PAGE = 500


class StopBody(BaseModel):
    """The fleet-wide stop switch: on, no rollout moves a device."""

    model_config = ConfigDict(extra="forbid")

    on: bool


class BulkLabelBody(BaseModel):
    """Labels to set (and keys to remove) on every device a filter selects."""

    model_config = ConfigDict(extra="forbid")

    filter: DeviceFilter
    set: Annotated[Labels, Field(max_length=MAX_LABELS)] = {}
    remove: Annotated[list[LabelKey], Field(max_length=MAX_LABELS)] = []
    dry_run: bool = False


@router.get("/fleet/overview", summary="The fleet at a glance")
def overview(fleet: Fleet, search: Search, caller: Reader) -> JSONResponse:
    """Presence per group, versions in the field per skill, open alerts, the stop switch."""
    found = search.overview(caller.project)
    if caller.group is not None:  # a group-scoped principal sees its group only
        groups = tuple(g for g in found.groups if g.group == caller.group)
        totals = (
            groups[0] if groups else dataclasses.replace(found.totals, online=0, stale=0, offline=0)
        )
        alerts = tuple(a for a in found.alerts if a.group == caller.group)
        found = dataclasses.replace(found, totals=totals, groups=groups, versions=(), alerts=alerts)
    return reply({"overview": found, "fleet_stopped": fleet.deployments.fleet_stopped()})


@router.post("/fleet/stop", summary="Turn the fleet-wide stop switch on or off")
def fleet_stop(fleet: Fleet, caller: Stopper, body: StopBody) -> JSONResponse:
    """Stop every rollout of the hub (or let them go on); the switch spans every project."""
    caller.require_hub_wide("the fleet-wide stop switch")
    before = fleet.deployments.fleet_stopped()
    changed = fleet.deployments.fleet_stop(body.on)
    if changed:
        record(fleet, caller, "fleet.stop", "fleet/stop", {"on": before}, {"on": body.on})
    return reply({"on": body.on, "changed": changed})


def _selected(search: DeviceSearch, caller: Caller, wanted: DeviceFilter) -> list[DeviceView]:
    devices: list[DeviceView] = []
    cursor: str | None = None
    while True:
        page = search_devices(search, caller, wanted, limit=_PAGE, cursor=cursor)
        if page.total > MAX_BULK_DEVICES:
            raise ValidationError(
                f"the filter selects {page.total} devices; a bulk action changes at most "
                f"{MAX_BULK_DEVICES}: narrow it"
            )
        devices.extend(page.devices)
        cursor = page.next_cursor
        if cursor is None or len(devices) >= MAX_BULK_DEVICES:
            return devices[:MAX_BULK_DEVICES]


@router.post("/bulk/label", summary="Label every device a filter selects")
def bulk_label(fleet: Fleet, search: Search, caller: Bulk, body: BulkLabelBody) -> JSONResponse:
    """Set and remove labels on the filtered devices; every new label set is checked first."""
    overlap = sorted(set(body.set) & set(body.remove))
    if overlap:
        raise ValidationError(f"labels both set and removed: {', '.join(overlap)}")
    devices = _selected(search, caller, body.filter)
    plans: list[tuple[DeviceView, dict[str, str]]] = []
    for device in devices:
        labels = {k: v for k, v in device.labels.items() if k not in body.remove}
        labels = check_labels({**labels, **body.set})
        if not caller.sees_labels(labels):
            raise PermissionDeniedError(
                f"the new labels would take {device.device_id} out of group {caller.group!r}"
            )
        if labels != dict(device.labels):
            plans.append((device, labels))
    if not body.dry_run and plans:
        before = {d.device_id: d for d, _ in plans}
        wanted = {d.device_id: labels for d, labels in plans}
        for after in fleet.devices.label_many(wanted, project=caller.project):  # all or none
            record(
                fleet,
                caller,
                "devices.label",
                f"device/{after.device_id}",
                {"labels": before[after.device_id].labels, "bulk": True},
                {"labels": after.labels, "bulk": True},
                project=after.project,
            )
    changes = [{"device_id": d.device_id, "labels": labels} for d, labels in plans]
    return reply(
        {
            "matched": len(devices),
            "changed": len(plans),
            "dry_run": body.dry_run,
            "changes": changes,
        }
    )
