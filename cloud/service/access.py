"""Who may do what: principals, roles, API tokens, projects and the audit log.

A **principal** is whoever makes a request: the holder of an API token, or the
local CLI (an admin of every project). Its **role** says what it may do:

- ``viewer`` reads everything in its project (within its group scope);
- ``operator`` also labels devices, edits groups, deploys and steers rollouts,
  runs bulk actions, sets drift policies and publishes skills;
- ``admin`` also manages the project's tokens and reads its audit log.

A principal bound to a **project** sees nothing of other projects; one with no
project (a hub admin) sees every project and may create projects and move
devices between them. A **group scope** limits a role to the devices one group
selects and to deployments to that group.

Tokens are ``est_<id>_<secret>``: the id is public (it names the token in lists
and the audit log), the secret is shown once and only its SHA-256 is kept.
"""

from __future__ import annotations

import builtins
import csv
import getpass
import hashlib
import hmac
import io
import json
import re
import secrets
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Literal, get_args

from cloud.errors import AuthError, NotFoundError, PermissionDeniedError, ValidationError
from cloud.store import Store
from cloud.store.access import MAX_AUDIT_PAGE, AuditRecord, NewAudit, TokenRecord
from protos.envelope import now_ms

__all__ = [
    "ACTIONS",
    "AUDIT_MIN_RETENTION_DAYS",
    "AUDIT_RETENTION_DAYS",
    "AuditService",
    "AuditView",
    "Principal",
    "ProjectService",
    "Role",
    "TokenService",
    "TokenView",
]

Role = Literal["viewer", "operator", "admin"]
_RANK: dict[str, int] = {"viewer": 0, "operator": 1, "admin": 2}

#: Every action a request can ask for, and the least role that may do it. Actions
#: marked ``hub`` need an admin of every project (a principal with no project).
ACTIONS: dict[str, tuple[Role, bool]] = {
    "read": ("viewer", False),
    "devices.label": ("operator", False),
    "groups.write": ("operator", False),
    "deployments.write": ("operator", False),
    "bulk": ("operator", False),
    "drift.settings": ("operator", False),
    "skills.publish": ("operator", False),
    "fleet.stop": ("operator", False),
    "tokens.write": ("admin", False),
    "tokens.read": ("admin", False),
    "audit.read": ("admin", False),
    "projects.read": ("admin", False),
    "projects.write": ("admin", True),
    "devices.move": ("admin", True),
}

#: How long audit entries are kept by default, and the least a setting may make it.
AUDIT_RETENTION_DAYS = 400
AUDIT_MIN_RETENTION_DAYS = 90
_DAY_MS = 86_400_000

_TOKEN_RE = re.compile(r"^est_([0-9a-f]{12})_([A-Za-z0-9_-]{43})$")
#: Longest token lifetime: ten years.
MAX_TOKEN_TTL_S = 10 * 365 * 86_400


@dataclass(frozen=True)
class Principal:
    """Whoever makes a request: what it may do, and in which project and group."""

    actor: str
    role: Role
    project: str | None
    group: str | None = None

    def __post_init__(self) -> None:
        if self.role not in _RANK:
            raise ValidationError(f"unknown role {self.role!r}; one of {', '.join(_RANK)}")

    @classmethod
    def local(cls) -> Principal:
        """The local CLI: an admin of every project, named by the user running it."""
        try:
            user = getpass.getuser()
        except (KeyError, OSError):
            user = "unknown"
        return cls(f"cli:{user}", "admin", None)

    def can(self, action: str) -> bool:
        """Whether this principal may do ``action`` (a key of :data:`ACTIONS`)."""
        need, hub_wide = ACTIONS[action]
        if hub_wide and self.project is not None:
            return False
        return _RANK[self.role] >= _RANK[need]

    def require(self, action: str) -> None:
        """Raises: PermissionDeniedError: this principal may not do ``action``."""
        if action not in ACTIONS:
            raise ValidationError(f"unknown action {action!r}")
        if not self.can(action):
            need, hub_wide = ACTIONS[action]
            who = "an admin of every project" if hub_wide else f"role {need} or above"
            raise PermissionDeniedError(
                f"{action} needs {who}; this token is {self.role}"
                + (f" of project {self.project!r}" if self.project else "")
            )

    def project_for(self, asked: str | None) -> str | None:
        """The project a request acts in: the principal's own, or for a hub admin the one asked.

        Raises:
            PermissionDeniedError: a project-bound principal asked for another project.
        """
        if self.project is None:
            return asked
        if asked not in (None, self.project):
            raise PermissionDeniedError(f"this token is bound to project {self.project!r}")
        return self.project


