"""Device search and the fleet overview on SQLite and PostgreSQL."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import select, text, update

from cloud.errors import ValidationError
from cloud.presence import presence
from cloud.service.search import MAX_PAGE, DeviceSearch, decode_cursor, encode_cursor
from cloud.store import SkillStatusRecord, Store
from cloud.store.schema import devices, rollouts
from cloud.store.search import PRESENCES, fleet_presence, presence_clause

NOW = 1_000_000_000
HOUR = 3_600_000
BOARDS = ("rpi4", "jetson", "coral")


def _device_id(i: int) -> str:
    return f"dev-{i:03d}"


def fill(store: Store, n: int = 30) -> None:
    """``n`` devices: three boards, two sites, mixed presence, reports of two skills."""
    for i in range(n):
        device = _device_id(i)
        labels = {"site": f"s{i % 2}", "kind": "camera" if i % 3 else "gate"}
        store.register_device(
            device, labels, {"board": BOARDS[i % 3], "ram_mb": 512}, now_ms=NOW - i * HOUR,
            heartbeat_ms=5000,
        )  # fmt: skip
        if i % 5 == 0:
            store.set_device_connected(device, connected=False)
        skills = [SkillStatusRecord("face", "1.0.0" if i % 4 else "2.0.0", "running")]
        if i % 6 == 0:
            skills.append(SkillStatusRecord("plates", "0.1.0", "failed", error="boom"))
        store.save_report(device, 1, skills, now_ms=NOW - i * HOUR)
    # the first device speaks now: online
    store.touch_device(_device_id(1), now_ms=NOW, online=True)


def set_project(store: Store, device_ids: list[str], project: str) -> None:
    with store.engine.begin() as conn:
        conn.execute(
            update(devices).where(devices.c.device_id.in_(device_ids)).values(project=project)
        )


@pytest.fixture
def search(store: Store) -> DeviceSearch:
    fill(store)
    return DeviceSearch(store, clock=lambda: NOW)


def ids(page: object) -> list[str]:
    return [d.device_id for d in page.devices]  # type: ignore[attr-defined]


def expected(store: Store, keep: object) -> list[str]:
    """Every device a Python predicate over the store's own views keeps, by id."""
    states = store.device_states()
    return [s.device.device_id for s in states if keep(s)]  # type: ignore[operator]


def test_no_filter_lists_everything_with_total(search: DeviceSearch) -> None:
    page = search.search(None, limit=500)
    assert page.total == 30
    assert ids(page) == [_device_id(i) for i in range(30)]
    assert page.next_cursor is None


def test_label_group_board_and_text_filters(search: DeviceSearch, store: Store) -> None:
    page = search.search(None, labels="site=s1", group_selector={"kind": "camera"}, limit=500)
    want = expected(store, lambda s: s.device.labels == {"site": "s1", "kind": "camera"})
    assert ids(page) == want and page.total == len(want)
    page = search.search(None, profile="jetson", limit=500)
    assert ids(page) == [_device_id(i) for i in range(30) if i % 3 == 1]
    assert all(d.board == "jetson" for d in page.devices)
    assert search.search(None, profile="JETSON").total == 0
    assert ids(search.search(None, text="V-02", limit=500)) == [
        _device_id(i) for i in range(20, 30)
    ]
    assert search.search(None, text="%").total == 0
    assert search.search(None, text="_").total == 0


def test_skill_and_version_filters_read_the_report(search: DeviceSearch) -> None:
    assert search.search(None, skill="face").total == 30
    v2 = search.search(None, skill="face", version="2.0.0", limit=500)
    assert ids(v2) == [_device_id(i) for i in range(30) if i % 4 == 0]
    plates = search.search(None, skill="plates", limit=500)
    assert ids(plates) == [_device_id(i) for i in range(30) if i % 6 == 0]
    # name and version must hold on the same skill
    assert search.search(None, skill="plates", version="1.0.0").total == 0
    assert search.search(None, version="0.1.0").total == plates.total
    assert search.search(None, skill="fac").total == 0


