"""``/groups``: named label selectors, a preview of what a selector would select."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path, Query
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from cloud.console.routes_devices import DeviceFilter, search_devices
from cloud.console.routing import (
    MAX_PAGE,
    MAX_SELECTOR_CHARS,
    Fleet,
    GroupWriter,
    Name,
    Reader,
    Search,
    record,
    reply,
)
from cloud.selectors import parse_selector

__all__ = ["GroupBody", "router"]

router = APIRouter(tags=["groups"])

GroupPath = Annotated[
    str, Path(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
]
Selector = Annotated[str, Field(max_length=MAX_SELECTOR_CHARS)]


class GroupBody(BaseModel):
    """A new group: its name and label selector (``all_devices`` for every device)."""

    model_config = ConfigDict(extra="forbid")

    name: Name
    selector: Selector = ""
    all_devices: bool = False


@router.get("/groups", summary="Every group")
def list_groups(fleet: Fleet, caller: Reader) -> JSONResponse:
    """Every group of the project (only its own for a group-scoped token), by name."""
    groups = fleet.groups.list(project=caller.project)
    return reply([g for g in groups if caller.group in (None, g.name)])


@router.post("/groups", summary="Create a group", status_code=201)
def create_group(fleet: Fleet, caller: GroupWriter, body: GroupBody) -> JSONResponse:
    """Create a group in the caller's project."""
    caller.require_whole_project("create groups")
    group = fleet.groups.create(
        body.name, body.selector, all_devices=body.all_devices, project=caller.home_project
    )
    record(fleet, caller, "groups.create", f"group/{group.name}", None, group)
    return reply(group, 201)


@router.get("/groups/preview", summary="Devices a selector would select")
def preview_group(
    search: Search,
    caller: Reader,
    selector: Annotated[str, Query(max_length=MAX_SELECTOR_CHARS)] = "",
    limit: Annotated[int, Query(ge=1, le=MAX_PAGE)] = 50,
) -> JSONResponse:
    """How many devices (of the project, within the scope) a selector selects, and a page."""
    wanted = DeviceFilter(labels=parse_selector(selector))
    page = search_devices(search, caller, wanted, limit=limit)
    return reply({"count": page.total, "devices": page.devices, "next_cursor": page.next_cursor})


@router.get("/groups/{name}", summary="One group")
def get_group(fleet: Fleet, search: Search, caller: Reader, name: GroupPath) -> JSONResponse:
    """One group, the first page of its devices and the deployments to it."""
    caller.check_group(name)
    group = fleet.groups.get(name, project=caller.project)
    page = search_devices(search, caller, DeviceFilter(labels=parse_selector(group.selector)))
    deployments = [d for d in fleet.deployments.list(project=caller.project) if d.group == name]
    return reply(
        {
            "group": group,
            "devices": page.devices,
            "count": page.total,
            "next_cursor": page.next_cursor,
            "deployments": deployments,
        }
    )
