"""Relabelling many devices in one transaction: all change or none (SQLite and PostgreSQL)."""

from __future__ import annotations

from typing import Any

import pytest

from cloud.errors import NotFoundError, StoreError, ValidationError
from cloud.service.devices import DeviceService
from cloud.store import Store
from cloud.store import devices as store_devices
from cloud.store.devices import MAX_LABEL_BATCH


def _fleet(store: Store) -> None:
    store.add_skill_version(
        "face", "1.0.0", target_name="face-1.0.0.skill", sha256="a" * 64, size=1, manifest="",
        now_ms=1,
    )  # fmt: skip
    store.create_group("cameras", "kind=camera")
    for i in range(3):
        store.register_device(f"cam-{i}", {"kind": "camera"}, {}, now_ms=1)
    store.register_device("gw-1", {"kind": "gateway"}, {}, now_ms=1)
    store.create_deployment("face", "1.0.0", "cameras", now_ms=2)


def _state(store: Store) -> tuple[dict[str, dict[str, str]], dict[str, int]]:
    labels = {d.device_id: dict(d.labels) for d in store.list_devices()}
    return labels, store.desired_generations()


def _skills(store: Store, device_id: str) -> list[str]:
    return [s.name for s in store.desired_for(device_id).skills]


def test_every_device_changes_and_desired_state_follows(store: Store) -> None:
    _fleet(store)
    changed = store.set_labels_many(
        {"gw-1": {"kind": "camera", "site": "x"}, "cam-0": {"kind": "gateway"}, "cam-1": {}}
    )
    assert [(r.device_id, r.labels) for r in changed] == [
        ("gw-1", {"kind": "camera", "site": "x"}),
        ("cam-0", {"kind": "gateway"}),
        ("cam-1", {}),
    ]
    labels, _ = _state(store)
    assert labels["gw-1"] == {"kind": "camera", "site": "x"} and labels["cam-1"] == {}
    assert _skills(store, "gw-1") == ["face"]
    assert _skills(store, "cam-0") == _skills(store, "cam-1") == []
    assert _skills(store, "cam-2") == ["face"]
    assert store.set_labels_many({}) == []


@pytest.mark.parametrize(
    ("bad", "error"),
    [
        ({"nobody": {"kind": "camera"}}, NotFoundError),
        ({"cam-2": {"": "camera"}}, ValidationError),
        ({"not a device id!": {"kind": "camera"}}, ValidationError),
    ],
)
def test_one_bad_device_in_the_middle_changes_nothing(
    store: Store, bad: dict[str, dict[str, str]], error: type[Exception]
) -> None:
    _fleet(store)
    before = _state(store)
    batch = {"gw-1": {"kind": "camera"}, **bad, "cam-0": {"kind": "gateway"}}
    with pytest.raises(error):
        store.set_labels_many(batch)
    assert _state(store) == before


def test_a_failure_after_the_labels_are_written_rolls_them_back(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    _fleet(store)
    before = _state(store)

    def broken(*_: Any) -> int:
        raise StoreError("the database went away")

    monkeypatch.setattr(store_devices, "recompute", broken)
    with pytest.raises(StoreError, match="went away"):
        store.set_labels_many({"gw-1": {"kind": "camera"}, "cam-0": {"kind": "gateway"}})
    assert _state(store) == before


def test_a_device_of_another_project_is_not_found_and_nothing_changes(store: Store) -> None:
    _fleet(store)
    store.create_project("b", now_ms=1)
    store.enroll_device("b-cam", {"kind": "camera"}, now_ms=1, project="b")
    before = _state(store)
    with pytest.raises(NotFoundError, match="b-cam"):
        store.set_labels_many({"cam-0": {"kind": "x"}, "b-cam": {"kind": "x"}}, project="default")
    assert _state(store) == before
    assert [r.project for r in store.set_labels_many({"b-cam": {"k": "v"}}, project="b")] == ["b"]


def test_a_batch_over_the_cap_is_refused(store: Store) -> None:
    too_many = {f"d-{i}": {"k": "v"} for i in range(MAX_LABEL_BATCH + 1)}
    with pytest.raises(ValidationError, match="at most"):
        store.set_labels_many(too_many)


def test_the_service_returns_views_and_takes_text_labels(store: Store) -> None:
    _fleet(store)
    service = DeviceService(store, lambda: 10)
    views = service.label_many({"cam-2": "kind=gateway,site=3", "gw-1": {"kind": "camera"}})
    assert [(v.device_id, v.labels, v.project) for v in views] == [
        ("cam-2", {"kind": "gateway", "site": "3"}, "default"),
        ("gw-1", {"kind": "camera"}, "default"),
    ]
    assert views[1].desired_generation > 0
    with pytest.raises(ValidationError):
        service.label_many({"cam-0": "kind=camera", "cam-1": "not a label"})
    assert service.get("cam-0").labels == {"kind": "camera"}
