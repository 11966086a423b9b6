"""The registry store, on SQLite and PostgreSQL (see conftest.py)."""

from __future__ import annotations

import dataclasses
import sqlite3
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import text

from cloud.errors import ConflictError, NotFoundError, StoreError, ValidationError
from cloud.store import (
    DesiredSkill,
    SkillStatusRecord,
    Store,
    TelemetryRecord,
    open_store,
)
from cloud.store.engine import MIGRATIONS_DIR
from cloud.store.schema import metadata
from tests.support import wait_until

SHA_A = "a" * 64
SHA_B = "b" * 64
CAMERA = {"kind": "camera", "site": "plant-3"}


def add_skill(store: Store, name: str = "face", version: str = "1.0.0", sha: str = SHA_A) -> None:
    store.add_skill_version(
        name,
        version,
        target_name=f"{name}-{version}.skill",
        sha256=sha,
        size=100,
        manifest="[skill]",
        now_ms=1,
    )


def window(**changes: Any) -> TelemetryRecord:
    values: dict[str, Any] = {
        "skill": "face",
        "version": "1.0.0",
        "inferences": 10,
        "labelled": 4,
        "correct": 3,
        "latency_p50_ms": 2.0,
        "latency_p99_ms": 9.0,
        "latency_p95_ms": 7.0,
        "errors": 2,
        "window_start_ms": 0,
        "window_end_ms": 1000,
        "metrics": {"drift": 0.25},
        "received_ms": 1500,
    }
    values.update(changes)
    return TelemetryRecord(**values)


def scalar(store: Store, sql: str) -> Any:
    with store.engine.connect() as conn:
        return conn.execute(text(sql)).scalar()


def versions(store: Store, device_id: str) -> dict[str, str]:
    return {s.name: s.version for s in store.desired_for(device_id).skills}


# devices and groups


def test_register_device_inserts_then_updates(store: Store) -> None:
    first = store.register_device("cam-1", CAMERA, {"arch": "x86_64", "cpus": 4}, now_ms=10)
    assert store.get_device("cam-1") == first
    assert first.online and first.profile == {"arch": "x86_64", "cpus": 4}

    store.touch_device("cam-1", now_ms=20, online=False)
    # A device registering again cannot change its labels (only the hub's API can).
    again = store.register_device("cam-1", {"kind": "gateway"}, {"arch": "arm64"}, now_ms=30)
    stored = store.get_device("cam-1")
    assert stored == again
    assert (stored.labels, stored.profile, stored.last_seen_ms, stored.online) == (
        CAMERA,
        {"arch": "arm64"},
        30,
        True,
    )
    assert store.get_device("nope") is None


def test_touch_device_updates_presence_and_refuses_unknown_devices(store: Store) -> None:
    store.register_device("cam-1", CAMERA, {}, now_ms=10)
    store.touch_device("cam-1", now_ms=11)
    assert store.get_device("cam-1").online  # type: ignore[union-attr]
    store.touch_device("cam-1", now_ms=12, online=False)
    device = store.get_device("cam-1")
    assert device is not None and (device.last_seen_ms, device.online) == (12, False)
    with pytest.raises(NotFoundError):
        store.touch_device("ghost", now_ms=13)


def test_record_presence_writes_heard_times_and_news_in_one_go_and_skips_unknown_ones(
    store: Store,
) -> None:
    for device in ("cam-1", "cam-2", "cam-3", "cam-4"):
        store.register_device(device, CAMERA, {}, now_ms=10)
        store.touch_device(device, now_ms=11, online=device != "cam-3")
    unknown = store.record_presence(
        {
            "cam-1": (20, True),
            "cam-2": (21, False),  # heard, then news that it went
            "cam-3": (None, True),  # news only: connected, but not seen any later
            "cam-4": (None, False),
            "ghost": (22, True),
        }
    )
    assert unknown == {"ghost"}
    seen = {d.device_id: (d.last_seen_ms, d.online) for d in store.list_devices()}
    assert seen == {
        "cam-1": (20, True),
        "cam-2": (21, False),
        "cam-3": (11, True),
        "cam-4": (11, False),
    }
    with pytest.raises(ValidationError):
        store.record_presence({"cam-3": (30, False), "a/b": (None, True)})
    with pytest.raises(ValidationError):
        store.record_presence({"cam-3": (30, False), "cam-4": (-1, True)})
    unchanged = store.get_device("cam-3")
    assert unchanged is not None and (unchanged.last_seen_ms, unchanged.online) == (11, True)


