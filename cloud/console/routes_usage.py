"""``/usage`` and ``/audit``: metered inferences and the log of every change, as JSON or CSV."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Query
from fastapi.responses import JSONResponse, Response, StreamingResponse

from cloud.console.routing import AuditReader, Fleet, Metering, Now, Reader, TimeMs, reply
from cloud.errors import ValidationError
from cloud.service.metering import MAX_USAGE_PAGE

__all__ = ["router"]

router = APIRouter(tags=["usage and audit"])

#: The default span of a usage report: the last 30 days.
_MONTH_MS = 30 * 86_400_000
#: Most audit entries one page returns.
MAX_AUDIT_PAGE = 1000
Format = Annotated[Literal["json", "csv"], Query()]
Filter = Annotated[str | None, Query(min_length=1, max_length=255)]
_CSV = "text/csv; charset=utf-8"


def _attachment(name: str) -> dict[str, str]:
    return {"Content-Disposition": f'attachment; filename="{name}.csv"'}


def _csv(text: str, name: str) -> Response:
    return Response(text, media_type=_CSV, headers=_attachment(name))


def _span(since: int | None, until: int | None, now: int) -> tuple[int, int]:
    end = now if until is None else until
    start = end - _MONTH_MS if since is None else since
    if start >= end:
        raise ValidationError(f"since ({start}) must be before until ({end})")
    return max(start, 0), end


@router.get("/usage", summary="Metered inferences", response_model=None)
def usage(
    metering: Metering,
    caller: Reader,
    since: TimeMs = None,
    until: TimeMs = None,
    format: Format = "json",
    limit: Annotated[int, Query(ge=1, le=MAX_USAGE_PAGE)] = 500,
    cursor: Annotated[str | None, Query(min_length=1, max_length=1024)] = None,
    *,
    now: Now,
) -> JSONResponse | Response:
    """Inferences per device, skill and version with windows ending in [since, until).

    JSON: the period's totals and one page of rows (``next_cursor`` continues it);
    CSV: every row, streamed.
    """
    caller.require_whole_project("read the project's usage")
    start, end = _span(since, until, now)
    if format == "csv":
        chunks = metering.usage_csv_chunks(caller.project, start, end)
        return StreamingResponse(chunks, media_type=_CSV, headers=_attachment("usage"))
    return reply(metering.usage_page(caller.project, start, end, limit=limit, cursor=cursor))


@router.get("/audit", summary="The audit log", response_model=None)
def audit(
    fleet: Fleet,
    caller: AuditReader,
    actor: Filter = None,
    action: Filter = None,
    since: TimeMs = None,
    until: TimeMs = None,
    q: Filter = None,
    limit: Annotated[int, Query(ge=1, le=MAX_AUDIT_PAGE)] = 100,
    before_id: Annotated[int | None, Query(ge=1, le=2**62)] = None,
    format: Format = "json",
) -> JSONResponse | Response:
    """Every change the API made, newest first, by actor, action, time and text."""
    caller.require_whole_project("read the project's audit log")
    filters = {
        "actor": actor,
        "action": action,
        "since_ms": since,
        "until_ms": until,
        "text": q,
        "limit": limit,
        "before_id": before_id,
    }
    if format == "csv":
        return _csv(fleet.audit.csv(caller.project, **filters), "audit")
    return reply(fleet.audit.search(caller.project, **filters))  # type: ignore[arg-type]
