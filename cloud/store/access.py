"""API tokens and the audit log, as the console's access service stores them.

Tokens are kept as the SHA-256 of their secret, never the secret. The audit log
is append-only: rows are inserted, read and, past the retention, pruned; no
method changes one.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import ColumnElement, Row, and_, delete, func, insert, or_, select, true, update

from cloud.errors import ConflictError, StoreError, ValidationError
from cloud.store import checks as check
from cloud.store.access_schema import api_tokens, audit_log
from cloud.store.base import StoreBase

__all__ = [
    "MAX_AUDIT_PAGE",
    "MAX_AUDIT_VALUE_BYTES",
    "AccessTables",
    "AuditRecord",
    "NewAudit",
    "TokenRecord",
]

#: Most audit rows one read returns.
MAX_AUDIT_PAGE = 5000
#: Most bytes of the before or after record kept per entry; larger ones are cut and marked.
MAX_AUDIT_VALUE_BYTES = 16_384
_ROLES = ("viewer", "operator", "admin")


@dataclass(frozen=True)
class TokenRecord:
    """A stored API token (its secret's hash, never the secret)."""

    token_id: str
    name: str
    secret_sha256: str
    role: str
    project: str | None
    group: str | None
    created_ms: int
    expires_ms: int | None
    revoked: bool
    created_by: str


@dataclass(frozen=True)
class NewAudit:
    """One change to record: who did what to which record, and the record before and after."""

    at_ms: int
    actor: str
    project: str
    action: str
    target: str
    before: Mapping[str, Any]
    after: Mapping[str, Any]


@dataclass(frozen=True)
class AuditRecord:
    """A stored audit entry."""

    id: int
    at_ms: int
    actor: str
    project: str
    action: str
    target: str
    before: Mapping[str, Any]
    after: Mapping[str, Any]


def _token(row: Row[Any]) -> TokenRecord:
    return TokenRecord(
        row.id,
        row.name,
        row.secret_sha256,
        row.role,
        row.project,
        row.group_name,
        int(row.created_ms),
        None if row.expires_ms is None else int(row.expires_ms),
        bool(row.revoked),
        row.created_by,
    )


def _value_text(value: Mapping[str, Any]) -> str:
    try:
        text = json.dumps(dict(value), sort_keys=True, separators=(",", ":"), default=str)
    except (TypeError, ValueError) as exc:
        raise ValidationError(f"audit value is not JSON: {exc}") from exc
    if len(text.encode()) <= MAX_AUDIT_VALUE_BYTES:
        return text
    cut = text.encode()[: MAX_AUDIT_VALUE_BYTES - 64].decode("utf-8", "ignore")
    return json.dumps({"truncated": True, "prefix": cut}, separators=(",", ":"))


def _value(text: str) -> Mapping[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise StoreError(f"stored audit value is corrupt: {exc}") from exc
    if not isinstance(value, dict):
        raise StoreError("stored audit value is not an object")
    return value


def _audit(row: Row[Any]) -> AuditRecord:
    return AuditRecord(
        int(row.id),
        int(row.at_ms),
        row.actor,
        row.project,
        row.action,
        row.target,
        _value(row.before),
        _value(row.after),
    )


class AccessTables(StoreBase):
    """API tokens and the audit log."""

    def insert_token(self, token: TokenRecord) -> TokenRecord:
        """Store a new token.

        Raises:
            ValidationError: a bad name, role, project or group.
            ConflictError: a token of that id exists.
            StoreError: the store failed.
        """
        check.name(token.name, "token name")
        if token.role not in _ROLES:
            raise ValidationError(f"unknown role {token.role!r}; one of {', '.join(_ROLES)}")
        if token.project is not None:
            check.name(token.project, "project")
        if token.group is not None:
            check.name(token.group, "group")
        check.sha256(token.secret_sha256)
        with self._tx(write=True) as conn:
            if conn.execute(
                select(api_tokens.c.id).where(api_tokens.c.id == token.token_id)
            ).first():
                raise ConflictError(f"token {token.token_id!r} exists")
            conn.execute(
                insert(api_tokens).values(
                    id=token.token_id,
                    name=token.name,
                    secret_sha256=token.secret_sha256,
                    role=token.role,
                    project=token.project,
                    group_name=token.group,
                    created_ms=token.created_ms,
                    expires_ms=token.expires_ms,
                    revoked=token.revoked,
                    created_by=check.text(token.created_by, "creator", 255),
                )
            )
        return token

    def get_token(self, token_id: str) -> TokenRecord | None:
        """The token of that id, revoked or not, or None.

        Raises:
            StoreError: the store failed.
        """
        with self._tx() as conn:
            row = conn.execute(select(api_tokens).where(api_tokens.c.id == token_id)).first()
        return None if row is None else _token(row)

    def list_tokens(self, project: str | None) -> list[TokenRecord]:
        """The tokens of ``project`` (every token for None), oldest first.

        Raises:
            StoreError: the store failed.
        """
        query = select(api_tokens).order_by(api_tokens.c.created_ms, api_tokens.c.id)
        if project is not None:
            query = query.where(api_tokens.c.project == project)
        with self._tx() as conn:
            return [_token(r) for r in conn.execute(query)]

    def revoke_token(self, token_id: str, project: str | None) -> TokenRecord | None:
        """Revoke a token of ``project`` (any project for None); the token, or None if none.

        Raises:
            StoreError: the store failed.
        """
        where = api_tokens.c.id == token_id
        if project is not None:
            where = and_(where, api_tokens.c.project == project)
        with self._tx(write=True) as conn:
            row = conn.execute(select(api_tokens).where(where)).first()
            if row is None:
                return None
            conn.execute(update(api_tokens).where(where).values(revoked=True))
            row = conn.execute(select(api_tokens).where(where)).first()
        return None if row is None else _token(row)

    def append_audit(self, entry: NewAudit) -> int:
        """Append one audit entry; its id.

        Raises:
            ValidationError: a field over its cap, or values that are not JSON.
            StoreError: the store failed.
        """
        check.name(entry.project, "project")
        check.name(entry.action, "audit action")
        values = {
            "at_ms": check.counter(entry.at_ms, "at_ms"),
            "actor": check.text(entry.actor, "actor", 255),
            "project": entry.project,
            "action": entry.action,
            "target": check.text(entry.target, "audit target", 255),
            "before": _value_text(entry.before),
            "after": _value_text(entry.after),
        }
        with self._tx(write=True) as conn:
            made = conn.execute(insert(audit_log).values(**values).returning(audit_log.c.id))
            return int(made.scalar_one())

    def search_audit(
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
    ) -> list[AuditRecord]:
        """Audit entries, newest first, that match every filter given.

        Args:
            project: Only this project's entries (every project's for None).
            actor: Exact actor.
            action: Exact action, or a prefix ending in ``.`` (``deployments.``).
            since_ms: At or after this time.
            until_ms: Before this time.
            text: A substring of the target, actor or action.
            limit: Most entries (1 to :data:`MAX_AUDIT_PAGE`).
            before_id: Only entries older than this id (the next page).

        Raises:
            ValidationError: a limit out of range.
            StoreError: the store failed or holds corrupt entries.
        """
        if not 1 <= limit <= MAX_AUDIT_PAGE:
            raise ValidationError(f"limit must be 1..{MAX_AUDIT_PAGE}, got {limit}")
        c = audit_log.c
        where: list[ColumnElement[bool]] = [true()]
        if project is not None:
            where.append(c.project == project)
        if actor is not None:
            where.append(c.actor == actor)
        if action is not None:
            where.append(
                c.action.startswith(action, autoescape=True)
                if action.endswith(".")
                else c.action == action
            )
        if since_ms is not None:
            where.append(c.at_ms >= since_ms)
        if until_ms is not None:
            where.append(c.at_ms < until_ms)
        if before_id is not None:
            where.append(c.id < before_id)
        if text:
            needle = text.lower()
            where.append(
                or_(
                    *(
                        func.lower(col).contains(needle, autoescape=True)
                        for col in (c.target, c.actor, c.action)
                    )
                )
            )
        query = select(audit_log).where(and_(*where)).order_by(c.id.desc()).limit(limit)
        with self._tx() as conn:
            return [_audit(r) for r in conn.execute(query)]

    def prune_audit(self, older_than_ms: int) -> int:
        """Delete the entries made before ``older_than_ms``; how many.

        Raises:
            StoreError: the store failed.
        """
        with self._tx(write=True) as conn:
            return int(
                conn.execute(delete(audit_log).where(audit_log.c.at_ms < older_than_ms)).rowcount
            )