def test_list_devices_filters_by_selector(store: Store) -> None:
    store.register_device("cam-2", CAMERA, {}, now_ms=1)
    store.register_device("cam-1", {"kind": "camera", "site": "plant-4"}, {}, now_ms=1)
    store.register_device("gw-1", {"kind": "gateway", "site": "plant-3"}, {}, now_ms=1)
    store.register_device("bare", {}, {}, now_ms=1)
    assert [d.device_id for d in store.list_devices()] == ["bare", "cam-1", "cam-2", "gw-1"]
    assert [d.device_id for d in store.list_devices({"kind": "camera"})] == ["cam-1", "cam-2"]
    assert [d.device_id for d in store.list_devices(CAMERA)] == ["cam-2"]
    assert store.list_devices({"kind": "printer"}) == []
    assert store.list_devices({})[0].labels == {}


@pytest.mark.parametrize(
    ("device_id", "labels", "profile"),
    [
        ("bad id", CAMERA, {}),
        ("x" * 129, CAMERA, {}),
        ("cam/1", CAMERA, {}),
        ("cam-1", {"kind": "a b"}, {}),
        ("cam-1", CAMERA, {"blob": "x" * 70_000}),
        ("cam-1", CAMERA, {"obj": object()}),
    ],
)
def test_register_device_refuses_bad_input_and_writes_nothing(
    store: Store, device_id: str, labels: dict[str, str], profile: dict[str, object]
) -> None:
    with pytest.raises(ValidationError):
        store.register_device(device_id, labels, profile, now_ms=1)
    assert store.list_devices() == []


def test_groups_are_unique_and_canonical(store: Store) -> None:
    group = store.create_group("cams", " site=plant-3 , kind=camera ")
    assert group.selector == "kind=camera,site=plant-3"
    assert store.get_group("cams") == group
    with pytest.raises(ConflictError):
        store.create_group("cams", "kind=gateway")
    assert store.get_group("cams").selector == "kind=camera,site=plant-3"
    store.create_group("all", "")
    assert [g.name for g in store.list_groups()] == ["all", "cams"]
    with pytest.raises(NotFoundError):
        store.get_group("nope")
    for name, selector in (("bad name", ""), ("ok", "kind"), ("ok", "a=b,a=c")):
        with pytest.raises(ValidationError):
            store.create_group(name, selector)
    assert len(store.list_groups()) == 2


# skills


def test_skill_versions_are_immutable(store: Store) -> None:
    add_skill(store, "face", "1.0.0", SHA_A)
    add_skill(store, "face", "1.0.0", SHA_A)  # the same bundle again is fine
    with pytest.raises(ConflictError):
        add_skill(store, "face", "1.0.0", SHA_B)
    assert store.get_skill_version("face", "1.0.0").sha256 == SHA_A
    add_skill(store, "face", "1.1.0", SHA_B)
    add_skill(store, "ocr", "0.1.0", SHA_B)
    assert [(s.name, s.version) for s in store.list_skill_versions()] == [
        ("face", "1.0.0"),
        ("face", "1.1.0"),
        ("ocr", "0.1.0"),
    ]
    assert [s.version for s in store.list_skill_versions("ocr")] == ["0.1.0"]
    with pytest.raises(NotFoundError):
        store.get_skill_version("face", "9.9.9")


def test_add_skill_version_validates(store: Store) -> None:
    kwargs: dict[str, Any] = {"target_name": "t.skill", "size": 1, "manifest": "", "now_ms": 1}
    with pytest.raises(ValidationError):
        store.add_skill_version("face", "1.0", sha256="XYZ", **kwargs)
    with pytest.raises(ValidationError):
        store.add_skill_version("face", "1.0", sha256=SHA_A, **{**kwargs, "size": -1})
    with pytest.raises(ValidationError):
        store.add_skill_version("face", "1.0", sha256=SHA_A, **{**kwargs, "target_name": "../x"})
    with pytest.raises(ValidationError):
        store.add_skill_version("face", "1.0", sha256=SHA_A, **{**kwargs, "manifest": "x" * 2**21})
    assert store.list_skill_versions() == []


# deployments and desired state


