"""What the route modules share: the caller of each action, replies, audit entries, caps."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import Depends, Query, Request
from fastapi.responses import JSONResponse
from pydantic import StringConstraints

from cloud.console.auth import NAME_PATTERN, Caller, allow, fleet_of
from cloud.console.serialize import to_json
from cloud.selectors import MAX_LABEL_KEY_LEN, MAX_LABEL_VALUE_LEN, MAX_LABELS
from cloud.service import FleetService
from cloud.service.metering import MeteringService
from cloud.service.search import DeviceSearch
from protos import limits

__all__ = [
    "MAX_PAGE",
    "MAX_SELECTOR_CHARS",
    "Admin",
    "AuditReader",
    "Bulk",
    "Deployer",
    "DeviceId",
    "DriftSetter",
    "Fleet",
    "GroupWriter",
    "HubAdmin",
    "LabelKey",
    "LabelValue",
    "Labeller",
    "Labels",
    "Metering",
    "Name",
    "Now",
    "ProjectReader",
    "Reader",
    "Search",
    "Stopper",
    "TimeMs",
    "TokenReader",
    "Version",
    "record",
    "reply",
]

#: Most items one page of a listing holds.
MAX_PAGE = 500
#: Longest selector text read (every label a device may carry).
MAX_SELECTOR_CHARS = MAX_LABELS * (MAX_LABEL_KEY_LEN + MAX_LABEL_VALUE_LEN + 2)

Fleet = Annotated[FleetService, Depends(fleet_of)]


def search_of(request: Request) -> DeviceSearch:
    """The device search the app serves."""
    found: DeviceSearch = request.app.state.search
    return found


def metering_of(request: Request) -> MeteringService:
    """The metering service the app serves."""
    found: MeteringService = request.app.state.metering
    return found


Search = Annotated[DeviceSearch, Depends(search_of)]
Metering = Annotated[MeteringService, Depends(metering_of)]


def now_of(request: Request) -> int:
    """The app's clock now, in milliseconds since the Unix epoch."""
    return int(request.app.state.clock())


Now = Annotated[int, Depends(now_of)]
Reader = Annotated[Caller, Depends(allow("read"))]
Labeller = Annotated[Caller, Depends(allow("devices.label"))]
GroupWriter = Annotated[Caller, Depends(allow("groups.write"))]
Deployer = Annotated[Caller, Depends(allow("deployments.write"))]
Bulk = Annotated[Caller, Depends(allow("bulk"))]
DriftSetter = Annotated[Caller, Depends(allow("drift.settings"))]
Stopper = Annotated[Caller, Depends(allow("fleet.stop"))]
Admin = Annotated[Caller, Depends(allow("tokens.write"))]
TokenReader = Annotated[Caller, Depends(allow("tokens.read"))]
AuditReader = Annotated[Caller, Depends(allow("audit.read"))]
ProjectReader = Annotated[Caller, Depends(allow("projects.read"))]
HubAdmin = Annotated[Caller, Depends(allow("projects.write"))]

Name = Annotated[str, StringConstraints(min_length=1, max_length=64, pattern=NAME_PATTERN)]
LabelKey = Annotated[
    str,
    StringConstraints(min_length=1, max_length=MAX_LABEL_KEY_LEN, pattern=r"^[A-Za-z0-9._/-]+$"),
]
LabelValue = Annotated[
    str,
    StringConstraints(min_length=1, max_length=MAX_LABEL_VALUE_LEN, pattern=r"^[A-Za-z0-9._/-]+$"),
]
Labels = dict[LabelKey, LabelValue]
DeviceId = Annotated[
    str,
    StringConstraints(
        min_length=1, max_length=limits.MAX_DEVICE_ID_CHARS, pattern=f"^{limits.DEVICE_ID_PATTERN}$"
    ),
]
Version = Annotated[
    str,
    StringConstraints(
        min_length=1,
        max_length=limits.MAX_VERSION_CHARS,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9.+_-]*$",
    ),
]
#: Milliseconds since the Unix epoch, as a query parameter.
TimeMs = Annotated[int | None, Query(ge=0, le=2**62)]


def reply(value: object, status: int = 200) -> JSONResponse:
    """A JSON response of a service view (or of plain values holding views)."""
    return JSONResponse(to_json(value), status_code=status)


def _as_dict(value: object) -> dict[str, Any]:
    data = to_json(value)
    if data is None:
        return {}
    return data if isinstance(data, dict) else {"value": data}


def record(
    fleet: FleetService,
    caller: Caller,
    action: str,
    target: str,
    before: object = None,
    after: object = None,
    *,
    project: str | None = None,
) -> None:
    """Write the audit entry of a change the API made (views become JSON objects).

    The entry's project is ``project``, else the ``project`` of the view after (or
    before) the change, else the caller's.

    Raises:
        ValidationError: A field over the audit log's caps.
        StoreError: The store failed.
    """
    fleet.audit.record(
        caller.principal,
        action,
        target,
        _as_dict(before),
        _as_dict(after),
        project or caller.audit_project(after if after is not None else before),
    )