def test_seen_before_and_after(search: DeviceSearch) -> None:
    page = search.search(None, seen_after_ms=NOW - 3 * HOUR, limit=500)
    assert ids(page) == [_device_id(i) for i in range(4)]
    page = search.search(None, seen_before_ms=NOW - 27 * HOUR, limit=500)
    assert ids(page) == [_device_id(i) for i in (28, 29)]


def test_project_filter(search: DeviceSearch, store: Store) -> None:
    set_project(store, [_device_id(3), _device_id(7)], "acme")
    assert ids(search.search("acme")) == [_device_id(3), _device_id(7)]
    assert search.search("default").total == 28
    assert search.search("nobody").total == 0
    assert search.search(None).total == 30


def test_presence_filter_agrees_with_the_rule(search: DeviceSearch, store: Store) -> None:
    pages = {p: ids(search.search(None, presence=p, limit=500)) for p in PRESENCES}
    assert sorted(itertools.chain(*pages.values())) == [_device_id(i) for i in range(30)]
    for p, got in pages.items():
        assert got == expected(
            store,
            lambda s, p=p: (
                fleet_presence(s.device.last_seen_ms, s.device.heartbeat_ms, s.device.online, NOW)
                == p
            ),
        )
    assert pages["online"] == [_device_id(1)]
    assert _device_id(5) in pages["offline"] and _device_id(2) in pages["stale"]
    shown = search.search(None, presence="stale").devices[0]
    assert shown.presence == "stale" and not shown.online


@settings(max_examples=200, deadline=None)
@given(
    st.integers(0, 10**7),
    st.integers(-1, 10**7),
    st.booleans(),
    st.integers(0, 2 * 10**7),
)
def test_fleet_presence_refines_presence(last: int, beat: int, connected: bool, now: int) -> None:
    three = fleet_presence(last, beat, connected, now)
    assert (three == "online") == (presence(last, beat, connected, now) == "online")
    assert (three == "offline") == (not connected)


PRESENCE_CASES = st.lists(
    st.tuples(st.integers(0, 100_000), st.integers(0, 20_000), st.booleans()),
    min_size=1,
    max_size=12,
)


@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(PRESENCE_CASES, st.integers(0, 150_000))
def test_presence_sql_matches_the_function(
    store: Store, cases: list[tuple[int, int, bool]], now: int
) -> None:
    with store.engine.begin() as conn:
        conn.execute(text("DELETE FROM devices"))
        conn.execute(
            devices.insert(),
            [
                {"device_id": f"p{i}", "profile": "{}", "last_seen_ms": last,
                 "online": on, "heartbeat_ms": beat}
                for i, (last, beat, on) in enumerate(cases)
            ],
        )  # fmt: skip
        for which in PRESENCES:
            got = set(
                conn.execute(
                    select(devices.c.device_id).where(presence_clause(which, now))
                ).scalars()
            )
            want = {
                f"p{i}"
                for i, (last, beat, on) in enumerate(cases)
                if fleet_presence(last, beat, on, now) == which
            }
            assert got == want, which


def test_paging_has_no_gaps_or_duplicates(search: DeviceSearch) -> None:
    for size in (1, 7, 30):
        seen: list[str] = []
        cursor = None
        while True:
            page = search.search(None, labels="site=s0", limit=size, cursor=cursor)
            assert page.total == 15 and len(page.devices) <= size
            seen += ids(page)
            if page.next_cursor is None:
                break
            cursor = page.next_cursor
        assert seen == [_device_id(i) for i in range(0, 30, 2)]


def test_paging_survives_changes_between_pages(search: DeviceSearch, store: Store) -> None:
    first = search.search(None, limit=10)
    # a device before the cursor and one after it change; the next page neither repeats nor skips
    store.set_device_labels(_device_id(2), {"site": "x"})
    store.register_device("dev-0000", {}, {}, now_ms=NOW)  # sorts before dev-001..
    rest = search.search(None, limit=500, cursor=first.next_cursor)
    assert ids(first) + ids(rest) == [_device_id(i) for i in range(30)]


