"""``/events/stream``: server-sent events telling pages to refetch when the hub changed.

The stream polls the newest id of the hub's event log about once a second
(one indexed query) and sends ``event: change`` with that id when it moved,
and a comment line every :data:`HEARTBEAT_S` seconds so proxies keep the
connection open. The id says only that something happened, not what: a page
refetches what it shows through the other routes, which apply the caller's
scope. A project-bound caller gets a change only when one of the new events
concerns a device, group, skill or deployment of its project (checked only
when the log moved), so it learns nothing of other projects.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections.abc import AsyncIterator

import anyio.to_thread
from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse

from cloud.console.auth import Caller
from cloud.console.routing import Fleet, Reader
from cloud.service import EventView, FleetService

__all__ = ["HEARTBEAT_S", "POLL_S", "router"]

router = APIRouter(tags=["live"])

#: Seconds between two looks at the event log.
POLL_S = 1.0
#: Seconds between two heartbeat comments.
HEARTBEAT_S = 15.0
#: Most new events read to judge whether they concern a project.
_MAX_NEW = 1000
_DEPLOYMENT_RE = re.compile(r"\bdeployment (\d+)\b")


def _newest(fleet: FleetService) -> int:
    found = fleet.events.recent(limit=1)
    return found[-1].id if found else 0


def _concerns(fleet: FleetService, caller: Caller, events: list[EventView]) -> bool:
    """Whether any of ``events`` is about something the caller may see."""
    if caller.project is None and caller.group is None:
        return bool(events)
    devices = {
        d.device_id
        for d in fleet.devices.list(project=caller.project)
        if caller.sees_labels(d.labels)
    }
    deployments = {
        d.id
        for d in fleet.deployments.list(project=caller.project)
        if caller.group in (None, d.group)
    }
    names = {g.name for g in fleet.groups.list(project=caller.project)}
    names |= {s.name for s in fleet.skills.list(project=caller.project)}
    for e in events:
        if e.device_id:
            if e.device_id in devices:
                return True
            continue
        found = _DEPLOYMENT_RE.search(e.message)
        if (found and int(found.group(1)) in deployments) or (not found and e.subject in names):
            return True
    return False


def _change(fleet: FleetService, caller: Caller, seen: int) -> tuple[int, bool]:
    """The newest event id, and whether the events after ``seen`` concern the caller."""
    newest = _newest(fleet)
    if newest <= seen:
        return newest, False
    if caller.project is None and caller.group is None:
        return newest, True
    events = fleet.events.after(seen, limit=_MAX_NEW)
    return newest, _concerns(fleet, caller, events)


async def _stream(
    request: Request, fleet: FleetService, caller: Caller, poll_s: float, heartbeat_s: float
) -> AsyncIterator[str]:
    seen = await anyio.to_thread.run_sync(_newest, fleet)
    yield f"retry: 3000\nevent: hello\ndata: {json.dumps({'id': seen})}\n\n"
    quiet = 0.0
    while not await request.is_disconnected():
        await asyncio.sleep(poll_s)
        newest, concerns = await anyio.to_thread.run_sync(_change, fleet, caller, seen)
        seen = min(seen, newest)
        if concerns:
            seen = newest
            quiet = 0.0
            yield f"event: change\ndata: {json.dumps({'id': newest})}\n\n"
            continue
        seen = max(seen, newest)
        quiet += poll_s
        if quiet >= heartbeat_s:
            quiet = 0.0
            yield ": heartbeat\n\n"


@router.get(
    "/events/stream",
    summary="Live changes (server-sent events)",
    response_class=StreamingResponse,
    responses={200: {"content": {"text/event-stream": {}}}},
)
async def events_stream(request: Request, fleet: Fleet, caller: Reader) -> StreamingResponse:
    """``event: change`` with the newest event id whenever the hub changed; pages refetch."""
    poll_s = float(getattr(request.app.state, "poll_s", POLL_S))
    heartbeat_s = float(getattr(request.app.state, "heartbeat_s", HEARTBEAT_S))
    return StreamingResponse(
        _stream(request, fleet, caller, poll_s, heartbeat_s),
        media_type="text/event-stream",
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )
