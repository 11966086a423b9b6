"""Projects (tenants) in the store, the desired-state rule and the fleet service.

The property that matters most: a deployment only ever reaches devices of its
own project, whatever their labels. Store tests run on SQLite and PostgreSQL.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic import command
from alembic.config import Config
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import text

from cloud.enrolment import Enroller, EnrolmentError
from cloud.errors import ConflictError, NotFoundError, ValidationError
from cloud.pki import init_hub_pki
from cloud.rollout import ActiveDeployment, compute_desired, compute_fleet
from cloud.rollout.plan import plan_from_dict
from cloud.selectors import matches
from cloud.service import DeploymentService, DeviceService, FleetService, GroupService
from cloud.store import Store, open_store
from cloud.store.engine import MIGRATIONS_DIR, create_store_engine
from skills.bundle import build_bundle
from tests.cloud.test_enrolment import make_csr

CAMERA = {"kind": "camera"}
CANARY = {"strategy": "canary", "canary": 1, "min_samples": 1, "wave_interval_s": 0}
LIBRARY = Path(__file__).resolve().parents[2] / "skills" / "library"


def add_skill(store: Store, name: str, version: str = "1.0.0", project: str = "default") -> None:
    store.add_skill_version(
        name,
        version,
        target_name=f"{name}/{name}-{version}.skill",
        sha256=(name[0] + version[0]) * 32,
        size=1,
        manifest="[skill]",
        now_ms=1,
        project=project,
    )


def two_tenants(store: Store) -> None:
    """Projects a and b, each with two cameras of the same labels, a group and a skill."""
    store.create_project("a", now_ms=1)
    store.create_project("b", now_ms=1)
    claims = Enrolments(store)
    for project in ("a", "b"):
        for i in range(2):
            claims.enrol(f"{project}-cam-{i}", project)
        store.create_group(f"{project}-cams", "kind=camera", project)
        add_skill(store, f"{project}-face", project=project)


class Enrolments:
    """Devices put in a project the way enrolment does it."""

    def __init__(self, store: Store) -> None:
        self.store = store

    def enrol(self, device_id: str, project: str) -> None:
        self.store.enroll_device(device_id, CAMERA, now_ms=1, project=project)
        self.store.register_device(device_id, {}, {"board": "x86-cpu"}, now_ms=2)


def desired(store: Store, device_id: str) -> list[tuple[str, str]]:
    return [(s.name, s.version) for s in store.desired_for(device_id).skills]


# projects themselves


def test_projects_are_created_listed_and_checked(store: Store) -> None:
    assert [p.name for p in store.list_projects()] == ["default"]
    made = store.create_project("plant-3", now_ms=5)
    assert (made.name, made.created_ms) == ("plant-3", 5)
    assert [p.name for p in store.list_projects()] == ["default", "plant-3"]
    assert store.project_exists("plant-3")
    assert not store.project_exists("nowhere")
    with pytest.raises(ConflictError):
        store.create_project("plant-3", now_ms=6)
    with pytest.raises(ValidationError):
        store.create_project("no spaces", now_ms=6)


def test_nothing_is_made_in_a_project_that_does_not_exist(store: Store) -> None:
    with pytest.raises(NotFoundError, match="no project 'ghost'"):
        store.create_group("cams", "kind=camera", "ghost")
    with pytest.raises(NotFoundError, match="no project 'ghost'"):
        add_skill(store, "face", project="ghost")
    with pytest.raises(NotFoundError, match="no project 'ghost'"):
        store.enroll_device("cam-1", CAMERA, now_ms=1, project="ghost")
    store.create_group("cams", "kind=camera")
    add_skill(store, "face")
    with pytest.raises(NotFoundError, match="no project 'ghost'"):
        store.create_deployment("face", "1.0.0", "cams", now_ms=1, project="ghost")
    with pytest.raises(ValidationError):
        store.create_group("cams2", "kind=camera", "bad name!")
    assert store.list_groups() == [store.get_group("cams")]
    assert store.list_devices() == []
    assert store.list_deployments() == []
    assert [v.name for v in store.list_skill_versions()] == ["face"]


# the rule: isolation between projects


def test_the_rule_never_gives_a_device_another_projects_deployment() -> None:
    theirs = ActiveDeployment(9, "face", "9.0.0", "t9", {}, {}, priority=100, project="b")
    ours = ActiveDeployment(1, "face", "1.0.0", "t1", CAMERA, {}, project="a")
    assert compute_desired(CAMERA, [theirs], "cam", "a") == ()
    assert [s.version for s in compute_desired(CAMERA, [theirs, ours], "cam", "a")] == ["1.0.0"]
    assert [s.version for s in compute_desired(CAMERA, [theirs, ours], "cam", "b")] == ["9.0.0"]
    # a device of no named project is in the default one: neither reaches it
    assert compute_fleet({"cam": CAMERA}, [theirs, ours]) == {"cam": ()}
    fleet = compute_fleet({"x": CAMERA, "y": CAMERA}, [theirs, ours], {"x": "a", "y": "b"})
    assert {d: [s.version for s in skills] for d, skills in fleet.items()} == {
        "x": ["1.0.0"],
        "y": ["9.0.0"],
    }


PROJECTS = ("a", "b", "default")
labels_st = st.dictionaries(st.sampled_from(("kind", "site")), st.sampled_from(("x", "y")))


@st.composite
def deployments_st(draw: st.DrawFn) -> list[ActiveDeployment]:
    ids = draw(st.lists(st.integers(0, 1000), unique=True, max_size=10))
    return [
        ActiveDeployment(
            id=i,
            skill=draw(st.sampled_from(("face", "ocr"))),
            version=f"{i}.0.0",
            target_name=f"t{i}",
            selector=draw(labels_st),
            config={},
            priority=draw(st.integers(0, 2)),
            project=draw(st.sampled_from(PROJECTS)),
        )
        for i in ids
    ]


@settings(max_examples=200, deadline=None)
@given(
    st.dictionaries(st.sampled_from([f"d{i}" for i in range(6)]), labels_st, max_size=6),
    st.dictionaries(st.sampled_from([f"d{i}" for i in range(6)]), st.sampled_from(PROJECTS)),
    deployments_st(),
)
def test_a_device_gets_exactly_what_its_own_projects_deployments_say(
    fleet: dict[str, dict[str, str]],
    projects: dict[str, str],
    active: list[ActiveDeployment],
) -> None:
    by_id = {d.id: d for d in active}
    wanted = compute_fleet(fleet, active, projects)
    for device_id, skills in wanted.items():
        project = projects.get(device_id, "default")
        own = [d for d in active if d.project == project]
        assert skills == compute_desired(fleet[device_id], own, device_id, project)
        for skill in skills:
            (dep,) = [d for d in by_id.values() if d.target_name == skill.target_name]
            assert dep.project == project
            assert matches(dep.selector, fleet[device_id])


# the store: desired state, reads, writes across projects


def test_identical_labels_in_two_projects_get_only_their_own_deployments(store: Store) -> None:
    two_tenants(store)
    store.create_deployment("a-face", "1.0.0", "a-cams", now_ms=3, project="a")
    for i in range(2):
        assert desired(store, f"a-cam-{i}") == [("a-face", "1.0.0")]
        assert desired(store, f"b-cam-{i}") == []
        assert store.desired_for(f"b-cam-{i}").generation == 0
    store.create_deployment("b-face", "1.0.0", "b-cams", now_ms=4, project="b")
    assert desired(store, "a-cam-0") == [("a-face", "1.0.0")]
    assert desired(store, "b-cam-0") == [("b-face", "1.0.0")]
    # relabelling or re-registering a device recomputes it within its own project only
    store.set_device_labels("b-cam-1", {"kind": "camera", "site": "x"})
    store.register_device("b-cam-0", {}, {}, now_ms=5)
    assert desired(store, "b-cam-1") == [("b-face", "1.0.0")]
    assert desired(store, "b-cam-0") == [("b-face", "1.0.0")]


def test_a_group_of_every_device_selects_only_its_projects_devices(store: Store) -> None:
    two_tenants(store)
    store.create_group("a-all", "", "a")
    store.create_deployment("a-face", "1.0.0", "a-all", now_ms=3, project="a")
    assert [d for d in ("a-cam-0", "a-cam-1", "b-cam-0", "b-cam-1") if desired(store, d)] == [
        "a-cam-0",
        "a-cam-1",
    ]


def test_a_staged_rollout_targets_only_its_projects_devices(store: Store) -> None:
    two_tenants(store)
    plan = plan_from_dict(CANARY)
    dep = store.create_deployment("a-face", "1.0.0", "a-cams", plan=plan, now_ms=3, project="a")
    (rollout,) = store.driven_rollouts()
    assert rollout.deployment.id == dep.id
    assert set(store.rollout_facts(rollout).targets) == {"a-cam-0", "a-cam-1"}


def test_a_deployment_across_projects_is_refused_and_changes_nothing(store: Store) -> None:
    two_tenants(store)
    events = len(store.events())
    with pytest.raises(NotFoundError, match="no group 'b-cams'") as group_error:
        store.create_deployment("a-face", "1.0.0", "b-cams", now_ms=3, project="a")
    with pytest.raises(NotFoundError, match=r"no skill b-face version 1\.0\.0") as skill_error:
        store.create_deployment("b-face", "1.0.0", "a-cams", now_ms=3, project="a")
    for error in (group_error, skill_error):
        assert "project" not in str(error.value)
    # the same words as for a group or skill that does not exist at all
    with pytest.raises(NotFoundError, match="no group 'nothing'"):
        store.create_deployment("a-face", "1.0.0", "nothing", now_ms=3, project="a")
    with pytest.raises(NotFoundError):  # the default project is a project like any other
        store.create_deployment("a-face", "1.0.0", "a-cams", now_ms=3)
    assert store.list_deployments() == []
    assert len(store.events()) == events
    assert all(desired(store, d) == [] for d in ("a-cam-0", "a-cam-1", "b-cam-0", "b-cam-1"))


def test_names_are_taken_hub_wide_without_saying_by_whom(store: Store) -> None:
    two_tenants(store)
    with pytest.raises(ConflictError) as group_clash:
        store.create_group("b-cams", "kind=gateway", "a")
    with pytest.raises(ConflictError, match="skill name 'b-face' is taken") as skill_clash:
        add_skill(store, "b-face", "2.0.0", project="a")
    for clash in (group_clash, skill_clash):
        assert "'b'" not in str(clash.value)
    assert store.get_group("b-cams").selector == "kind=camera"
    assert [v.version for v in store.list_skill_versions("b-face")] == ["1.0.0"]
    add_skill(store, "b-face", "2.0.0", project="b")  # the owner adds versions as before
    assert store.get_skill_version("b-face", "2.0.0").project == "b"


def test_store_reads_keep_to_a_project(store: Store) -> None:
    two_tenants(store)
    dep = store.create_deployment("a-face", "1.0.0", "a-cams", now_ms=3, project="a")
    assert [d.device_id for d in store.list_devices(project="b")] == ["b-cam-0", "b-cam-1"]
    assert [d.device_id for d in store.list_devices(CAMERA, project="a")] == ["a-cam-0", "a-cam-1"]
    assert len(store.list_devices()) == 4
    assert store.get_device("a-cam-0", project="b") is None
    assert store.get_device("a-cam-0", project="a") is not None
    assert [g.name for g in store.list_groups(project="a")] == ["a-cams"]
    assert [g.project for g in store.list_groups()] == ["a", "b"]
    assert [v.name for v in store.list_skill_versions(project="b")] == ["b-face"]
    assert store.list_deployments(project="b") == []
    assert store.list_deployments(project="a") == [dep]
    assert store.get_deployment(dep.id, project="a").project == "a"
    with pytest.raises(NotFoundError, match=f"no deployment {dep.id}"):
        store.get_deployment(dep.id, project="b")
    with pytest.raises(NotFoundError, match="no group 'a-cams'"):
        store.get_group("a-cams", project="b")
    with pytest.raises(NotFoundError):
        store.get_skill_version("a-face", "1.0.0", project="b")
    with pytest.raises(NotFoundError, match="no device 'a-cam-0'"):
        store.set_device_labels("a-cam-0", {}, project="b")
    assert store.get_device("a-cam-0", project="a").labels == CAMERA  # type: ignore[union-attr]
    with pytest.raises(NotFoundError, match=f"no deployment {dep.id}"):
        store.abort_deployment(dep.id, now_ms=4, project="b")
    assert store.get_deployment(dep.id).state == "active"


def test_devices_that_register_without_enrolment_are_in_the_default_project(
    store: Store,
) -> None:
    store.create_project("a", now_ms=1)
    first = store.register_device("cam-1", CAMERA, {}, now_ms=1)
    assert first.project == "default"
    assert store.get_device("cam-1").project == "default"  # type: ignore[union-attr]
    store.enroll_device("cam-2", CAMERA, now_ms=1, project="a")
    again = store.register_device("cam-2", {}, {}, now_ms=2)
    assert again.project == "a"


# enrolment


@pytest.fixture
def enroller(tmp_path: Path, store: Store) -> Enroller:
    init_hub_pki(tmp_path / "home")
    return Enroller(tmp_path / "home", store)


def test_a_project_claim_enrols_devices_into_its_project(enroller: Enroller, store: Store) -> None:
    store.create_project("plant-3", now_ms=1)
    token = enroller.create_claim(CAMERA, uses=2, project="plant-3", reenroll=True)
    enroller.enroll(token, make_csr("cam-1"))
    assert store.get_device("cam-1", project="plant-3") is not None
    assert store.get_device("cam-1", project="default") is None
    # a device the hub knew keeps its project, whatever the claim's
    old = enroller.create_claim({"kind": "other"}, reenroll=True)
    enroller.enroll(old, make_csr("cam-1"))
    device = store.get_device("cam-1")
    assert device is not None
    assert (device.project, device.labels) == ("plant-3", {"kind": "other"})


def test_a_claim_needs_a_project_that_exists(enroller: Enroller, store: Store) -> None:
    with pytest.raises(NotFoundError, match="no project 'ghost'"):
        enroller.create_claim(CAMERA, project="ghost")
    with pytest.raises(ValidationError):
        enroller.create_claim(CAMERA, project="bad name")
    token = enroller.create_claim(CAMERA)
    assert enroller.enroll(token, make_csr("cam-1")).device_id == "cam-1"
    assert store.get_device("cam-1").project == "default"  # type: ignore[union-attr]


def test_a_claim_whose_project_is_gone_is_refused(tmp_path: Path, store: Store) -> None:
    init_hub_pki(tmp_path / "home")
    other = open_store(f"sqlite:///{tmp_path / 'other.db'}")
    try:
        other.create_project("gone", now_ms=1)
        token = Enroller(tmp_path / "home", other).create_claim(CAMERA, project="gone")
    finally:
        other.close()
    with pytest.raises(EnrolmentError, match="no project 'gone'"):
        Enroller(tmp_path / "home", store).enroll(token, make_csr("cam-1"))
    assert store.list_devices() == []


# the fleet service


class Clock:
    def __init__(self) -> None:
        self.now = 1_000

    def __call__(self) -> int:
        return self.now


@pytest.fixture
def services(store: Store) -> tuple[DeviceService, GroupService, DeploymentService]:
    devices = DeviceService(store, Clock())
    return devices, GroupService(store), DeploymentService(store, Clock(), devices=devices)


def test_service_reads_keep_to_a_project(
    store: Store, services: tuple[DeviceService, GroupService, DeploymentService]
) -> None:
    devices, groups, deployments = services
    two_tenants(store)
    dep = deployments.create("a-face", "1.0.0", "a-cams", project="a")
    assert dep.project == "a"
    assert [d.device_id for d in devices.list(project="a")] == ["a-cam-0", "a-cam-1"]
    assert {d.project for d in devices.list()} == {"a", "b"}
    assert devices.get("b-cam-0", project="b").project == "b"
    for read in (
        lambda: devices.get("b-cam-0", project="a"),
        lambda: devices.show("b-cam-0", project="a"),
        lambda: devices.label("b-cam-0", {"kind": "x"}, project="a"),
        lambda: groups.get("b-cams", project="a"),
    ):
        with pytest.raises(NotFoundError):
            read()
    assert devices.get("b-cam-0").labels == CAMERA
    # each group counts only its own project's devices, though both select kind=camera
    assert [(g.name, g.devices, g.project) for g in groups.list()] == [
        ("a-cams", 2, "a"),
        ("b-cams", 2, "b"),
    ]
    assert [g.name for g in groups.list(project="b")] == ["b-cams"]
    assert groups.get("a-cams").devices == 2
    assert deployments.list(project="b") == []
    assert deployments.status(project="b") == []
    (status,) = deployments.status(project="a")
    assert [d.device_id for d in status.devices] == ["a-cam-0", "a-cam-1"]
    assert deployments.get(dep.id, project="a") == dep
    assert deployments.rollout(dep.id, project="a") is None


def test_service_changes_across_projects_are_refused_and_change_nothing(
    store: Store, services: tuple[DeviceService, GroupService, DeploymentService]
) -> None:
    _, groups, deployments = services
    two_tenants(store)
    with pytest.raises(NotFoundError, match="no group 'b-cams'"):
        deployments.create("a-face", "1.0.0", "b-cams", project="a")
    with pytest.raises(NotFoundError, match="no skill b-face"):
        deployments.create("b-face", "1.0.0", "a-cams", project="a")
    with pytest.raises(NotFoundError, match="no project 'ghost'"):
        groups.create("g", "kind=camera", project="ghost")
    assert deployments.list() == []
    staged = deployments.create("a-face", "1.0.0", "a-cams", plan=CANARY, project="a")
    groups.create("a-more", "kind=camera", project="a")
    whole = deployments.create("a-face", "1.0.0", "a-more", project="a")
    for change in (
        lambda: deployments.abort(whole.id, project="b"),
        lambda: deployments.rollback(whole.id, project="b"),
        lambda: deployments.abort(staged.id, project="b"),
        lambda: deployments.pause(staged.id, project="b"),
        lambda: deployments.resume(staged.id, project="b"),
        lambda: deployments.rollback(staged.id, project="b"),
        lambda: deployments.status(staged.id, project="b"),
        lambda: deployments.rollout(staged.id, project="b"),
    ):
        with pytest.raises(NotFoundError, match="no deployment"):
            change()
    assert [d.state for d in deployments.list()] == ["active", "active"]
    assert store.rollouts_of([staged.id])[staged.id].commands == ()
    assert deployments.pause(staged.id, project="a").id == staged.id
    assert deployments.abort(whole.id, project="a").state == "aborted"


def _bundle(tmp_path: Path, name: str) -> Path:
    src = tmp_path / f"src-{name}"
    shutil.copytree(LIBRARY / "digits", src)
    toml = (src / "skill.toml").read_text(encoding="utf-8")
    (src / "skill.toml").write_text(toml.replace('name = "digits"', f'name = "{name}"', 1))
    return build_bundle(src, tmp_path / f"dist-{name}")


@pytest.fixture
def fleet(store_url: str, tmp_path: Path) -> Iterator[FleetService]:
    opened = FleetService.init(tmp_path / "hub", store_url=store_url, insecure=True)
    try:
        yield opened
    finally:
        opened.close()


def test_publishing_puts_a_skill_in_a_project_and_guards_its_name(
    fleet: FleetService, tmp_path: Path
) -> None:
    fleet.projects.create("a")
    fleet.projects.create("b")
    bundle = _bundle(tmp_path, "digits")
    published = fleet.skills.publish(bundle, project="a")
    assert published.version.project == "a"
    assert [v.project for v in fleet.skills.list(project="a")] == ["a"]
    assert fleet.skills.list(project="b") == []
    targets = fleet.home / "trust" / "targets"
    signed = sorted(p.name for p in targets.rglob("*") if p.is_file())
    with pytest.raises(ConflictError, match="skill name 'digits' is taken"):
        fleet.skills.publish(bundle, project="b")
    with pytest.raises(NotFoundError, match="no project 'ghost'"):
        fleet.skills.publish(bundle, project="ghost")
    assert sorted(p.name for p in targets.rglob("*") if p.is_file()) == signed  # nothing signed
    assert [v.project for v in fleet.skills.list()] == ["a"]


# migration


def _upgrade(url: str, revision: str) -> None:
    engine = create_store_engine(url)
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    try:
        with engine.begin() as conn:
            config.attributes["connection"] = conn
            command.upgrade(config, revision)
    finally:
        engine.dispose()


def test_rows_from_before_projects_are_in_the_default_project(store_url: str) -> None:
    _upgrade(store_url, "0007")
    engine = create_store_engine(store_url)
    try:
        with engine.begin() as conn:
            for statement in (
                "INSERT INTO devices (device_id, profile, last_seen_ms, online, heartbeat_ms)"
                " VALUES ('cam-1', '{}', 1, false, 0)",
                "INSERT INTO device_labels (device_id, key, value) VALUES ('cam-1', 'kind', 'a')",
                "INSERT INTO device_groups (name, selector) VALUES ('cams', 'kind=a')",
                "INSERT INTO skill_versions (name, version, target_name, sha256, size, manifest,"
                f" created_ms) VALUES ('face', '1.0.0', 'face-1.0.0.skill', '{'a' * 64}', 1,"
                " '', 1)",
                "INSERT INTO deployments (skill, version, group_name, strategy, config, state,"
                " created_ms, priority) VALUES ('face', '1.0.0', 'cams', 'all-at-once', '{}',"
                " 'active', 1, 0)",
            ):
                conn.execute(text(statement))
    finally:
        engine.dispose()
    store = open_store(store_url)
    try:
        assert [p.name for p in store.list_projects()] == ["default"]
        assert store.get_device("cam-1", project="default") is not None
        assert store.get_group("cams", project="default").project == "default"
        assert store.get_skill_version("face", "1.0.0", project="default").project == "default"
        (dep,) = store.list_deployments(project="default")
        assert dep.project == "default"
        store.register_device("cam-1", {}, {}, now_ms=2)  # recomputes: still reached
        assert [s.name for s in store.desired_for("cam-1").skills] == ["face"]
    finally:
        store.close()
