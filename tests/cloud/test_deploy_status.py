"""Deployment status computed from the devices, and a device's whole story.

The pure rule first (views in, a view out), then the service on both
databases with reports stored as the hub stores what agents send: a failed
install, a rollback, and a partial rollout.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from cloud.errors import NotFoundError
from cloud.service import FleetService
from cloud.service.status import deployment_status, short_reason
from cloud.service.views import DeploymentView, DeviceView, SkillStateView
from cloud.store import SkillStatusRecord, Store, open_store
from protos.envelope import now_ms

V2 = DeploymentView(7, "digits", "2.0.0", "cams", "all-at-once", {}, "active", 1)
SETUP_FAILED = (
    "digits 2.0.0 setup failed:\n"
    "Traceback (most recent call last):\n"
    '  File "control/main.py", line 9, in setup\n'
    "RuntimeError: no camera at /dev/video0"
)


def device(device_id: str, *skills: SkillStateView, online: bool = True) -> DeviceView:
    return DeviceView(
        device_id=device_id,
        labels={"kind": "camera"},
        online=online,
        board="x86-cpu",
        last_seen_ms=1,
        desired_generation=2,
        reported_generation=2,
        reported=skills,
    )


def skill(version: str, state: str, want: str, error: str = "", prev: str = "") -> SkillStateView:
    return SkillStateView("digits", version, state, error, "", want, prev)


RUNNING_V2 = skill("2.0.0", "running", "2.0.0")
INSTALLING_V2 = skill("1.0.0", "installing", "2.0.0", prev="1.0.0")
FAILED_V2 = skill("", "failed", "2.0.0", SETUP_FAILED)
ROLLED_BACK = skill("1.0.0", "rolled_back", "2.0.0", "health check failed", "2.0.0")
RUNNING_V1 = skill("1.0.0", "running", "1.0.0")


def statuses(devices: list[DeviceView], dep: DeploymentView = V2) -> tuple[str, list[str]]:
    st = deployment_status(dep, devices)
    return st.state, [d.status for d in st.devices]


def test_each_device_is_pending_in_progress_succeeded_failed_or_offline() -> None:
    state, each = statuses(
        [
            device("a", RUNNING_V2),
            device("b", INSTALLING_V2),
            device("c", FAILED_V2),
            device("d", ROLLED_BACK),
            device("e", RUNNING_V1),
            device("f", RUNNING_V1, online=False),
            device("g"),
        ]
    )
    assert each == ["succeeded", "in progress", "failed", "failed", "pending", "offline", "pending"]
    assert state == "partially failed"
    st = deployment_status(V2, [device("d", ROLLED_BACK), device("c", FAILED_V2)])
    assert st.first_failure is not None and st.first_failure.device_id == "c"
    assert st.first_failure.reason == SETUP_FAILED
    assert st.devices[1].reason == "rolled back to 1.0.0: health check failed"
    assert (st.total, st.count("failed"), st.state) == (2, 2, "failed")


def test_the_deployment_state_follows_its_devices() -> None:
    assert statuses([]) == ("pending", [])
    assert statuses([device("a"), device("b", online=False)])[0] == "pending"
    assert statuses([device("a", INSTALLING_V2), device("b")])[0] == "in progress"
    assert statuses([device("a", RUNNING_V2), device("b")])[0] == "in progress"
    assert statuses([device("a", RUNNING_V2), device("b", RUNNING_V2)])[0] == "succeeded"
    assert statuses([device("a", RUNNING_V2), device("b", FAILED_V2)])[0] == "partially failed"
    # A failure of another version is not this deployment's failure.
    other = skill("1.0.0", "failed", "1.0.0", "bad metadata")
    assert statuses([device("a", other)]) == ("pending", ["pending"])
    for stored in ("superseded", "aborted"):
        dep = DeploymentView(7, "digits", "2.0.0", "cams", "all-at-once", {}, stored, 1)
        assert statuses([device("a", RUNNING_V2)], dep)[0] == stored


def test_a_short_reason_is_one_line_with_the_gist() -> None:
    assert (
        short_reason(SETUP_FAILED) == "digits 2.0.0 setup failed: RuntimeError: no camera at /dev/…"
    )
    assert len(short_reason(SETUP_FAILED)) == 60
    assert short_reason("\n  bad metadata: expired\nmore") == "bad metadata: expired"
    assert short_reason("") == ""


# -- the service, on both databases -------------------------------------------------


@pytest.fixture
def fleet(store_url: str, tmp_path: Path) -> Iterator[tuple[FleetService, Store]]:
    """A hub home knowing digits 1.0.0 and 2.0.0 and a ``cams`` group; the devices' store."""
    service = FleetService.init(tmp_path / "hub", store_url=store_url)
    devices = open_store(store_url)
    try:
        for version, sha in (("1.0.0", "a"), ("2.0.0", "b")):
            devices.add_skill_version(
                "digits",
                version,
                target_name=f"digits/digits-{version}.skill",
                sha256=sha * 64,
                size=1,
                manifest="",
                now_ms=1,
            )
        service.groups.create("cams", "kind=camera")
        yield service, devices
    finally:
        devices.close()
        service.close()