def test_deployment_sets_desired_state_of_matching_devices_only(store: Store) -> None:
    store.register_device("cam-1", CAMERA, {}, now_ms=1)
    store.register_device("gw-1", {"kind": "gateway"}, {}, now_ms=1)
    store.create_group("cams", "kind=camera")
    add_skill(store)
    dep = store.create_deployment("face", "1.0.0", "cams", config={"threshold": "0.6"}, now_ms=5)
    assert (dep.state, dep.config, dep.strategy) == ("active", {"threshold": "0.6"}, "all-at-once")
    assert store.get_deployment(dep.id) == dep
    assert store.list_deployments() == [dep]
    desired = store.desired_for("cam-1")
    assert desired.generation == 1
    assert desired.skills == (
        DesiredSkill("face", "1.0.0", "face-1.0.0.skill", {"threshold": "0.6"}),
    )
    assert store.desired_for("gw-1").generation == 0
    assert store.desired_for("unknown").skills == ()

    # A device joining later, or re-registering unchanged, gets the same state.
    store.register_device("cam-2", {"kind": "camera"}, {}, now_ms=6)
    assert store.desired_for("cam-2").skills == desired.skills
    store.register_device("cam-1", CAMERA, {"new": "profile"}, now_ms=7)
    assert store.desired_for("cam-1") == desired
    # Registering with other labels changes nothing; losing the label through the hub's
    # API drops the skill and bumps the generation.
    store.register_device("cam-1", {"kind": "gateway"}, {}, now_ms=8)
    assert store.desired_for("cam-1") == desired
    store.set_device_labels("cam-1", {"kind": "gateway"})
    assert store.desired_for("cam-1").generation == 2
    assert store.desired_for("cam-1").skills == ()


def test_newest_deployment_wins_so_redeploying_an_old_version_rolls_back(store: Store) -> None:
    store.register_device("cam-1", CAMERA, {}, now_ms=1)
    store.create_group("cams", "kind=camera")
    store.create_group("plant-3", "site=plant-3")
    add_skill(store, "face", "1.0.0", SHA_A)
    add_skill(store, "face", "2.0.0", SHA_B)
    add_skill(store, "ocr", "0.1.0", SHA_A)

    store.create_deployment("face", "1.0.0", "cams", now_ms=1)
    v2 = store.create_deployment("face", "2.0.0", "plant-3", now_ms=2)
    store.create_deployment("ocr", "0.1.0", "cams", now_ms=3)
    assert versions(store, "cam-1") == {"face": "2.0.0", "ocr": "0.1.0"}
    assert store.desired_for("cam-1").generation == 3

    rollback = store.create_deployment("face", "1.0.0", "cams", now_ms=4)
    assert versions(store, "cam-1") == {"face": "1.0.0", "ocr": "0.1.0"}
    assert store.desired_for("cam-1").generation == 4

    # Aborting the rollback brings back the newest remaining deployment.
    aborted = store.abort_deployment(rollback.id, now_ms=5)
    assert aborted.state == "aborted" and store.get_deployment(rollback.id) == aborted
    assert versions(store, "cam-1") == {"face": "2.0.0", "ocr": "0.1.0"}
    assert store.desired_for("cam-1").generation == 5
    assert store.abort_deployment(rollback.id, now_ms=6) == aborted
    store.abort_deployment(v2.id, now_ms=7)
    assert versions(store, "cam-1") == {"face": "1.0.0", "ocr": "0.1.0"}
    with pytest.raises(NotFoundError):
        store.abort_deployment(999, now_ms=8)


def test_same_desired_set_keeps_the_generation(store: Store) -> None:
    store.register_device("cam-1", CAMERA, {}, now_ms=1)
    store.create_group("cams", "kind=camera")
    store.create_group("everyone", "")
    add_skill(store)
    store.create_deployment("face", "1.0.0", "cams", now_ms=1)
    store.create_deployment("face", "1.0.0", "everyone", now_ms=2)  # same result
    assert store.desired_for("cam-1").generation == 1
    store.create_deployment("face", "1.0.0", "everyone", config={"a": "b"}, now_ms=3)
    assert store.desired_for("cam-1").generation == 2


