"""The hub's event log: skill transitions written with the report, deployments, retention."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from sqlalchemy import update

from cloud.errors import NotFoundError, ValidationError
from cloud.hubcore import HubCore
from cloud.service.events import EventService
from cloud.store import SkillStatusRecord, Store, open_store
from cloud.store.events import (
    MAX_EVENT_MESSAGE_BYTES,
    NewEvent,
    insert_events,
    skill_transitions,
)
from cloud.store.schema import reported_states
from protos import make_envelope, pb
from skills.trust import TrustRepository

CAMERA = {"kind": "camera"}


def add_skill(store: Store, name: str, version: str) -> None:
    store.add_skill_version(
        name,
        version,
        target_name=f"{name}-{version}.skill",
        sha256=("a" if version.startswith("1") else "b") * 64,
        size=1,
        manifest="",
        now_ms=1,
    )


def status(
    version: str, state: str, want: str, error: str = "", previous: str = ""
) -> list[SkillStatusRecord]:
    return [SkillStatusRecord("digits", version, state, error, want, previous)]


def messages(store: Store, **filters: object) -> list[str]:
    return [e.message for e in store.events(**filters)]  # type: ignore[arg-type]


# -- the pure diff -------------------------------------------------------------------


def test_transitions_name_the_versions_the_state_and_the_reason() -> None:
    running = status("1.0.0", "running", "1.0.0")
    rolled = status("1.0.0", "rolled_back", "2.0.0", "health check failed:\nboom", "2.0.0")
    [event] = skill_transitions("cam-1", running, rolled)
    assert (event.kind, event.device_id, event.subject) == ("skill", "cam-1", "digits")
    assert (
        event.message == "digits 1.0.0 -> 2.0.0: rolled_back to 1.0.0: health check failed:\nboom"
    )
    assert skill_transitions("cam-1", rolled, rolled) == []  # the same failure again: nothing
    [first] = skill_transitions("cam-1", [], status("", "installing", "1.0.0"))
    assert first.message == "digits none -> 1.0.0: installing"
    [gone] = skill_transitions("cam-1", running, [])
    assert gone.message == "digits 1.0.0 -> none: removed"


# -- the store -----------------------------------------------------------------------


def test_each_skill_transition_is_logged_with_the_report_that_made_it(store: Store) -> None:
    store.register_device("cam-1", CAMERA, {}, now_ms=1)
    store.register_device("cam-2", CAMERA, {}, now_ms=1)
    store.save_report("cam-1", 1, status("", "installing", "1.0.0"), now_ms=10)
    store.save_report(
        "cam-1", 1, status("", "failed", "1.0.0", "setup failed:\nRuntimeError"), now_ms=11
    )
    store.save_report(
        "cam-1", 1, status("", "failed", "1.0.0", "setup failed:\nRuntimeError"), now_ms=12
    )
    store.save_report("cam-2", 1, status("1.0.0", "running", "1.0.0"), now_ms=13)
    assert messages(store, device_id="cam-1") == [
        "digits none -> 1.0.0: installing",
        "digits none -> 1.0.0: failed: setup failed:\nRuntimeError",
    ]
    assert [e.at_ms for e in store.events(device_id="cam-1")] == [10, 11]
    assert messages(store, device_id="cam-2") == ["digits none -> 1.0.0: running"]

    # A late report (redelivered after a newer one) changes nothing, so it logs nothing.
    store.save_report("cam-1", 1, status("1.0.0", "running", "1.0.0"), now_ms=5)
    assert len(store.events(device_id="cam-1")) == 2
    assert store.reported_for("cam-1").skills[0].state == "failed"  # type: ignore[union-attr]
    # A report of an unknown device is refused whole: no event either.
    with pytest.raises(NotFoundError):
        store.save_report("ghost", 1, status("1.0.0", "running", "1.0.0"), now_ms=20)
    assert store.events(device_id="ghost") == []


def test_a_refused_report_leaves_no_event_and_no_report(store: Store) -> None:
    store.register_device("cam-1", CAMERA, {}, now_ms=1)
    bad = [SkillStatusRecord("digits", "1.0.0", "no spaces allowed", "", "1.0.0")]
    with pytest.raises(ValidationError):
        store.save_report("cam-1", 1, bad, now_ms=2)
    assert store.reported_for("cam-1") is None and store.events() == []


def test_a_corrupt_stored_report_is_replaced_not_a_dead_end(store: Store) -> None:
    store.register_device("cam-1", CAMERA, {}, now_ms=1)
    store.save_report("cam-1", 1, status("1.0.0", "running", "1.0.0"), now_ms=2)
    with store.engine.begin() as conn:
        conn.execute(update(reported_states).values(skills="not json"))
    store.save_report("cam-1", 1, status("1.0.0", "failed", "1.0.0", "gone"), now_ms=3)
    assert store.reported_for("cam-1").skills[0].error == "gone"  # type: ignore[union-attr]
    assert messages(store)[-1] == "digits none -> 1.0.0: failed: gone"


def test_a_newer_deployment_of_a_skill_supersedes_the_older_on_that_group(store: Store) -> None:
    store.register_device("cam-1", CAMERA, {}, now_ms=1)
    store.create_group("cams", "kind=camera")
    for name, version in (("digits", "1.0.0"), ("digits", "2.0.0"), ("ocr", "1.0.0")):
        add_skill(store, name, version)
    v1 = store.create_deployment("digits", "1.0.0", "cams", now_ms=2)
    ocr = store.create_deployment("ocr", "1.0.0", "cams", now_ms=3)
    v2 = store.create_deployment("digits", "2.0.0", "cams", now_ms=4)
    states = {d.id: d.state for d in store.list_deployments()}
    assert states == {v1.id: "superseded", ocr.id: "active", v2.id: "active"}
    assert messages(store, kind="deployment")[-2:] == [
        f"deployment {v2.id} created: digits 2.0.0 -> group cams (all-at-once)",
        f"deployment {v1.id} superseded by deployment {v2.id} "
        "(digits 2.0.0 -> group cams (all-at-once))",
    ]
    # Aborting the newer one brings the one it superseded back.
    store.abort_deployment(v2.id, now_ms=5)
    assert store.get_deployment(v1.id).state == "active"
    assert {s.name: s.version for s in store.desired_for("cam-1").skills} == {
        "digits": "1.0.0",
        "ocr": "1.0.0",
    }
    assert messages(store, kind="deployment")[-2:] == [
        f"deployment {v2.id} aborted",
        f"deployment {v1.id} active again (digits 1.0.0 -> group cams) "
        f"after deployment {v2.id} was aborted",
    ]
    # An aborted superseded deployment never comes back.
    v3 = store.create_deployment("digits", "2.0.0", "cams", now_ms=6)
    store.abort_deployment(v1.id, now_ms=7)
    store.abort_deployment(v3.id, now_ms=8)
    assert store.get_deployment(v1.id).state == "aborted"
    assert [s.name for s in store.desired_for("cam-1").skills] == ["ocr"]


def test_a_refused_deployment_logs_nothing(store: Store) -> None:
    store.create_group("cams", "kind=camera")
    with pytest.raises(NotFoundError):
        store.create_deployment("digits", "9.9.9", "cams", now_ms=1)
    assert store.events() == []


def test_listing_filters_pages_and_caps(store: Store) -> None:
    for i in range(5):
        store.record_event(NewEvent("device", f"m{i}", f"cam-{i % 2}"), now_ms=i)
    store.record_event(NewEvent("security", "x" * (MAX_EVENT_MESSAGE_BYTES + 10)), now_ms=9)
    assert messages(store, limit=2)[0] == "m4"
    assert messages(store, device_id="cam-0") == ["m0", "m2", "m4"]
    first = store.events(limit=1, after_id=0)[0]
    assert first.message == "m0"
    assert messages(store, after_id=first.id, limit=2) == ["m1", "m2"]
    assert len(store.events(kind="security")[0].message) == MAX_EVENT_MESSAGE_BYTES
    with pytest.raises(ValidationError):
        store.events(limit=0)
    with pytest.raises(ValidationError):
        store.record_event(NewEvent("not a kind", "m"), now_ms=1)
    with pytest.raises(ValidationError, match="unknown event kind 'nope'"):
        EventService(store).recent(kind="nope")


def test_old_events_are_pruned_by_count_and_by_age(store: Store) -> None:
    for i in range(10):
        store.record_event(NewEvent("device", f"m{i}"), now_ms=1000 + i)
    assert store.prune_events(now_ms=2000, keep=6, max_age_ms=10_000) == 4
    assert messages(store) == [f"m{i}" for i in range(4, 10)]
    assert store.prune_events(now_ms=2000, keep=100, max_age_ms=994) == 2  # before 1006
    assert messages(store) == [f"m{i}" for i in range(6, 10)]

    # The log prunes itself when an event's id is a multiple of prune_every.
    with store.engine.begin() as conn:
        for i in range(10):
            insert_events(conn, [NewEvent("device", f"n{i}")], at_ms=3000, keep=3, prune_every=5)
    assert messages(store) == ["n7", "n8", "n9"]  # pruned at ids 15 and 20


def test_the_hub_core_logs_registrations_and_security_events_once(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'hub.db'}")
    core = HubCore(store, TrustRepository.init(tmp_path / "trust"))
    try:
        profile = pb.HardwareProfile(arch="x86_64", board="jetson-orin")
        asyncio.run(core.register(make_envelope("cam-1", register=pb.Register(profile=profile))))
        event = pb.SecurityEvent(kind="desired-refused", reason="foreign", subject="s", count=2)
        env = make_envelope("cam-1", security_event=event)
        asyncio.run(core.handle("cam-1", env))
        asyncio.run(core.handle("cam-1", env))  # redelivered: logged once
        assert messages(store, device_id="cam-1") == [
            "cam-1 registered (jetson-orin)",
            "desired-refused (foreign) x2 s",
        ]
        assert [e.kind for e in store.events()] == ["device", "security"]
    finally:
        store.close()


def test_an_enrolment_is_logged_with_the_labels_its_claim_gave(store: Store) -> None:
    store.enroll_device("cam-9", {"site": "p3", "kind": "camera"}, now_ms=1_000)
    assert messages(store, device_id="cam-9") == ["cam-9 enrolled (kind=camera,site=p3)"]
    with pytest.raises(ValidationError):
        store.enroll_device("a/b", {}, now_ms=1_000)
    assert messages(store, device_id="a/b") == []
