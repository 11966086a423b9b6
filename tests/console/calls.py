"""One sample request for every route of the console API, naming one project's things.

Tests walk :func:`calls` and check that it covers the app's route table, so a
new route cannot escape the role matrix, the isolation check or the audit check.
"""

from __future__ import annotations

from dataclasses import dataclass

from tests.console.world import World

#: Roles from weakest to strongest; ``hub`` is an admin of every project.
RANKS = ("viewer", "operator", "admin", "hub")
#: Routes whose answer never ends (tested in test_stream.py with a real server).
STREAMING = {("GET", "/api/v1/events/stream")}


@dataclass(frozen=True)
class Call:
    """A request, the least role it succeeds with, its status then, and its audit action."""

    method: str
    path: str
    body: object = None
    role: str = "viewer"
    status: int = 200
    audit: str | None = None

    @property
    def mutating(self) -> bool:
        """Whether the request changes something (and must leave an audit entry)."""
        return self.audit is not None


def token_for(project: str, role: str) -> str:
    """The name of the world's token of ``role`` in ``project`` (``hub-admin`` for hub)."""
    return "hub-admin" if role == "hub" else f"{project}-{role}"


def calls(world: World, p: str) -> dict[tuple[str, str], Call]:
    """A request per route ``(method, path template)``, naming project ``p``'s things."""
    dep, staged, incident = world.deployments[p], world.staged[p], world.incidents[p]
    api = "/api/v1"
    out = {
        ("GET", "/whoami"): Call("GET", f"{api}/whoami"),
        ("GET", "/tokens"): Call("GET", f"{api}/tokens", role="admin"),
        ("POST", "/tokens"): Call(
            "POST", f"{api}/tokens", {"name": "ci", "role": "viewer"}, "admin", 201, "tokens.create"
        ),
        ("DELETE", "/tokens/{token_id}"): Call(
            "DELETE",
            f"{api}/tokens/{world.token_ids[f'{p}-viewer']}",
            role="admin",
            audit="tokens.revoke",
        ),
        ("GET", "/projects"): Call("GET", f"{api}/projects", role="admin"),
        ("POST", "/projects"): Call(
            "POST", f"{api}/projects", {"name": "gamma"}, "hub", 201, "projects.create"
        ),
        ("GET", "/devices"): Call("GET", f"{api}/devices?label=kind=camera&limit=10"),
        ("GET", "/devices/{device_id}"): Call("GET", f"{api}/devices/{p}-dev-1"),
        ("PUT", "/devices/{device_id}/labels"): Call(
            "PUT",
            f"{api}/devices/{p}-dev-3/labels",
            {"labels": {"kind": "gateway", "floor": "2"}},
            "operator",
            audit="devices.label",
        ),
        ("GET", "/devices/{device_id}/telemetry"): Call(
            "GET", f"{api}/devices/{p}-dev-1/telemetry?since=0"
        ),
        ("GET", "/groups"): Call("GET", f"{api}/groups"),
        ("POST", "/groups"): Call(
            "POST",
            f"{api}/groups",
            {"name": "gateways", "selector": "kind=gateway"},
            "operator",
            201,
            "groups.create",
        ),
        ("GET", "/groups/preview"): Call("GET", f"{api}/groups/preview?selector=site={p}-site"),
        ("GET", "/groups/{name}"): Call("GET", f"{api}/groups/{p}-cams"),
        ("GET", "/skills"): Call("GET", f"{api}/skills"),
        ("GET", "/skills/{name}"): Call("GET", f"{api}/skills/{p}-digits"),
        ("GET", "/deployments"): Call("GET", f"{api}/deployments"),
        ("POST", "/deployments"): Call(
            "POST",
            f"{api}/deployments",
            {"skill": f"{p}-digits", "version": "1.1.0", "group": f"{p}-cams", "priority": 5},
            "operator",
            201,
            "deployments.create",
        ),
        ("GET", "/deployments/{deployment_id}"): Call("GET", f"{api}/deployments/{staged}"),
        **{
            ("POST", f"/deployments/{{deployment_id}}/{verb}"): Call(
                "POST",
                f"{api}/deployments/{dep if verb == 'abort' else staged}/{verb}",
                role="operator",
                audit=f"deployments.{verb}",
            )
            for verb in ("pause", "resume", "abort", "rollback")
        },
        ("GET", "/fleet/overview"): Call("GET", f"{api}/fleet/overview"),
        ("POST", "/fleet/stop"): Call(
            "POST", f"{api}/fleet/stop", {"on": True}, "hub", 200, "fleet.stop"
        ),
        ("POST", "/bulk/label"): Call(
            "POST",
            f"{api}/bulk/label",
            {"filter": {"labels": {"site": f"{p}-site"}}, "set": {"tier": "b"}},
            "operator",
            audit="devices.label",
        ),
        ("GET", "/telemetry/summary"): Call("GET", f"{api}/telemetry/summary"),
        ("GET", "/drift/incidents"): Call("GET", f"{api}/drift/incidents?all=true"),
        ("GET", "/drift/incidents/{incident_id}"): Call("GET", f"{api}/drift/incidents/{incident}"),
        ("GET", "/drift/series"): Call(
            "GET", f"{api}/drift/series?skill={p}-digits&group={p}-cams&since=0"
        ),
        ("GET", "/drift/settings/{group}"): Call("GET", f"{api}/drift/settings/{p}-cams"),
        ("PUT", "/drift/settings/{group}"): Call(
            "PUT",
            f"{api}/drift/settings/{p}-cams",
            {"settings": {"retrain": False, "min_gain": 1.5}},
            "operator",
            audit="drift.settings",
        ),
        ("GET", "/models"): Call("GET", f"{api}/models", role="hub"),
        ("GET", "/jobs"): Call("GET", f"{api}/jobs", role="hub"),
        ("GET", "/usage"): Call("GET", f"{api}/usage"),
        ("GET", "/audit"): Call("GET", f"{api}/audit?limit=50", role="admin"),
    }
    return {(method, api + path): call for (method, path), call in out.items()}