@dataclass(frozen=True)
class TokenView:
    """An API token as people see it: never its secret."""

    token_id: str
    name: str
    role: str
    project: str | None
    group: str | None
    created_ms: int
    expires_ms: int | None
    revoked: bool
    created_by: str


def _view(rec: TokenRecord) -> TokenView:
    return TokenView(
        rec.token_id,
        rec.name,
        rec.role,
        rec.project,
        rec.group,
        rec.created_ms,
        rec.expires_ms,
        rec.revoked,
        rec.created_by,
    )


def _digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


class TokenService:
    """API tokens: made with a role in a project, checked on every console request."""

    def __init__(self, store: Store, clock: Callable[[], int] = now_ms) -> None:
        """Keep tokens in ``store``; ``clock`` gives wall-clock milliseconds."""
        self._store = store
        self._clock = clock

    def create(
        self,
        name: str,
        role: str,
        project: str | None,
        group: str | None = None,
        ttl_s: float | None = None,
        *,
        by: Principal | None = None,
    ) -> tuple[TokenView, str]:
        """A new token and its secret (shown once; only its hash is kept).

        Args:
            name: What the token is for (``ci-deployer``).
            role: ``viewer``, ``operator`` or ``admin``.
            project: The project it is bound to; None makes a hub admin's token.
            group: Limit the role to the devices this group selects.
            ttl_s: Lifetime in seconds (None: until revoked).
            by: Who makes it (recorded); the local CLI by default.

        Raises:
            ValidationError: a bad name, role or lifetime; a group scope without a project.
            NotFoundError: no such project or group.
            PermissionDeniedError: ``by`` may not make tokens, or not one this strong.
            StoreError: the store failed.
        """
        maker = by or Principal.local()
        maker.require("tokens.write")
        if role not in _RANK:
            raise ValidationError(f"unknown role {role!r}; one of {', '.join(_RANK)}")
        project = maker.project_for(project)
        if maker.project is not None and _RANK[role] > _RANK[maker.role]:
            raise PermissionDeniedError(f"a {maker.role} cannot make a {role} token")
        if maker.group is not None and group != maker.group:
            raise PermissionDeniedError(
                f"this token may only make tokens for group {maker.group!r}"
            )
        if group is not None and project is None:
            raise ValidationError("a group-scoped token needs a project")
        if project is not None and not self._store.project_exists(project):
            raise NotFoundError(f"no project {project!r}")
        if group is not None:
            self._store.get_group(group, project=project)  # NotFoundError when missing
        if ttl_s is not None and not 1 <= ttl_s <= MAX_TOKEN_TTL_S:
            raise ValidationError(f"token lifetime must be 1 s to 10 years, got {ttl_s}")
        now = self._clock()
        token_id = secrets.token_hex(6)
        secret = secrets.token_urlsafe(32)
        rec = TokenRecord(
            token_id=token_id,
            name=name,
            secret_sha256=_digest(secret),
            role=role,
            project=project,
            group=group,
            created_ms=now,
            expires_ms=None if ttl_s is None else now + int(ttl_s * 1000),
            revoked=False,
            created_by=maker.actor,
        )
        self._store.insert_token(rec)
        return _view(rec), f"est_{token_id}_{secret}"

    def authenticate(self, presented: str) -> Principal:
        """The principal a presented token stands for.

        Raises:
            AuthError: malformed, unknown, revoked or expired (one message for all,
                so a guesser learns nothing).
            StoreError: the store failed.
        """
        refused = AuthError("invalid or expired API token")
        found = _TOKEN_RE.match(presented or "")
        if found is None:
            raise refused
        token_id, secret = found.groups()
        rec = self._store.get_token(token_id)
        expected = rec.secret_sha256 if rec else _digest("")
        if not hmac.compare_digest(expected, _digest(secret)) or rec is None:
            raise refused
        if rec.revoked or (rec.expires_ms is not None and self._clock() >= rec.expires_ms):
            raise refused
        role: Role = rec.role if rec.role in get_args(Role) else "viewer"  # type: ignore[assignment]
        return Principal(f"token:{rec.token_id}:{rec.name}", role, rec.project, rec.group)

    def list(self, project: str | None) -> builtins.list[TokenView]:
        """The tokens of ``project`` (all for None), oldest first.

        Raises:
            StoreError: the store failed.
        """
        return [_view(r) for r in self._store.list_tokens(project)]

    def revoke(self, token_id: str, project: str | None) -> TokenView:
        """Revoke a token of ``project`` (any for None); it stops working at once.

        Raises:
            NotFoundError: no such token in that project.
            StoreError: the store failed.
        """
        rec = self._store.revoke_token(token_id, project)
        if rec is None:
            raise NotFoundError(f"no token {token_id!r}")
        return _view(rec)


