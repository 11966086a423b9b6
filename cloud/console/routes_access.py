"""``/whoami``, ``/tokens`` and ``/projects``: who calls, API tokens, tenants."""

from __future__ import annotations

from typing import Annotated, Literal

from fastapi import APIRouter, Path
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from cloud.console.routing import (
    Admin,
    Fleet,
    HubAdmin,
    Name,
    ProjectReader,
    Reader,
    TokenReader,
    record,
    reply,
)

__all__ = ["ProjectBody", "TokenBody", "router"]

router = APIRouter(tags=["access"])

TokenPath = Annotated[str, Path(min_length=1, max_length=32, pattern=r"^[0-9a-f]+$")]
#: Longest token lifetime asked for: ten years.
_MAX_TTL_S = 10 * 365 * 86_400


class TokenBody(BaseModel):
    """A new API token: what it is for, its role, and the reach of its scope."""

    model_config = ConfigDict(extra="forbid")

    name: Name
    role: Literal["viewer", "operator", "admin"]
    project: Name | None = None
    group: Name | None = None
    ttl_s: Annotated[int | None, Field(ge=1, le=_MAX_TTL_S)] = None


class ProjectBody(BaseModel):
    """A new project."""

    model_config = ConfigDict(extra="forbid")

    name: Name


@router.get("/whoami", summary="Who this token is")
def whoami(caller: Reader) -> JSONResponse:
    """The token's actor, role, project and group scope, and the project it acts in."""
    p = caller.principal
    return reply(
        {
            "actor": p.actor,
            "role": p.role,
            "project": p.project,
            "group": p.group,
            "acting_in": caller.project,
        }
    )


@router.get("/tokens", summary="The project's API tokens")
def list_tokens(fleet: Fleet, caller: TokenReader) -> JSONResponse:
    """The project's tokens (every token for a hub admin), never their secrets."""
    tokens = fleet.tokens.list(caller.project)
    return reply([t for t in tokens if caller.group in (None, t.group)])


@router.post("/tokens", summary="Create an API token", status_code=201)
def create_token(fleet: Fleet, caller: Admin, body: TokenBody) -> JSONResponse:
    """A new token; its secret is in this answer only."""
    project = body.project if body.project is not None else caller.project
    view, secret = fleet.tokens.create(
        body.name, body.role, project, body.group, body.ttl_s, by=caller.principal
    )
    record(fleet, caller, "tokens.create", f"token/{view.token_id}", None, view)
    return reply({"token": view, "secret": secret}, 201)


@router.delete("/tokens/{token_id}", summary="Revoke an API token")
def revoke_token(fleet: Fleet, caller: Admin, token_id: TokenPath) -> JSONResponse:
    """Revoke a token of the project; it stops working at once."""
    caller.require_whole_project("revoke tokens")
    before = next((t for t in fleet.tokens.list(caller.project) if t.token_id == token_id), None)
    after = fleet.tokens.revoke(token_id, caller.project)
    record(fleet, caller, "tokens.revoke", f"token/{token_id}", before, after)
    return reply(after)


@router.get("/projects", summary="Projects")
def list_projects(fleet: Fleet, caller: ProjectReader) -> JSONResponse:
    """Every project for a hub admin; a project's admin sees its own."""
    found = fleet.projects.list()
    return reply([p for p in found if caller.project in (None, p.name)])


@router.post("/projects", summary="Create a project", status_code=201)
def create_project(fleet: Fleet, caller: HubAdmin, body: ProjectBody) -> JSONResponse:
    """Create a project (hub admins only)."""
    created = fleet.projects.create(body.name)
    record(
        fleet,
        caller,
        "projects.create",
        f"project/{created.name}",
        None,
        created,
        project=created.name,
    )
    return reply(created, 201)
