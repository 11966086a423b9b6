"""``/models`` and ``/jobs``: the hub's model factory (hub-wide: no project owns a model)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from cloud.console.routing import Fleet, Reader, reply

__all__ = ["router"]

router = APIRouter(tags=["models"])


@router.get("/models", summary="Every model of the factory")
def list_models(fleet: Fleet, caller: Reader) -> JSONResponse:
    """Every model with its metrics and where it came from (hub admins only)."""
    caller.require_hub_wide("the model factory")
    return reply(fleet.models.tables.list_models())


@router.get("/jobs", summary="Every training job")
def list_jobs(fleet: Fleet, caller: Reader) -> JSONResponse:
    """Every training job and its state (hub admins only)."""
    caller.require_hub_wide("the model factory")
    return reply(fleet.models.tables.list_jobs())