@dataclass(frozen=True)
class AuditView:
    """One audit entry: who did what to which record, when, and the record before and after."""

    id: int
    at_ms: int
    actor: str
    project: str
    action: str
    target: str
    before: Mapping[str, Any]
    after: Mapping[str, Any]


def _audit_view(rec: AuditRecord) -> AuditView:
    return AuditView(
        rec.id, rec.at_ms, rec.actor, rec.project, rec.action, rec.target, rec.before, rec.after
    )


#: Columns of the audit log's CSV export, in order.
AUDIT_CSV_COLUMNS = ("id", "at_ms", "actor", "project", "action", "target", "before", "after")


class AuditService:
    """The append-only audit log of every change, kept at least 90 days."""

    def __init__(self, store: Store, clock: Callable[[], int] = now_ms) -> None:
        """Keep the log in ``store``; ``clock`` stamps entries."""
        self._store = store
        self._clock = clock

    def record(
        self,
        principal: Principal,
        action: str,
        target: str,
        before: Mapping[str, Any] | None = None,
        after: Mapping[str, Any] | None = None,
        project: str | None = None,
    ) -> int:
        """Append an entry for a change ``principal`` made; its id.

        Args:
            principal: Who made the change.
            action: What was done (``deployments.create``).
            target: Which record (``deployment/12``).
            before: The record before the change (empty for a creation).
            after: The record after it (empty for a removal).
            project: The project the change is in (the principal's, or ``default``).

        Raises:
            ValidationError: a field over its cap.
            StoreError: the store failed.
        """
        entry = NewAudit(
            at_ms=self._clock(),
            actor=principal.actor,
            project=project or principal.project or "default",
            action=action,
            target=target,
            before=before or {},
            after=after or {},
        )
        return self._store.append_audit(entry)

    def search(
        self,
        project: str | None,
        *,
        actor: str | None = None,
        action: str | None = None,
        since_ms: int | None = None,
        until_ms: int | None = None,
        text: str | None = None,
        limit: int = 100,
        before_id: int | None = None,
    ) -> builtins.list[AuditView]:
        """Entries newest first; see :meth:`cloud.store.access.AccessTables.search_audit`.

        Raises:
            ValidationError: a limit out of range.
            StoreError: the store failed.
        """
        found = self._store.search_audit(
            project,
            actor=actor,
            action=action,
            since_ms=since_ms,
            until_ms=until_ms,
            text=text,
            limit=limit,
            before_id=before_id,
        )
        return [_audit_view(r) for r in found]

    def csv(self, project: str | None, **filters: Any) -> str:
        """The entries :meth:`search` finds (up to the page cap) as CSV, one per line.

        Raises:
            ValidationError: a bad filter.
            StoreError: the store failed.
        """
        filters.setdefault("limit", MAX_AUDIT_PAGE)
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(AUDIT_CSV_COLUMNS)
        for e in self.search(project, **filters):
            writer.writerow(
                [
                    e.id,
                    e.at_ms,
                    e.actor,
                    e.project,
                    e.action,
                    e.target,
                    json.dumps(e.before, sort_keys=True),
                    json.dumps(e.after, sort_keys=True),
                ]
            )
        return out.getvalue()

    def prune(self, now_ms: int | None = None, keep_days: int = AUDIT_RETENTION_DAYS) -> int:
        """Delete entries older than ``keep_days`` (never under 90); how many.

        Raises:
            ValidationError: ``keep_days`` under :data:`AUDIT_MIN_RETENTION_DAYS`.
            StoreError: the store failed.
        """
        if keep_days < AUDIT_MIN_RETENTION_DAYS:
            raise ValidationError(
                f"audit entries are kept at least {AUDIT_MIN_RETENTION_DAYS} days, got {keep_days}"
            )
        now = self._clock() if now_ms is None else now_ms
        return self._store.prune_audit(now - keep_days * _DAY_MS)


@dataclass(frozen=True)
class ProjectView:
    """A project (tenant)."""

    name: str
    created_ms: int


class ProjectService:
    """Projects: tenants whose devices, skills, data and usage are invisible to each other."""

    def __init__(self, store: Store, clock: Callable[[], int] = now_ms) -> None:
        """Keep projects in ``store``."""
        self._store = store
        self._clock = clock

    def create(self, name: str) -> ProjectView:
        """Create a project.

        Raises:
            ValidationError: a malformed name.
            ConflictError: a project of that name exists.
            StoreError: the store failed.
        """
        self._store.create_project(name, now_ms=self._clock())
        return ProjectView(name, self._clock())

    def list(self) -> builtins.list[ProjectView]:
        """Every project, by name.

        Raises:
            StoreError: the store failed.
        """
        return [ProjectView(p.name, p.created_ms) for p in self._store.list_projects()]