def test_create_deployment_with_missing_parts_changes_nothing(store: Store) -> None:
    store.register_device("cam-1", CAMERA, {}, now_ms=1)
    store.create_group("cams", "kind=camera")
    add_skill(store)
    with pytest.raises(NotFoundError):
        store.create_deployment("face", "1.0.0", "no-such-group", now_ms=2)
    with pytest.raises(NotFoundError):
        store.create_deployment("face", "9.0.0", "cams", now_ms=2)
    with pytest.raises(ValidationError):
        store.create_deployment("face", "1.0.0", "cams", config={"k": "v" * 2000}, now_ms=2)
    with pytest.raises(ValidationError, match="unknown rollout strategy 'no spaces'"):
        store.create_deployment("face", "1.0.0", "cams", strategy="no spaces", now_ms=2)
    with pytest.raises(ValidationError, match="unknown rollout strategy 'blue-green'"):
        store.create_deployment("face", "1.0.0", "cams", strategy="blue-green", now_ms=2)
    assert store.list_deployments() == []
    assert scalar(store, "SELECT count(*) FROM deployments") == 0
    assert store.desired_for("cam-1").generation == 0


def test_failure_after_the_insert_rolls_the_whole_deployment_back(store: Store) -> None:
    store.register_device("cam-1", CAMERA, {}, now_ms=1)
    store.create_group("cams", "kind=camera")
    store.create_group("broken", "kind=camera")
    add_skill(store, "face", "1.0.0")
    add_skill(store, "ocr", "1.0.0")
    store.create_deployment("ocr", "1.0.0", "broken", now_ms=1)
    before = store.desired_for("cam-1")
    # Corrupt another group behind the store's back: the recompute that follows
    # the deployment insert reads every active deployment and fails on it.
    with store.engine.begin() as conn:
        conn.execute(
            text("UPDATE device_groups SET selector = 'not a selector' WHERE name = 'broken'")
        )
    with pytest.raises(StoreError, match="corrupt"):
        store.create_deployment("face", "1.0.0", "cams", now_ms=2)
    assert [d.skill for d in store.list_deployments()] == ["ocr"]
    assert store.desired_for("cam-1") == before


# reported state


def test_reports_round_trip_and_need_a_registered_device(store: Store) -> None:
    assert store.reported_for("cam-1") is None
    store.register_device("cam-1", CAMERA, {}, now_ms=1)
    skills = [
        SkillStatusRecord("face", "2.0.0", "running", "", "2.0.0", "1.0.0"),
        SkillStatusRecord("ocr", "0.1.0", "failed", "health check timed out"),
    ]
    store.save_report("cam-1", 3, skills, now_ms=50)
    report = store.reported_for("cam-1")
    assert report is not None
    assert (report.generation, report.skills, report.reported_ms) == (3, tuple(skills), 50)
    store.save_report("cam-1", 4, [], now_ms=60)
    assert store.reported_for("cam-1").generation == 4  # type: ignore[union-attr]
    with pytest.raises(NotFoundError):
        store.save_report("ghost", 1, [], now_ms=1)
    with pytest.raises(ValidationError):
        store.save_report("cam-1", 5, [SkillStatusRecord("face", "1", "ok", "e" * 5000)], now_ms=1)
    with pytest.raises(ValidationError):
        store.save_report("cam-1", 5, [SkillStatusRecord("face", "1", "ok")] * 300, now_ms=1)
    assert store.reported_for("cam-1").generation == 4  # type: ignore[union-attr]


def test_many_reports_go_in_one_batch_in_order_and_late_or_unknown_ones_change_nothing(
    store: Store,
) -> None:
    for device in ("cam-1", "cam-2"):
        store.register_device(device, CAMERA, {}, now_ms=1)
    running = [SkillStatusRecord("face", "2.0.0", "running", "", "2.0.0", "1.0.0")]
    installing = [SkillStatusRecord("face", "2.0.0", "installing", "", "2.0.0", "1.0.0")]
    results = store.save_reports_many(
        [
            ("cam-1", 3, installing, 50),
            ("cam-1", 3, running, 60),  # the newer report of the same device, after it
            ("cam-1", 3, installing, 55),  # redelivered late: older than what is stored
            ("cam-2", 2, running, 40),
            ("ghost", 1, running, 40),
        ]
    )
    assert results == [True, True, False, True, False]
    assert store.reported_for("cam-1").skills == tuple(running)  # type: ignore[union-attr]
    assert store.reported_for("cam-2").generation == 2  # type: ignore[union-attr]
    # Each transition logged once, at its report's time, the late one logging nothing.
    logged = [(e.device_id, e.at_ms) for e in store.events(kind="skill")]
    assert logged == [("cam-1", 50), ("cam-1", 60), ("cam-2", 40)]
    # A later batch diffs against what the earlier one stored, and a report of an older
    # generation than the stored one changes nothing.
    assert store.save_reports_many([("cam-2", 2, installing, 80), ("cam-1", 2, [], 90)]) == [
        True,
        False,
    ]
    assert [(e.device_id, e.at_ms) for e in store.events(kind="skill")][3:] == [("cam-2", 80)]
    assert store.reported_for("cam-1").skills == tuple(running)  # type: ignore[union-attr]
    bad = ("cam-2", 9, [SkillStatusRecord("face", "1", "ok", "e" * 5000)], 70)
    with pytest.raises(ValidationError):
        store.check_report(bad)
    with pytest.raises(ValidationError):
        store.save_reports_many([("cam-2", 8, [], 70), bad])
    assert store.reported_for("cam-2").generation == 2  # type: ignore[union-attr]


