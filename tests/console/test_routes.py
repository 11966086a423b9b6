"""Every route of the console API: happy path, role matrix, project isolation, audit.

Parametrised over :func:`tests.console.calls.calls`, which a test checks against
the app's own route table: a new route without a sample request fails here.
"""

from __future__ import annotations

import pytest
from fastapi.routing import APIRoute

from cloud.console import app as console_app
from cloud.console.auth import action_of
from cloud.store import TelemetryRecord
from protos.envelope import now_ms
from tests.console.calls import RANKS, STREAMING, Call, calls, token_for
from tests.console.world import TestClient, World, snapshot

#: The route templates, in the order :func:`calls` lists them.
_KEYS = [
    ("GET", "/api/v1/whoami"),
    ("GET", "/api/v1/tokens"),
    ("POST", "/api/v1/tokens"),
    ("DELETE", "/api/v1/tokens/{token_id}"),
    ("GET", "/api/v1/projects"),
    ("POST", "/api/v1/projects"),
    ("GET", "/api/v1/devices"),
    ("GET", "/api/v1/devices/{device_id}"),
    ("PUT", "/api/v1/devices/{device_id}/labels"),
    ("GET", "/api/v1/devices/{device_id}/telemetry"),
    ("GET", "/api/v1/groups"),
    ("POST", "/api/v1/groups"),
    ("GET", "/api/v1/groups/preview"),
    ("GET", "/api/v1/groups/{name}"),
    ("GET", "/api/v1/skills"),
    ("GET", "/api/v1/skills/{name}"),
    ("GET", "/api/v1/deployments"),
    ("POST", "/api/v1/deployments"),
    ("GET", "/api/v1/deployments/{deployment_id}"),
    ("POST", "/api/v1/deployments/{deployment_id}/pause"),
    ("POST", "/api/v1/deployments/{deployment_id}/resume"),
    ("POST", "/api/v1/deployments/{deployment_id}/abort"),
    ("POST", "/api/v1/deployments/{deployment_id}/rollback"),
    ("GET", "/api/v1/fleet/overview"),
    ("POST", "/api/v1/fleet/stop"),
    ("POST", "/api/v1/bulk/label"),
    ("GET", "/api/v1/telemetry/summary"),
    ("GET", "/api/v1/drift/incidents"),
    ("GET", "/api/v1/drift/incidents/{incident_id}"),
    ("GET", "/api/v1/drift/series"),
    ("GET", "/api/v1/drift/settings/{group}"),
    ("PUT", "/api/v1/drift/settings/{group}"),
    ("GET", "/api/v1/models"),
    ("GET", "/api/v1/jobs"),
    ("GET", "/api/v1/usage"),
    ("GET", "/api/v1/audit"),
]


def _ids(key: tuple[str, str]) -> str:
    return f"{key[0]} {key[1].removeprefix('/api/v1')}"


def _send(client: TestClient, world: World, call: Call, who: str, query: str = "") -> object:
    path = call.path + (("&" if "?" in call.path else "?") + query if query else "")
    return client.request(call.method, path, json=call.body, headers=world.auth(who))


def _published(client: TestClient) -> set[tuple[str, str]]:
    spec = client.get("/api/v1/openapi.json").json()
    return {(m.upper(), path) for path, ops in spec["paths"].items() for m in ops}


def _actions() -> dict[tuple[str, str], list[str]]:
    found = {}
    for module in console_app._ROUTERS:
        for route in module.router.routes:
            assert isinstance(route, APIRoute)
            actions = [action_of(d.call) for d in route.dependant.dependencies]
            for method in route.methods:
                found[(method, "/api/v1" + route.path)] = [a for a in actions if a]
    return found


def test_every_api_route_has_a_sample_request_and_one_action(
    world: World, client: TestClient
) -> None:
    published = _published(client)
    assert published == set(calls(world, "alpha")) | STREAMING == set(_KEYS) | STREAMING
    actions = _actions()
    assert set(actions) == published
    for key, found in actions.items():
        assert len(found) == 1, f"{key} must declare exactly one action, not {found}"
    spec = client.get("/api/v1/openapi.json").json()
    for path, ops in spec["paths"].items():
        for method, op in ops.items():
            assert op.get("security") == [{"HTTPBearer": []}], (method, path)


@pytest.mark.parametrize("key", _KEYS, ids=_ids)
def test_happy_path(world: World, client: TestClient, key: tuple[str, str]) -> None:
    call = calls(world, "alpha")[key]
    response = _send(client, world, call, token_for("alpha", call.role))
    assert response.status_code == call.status, response.text  # type: ignore[attr-defined]
    assert "beta" not in response.text  # type: ignore[attr-defined]


