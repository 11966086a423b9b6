"""``/skills``: published skill versions, and where each is deployed."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Path
from fastapi.responses import JSONResponse

from cloud.console.routing import Fleet, Reader, reply
from cloud.errors import NotFoundError
from cloud.service import SkillVersionView

__all__ = ["router"]

router = APIRouter(tags=["skills"])

SkillPath = Annotated[
    str, Path(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
]


def _by_skill(versions: list[SkillVersionView]) -> list[dict[str, object]]:
    skills: dict[str, list[SkillVersionView]] = {}
    for v in versions:
        skills.setdefault(v.name, []).append(v)
    return [
        {"name": name, "project": found[-1].project, "latest": found[-1].version, "versions": found}
        for name, found in sorted(skills.items())
    ]


@router.get("/skills", summary="Every skill")
def list_skills(fleet: Fleet, caller: Reader) -> JSONResponse:
    """Every skill of the project with its published versions, oldest first."""
    return reply(_by_skill(fleet.skills.list(project=caller.project)))


@router.get("/skills/{name}", summary="One skill")
def get_skill(fleet: Fleet, caller: Reader, name: SkillPath) -> JSONResponse:
    """A skill's versions (immutable, signed), the deployments of each, and their lineage.

    ``lineage`` has one row per model artefact a version ships: its target and
    variant, the model it came from, and that model's training job and data set.
    """
    versions = fleet.skills.list(name, project=caller.project)
    if not versions:
        raise NotFoundError(f"no skill {name!r}")
    deployments = [
        d
        for d in fleet.deployments.list(project=caller.project)
        if d.skill == name and caller.group in (None, d.group)
    ]
    lineage = fleet.skills.lineage(name, project=caller.project)
    return reply({**_by_skill(versions)[0], "deployments": deployments, "lineage": lineage})
