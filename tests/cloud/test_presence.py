"""Derived presence: the pure rule, its SQL twin, the store, the core, the service and the gauge.

Store-backed tests run on SQLite and on PostgreSQL (the ``store`` fixture).
"""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path

import pytest
from sqlalchemy import select

from cloud.errors import NotFoundError, ValidationError
from cloud.hubcore import HubCore
from cloud.metrics import HubCollector
from cloud.presence import (
    DEFAULT_HEARTBEAT_MS,
    MAX_HEARTBEAT_S,
    MIN_HEARTBEAT_S,
    heartbeat_seconds,
    online_clause,
    presence,
)
from cloud.service.devices import DeviceService
from cloud.store import Store
from cloud.store.schema import devices
from protos import encode_envelope, kind_of, make_envelope, pb
from protos.envelope import now_ms
from skills.trust import TrustRepository
from tests.support import async_wait_until

# -- the pure rule -------------------------------------------------------------------


def test_a_device_is_online_while_its_last_message_is_at_most_two_intervals_old() -> None:
    assert presence(10_000, 1000, True, 10_000) == "online"
    assert presence(10_000, 1000, True, 12_000) == "online"  # exactly two intervals
    assert presence(10_000, 1000, True, 12_001) == "offline"
    assert presence(10_000, 60_000, True, 120_000) == "online"  # its own, longer interval


def test_a_disconnected_device_is_offline_however_fresh_its_last_message() -> None:
    assert presence(10_000, 1000, False, 10_000) == "offline"


def test_an_unknown_interval_means_the_default_of_five_seconds() -> None:
    assert DEFAULT_HEARTBEAT_MS == 5000
    assert presence(0, 0, True, 2 * DEFAULT_HEARTBEAT_MS) == "online"
    assert presence(0, 0, True, 2 * DEFAULT_HEARTBEAT_MS + 1) == "offline"


def test_a_last_message_from_a_clock_slightly_ahead_counts_as_fresh() -> None:
    assert presence(10_500, 1000, True, 10_000) == "online"


@pytest.mark.parametrize(("given", "seconds"), [(1, 1), (5, 5), (300, 300), ("7", 7), (" 60 ", 60)])
def test_heartbeat_intervals_from_1_to_300_seconds_are_accepted(
    given: int | str, seconds: int
) -> None:
    assert heartbeat_seconds(given) == seconds


@pytest.mark.parametrize(
    ("given", "named"),
    [
        (0, "heartbeat 0 s"),
        (MAX_HEARTBEAT_S + 1, "heartbeat 301 s"),
        (-1, "heartbeat -1 s"),
        ("0", "heartbeat 0 s"),
        ("abc", "heartbeat 'abc'"),
        ("", "heartbeat ''"),
        ("1.5", "heartbeat '1.5'"),
        ("-5", "heartbeat '-5'"),
        ("9" * 5000, "heartbeat '999999999999...'"),
        (True, "heartbeat True"),
    ],
)
def test_other_heartbeat_intervals_are_refused_naming_the_value_and_the_range(
    given: int | str, named: str
) -> None:
    with pytest.raises(ValidationError) as caught:
        heartbeat_seconds(given)
    message = str(caught.value)
    assert message.startswith(named)
    assert f"{MIN_HEARTBEAT_S} to {MAX_HEARTBEAT_S} seconds" in message


# -- the SQL twin and the store ------------------------------------------------------

NOW = 1_000_000


def _fleet_of_every_case(store: Store) -> dict[str, tuple[int, int, bool]]:
    """Devices at, around and past their limit, connected or not, with and without an interval."""
    cases: dict[str, tuple[int, int, bool]] = {}
    ages = (0, 1999, 2000, 2001, 9999, 10_000, 10_001, 50_000, -300)
    for n, (age, beat, connected) in enumerate(
        itertools.product(ages, (0, 1000, 5000), (True, False))
    ):
        device_id = f"dev-{n}"
        store.register_device(device_id, {}, {}, now_ms=NOW - age, heartbeat_ms=beat)
        if not connected:
            store.set_device_connected(device_id, connected=False)
        cases[device_id] = (NOW - age, beat, connected)
    return cases


