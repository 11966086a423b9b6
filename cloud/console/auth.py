"""Who is calling: the bearer token, the principal it names, and the reach of its scope.

Every route takes a :class:`Caller` through :func:`allow`, which names the action
the route performs: the token is authenticated (:class:`~cloud.errors.AuthError`,
401, when missing or invalid), the principal must hold the action
(:class:`~cloud.errors.PermissionDeniedError`, 403), and its project and group
scope are resolved once. Routes pass ``caller.project`` as ``project=`` to every
service call and filter device reads and deployments through the group scope.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import Depends, Query, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from cloud.errors import (
    AuthError,
    NotFoundError,
    PermissionDeniedError,
    StoreError,
    ValidationError,
)
from cloud.selectors import matches, parse_selector

if TYPE_CHECKING:
    from cloud.service import FleetService
    from cloud.service.access import Principal

__all__ = [
    "MAX_TOKEN_CHARS",
    "NAME_PATTERN",
    "Caller",
    "action_of",
    "allow",
    "fleet_of",
    "merge_selectors",
]

#: Longest bearer secret read; longer headers are refused before hashing.
MAX_TOKEN_CHARS = 256
#: What project, group, skill and token names look like (the store checks them again).
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"

_bearer = HTTPBearer(auto_error=False, description="An API token: `Bearer est_<id>_<secret>`.")

ProjectQuery = Annotated[
    str | None,
    Query(
        max_length=64,
        pattern=NAME_PATTERN,
        description="Hub admins: the project to act in (default: every project).",
    ),
]


def fleet_of(request: Request) -> FleetService:
    """The fleet service the app serves."""
    fleet: FleetService = request.app.state.fleet
    return fleet


def merge_selectors(
    scope: Mapping[str, str] | None, wanted: Mapping[str, str]
) -> dict[str, str] | None:
    """The selector that selects what both select; None when they contradict (nothing)."""
    merged = dict(scope or {})
    for key, value in wanted.items():
        if merged.get(key, value) != value:
            return None
        merged[key] = value
    return merged


@dataclass(frozen=True)
class Caller:
    """An authenticated principal and the project and group scope its calls run in.

    Attributes:
        principal: Who calls, as the token service authenticated it.
        project: What routes pass as ``project=``: the token's project, or for a hub
            admin the ``?project=`` it asked for (None: every project).
        group: The group the principal is limited to (None: the whole project).
        selector: That group's selector (None without a group scope).
    """

    principal: Principal
    project: str | None
    group: str | None = None
    selector: Mapping[str, str] | None = None

    @property
    def hub_wide(self) -> bool:
        """Whether the principal reaches every project (a hub admin's token)."""
        return self.principal.project is None

    def sees_labels(self, labels: Mapping[str, str]) -> bool:
        """Whether a device with these labels is inside the group scope."""
        return self.selector is None or matches(self.selector, labels)

    def check_group(self, group: str) -> None:
        """Refuse a group outside the group scope as if it did not exist.

        Raises:
            NotFoundError: The principal is limited to another group.
        """
        if self.group is not None and group != self.group:
            raise NotFoundError(f"no group {group!r}")

    def require_hub_wide(self, what: str) -> None:
        """Refuse what only a hub admin (a token of no project) may do.

        Raises:
            PermissionDeniedError: The token belongs to a project.
        """
        if not self.hub_wide:
            raise PermissionDeniedError(f"{what} belongs to the whole hub; use a hub admin token")

    def require_whole_project(self, what: str) -> None:
        """Refuse what a principal limited to one group may not do.

        Raises:
            PermissionDeniedError: The principal is limited to a group.
        """
        if self.group is not None:
            raise PermissionDeniedError(f"a token limited to group {self.group!r} cannot {what}")

    @property
    def home_project(self) -> str:
        """The project what this caller creates goes to (``default`` for a hub admin's)."""
        return self.project or "default"

    def audit_project(self, view: object = None) -> str:
        """The project an audit entry about ``view`` belongs to."""
        found = getattr(view, "project", None)
        if isinstance(found, str) and found:
            return found
        return self.home_project


def _secret(request: Request, credentials: HTTPAuthorizationCredentials | None) -> str:
    if credentials is None:
        if request.headers.get("authorization"):
            raise AuthError("the Authorization header must be 'Bearer <token>'")
        raise AuthError("this API needs a token: send 'Authorization: Bearer est_...'")
    secret = credentials.credentials.strip()
    if not secret or len(secret) > MAX_TOKEN_CHARS:
        raise AuthError("invalid API token")
    return secret


def _resolve(fleet: FleetService, principal: Principal, project: str | None) -> Caller:
    chosen = principal.project_for(project)
    if principal.group is None:
        return Caller(principal, chosen)
    try:
        group = fleet.groups.get(principal.group, project=chosen)
    except NotFoundError as exc:
        raise PermissionDeniedError(
            f"the token's group {principal.group!r} no longer exists"
        ) from exc
    try:
        selector = parse_selector(group.selector)
    except ValidationError as exc:
        raise StoreError(f"group {group.name!r} has a corrupt selector") from exc
    return Caller(principal, chosen, group.name, selector)


def allow(action: str) -> Callable[..., Caller]:
    """A dependency giving the route's :class:`Caller`, once it may perform ``action``.

    The returned callable carries ``action`` as an attribute, so tests can read
    what each route of the app requires.

    Raises:
        AuthError: (when called) No token, or one that is unknown, revoked or expired.
        PermissionDeniedError: (when called) The role does not allow ``action``, or a
            project token asked for another project.
    """

    def caller(
        request: Request,
        credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)],
        project: ProjectQuery = None,
    ) -> Caller:
        fleet = fleet_of(request)
        principal = fleet.tokens.authenticate(_secret(request, credentials))
        principal.require(action)
        return _resolve(fleet, principal, project)

    setattr(caller, "action", action)  # noqa: B010 - read by the route-table tests
    return caller


def action_of(dependency: Any) -> str | None:
    """The action an :func:`allow` dependency requires (None for other callables)."""
    found = getattr(dependency, "action", None)
    return found if isinstance(found, str) else None
