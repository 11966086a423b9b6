"""API tokens, roles and the audit log (cloud.service.access), on SQLite and PostgreSQL."""

from __future__ import annotations

import csv
import io

import pytest

from cloud.errors import AuthError, NotFoundError, PermissionDeniedError, ValidationError
from cloud.service.access import (
    ACTIONS,
    AUDIT_CSV_COLUMNS,
    AuditService,
    Principal,
    ProjectService,
    TokenService,
)
from cloud.store import Store

DAY_MS = 86_400_000


class Clock:
    def __init__(self, now_ms: int = 1_800_000_000_000) -> None:
        self.now_ms = now_ms

    def __call__(self) -> int:
        return self.now_ms


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def tokens(store: Store, clock: Clock) -> TokenService:
    ProjectService(store, clock).create("acme")
    return TokenService(store, clock)


def test_a_token_authenticates_as_its_role_and_project_and_only_its_hash_is_stored(
    tokens: TokenService, store: Store
) -> None:
    view, secret = tokens.create("ci", "operator", "acme")
    who = tokens.authenticate(secret)
    assert (who.role, who.project, who.group) == ("operator", "acme", None)
    assert who.actor == f"token:{view.token_id}:ci"
    stored = store.get_token(view.token_id)
    assert stored is not None and secret.split("_", 2)[2] not in repr(stored)
    assert stored.created_by.startswith("cli:")


@pytest.mark.parametrize(
    "bad",
    ["", "est_", "Bearer x", "est_000000000000_" + "A" * 43, "est_zz_" + "A" * 43],
)
def test_malformed_or_unknown_tokens_are_refused_with_one_message(
    tokens: TokenService, bad: str
) -> None:
    with pytest.raises(AuthError, match="invalid or expired API token"):
        tokens.authenticate(bad)


def test_a_wrong_secret_for_a_real_token_id_is_refused(tokens: TokenService) -> None:
    _, secret = tokens.create("ci", "viewer", "acme")
    forged = secret[:-1] + ("A" if secret[-1] != "A" else "B")
    with pytest.raises(AuthError):
        tokens.authenticate(forged)


def test_revoked_and_expired_tokens_stop_working(tokens: TokenService, clock: Clock) -> None:
    _, kept_secret = tokens.create("kept", "viewer", "acme")
    gone, gone_secret = tokens.create("gone", "viewer", "acme")
    _, brief_secret = tokens.create("brief", "viewer", "acme", ttl_s=60)
    tokens.revoke(gone.token_id, "acme")
    with pytest.raises(AuthError):
        tokens.authenticate(gone_secret)
    assert tokens.authenticate(brief_secret).project == "acme"
    clock.now_ms += 60_000
    with pytest.raises(AuthError):
        tokens.authenticate(brief_secret)
    assert tokens.authenticate(kept_secret).role == "viewer"


def test_a_project_cannot_see_or_revoke_another_projects_tokens(
    tokens: TokenService, store: Store, clock: Clock
) -> None:
    ProjectService(store, clock).create("other")
    mine, _ = tokens.create("mine", "admin", "acme")
    theirs, theirs_secret = tokens.create("theirs", "admin", "other")
    assert [t.token_id for t in tokens.list("acme")] == [mine.token_id]
    with pytest.raises(NotFoundError):
        tokens.revoke(theirs.token_id, "acme")
    assert tokens.authenticate(theirs_secret).project == "other"


def test_a_project_admin_makes_tokens_only_in_its_project_and_never_stronger(
    tokens: TokenService, store: Store, clock: Clock
) -> None:
    ProjectService(store, clock).create("other")
    admin = Principal("token:a:admin", "admin", "acme")
    operator = Principal("token:o:op", "operator", "acme")
    view, _ = tokens.create("made", "viewer", None, by=admin)
    assert view.project == "acme" and view.created_by == "token:a:admin"
    with pytest.raises(PermissionDeniedError):
        tokens.create("x", "viewer", "other", by=admin)
    with pytest.raises(PermissionDeniedError):
        tokens.create("x", "viewer", "acme", by=operator)
    with pytest.raises(NotFoundError):
        tokens.create("x", "viewer", "nowhere")
    with pytest.raises(ValidationError):
        tokens.create("x", "root", "acme")
    assert [t.name for t in tokens.list("acme")] == ["made"]


@pytest.mark.parametrize("action", sorted(ACTIONS))
def test_each_role_may_do_exactly_what_the_table_says(action: str) -> None:
    need, hub_wide = ACTIONS[action]
    rank = {"viewer": 0, "operator": 1, "admin": 2}
    for role in ("viewer", "operator", "admin"):
        bound = Principal("t", role, "acme")  # type: ignore[arg-type]
        allowed = rank[role] >= rank[need] and not hub_wide
        assert bound.can(action) is allowed
        if not allowed:
            with pytest.raises(PermissionDeniedError):
                bound.require(action)
    assert Principal("t", "admin", None).can(action)
    assert Principal("t", "viewer", "acme").can("deployments.write") is False


def test_a_bound_principal_cannot_act_in_another_project() -> None:
    bound = Principal("t", "admin", "acme")
    assert bound.project_for(None) == "acme"
    assert bound.project_for("acme") == "acme"
    with pytest.raises(PermissionDeniedError):
        bound.project_for("other")
    assert Principal("t", "admin", None).project_for("other") == "other"


def test_the_audit_log_records_searches_exports_and_keeps_ninety_days(
    store: Store, clock: Clock
) -> None:
    audit = AuditService(store, clock)
    who = Principal("token:abc:ci", "operator", "acme")
    first = audit.record(who, "groups.create", "group/cams", {}, {"selector": "kind=camera"})
    clock.now_ms += 1000
    audit.record(who, "deployments.create", "deployment/1", {}, {"version": "1.0.0"})
    audit.record(Principal("cli:root", "admin", None), "groups.create", "group/x", {}, {})
    found = audit.search("acme")
    assert [e.action for e in found] == ["deployments.create", "groups.create"]
    assert found[1].id == first and found[1].after == {"selector": "kind=camera"}
    assert [e.target for e in audit.search("acme", action="deployments.")] == ["deployment/1"]
    assert [e.target for e in audit.search("acme", text="CAMS")] == ["group/cams"]
    assert audit.search("acme", text="%") == []
    assert [e.project for e in audit.search(None)] == ["default", "acme", "acme"]
    rows = list(csv.reader(io.StringIO(audit.csv("acme"))))
    assert tuple(rows[0]) == AUDIT_CSV_COLUMNS and len(rows) == 3
    with pytest.raises(ValidationError):
        audit.prune(keep_days=30)
    clock.now_ms += 89 * DAY_MS
    assert audit.prune(keep_days=90) == 0
    clock.now_ms += 2 * DAY_MS
    assert audit.prune(keep_days=90) == 3
    assert audit.search(None) == []


def test_oversized_audit_values_are_cut_and_marked_not_refused(store: Store, clock: Clock) -> None:
    audit = AuditService(store, clock)
    audit.record(Principal("t", "admin", "acme"), "bulk", "devices", {}, {"ids": "x" * 100_000})
    (entry,) = audit.search("acme")
    assert entry.after["truncated"] is True