def report(store: Store, device_id: str, *states: SkillStatusRecord) -> None:
    generation = store.desired_for(device_id).generation
    store.save_report(device_id, generation, list(states), now_ms=now_ms())


def test_a_failed_install_shows_its_reason(fleet: tuple[FleetService, Store]) -> None:
    service, store = fleet
    store.register_device("cam-1", {"kind": "camera"}, {"board": "arm-cpu"}, now_ms=now_ms())
    dep = service.deployments.create("digits", "2.0.0", "cams")
    report(store, "cam-1", SkillStatusRecord("digits", "", "installing", "", "2.0.0"))
    report(store, "cam-1", SkillStatusRecord("digits", "", "failed", SETUP_FAILED, "2.0.0"))

    [st] = service.deployments.status()
    assert (st.deployment.id, st.state, st.total, st.count("failed")) == (dep.id, "failed", 1, 1)
    assert st.first_failure is not None and st.first_failure.reason == SETUP_FAILED

    shown = service.devices.show("cam-1")
    assert shown.device.device_id == "cam-1" and shown.device.board == "arm-cpu"
    [digits] = shown.skills
    assert (digits.desired_version, digits.reported_version, digits.state) == (
        "2.0.0",
        "",
        "failed",
    )
    assert digits.error == SETUP_FAILED
    assert [e.message for e in digits.transitions] == [
        "digits none -> 2.0.0: installing",
        f"digits none -> 2.0.0: failed: {SETUP_FAILED}",
    ]
    assert shown.reported_ms is not None
    assert any(e.kind == "skill" for e in shown.events)
    with pytest.raises(NotFoundError, match="no device 'nobody'"):
        service.devices.show("nobody")


def test_a_rollback_shows_the_version_kept_and_why(fleet: tuple[FleetService, Store]) -> None:
    service, store = fleet
    store.register_device("cam-1", {"kind": "camera"}, {}, now_ms=now_ms())
    v1 = service.deployments.create("digits", "1.0.0", "cams")
    report(store, "cam-1", SkillStatusRecord("digits", "1.0.0", "running", "", "1.0.0", "", "cpu"))
    v2 = service.deployments.create("digits", "2.0.0", "cams")
    report(store, "cam-1", SkillStatusRecord("digits", "1.0.0", "installing", "", "2.0.0", "1.0.0"))
    rolled = SkillStatusRecord(
        "digits", "1.0.0", "rolled_back", "health check failed: timeout", "2.0.0", "2.0.0"
    )
    report(store, "cam-1", rolled)

    states = {st.deployment.id: st for st in service.deployments.status()}
    assert states[v1.id].state == "superseded" and states[v2.id].state == "failed"
    failure = states[v2.id].first_failure
    assert failure is not None
    assert failure.reason == "rolled back to 1.0.0: health check failed: timeout"

    [digits] = service.devices.show("cam-1").skills
    assert (digits.desired_version, digits.reported_version) == ("2.0.0", "1.0.0")
    assert (digits.state, digits.previous_version) == ("rolled_back", "2.0.0")
    assert [e.message for e in digits.transitions][-1] == (
        "digits 1.0.0 -> 2.0.0: rolled_back to 1.0.0: health check failed: timeout"
    )
    assert [e.message for e in service.events.recent(kind="deployment")][-1] == (
        f"deployment {v1.id} superseded by deployment {v2.id} "
        "(digits 2.0.0 -> group cams (all-at-once))"
    )


def test_a_partial_rollout_counts_each_outcome(fleet: tuple[FleetService, Store]) -> None:
    service, store = fleet
    for name in ("cam-1", "cam-2", "cam-3"):
        store.register_device(name, {"kind": "camera"}, {}, now_ms=now_ms())
    store.register_device("gw-1", {"kind": "gateway"}, {}, now_ms=now_ms())
    dep = service.deployments.create("digits", "2.0.0", "cams")
    report(store, "cam-1", SkillStatusRecord("digits", "2.0.0", "running", "", "2.0.0"))
    refused = "fetch failed: digits-2.0.0.skill: root signed by 0/1 keys"
    report(store, "cam-2", SkillStatusRecord("digits", "", "failed", refused, "2.0.0"))

    [st] = service.deployments.status(dep.id)
    assert st.state == "partially failed"
    assert [(d.device_id, d.status) for d in st.devices] == [
        ("cam-1", "succeeded"),
        ("cam-2", "failed"),
        ("cam-3", "pending"),
    ]
    assert st.first_failure is not None and st.first_failure.reason == refused

    report(store, "cam-3", SkillStatusRecord("digits", "2.0.0", "running", "", "2.0.0"))
    report(store, "cam-2", SkillStatusRecord("digits", "2.0.0", "running", "", "2.0.0"))
    [st] = service.deployments.status(dep.id)
    assert (st.state, st.count("succeeded")) == ("succeeded", 3)
    with pytest.raises(NotFoundError):
        service.deployments.status(999)