def test_the_sql_rule_and_the_pure_rule_agree_on_every_case(store: Store) -> None:
    cases = _fleet_of_every_case(store)
    expected = {
        d for d, (seen, beat, up) in cases.items() if presence(seen, beat, up, NOW) == "online"
    }
    where = online_clause(devices.c.last_seen_ms, devices.c.heartbeat_ms, devices.c.online, NOW)
    with store.engine.connect() as conn:
        found = set(conn.execute(select(devices.c.device_id).where(where)).scalars())
    assert found == expected
    assert 0 < len(expected) < len(cases)  # the grid has both answers
    assert store.count_devices(now_ms=NOW) == (len(cases), len(expected))


def test_registering_records_the_interval_and_marks_the_device_connected_and_seen(
    store: Store,
) -> None:
    store.register_device("cam-1", {}, {}, now_ms=100, heartbeat_ms=1000)
    device = store.get_device("cam-1")
    assert device is not None
    assert (device.last_seen_ms, device.heartbeat_ms, device.online) == (100, 1000, True)
    store.register_device("cam-1", {}, {}, now_ms=200, heartbeat_ms=30_000)  # a new hub's interval
    again = store.get_device("cam-1")
    assert again is not None and (again.last_seen_ms, again.heartbeat_ms) == (200, 30_000)
    with pytest.raises(ValidationError):
        store.register_device("cam-1", {}, {}, now_ms=300, heartbeat_ms=-1)


def test_connection_news_changes_only_the_flag_never_the_last_seen_time(store: Store) -> None:
    store.register_device("cam-1", {}, {}, now_ms=100, heartbeat_ms=1000)
    store.set_device_connected("cam-1", connected=False)
    device = store.get_device("cam-1")
    assert device is not None and (device.last_seen_ms, device.online) == (100, False)
    store.set_device_connected("cam-1", connected=True)
    device = store.get_device("cam-1")
    assert device is not None and (device.last_seen_ms, device.online) == (100, True)
    with pytest.raises(NotFoundError):
        store.set_device_connected("ghost", connected=True)


def test_an_enrolled_device_that_never_connected_is_offline(store: Store) -> None:
    store.enroll_device("cam-1", {"kind": "camera"}, now_ms=NOW)
    device = store.get_device("cam-1")
    assert device is not None and device.heartbeat_ms == 0
    assert presence(device.last_seen_ms, device.heartbeat_ms, device.online, NOW) == "offline"
    assert store.count_devices(now_ms=NOW) == (1, 0)


# -- the service ---------------------------------------------------------------------


class Clock:
    """A wall clock the test moves."""

    def __init__(self, now: int) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def test_the_device_view_derives_presence_from_the_readers_clock(store: Store) -> None:
    clock = Clock(NOW)
    service = DeviceService(store, clock)
    store.register_device("cam-1", {}, {}, now_ms=NOW, heartbeat_ms=1000)

    view = service.get("cam-1")
    assert (view.presence, view.online, view.heartbeat_ms, view.last_seen_ms) == (
        "online",
        True,
        1000,
        NOW,
    )
    clock.now = NOW + 2000
    assert service.get("cam-1").presence == "online"
    clock.now = NOW + 2001  # two heartbeats missed: the agent died, whoever noticed
    listed = service.list()
    # not online, and the hub never saw the connection end: stale, as the console's search says
    assert [(d.device_id, d.presence, d.online) for d in listed] == [("cam-1", "stale", False)]
    assert service.show("cam-1").device.presence == "stale"

    store.touch_device("cam-1", now_ms=NOW + 2500, online=True)  # a heartbeat comes
    assert service.get("cam-1").presence == "online"
    store.set_device_connected("cam-1", connected=False)  # the hub saw it go
    assert service.get("cam-1").presence == "offline"


# -- the core, as both transports drive it -------------------------------------------


def _core(store: Store, tmp_path: Path, heartbeat_s: int = 1) -> HubCore:
    return HubCore(store, TrustRepository.init(tmp_path / "trust"), heartbeat_s=heartbeat_s)


def _register(device_id: str) -> bytes:
    reg = pb.Register(profile=pb.HardwareProfile(arch="x86_64"))
    return encode_envelope(make_envelope(device_id, register=reg))


def _heartbeat(device_id: str) -> bytes:
    return encode_envelope(make_envelope(device_id, heartbeat=pb.Heartbeat(uptime_s=1)))


