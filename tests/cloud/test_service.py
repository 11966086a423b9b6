"""The fleet service: typed views, hub errors, publishing, and listing at a fixed query cost."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, event

from cloud.errors import ConflictError, NotFoundError, ValidationError
from cloud.service import (
    DeploymentView,
    DeviceView,
    FleetService,
    GroupView,
    SkillStateView,
)
from cloud.store import SkillStatusRecord, Store, open_store
from skills.bundle import build_bundle

LIBRARY = Path(__file__).resolve().parents[2] / "skills" / "library"


@pytest.fixture
def service(store_url: str, tmp_path: Path) -> Iterator[FleetService]:
    """A fresh hub home on each database, opened again as a CLI command would."""
    fleet = FleetService.init(tmp_path / "hub", store_url=store_url)
    fleet.close()
    opened = FleetService.open(tmp_path / "hub")
    try:
        yield opened
    finally:
        opened.close()


@pytest.fixture
def devices_store(store_url: str) -> Iterator[Store]:
    """The same database, opened as the hub's servers open it (devices register there)."""
    opened = open_store(store_url)
    try:
        yield opened
    finally:
        opened.close()


def bundle(tmp_path: Path, version: str = "1.0.0", description: str = "") -> Path:
    src = tmp_path / f"src-{version}-{len(description)}"
    shutil.copytree(LIBRARY / "digits", src, dirs_exist_ok=True)
    toml = (src / "skill.toml").read_text(encoding="utf-8")
    toml = toml.replace('version = "1.0.0"', f'version = "{version}"')
    if description:
        toml = toml.replace('description = "', f'description = "{description} ')
    (src / "skill.toml").write_text(toml, encoding="utf-8")
    return build_bundle(src, tmp_path / f"dist-{len(description)}")


class QueryCounter:
    """Counts SQL statements sent by any engine while active."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, *_args: object) -> None:
        self.count += 1

    def __enter__(self) -> QueryCounter:
        event.listen(Engine, "before_cursor_execute", self)
        return self

    def __exit__(self, *_exc: object) -> None:
        event.remove(Engine, "before_cursor_execute", self)


def register(store: Store, start: int, stop: int) -> None:
    for i in range(start, stop):
        device_id = f"cam-{i:03d}"
        store.register_device(device_id, {"kind": "camera"}, {"board": "x86-cpu"}, now_ms=1)
        status = SkillStatusRecord("digits", "1.0.0", "running", variant="onnx-cpu/fp32")
        store.save_report(device_id, 1, [status], now_ms=2)


def test_listing_devices_costs_the_same_queries_for_1_and_50(
    service: FleetService, devices_store: Store
) -> None:
    register(devices_store, 0, 1)
    with QueryCounter() as one:
        assert len(service.devices.list()) == 1
    register(devices_store, 1, 50)
    with QueryCounter() as fifty:
        listed = service.devices.list()
    assert len(listed) == 50
    assert fifty.count == one.count
    assert one.count <= 6  # labels, devices, desired, reports (+ BEGIN on SQLite)
    with QueryCounter() as groups_one:
        service.groups.create("cams", "kind=camera")
        assert service.groups.list() == [GroupView("cams", "kind=camera", 50)]
    with QueryCounter() as groups_again:
        assert service.groups.list() == [GroupView("cams", "kind=camera", 50)]
    assert groups_again.count < groups_one.count


def test_a_device_view_has_labels_presence_board_generation_and_report(
    service: FleetService, devices_store: Store, tmp_path: Path
) -> None:
    devices_store.register_device("cam-1", {"kind": "camera"}, {"board": "arm-cpu"}, now_ms=5)
    devices_store.register_device("gw-1", {"kind": "gateway"}, {}, now_ms=6)
    service.skills.publish(bundle(tmp_path))
    service.groups.create("cams", "kind=camera")
    service.deployments.create("digits", "1.0.0", "cams")
    status = SkillStatusRecord("digits", "1.0.0", "running", variant="onnx-cpu/int8")
    devices_store.save_report("cam-1", 1, [status], now_ms=7)

    cam = service.devices.get("cam-1")
    assert cam == DeviceView(
        device_id="cam-1",
        labels={"kind": "camera"},
        online=False,  # last heard from at 5 ms after the epoch: long silent
        board="arm-cpu",
        last_seen_ms=5,
        desired_generation=1,
        reported_generation=1,
        reported=(SkillStateView("digits", "1.0.0", "running", "", "onnx-cpu/int8"),),
        profile={"board": "arm-cpu"},
        presence="stale",  # silent, but the hub never saw its connection end
        heartbeat_ms=0,
        reported_ms=7,  # when the hub recorded the report
    )
    assert cam.skill("digits") == cam.reported[0]
    gateway = service.devices.get("gw-1")
    assert (gateway.desired_generation, gateway.reported_generation, gateway.reported) == (
        0,
        None,
        (),
    )
    assert [d.device_id for d in service.devices.list("kind=gateway")] == ["gw-1"]
    with pytest.raises(NotFoundError, match="no device 'nobody'"):
        service.devices.get("nobody")
    with pytest.raises(ValidationError):
        service.devices.list("kind")


def test_publishing_is_immutable_and_idempotent(service: FleetService, tmp_path: Path) -> None:
    first = service.skills.publish(bundle(tmp_path))
    assert (first.version.name, first.version.version) == ("digits", "1.0.0")
    assert first.version.target_name == "digits/digits-1.0.0.skill"
    assert first.linked_artifacts == 0
    assert service.skills.publish(bundle(tmp_path)) == first
    with pytest.raises(ConflictError, match="versions are immutable"):
        service.skills.publish(bundle(tmp_path, description="changed"))
    assert service.skills.list() == [first.version]
    broken = tmp_path / "broken.skill"
    broken.write_bytes(b"not a bundle")
    with pytest.raises(ValidationError, match="cannot publish"):
        service.skills.publish(broken)
    assert service.skills.list() == [first.version]


def test_deployments_read_the_strategy_and_refuse_unknown_ones(
    service: FleetService, devices_store: Store, tmp_path: Path
) -> None:
    devices_store.register_device("cam-1", {"kind": "camera"}, {}, now_ms=1)
    service.skills.publish(bundle(tmp_path))
    service.groups.create("cams", "kind=camera")
    with pytest.raises(ValidationError, match="unknown rollout strategy 'blue-green'"):
        service.deployments.create("digits", "1.0.0", "cams", strategy="blue-green")
    with pytest.raises(NotFoundError):
        service.deployments.create("digits", "1.0.0", "nobody")
    assert service.deployments.list() == []

    dep = service.deployments.create("digits", "1.0.0", "cams", config={"k": "v"})
    assert dep == DeploymentView(
        dep.id, "digits", "1.0.0", "cams", "all-at-once", {"k": "v"}, "active", dep.created_ms
    )
    assert service.deployments.get(dep.id) == dep
    assert service.devices.get("cam-1").desired_generation == 1
    aborted = service.deployments.abort(dep.id)
    assert aborted.state == "aborted"
    assert service.devices.get("cam-1").desired_generation == 2
    with pytest.raises(ConflictError):
        service.groups.create("cams", "kind=gateway")
