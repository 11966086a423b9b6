"""The console tests' world: a hub of two projects (devices, groups, skills, deployments), tokens.

Project ``alpha`` and project ``beta`` hold the same shapes of things, every name
prefixed with the project: a test acting as ``alpha`` must never read ``beta``
in an answer. Each role of each project has a token, as does a hub admin and an
``alpha`` operator limited to group ``alpha-cams``.
"""

from __future__ import annotations

import shutil
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from cloud.console import create_app
from cloud.service import FleetService
from cloud.store import SkillStatusRecord, Store, TelemetryRecord
from protos.envelope import now_ms

with warnings.catch_warnings():  # starlette would rather have httpx2, which is not installed
    warnings.simplefilter("ignore")
    from fastapi.testclient import TestClient

__all__ = ["TestClient", "World", "client", "snapshot", "world"]

PROJECTS = ("alpha", "beta")
ROLES = ("viewer", "operator", "admin")


@dataclass
class World:
    """The hub, its store, and the secrets of its tokens by name."""

    fleet: FleetService
    store: Store
    tokens: dict[str, str] = field(default_factory=dict)
    token_ids: dict[str, str] = field(default_factory=dict)
    deployments: dict[str, int] = field(default_factory=dict)
    staged: dict[str, int] = field(default_factory=dict)
    incidents: dict[str, int] = field(default_factory=dict)

    def auth(self, who: str) -> dict[str, str]:
        """The Authorization header of token ``who`` (``alpha-viewer``, ``hub-admin``…)."""
        return {"Authorization": f"Bearer {self.tokens[who]}"}


def _populate(world: World, project: str, now: int) -> None:
    store = world.store
    world.fleet.projects.create(project)
    for i, kind in ((1, "camera"), (2, "camera"), (3, "gateway")):
        device_id = f"{project}-dev-{i}"
        labels = {"kind": kind, "site": f"{project}-site"}
        store.enroll_device(device_id, labels, now_ms=now, project=project)
        store.register_device(device_id, labels, {"board": "x86-cpu"}, now_ms=now)
    world.fleet.groups.create(f"{project}-cams", "kind=camera", project=project)
    for version in ("1.0.0", "1.1.0"):
        store.add_skill_version(
            f"{project}-digits",
            version,
            target_name=f"{project}-digits/{version}.skill",
            sha256="a" * 64,
            size=1,
            manifest="",
            now_ms=now,
            project=project,
        )
    dep = world.fleet.deployments.create(
        f"{project}-digits", "1.0.0", f"{project}-cams", project=project
    )
    world.deployments[project] = dep.id
    staged = world.fleet.deployments.create(
        f"{project}-digits", "1.1.0", f"{project}-cams", strategy="canary", project=project
    )
    world.staged[project] = staged.id
    incident = store.open_drift_incident(
        f"{project}-digits", "1.0.0", f"{project}-cams", "accuracy fell", {}, now_ms=now
    )
    assert incident is not None
    world.incidents[project] = incident.id
    status = SkillStatusRecord(f"{project}-digits", "1.0.0", "running", variant="onnx-cpu/fp32")
    store.save_report(f"{project}-dev-1", 1, [status], now_ms=now)
    window = TelemetryRecord(
        skill=f"{project}-digits",
        version="1.0.0",
        inferences=10,
        labelled=5,
        correct=4,
        latency_p50_ms=1.0,
        latency_p99_ms=2.0,
        window_start_ms=now - 2000,
        window_end_ms=now - 1000,
        metrics={"drift.n": 10.0, "drift.psi_class": 0.1, "drift.alarms": 0.0},
    )
    store.add_telemetry(f"{project}-msg-1", f"{project}-dev-1", window)
    for role in ROLES:
        view, secret = world.fleet.tokens.create(f"{project}-{role}", role, project)
        world.tokens[f"{project}-{role}"] = secret
        world.token_ids[f"{project}-{role}"] = view.token_id


def snapshot(world: World, project: str | None = None) -> dict[str, object]:
    """Everything a request could change (of one project, or all), for before/after checks."""
    fleet = world.fleet
    groups = fleet.groups.list(project=project)
    return {
        "devices": {d.device_id: dict(d.labels) for d in fleet.devices.list(project=project)},
        "groups": groups,
        "deployments": fleet.deployments.list(project=project),
        "rollouts": [
            fleet.deployments.rollout(d.id) for d in fleet.deployments.list(project=project)
        ],
        "skills": fleet.skills.list(project=project),
        "tokens": fleet.tokens.list(project),
        "projects": fleet.projects.list(),
        "drift": {g.name: fleet.drift.settings(g.name) for g in groups},
        "stopped": fleet.deployments.fleet_stopped(),
        "audit": fleet.audit.search(project, limit=1000),
    }


def _build(home: Path) -> World:
    fleet = FleetService.init(home, insecure=True)
    built = World(fleet, fleet._hub.store)
    now = now_ms()
    for project in PROJECTS:
        _populate(built, project, now)
    view, secret = fleet.tokens.create("hub-admin", "admin", None)
    built.tokens["hub-admin"], built.token_ids["hub-admin"] = secret, view.token_id
    view, secret = fleet.tokens.create(
        "alpha-cams-operator", "operator", "alpha", group="alpha-cams"
    )
    built.tokens["alpha-cams-operator"] = secret
    built.token_ids["alpha-cams-operator"] = view.token_id
    return built


@pytest.fixture(scope="session")
def console_template(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, World]:
    """The world built once; each test gets a copy of its hub home."""
    home = tmp_path_factory.mktemp("console-template") / "hub"
    built = _build(home)
    built.fleet.close()
    return home, built


@pytest.fixture
def world(console_template: tuple[Path, World], tmp_path: Path) -> Iterator[World]:
    """Two populated projects and a token for every role of each (a fresh copy per test)."""
    source, built = console_template
    home = tmp_path / "hub"
    shutil.copytree(source, home)
    config = home / "hub.toml"
    config.write_text(config.read_text().replace(str(source), str(home)))
    fleet = FleetService.open(home)
    try:
        yield World(
            fleet,
            fleet._hub.store,
            dict(built.tokens),
            dict(built.token_ids),
            dict(built.deployments),
            dict(built.staged),
            dict(built.incidents),
        )
    finally:
        fleet.close()


@pytest.fixture
def client(world: World) -> Iterator[TestClient]:
    """A client of the console app over the world's fleet (server errors become 500s)."""
    with TestClient(create_app(world.fleet), raise_server_exceptions=False) as test_client:
        yield test_client
