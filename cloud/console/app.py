"""The console's FastAPI app: the REST API under ``/api/v1`` and the pages at ``/``.

The API is a thin face over the fleet service layer, the same one the CLI
uses: each route authenticates the caller, checks the action it performs,
passes the caller's project as ``project=`` to the services, and writes an
audit entry for every change it makes. OpenAPI is published at
``/api/v1/openapi.json`` (interactive docs at ``/api/v1/docs``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from fastapi import APIRouter, FastAPI
from fastapi.responses import FileResponse, JSONResponse
from fastapi.staticfiles import StaticFiles

from cloud.console import (
    routes_access,
    routes_deployments,
    routes_devices,
    routes_drift,
    routes_events,
    routes_fleet,
    routes_groups,
    routes_models,
    routes_skills,
    routes_usage,
)
from cloud.console.assets import STATIC_ROOT, asset_root
from cloud.console.errors import error_response, install_error_handlers
from cloud.console.guard import MAX_BODY_BYTES, Guard
from cloud.service import FleetService
from protos.envelope import now_ms

__all__ = ["API_PREFIX", "create_app"]

API_PREFIX = "/api/v1"
_ROUTERS = (
    routes_access,
    routes_devices,
    routes_groups,
    routes_skills,
    routes_deployments,
    routes_fleet,
    routes_drift,
    routes_models,
    routes_usage,
    routes_events,
)


def _pages(app: FastAPI) -> None:
    index = STATIC_ROOT / "index.html"

    @app.get("/", include_in_schema=False)
    def console_page() -> Any:
        if not index.is_file():
            return error_response(404, "the console's pages are not installed")
        return FileResponse(index, headers={"Cache-Control": "no-cache"})

    app.mount("/static", StaticFiles(directory=STATIC_ROOT, check_dir=False), name="static")
    assets = asset_root()
    if assets is not None:
        app.mount("/assets", StaticFiles(directory=assets), name="assets")
        return

    @app.get("/assets/{path:path}", include_in_schema=False)
    def no_assets(path: str) -> JSONResponse:
        return error_response(
            404, f"no asset {path[:200]!r}: the console's assets are not installed"
        )


def create_app(
    fleet: FleetService,
    *,
    clock: Callable[[], int] = now_ms,
    poll_s: float | None = None,
) -> FastAPI:
    """The console app over ``fleet``.

    Args:
        fleet: The fleet service every route goes through (the caller keeps it open).
        clock: Milliseconds since the Unix epoch (default spans of reports, series).
        poll_s: Seconds between two looks at the event log in the live stream.
    """
    app = FastAPI(
        title="EdgeSkill console API",
        version="1",
        summary="Devices, groups, skills, deployments, drift, usage and audit of one hub.",
        openapi_url=f"{API_PREFIX}/openapi.json",
        docs_url=f"{API_PREFIX}/docs",
        redoc_url=None,
    )
    app.state.fleet = fleet
    app.state.search, app.state.metering = fleet.search, fleet.metering
    app.state.clock = clock
    if poll_s is not None:
        app.state.poll_s = poll_s
    install_error_handlers(app)
    app.add_middleware(Guard, max_body=MAX_BODY_BYTES)
    api = APIRouter(prefix=API_PREFIX)
    for module in _ROUTERS:
        api.include_router(module.router)
    app.include_router(api)
    _pages(app)
    return app