@pytest.mark.parametrize("key", _KEYS, ids=_ids)
def test_weaker_roles_are_refused_and_change_nothing(
    world: World, client: TestClient, key: tuple[str, str]
) -> None:
    call = calls(world, "alpha")[key]
    weaker = RANKS[: RANKS.index(call.role)]
    before = snapshot(world)
    if not weaker:  # the weakest role may do it: a viewer's token gets the same answer
        response = _send(client, world, call, token_for("alpha", call.role))
        assert response.status_code == call.status, response.text  # type: ignore[attr-defined]
        assert snapshot(world) == before
        return
    for role in weaker:
        response = _send(client, world, call, token_for("alpha", role))
        assert response.status_code == 403, (role, response.text)  # type: ignore[attr-defined]
        assert "needs" in response.json()["error"] or "hub" in response.json()["error"]  # type: ignore[attr-defined]
    assert snapshot(world) == before


@pytest.mark.parametrize("key", _KEYS, ids=_ids)
def test_a_project_token_sees_and_changes_nothing_of_another_project(
    world: World, client: TestClient, key: tuple[str, str]
) -> None:
    client.put(  # something of beta's in its audit log, made through the API
        "/api/v1/devices/beta-dev-2/labels",
        json={"labels": {"kind": "camera", "site": "beta-site", "x": "1"}},
        headers=world.auth("beta-admin"),
    ).raise_for_status()
    beta = snapshot(world, "beta")
    call = calls(world, "beta")[key]  # alpha's strongest token, naming beta's things
    response = _send(client, world, call, "alpha-admin")
    status = response.status_code  # type: ignore[attr-defined]
    if status < 300:
        assert "beta" not in response.text  # type: ignore[attr-defined]
    else:
        assert status in (403, 404), response.text  # type: ignore[attr-defined]
    asked = _send(client, world, calls(world, "alpha")[key], "alpha-admin", "project=beta")
    assert asked.status_code == 403, asked.text  # type: ignore[attr-defined]
    assert snapshot(world, "beta") == beta


@pytest.mark.parametrize("key", _KEYS, ids=_ids)
def test_every_change_is_in_the_audit_log(
    world: World, client: TestClient, key: tuple[str, str]
) -> None:
    call = calls(world, "alpha")[key]
    who = token_for("alpha", call.role)
    seen = {e.id for e in world.fleet.audit.search(None, limit=1000)}
    response = _send(client, world, call, who)
    assert response.status_code == call.status, response.text  # type: ignore[attr-defined]
    new = [e for e in world.fleet.audit.search(None, limit=1000) if e.id not in seen]
    if not call.mutating:  # a read changes nothing, so it leaves no entry either
        assert new == []
        return
    assert new, "no audit entry"
    assert {e.action for e in new} == {call.audit}
    assert all(e.actor.endswith(f":{who}") for e in new)
    assert all(isinstance(e.before, dict) and isinstance(e.after, dict) for e in new)
    if call.role != "hub":
        assert {e.project for e in new} == {"alpha"}


def test_usage_comes_a_page_at_a_time_and_the_csv_whole(world: World, client: TestClient) -> None:
    now = now_ms()
    for i in (2, 3):
        window = TelemetryRecord("alpha-digits", "1.0.0", 5 * i, 0, 0, 1.0, 2.0,
                                 window_start_ms=now - 2000, window_end_ms=now - 1000)  # fmt: skip
        world.store.add_telemetry(f"alpha-extra-{i}", f"alpha-dev-{i}", window)
    world.fleet.metering.fold()
    auth, pages, cursor = world.auth("alpha-admin"), [], None
    while True:
        query = {"limit": "2"} | ({"cursor": cursor} if cursor else {})
        page = client.get("/api/v1/usage", params=query, headers=auth).json()
        assert page["total_inferences"] == 10 + 10 + 15
        assert page["total_windows"] == 3
        pages.append([r["device_id"] for r in page["rows"]])
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert pages == [["alpha-dev-1", "alpha-dev-2"], ["alpha-dev-3"]]
    bad = client.get("/api/v1/usage", params={"cursor": "nope"}, headers=auth)
    assert bad.status_code in (400, 422), bad.text
    csv = client.get("/api/v1/usage", params={"format": "csv"}, headers=auth)
    assert csv.headers["content-type"].startswith("text/csv")
    assert "attachment" in csv.headers["content-disposition"]
    assert [line.split(",")[1] for line in csv.text.splitlines()] == [
        "device_id", "alpha-dev-1", "alpha-dev-2", "alpha-dev-3",
    ]  # fmt: skip