def _flag_and_seen(store: Store, device_id: str) -> tuple[bool, int]:
    device = store.get_device(device_id)
    assert device is not None
    return device.online, device.last_seen_ms


def test_the_core_tells_and_records_its_interval_and_heartbeats_move_last_seen(
    store: Store, tmp_path: Path
) -> None:
    core = _core(store, tmp_path, heartbeat_s=3)

    async def run() -> None:
        session = core.session()
        before = now_ms()
        welcome, _ = await session.open(_register("cam-1"))
        assert kind_of(welcome) == "welcome" and welcome.welcome.heartbeat_s == 3
        device = store.get_device("cam-1")
        assert device is not None and device.heartbeat_ms == 3000
        assert device.last_seen_ms >= before and device.online
        store.touch_device("cam-1", now_ms=1)  # as if long silent
        before = now_ms()
        assert await session.receive(_heartbeat("cam-1"), "heartbeat") == []
        await session.close()  # ends before the heartbeat's batch is written: written with it

        def offline_but_heard() -> bool:
            online, last_seen_ms = _flag_and_seen(store, "cam-1")
            return not online and last_seen_ms >= before

        await async_wait_until(offline_but_heard, 10, "the heartbeat written disconnected")
        beat = make_envelope("cam-1", heartbeat=pb.Heartbeat())
        assert await core.handle("cam-1", beat) == []
        await async_wait_until(
            lambda: _flag_and_seen(store, "cam-1")[0], 10, "the heartbeat's batch written"
        )
        await core.disconnected("cam-1")  # the stream ended: disconnected, last seen unchanged
        await async_wait_until(offline_but_heard, 10, "the disconnection written")
        await core.close()

    asyncio.run(run())


def test_a_brokers_status_sets_the_flag_but_never_freshens_a_silent_device(
    store: Store, tmp_path: Path
) -> None:
    core = _core(store, tmp_path)

    async def run() -> None:
        await core.session().open(_register("cam-1"))
        store.touch_device("cam-1", now_ms=1)
        store.set_device_connected("cam-1", connected=False)  # its last will came
        status = core.session("cam-1")  # an MQTT status topic's device
        await status.presence(online=True)  # a retained "online" replayed to a new hub
        await async_wait_until(
            lambda: _flag_and_seen(store, "cam-1")[0], 10, "the retained status written"
        )
        assert _flag_and_seen(store, "cam-1") == (True, 1)
        device = store.get_device("cam-1")
        assert device is not None
        assert presence(1, device.heartbeat_ms, device.online, now_ms()) == "offline"
        await status.presence(online=False)
        await async_wait_until(
            lambda: not _flag_and_seen(store, "cam-1")[0], 10, "the last will written"
        )
        assert _flag_and_seen(store, "cam-1") == (False, 1)
        await core.close()

    asyncio.run(run())


@pytest.mark.parametrize("heartbeat_s", [0, 301])
def test_a_core_with_an_interval_out_of_range_is_refused(
    store: Store, tmp_path: Path, heartbeat_s: int
) -> None:
    with pytest.raises(ValidationError, match=f"heartbeat {heartbeat_s} s"):
        _core(store, tmp_path, heartbeat_s)


# -- the gauge -----------------------------------------------------------------------


def _gauge(collector: HubCollector, name: str) -> float:
    for family in collector.collect():
        if family.name == name:
            return float(family.samples[0].value)
    raise AssertionError(f"no {name}")


def test_the_online_gauge_counts_by_the_same_rule(store: Store, tmp_path: Path) -> None:
    core = _core(store, tmp_path)
    clock = Clock(NOW)
    collector = HubCollector(core, store, clock=clock)
    store.register_device("cam-1", {}, {}, now_ms=NOW, heartbeat_ms=1000)
    store.register_device("cam-2", {}, {}, now_ms=NOW, heartbeat_ms=5000)
    assert _gauge(collector, "edgeskill_hub_devices") == 2
    assert _gauge(collector, "edgeskill_hub_devices_online") == 2
    clock.now = NOW + 2001
    assert _gauge(collector, "edgeskill_hub_devices_online") == 1
    clock.now = NOW + 10_001
    assert _gauge(collector, "edgeskill_hub_devices_online") == 0
    asyncio.run(core.close())
