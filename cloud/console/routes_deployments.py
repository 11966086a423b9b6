"""``/deployments``: roll a skill version out to a group, watch it, steer it."""

from __future__ import annotations

from collections import Counter
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, StringConstraints

from cloud.console.auth import Caller
from cloud.console.routing import Deployer, Fleet, Name, Reader, Version, record, reply
from cloud.errors import NotFoundError
from cloud.service import DeploymentView, FleetService
from protos import limits

__all__ = ["DeploymentBody", "router"]

router = APIRouter(tags=["deployments"])

DeploymentPath = Annotated[int, Path(ge=1, le=2**62)]
ConfigKey = Annotated[
    str, StringConstraints(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
]
ConfigValue = Annotated[str, StringConstraints(max_length=limits.MAX_CONFIG_VALUE_BYTES)]
Window = Annotated[str, StringConstraints(min_length=1, max_length=64)]
#: The rollout strategies (:mod:`cloud.rollout`).
Strategy = Literal["all-at-once", "canary", "waves", "rolling", "ab"]
#: Most keys of a rollout plan table (it has a dozen; nested gates add a few).
_MAX_PLAN_KEYS = 32


class DeploymentBody(BaseModel):
    """A deployment: a skill version on a group with a strategy, config and priority."""

    model_config = ConfigDict(extra="forbid")

    skill: Name
    version: Version
    group: Name
    strategy: Strategy | None = None
    config: Annotated[
        dict[ConfigKey, ConfigValue], Field(max_length=limits.MAX_CONFIG_ENTRIES)
    ] = {}
    priority: Annotated[int | None, Field(ge=-1000, le=1000)] = None
    canary: Annotated[str | None, Field(min_length=1, max_length=16)] = None
    windows: Annotated[list[Window], Field(max_length=16)] = []
    plan: Annotated[dict[str, Any] | None, Field(max_length=_MAX_PLAN_KEYS)] = None


def _visible(fleet: FleetService, caller: Caller, deployment_id: int) -> DeploymentView:
    found = fleet.deployments.get(deployment_id, project=caller.project)
    if caller.group not in (None, found.group):
        raise NotFoundError(f"no deployment {deployment_id}")
    return found


@router.get("/deployments", summary="Every deployment")
def list_deployments(fleet: Fleet, caller: Reader) -> JSONResponse:
    """Every deployment of the project (to the scope's group), oldest first."""
    found = fleet.deployments.list(project=caller.project)
    return reply([d for d in found if caller.group in (None, d.group)])


@router.post("/deployments", summary="Deploy a skill version to a group", status_code=201)
def create_deployment(fleet: Fleet, caller: Deployer, body: DeploymentBody) -> JSONResponse:
    """Deploy: all at once, or staged by a canary, waves or an A/B test."""
    caller.check_group(body.group)
    created = fleet.deployments.create(
        body.skill,
        body.version,
        body.group,
        strategy=body.strategy,
        config=body.config,
        plan=body.plan,
        canary=body.canary,
        priority=body.priority,
        windows=body.windows,
        project=caller.home_project,
    )
    record(fleet, caller, "deployments.create", f"deployment/{created.id}", None, created)
    return reply(created, 201)


@router.get("/deployments/{deployment_id}", summary="One deployment's status")
def get_deployment(fleet: Fleet, caller: Reader, deployment_id: DeploymentPath) -> JSONResponse:
    """A deployment, each target device's standing, and its rollout's waves and gates."""
    _visible(fleet, caller, deployment_id)
    status = fleet.deployments.status(deployment_id, project=caller.project)[0]
    tally = Counter(d.status for d in status.devices)
    counts = {s: tally[s] for s in sorted(tally)}
    return reply({"status": status, "total": status.total, "counts": counts})


def _steer(fleet: FleetService, caller: Caller, deployment_id: int, command: str) -> JSONResponse:
    before = _visible(fleet, caller, deployment_id)
    steer = getattr(fleet.deployments, command)
    after = steer(deployment_id, project=caller.project)
    rollout = fleet.deployments.rollout(deployment_id, project=caller.project)
    record(
        fleet,
        caller,
        f"deployments.{command}",
        f"deployment/{deployment_id}",
        before,
        {**vars(after), "requested": command},
        project=after.project,
    )
    return reply({"deployment": after, "rollout": rollout})


@router.post("/deployments/{deployment_id}/pause", summary="Pause a staged rollout")
def pause(fleet: Fleet, caller: Deployer, deployment_id: DeploymentPath) -> JSONResponse:
    """Hold a staged rollout: no new wave opens until resumed."""
    return _steer(fleet, caller, deployment_id, "pause")


@router.post("/deployments/{deployment_id}/resume", summary="Resume a paused rollout")
def resume(fleet: Fleet, caller: Deployer, deployment_id: DeploymentPath) -> JSONResponse:
    """Let a paused staged rollout carry on."""
    return _steer(fleet, caller, deployment_id, "resume")


@router.post("/deployments/{deployment_id}/abort", summary="Abort a deployment")
def abort(fleet: Fleet, caller: Deployer, deployment_id: DeploymentPath) -> JSONResponse:
    """Stop a deployment where it is (all at once: its devices fall back)."""
    return _steer(fleet, caller, deployment_id, "abort")


@router.post("/deployments/{deployment_id}/rollback", summary="Roll a deployment back")
def rollback(fleet: Fleet, caller: Deployer, deployment_id: DeploymentPath) -> JSONResponse:
    """Return every device the deployment moved to the version it ran before."""
    return _steer(fleet, caller, deployment_id, "rollback")