@settings(
    max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.integers(1, 12), st.sampled_from([None, "online", "stale", "offline"]))
def test_paging_property(search: DeviceSearch, size: int, which: str | None) -> None:
    everything = ids(search.search(None, presence=which, limit=500))
    seen: list[str] = []
    cursor = None
    for _ in range(40):
        page = search.search(None, presence=which, limit=size, cursor=cursor)
        seen += ids(page)
        cursor = page.next_cursor
        if cursor is None:
            break
    assert seen == everything


def test_limits_and_cursors_are_checked(search: DeviceSearch) -> None:
    with pytest.raises(ValidationError, match="limit"):
        search.search(None, limit=MAX_PAGE + 1)
    with pytest.raises(ValidationError, match="limit"):
        search.search(None, limit=0)
    with pytest.raises(ValidationError, match="cursor"):
        search.search(None, cursor="nonsense!")
    with pytest.raises(ValidationError, match="presence"):
        search.search(None, presence="asleep")
    with pytest.raises(ValidationError):
        search.search(None, labels="bad label")
    assert decode_cursor(encode_cursor("dev-007")) == "dev-007"


def test_overview_counts_versions_and_alerts(search: DeviceSearch, store: Store) -> None:
    store.create_group("cams", "kind=camera")
    store.create_group("gates", "kind=gate")
    set_project(store, [_device_id(24)], "acme")
    mine = [i for i in range(30) if i != 24]
    store.open_drift_incident("face", "1.0.0", "cams", "accuracy fell", {}, now_ms=NOW)
    store.add_skill_version(
        "face", "2.0.0", target_name="face.skill", sha256="a" * 64, size=1, manifest="[skill]",
        now_ms=1,
    )  # fmt: skip
    deployment = store.create_deployment("face", "2.0.0", "gates", now_ms=NOW)
    store.abort_deployment(deployment.id, now_ms=NOW)
    live = store.create_deployment("face", "2.0.0", "cams", now_ms=NOW)
    view = search.overview("default")
    assert view.totals.devices == 29
    by_group = {g.group: g for g in view.groups}
    assert set(by_group) == {"cams", "gates"}
    cams = [i for i in mine if i % 3]
    assert by_group["cams"].devices == len(cams)
    for g in view.groups:
        listed = search.search("default", labels=g.selector, limit=500).devices
        assert (g.online, g.stale, g.offline) == tuple(
            sum(d.presence == p for d in listed) for p in PRESENCES
        )
    versions = {(v.skill, v.version): v.devices for v in view.versions}
    assert versions == {
        ("face", "1.0.0"): sum(1 for i in mine if i % 4),
        ("face", "2.0.0"): sum(1 for i in mine if i % 4 == 0),
        ("plates", "0.1.0"): sum(1 for i in mine if i % 6 == 0),
    }
    kinds = {(a.kind, a.skill, a.ref) for a in view.alerts}
    failed = next(a for a in view.alerts if a.kind == "failed_install")
    assert failed.devices == 4 and failed.device_id == _device_id(0)
    assert ("rollout", "face", deployment.id) in kinds
    assert ("rollout", "face", live.id) not in kinds
    assert any(a.kind == "drift" and a.group == "cams" for a in view.alerts)
    # a paused rollout is an alert too
    with store.engine.begin() as conn:
        conn.execute(
            rollouts.insert().values(
                deployment_id=live.id, plan="{}", state="{}", phase="paused", admitted=None,
                commands="[]", updated_ms=NOW,
            )
        )  # fmt: skip
    assert ("rollout", "face", live.id) in {
        (a.kind, a.skill, a.ref) for a in search.overview(None).alerts
    }
    acme = search.overview("acme")
    assert (
        acme.totals.devices == 1 and acme.groups == () and acme.alerts[0].kind == "failed_install"
    )