# telemetry


def test_every_field_of_a_window_comes_back_as_stored(store: Store) -> None:
    sent = TelemetryRecord(
        skill="plates", version="3.1.4", inferences=90, labelled=70, correct=60,
        latency_p50_ms=1.5, latency_p99_ms=9.5, window_start_ms=1_000, window_end_ms=2_000,
        dropped_messages=4, metrics={"drift": 0.5, "ap/50": 0.75}, received_ms=3_000,
        latency_p95_ms=7.25, errors=3,
    )  # fmt: skip
    assert store.add_telemetry_many([("m-all", "cam-9", sent)]) == [True]
    (stored,) = store.telemetry_for("cam-9")
    assert stored == dataclasses.replace(sent, device_id="cam-9")


def test_telemetry_is_idempotent_by_message_id(store: Store) -> None:
    assert store.add_telemetry("m1", "cam-1", window())
    assert not store.add_telemetry("m1", "cam-1", window(inferences=99))
    results = store.add_telemetry_batch(
        "cam-1", [("m2", window()), ("m1", window()), ("m2", window()), ("m3", window())]
    )
    assert results == [True, False, False, True]
    stored = store.telemetry_for("cam-1")
    assert len(stored) == 3
    assert stored[0].inferences == 10 and stored[0].device_id == "cam-1"
    assert stored[0].metrics == {"drift": 0.25}
    assert (stored[0].latency_p95_ms, stored[0].latency_p99_ms) == (7.0, 9.0)
    assert stored[0].errors == 2


def test_a_bad_item_rejects_the_whole_batch(store: Store) -> None:
    bad = [
        window(correct=5),  # more correct than labelled
        window(latency_p50_ms=float("nan")),
        window(latency_p95_ms=-1.0),
        window(errors=11),  # more errors than inferences
        window(metrics={"bad key": 1.0}),
        window(inferences=-1),
        window(device_id="someone-else"),
    ]
    for record in bad:
        with pytest.raises(ValidationError):
            store.add_telemetry_batch("cam-1", [("ok", window()), ("bad", record)])
    with pytest.raises(ValidationError):
        store.add_telemetry("bad id!", "cam-1", window())
    assert store.telemetry_for() == []


def test_telemetry_queries_and_summary(store: Store) -> None:
    store.add_telemetry("a1", "cam-1", window(window_end_ms=1000, latency_p50_ms=2.0))
    store.add_telemetry(
        "a3", "cam-1", window(window_end_ms=3000, version="2.0.0", latency_p50_ms=4.0)
    )
    store.add_telemetry("a2", "cam-1", window(window_end_ms=2000, latency_p50_ms=3.0))
    store.add_telemetry("b1", "cam-1", window(skill="ocr", labelled=0, correct=0))
    store.add_telemetry("c1", "cam-2", window(inferences=5, labelled=5, correct=5))
    assert [t.window_end_ms for t in store.telemetry_for("cam-1", "face")] == [1000, 2000, 3000]
    assert [t.window_end_ms for t in store.telemetry_for("cam-1", "face", limit=2)] == [2000, 3000]
    assert {t.device_id for t in store.telemetry_for(skill="face")} == {"cam-1", "cam-2"}
    with pytest.raises(ValidationError):
        store.telemetry_for(limit=0)

    summary = {(s.device_id, s.skill): s for s in store.telemetry_summary()}
    assert list(summary) == [("cam-1", "face"), ("cam-1", "ocr"), ("cam-2", "face")]
    face = summary[("cam-1", "face")]
    assert (face.inferences, face.labelled, face.correct, face.windows) == (30, 12, 9, 3)
    assert face.accuracy == pytest.approx(0.75)
    assert (face.version, face.latency_p50_ms) == ("2.0.0", 4.0)
    assert summary[("cam-1", "ocr")].accuracy is None
    assert summary[("cam-2", "face")].accuracy == 1.0


