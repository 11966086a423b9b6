"""Bad input, missing tokens, group scopes and failures: 4xx (or a bare 500), nothing changed."""

from __future__ import annotations

import pytest

from tests.console.world import TestClient, World, snapshot

API = "/api/v1"

BAD = [
    ("PUT", f"{API}/devices/alpha-dev-1/labels", {"labels": {"kind": "bad value!"}}, 422),
    ("PUT", f"{API}/devices/alpha-dev-1/labels", {"labels": {}, "extra": 1}, 422),
    ("PUT", f"{API}/devices/no-such/labels", {"labels": {"a": "b"}}, 404),
    ("POST", f"{API}/groups", {"name": "g", "selector": ""}, 400),
    ("POST", f"{API}/groups", {"name": "alpha-cams", "selector": "kind=x"}, 409),
    ("POST", f"{API}/groups", {"name": "-bad", "selector": "kind=x"}, 422),
    ("POST", f"{API}/groups", {"name": "g2", "selector": "kind"}, 400),
    (
        "POST",
        f"{API}/deployments",
        {"skill": "alpha-digits", "version": "9.9.9", "group": "alpha-cams"},
        404,
    ),
    (
        "POST",
        f"{API}/deployments",
        {
            "skill": "alpha-digits",
            "version": "1.1.0",
            "group": "alpha-cams",
            "config": {"k": "v" * 2000},
        },
        422,
    ),
    (
        "POST",
        f"{API}/deployments",
        {
            "skill": "alpha-digits",
            "version": "1.1.0",
            "group": "alpha-cams",
            "plan": {"nonsense": 1},
        },
        400,
    ),
    ("POST", f"{API}/deployments/{1}/pause", None, 400),  # all at once: not staged
    ("POST", f"{API}/deployments/999/abort", None, 404),
    ("PUT", f"{API}/drift/settings/alpha-cams", {"settings": {"no_such_setting": 1}}, 400),
    ("PUT", f"{API}/drift/settings/alpha-cams", {"settings": {"min_gain": 1000}}, 400),
    ("POST", f"{API}/bulk/label", {"filter": {}, "set": {"a": "b"}, "remove": ["a"]}, 400),
    ("POST", f"{API}/tokens", {"name": "x", "role": "root"}, 422),
    ("POST", f"{API}/tokens", {"name": "x", "role": "viewer", "project": "beta"}, 403),
    ("DELETE", f"{API}/tokens/abcdef123456", None, 404),
    ("GET", f"{API}/devices?limit=100000", None, 422),
    ("GET", f"{API}/devices?cursor=garbage", None, 400),
    ("GET", f"{API}/usage?since=10&until=5", None, 400),
]


@pytest.mark.parametrize(
    ("method", "path", "body", "status"), BAD, ids=[f"{m} {p[7:]} {s}" for m, p, _, s in BAD]
)
def test_bad_input_is_refused_with_a_clear_error_and_changes_nothing(
    world: World, client: TestClient, method: str, path: str, body: object, status: int
) -> None:
    before = snapshot(world)
    response = client.request(method, path, json=body, headers=world.auth("alpha-admin"))
    assert response.status_code == status, response.text
    assert response.json()["error"]
    assert snapshot(world) == before


def test_a_body_over_the_cap_is_refused_with_413(world: World, client: TestClient) -> None:
    before = snapshot(world)
    big = {"labels": {"a": "b"}, "pad": "x" * 70_000}
    response = client.put(
        f"{API}/devices/alpha-dev-1/labels", json=big, headers=world.auth("alpha-admin")
    )
    assert response.status_code == 413
    assert "64" in response.json()["error"] or "65536" in response.json()["error"]
    assert snapshot(world) == before


@pytest.mark.parametrize(
    ("headers", "message"),
    [
        ({}, "needs a token"),
        ({"Authorization": "Basic abc"}, "Bearer"),
        ({"Authorization": "Bearer est_nope"}, "invalid"),
        ({"Authorization": "Bearer " + "x" * 300}, "invalid"),
    ],
)
def test_a_missing_or_bad_token_gets_401(
    client: TestClient, headers: dict[str, str], message: str
) -> None:
    response = client.get(f"{API}/devices", headers=headers)
    assert response.status_code == 401
    assert message in response.json()["error"]
    assert response.headers["www-authenticate"] == "Bearer"


def test_a_revoked_token_stops_working_at_once(world: World, client: TestClient) -> None:
    assert client.get(f"{API}/whoami", headers=world.auth("alpha-viewer")).status_code == 200
    token_id = world.token_ids["alpha-viewer"]
    revoked = client.delete(f"{API}/tokens/{token_id}", headers=world.auth("alpha-admin"))
    assert revoked.status_code == 200, revoked.text
    assert client.get(f"{API}/whoami", headers=world.auth("alpha-viewer")).status_code == 401


def test_a_group_scoped_token_reaches_only_its_group(world: World, client: TestClient) -> None:
    auth = world.auth("alpha-cams-operator")
    ids = {d["device_id"] for d in client.get(f"{API}/devices", headers=auth).json()["devices"]}
    assert ids == {"alpha-dev-1", "alpha-dev-2"}  # the gateway is outside alpha-cams
    assert client.get(f"{API}/devices/alpha-dev-3", headers=auth).status_code == 404
    before = snapshot(world)
    out = client.put(
        f"{API}/devices/alpha-dev-1/labels", json={"labels": {"kind": "gateway"}}, headers=auth
    )
    assert out.status_code == 403  # it would leave the group
    assert (
        client.post(
            f"{API}/groups", json={"name": "wide", "selector": "site=alpha-site"}, headers=auth
        ).status_code
        == 403
    )
    assert snapshot(world) == before
    ok = client.put(
        f"{API}/devices/alpha-dev-1/labels",
        json={"labels": {"kind": "camera", "x": "1"}},
        headers=auth,
    )
    assert ok.status_code == 200, ok.text
    assert [g["name"] for g in client.get(f"{API}/groups", headers=auth).json()] == ["alpha-cams"]


def test_an_unexpected_failure_is_a_bare_500(
    world: World, client: TestClient, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*_args: object, **_kwargs: object) -> None:
        raise RuntimeError("secret detail /etc/passwd SELECT * FROM")

    monkeypatch.setattr(world.fleet.groups, "list", broken)
    response = client.get(f"{API}/groups", headers=world.auth("alpha-viewer"))
    assert response.status_code == 500
    assert response.json() == {
        "error": "internal error: the hub failed to answer; see the hub's log"
    }


def test_pages_and_openapi_are_served(client: TestClient) -> None:
    assert client.get("/").status_code in (200, 404)
    spec = client.get(f"{API}/openapi.json")
    assert spec.status_code == 200
    assert spec.json()["info"]["title"] == "EdgeSkill console API"
    assert client.get(f"{API}/docs").status_code == 200
    assert client.get("/assets/no/such/file.js").status_code == 404