# schema, SQLite settings and several processes


def test_migration_head_matches_the_models(store_url: str) -> None:
    store = open_store(store_url)
    try:
        open_store(store_url).close()  # upgrading an up-to-date store is a no-op
        with store.engine.connect() as conn:
            context = MigrationContext.configure(conn, opts={"compare_type": True})
            assert compare_metadata(context, metadata) == []
            head = ScriptDirectory(str(MIGRATIONS_DIR)).get_current_head()
            assert context.get_current_revision() == head
    finally:
        store.close()


def test_sqlite_uses_wal_and_foreign_keys(tmp_path: Path) -> None:
    store = open_store(f"sqlite:///{tmp_path / 'hub.db'}")
    try:
        assert scalar(store, "PRAGMA foreign_keys") == 1
        assert scalar(store, "PRAGMA busy_timeout") >= 1000
    finally:
        store.close()
    with sqlite3.connect(tmp_path / "hub.db") as raw:
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_one_store_is_shared_by_many_threads(store: Store) -> None:
    store.create_group("all", "")
    add_skill(store)
    store.create_deployment("face", "1.0.0", "all", now_ms=1)
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: store.register_device(f"d{i}", {}, {}, now_ms=i), range(64)))
    assert len(store.list_devices()) == 64
    assert {store.desired_for(f"d{i}").generation for i in range(64)} == {1}


def test_open_store_refuses_bad_urls(tmp_path: Path) -> None:
    with pytest.raises(ValidationError):
        open_store("mysql://localhost/db")
    with pytest.raises(ValidationError):
        open_store("not a url")
    with pytest.raises(StoreError):
        open_store(f"sqlite:///{tmp_path / 'missing-dir' / 'hub.db'}")


WORKER = """
import sys, time
from pathlib import Path
from cloud.store import TelemetryRecord, open_store
url, job, worker, go = sys.argv[1], sys.argv[2], int(sys.argv[3]), Path(sys.argv[4])
store = open_store(url)
Path(f"{go}.ready-{worker}").touch()
while not go.exists():  # a poll for the start signal, so that all workers write at once
    time.sleep(0.005)
if job == "telemetry":
    record = TelemetryRecord("face", "1.0.0", 1, 0, 0, 1.0, 1.0, 0, 1)
    ids = [f"m{(i * 7 + worker * 13) % 200}" for i in range(200)]
    stored = 0
    for start in range(0, 200, 20):
        batch = [(i, record) for i in ids[start:start + 20]]
        stored += sum(store.add_telemetry_batch("cam-1", batch))
    print(stored)
else:
    for round_ in range(3):
        config = {"round": str(round_)}
        store.create_deployment(f"skill{worker}", "1.0.0", "all", config=config, now_ms=1)
    print(3)
store.close()
"""


def run_workers(url: str, job: str, count: int, tmp_path: Path) -> list[int]:
    go = tmp_path / f"go-{job}"
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER, url, job, str(i), str(go)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(count)
    ]
    ready = [Path(f"{go}.ready-{i}") for i in range(count)]
    wait_until(lambda: all(p.exists() for p in ready), 60, "every worker to open the store")
    go.touch()
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        results.append(int(out))
    return results


@pytest.mark.slow
def test_concurrent_processes_neither_duplicate_nor_lose_writes(
    store: Store, store_url: str, tmp_path: Path
) -> None:
    store.register_device("cam-1", CAMERA, {}, now_ms=1)
    store.create_group("all", "")
    for i in range(4):
        add_skill(store, f"skill{i}")

    stored = run_workers(store_url, "telemetry", 4, tmp_path)
    assert sum(stored) == 200
    assert scalar(store, "SELECT count(*) FROM telemetry") == 200

    # Each deployment changes the device's desired set: none may be lost.
    run_workers(store_url, "deploy", 4, tmp_path)
    desired = store.desired_for("cam-1")
    assert [(s.name, s.config) for s in desired.skills] == [
        (f"skill{i}", {"round": "2"}) for i in range(4)
    ]
    assert desired.generation == 12
