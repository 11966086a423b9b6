"""Staged rollouts in the store, driven by the rollout loop, on SQLite and PostgreSQL.

Devices and their reports are written to the store as the hub's servers write
them; the loop runs one pass at a time on a clock the test sets.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from sqlalchemy import text

from cloud.errors import NotFoundError, StoreError, ValidationError
from cloud.rollout.events import DeviceOutcome
from cloud.rollout.plan import plan_from_dict
from cloud.rollout.state import RolloutState
from cloud.rollout_loop import ROLLING_TICK_S, ROLLOUT_TICK_S, RolloutLoop, engine_events
from cloud.service.deployments import DeploymentService
from cloud.service.devices import DeviceService
from cloud.store import DeploymentRecord, SkillStatusRecord, Store, TelemetryRecord
from cloud.store.desired import _ADMITTED
from cloud.store.rollout_facts import KPI_COMMIT_LAG_S, KpiTally
from cloud.store.rollouts import RolloutUpdate
from cloud.store.store import open_store
from tests.support import async_wait_until, in_background

CAMERA = {"kind": "camera"}
DEVICES = [f"cam-{i:02d}" for i in range(20)]
#: A canary of 5 devices whose gates need 5 samples, then the rest at once.
CANARY = {"strategy": "canary", "canary": 5, "min_samples": 5, "wave_interval_s": 0}


class Clock:
    """A settable clock in ms."""

    def __init__(self, now: int = 1_000_000) -> None:
        self.now = now

    def __call__(self) -> int:
        return self.now


def add_skill(store: Store, version: str) -> None:
    store.add_skill_version(
        "face", version, target_name=f"face-{version}.skill", sha256="a" * 64, size=1,
        manifest="[skill]", now_ms=1,
    )  # fmt: skip


def desired(store: Store, device: str) -> str:
    skills = store.desired_for(device).skills
    return skills[0].version if skills else ""


def report(store: Store, device: str, version: str, state: str, wanted: str, at: int) -> None:
    generation = store.desired_for(device).generation
    status = SkillStatusRecord("face", version, state, desired_version=wanted)
    store.save_report(device, generation, [status], now_ms=at)


def fleet_on_v1(store: Store, clock: Clock) -> int:
    """20 cameras running face 1.0.0 from an all-at-once deployment; its id."""
    for device in DEVICES:
        store.register_device(device, CAMERA, {}, now_ms=clock.now)
    store.create_group("cams", "kind=camera")
    add_skill(store, "1.0.0")
    add_skill(store, "2.0.0")
    old = store.create_deployment("face", "1.0.0", "cams", now_ms=clock.now)
    for device in DEVICES:
        report(store, device, "1.0.0", "running", "1.0.0", clock.now)
    return old.id


def admitted_devices(store: Store, dep_id: int) -> dict[str, str]:
    rollout = store.rollouts_of([dep_id])[dep_id]
    return dict(rollout.admitted or {})


def phase(store: Store, dep_id: int) -> str:
    return store.rollouts_of([dep_id])[dep_id].phase


def messages(store: Store) -> list[str]:
    return [e.message for e in store.events(kind="deployment", limit=1000)]


def step(loop: RolloutLoop, clock: Clock, ms: int = 1000) -> None:
    clock.now += ms
    loop.pass_once()


def canary_opened(store: Store) -> tuple[Clock, DeploymentRecord, RolloutLoop]:
    """The 20 cameras on 1.0.0, a canary deployment of 2.0.0, and the pass that opened it."""
    clock = Clock()
    fleet_on_v1(store, clock)
    new = store.create_deployment(
        "face", "2.0.0", "cams", plan=plan_from_dict(CANARY), now_ms=clock.now
    )
    loop = RolloutLoop(store, clock=clock)
    step(loop, clock)
    return clock, new, loop


def test_a_staged_deployment_supersedes_nothing_until_its_rollout_completes(store: Store) -> None:
    clock = Clock()
    old_id = fleet_on_v1(store, clock)
    new = store.create_deployment(
        "face", "2.0.0", "cams", plan=plan_from_dict(CANARY), now_ms=clock.now
    )
    assert new.strategy == "canary"
    assert store.get_deployment(old_id).state == "active"
    assert {desired(store, d) for d in DEVICES} == {"1.0.0"}
    assert phase(store, new.id) == "pending"

    loop = RolloutLoop(store, clock=clock)
    step(loop, clock)
    canary = admitted_devices(store, new.id)
    assert len(canary) == 5 and set(canary.values()) == {"2.0.0"}
    for device in DEVICES:
        assert desired(store, device) == ("2.0.0" if device in canary else "1.0.0")
    assert phase(store, new.id) == "canary"
    step(loop, clock)  # nothing reported yet: the canary is in flight, nothing more moves
    assert admitted_devices(store, new.id) == canary

    for device in canary:
        report(store, device, "2.0.0", "running", "2.0.0", clock.now)
    step(loop, clock)
    assert len(admitted_devices(store, new.id)) == 20  # gates passed: the rest opened
    for device in set(DEVICES) - set(canary):
        report(store, device, "2.0.0", "running", "2.0.0", clock.now)
    step(loop, clock)
    step(loop, clock)
    assert phase(store, new.id) == "completed"
    assert store.rollouts_of([new.id])[new.id].admitted is None  # reaches every device now
    assert store.get_deployment(old_id).state == "superseded"
    assert {desired(store, d) for d in DEVICES} == {"2.0.0"}
    log = messages(store)
    assert any("canary opened: 5 -> 2.0.0 (of 20 devices)" in m for m in log)
    assert any("gates passed: install failures 0.0% (0 of 5)" in m for m in log)
    assert any(f"deployment {old_id} superseded by deployment {new.id}" in m for m in log)
    assert any("rollout completed: 20 devices moved" in m for m in log)


def test_a_failing_gate_rolls_the_canary_back_and_leaves_the_old_deployment(store: Store) -> None:
    clock = Clock()
    old_id = fleet_on_v1(store, clock)
    new = store.create_deployment(
        "face", "2.0.0", "cams", plan=plan_from_dict(CANARY), now_ms=clock.now
    )
    loop = RolloutLoop(store, clock=clock)
    step(loop, clock)
    canary = sorted(admitted_devices(store, new.id))
    generations = {d: store.desired_for(d).generation for d in DEVICES}
    for device in canary[:2]:  # the agent fell back to 1.0.0 after 2.0.0 failed
        report(store, device, "1.0.0", "rolled_back", "2.0.0", clock.now)
    for device in canary[2:]:
        report(store, device, "2.0.0", "running", "2.0.0", clock.now)
    step(loop, clock)

    assert phase(store, new.id) == "rolled_back"
    assert store.get_deployment(new.id).state == "aborted"
    assert store.get_deployment(old_id).state == "active"
    assert {desired(store, d) for d in DEVICES} == {"1.0.0"}
    for device in DEVICES:  # only the moved devices got a new desired state
        moved = device in canary
        assert store.desired_for(device).generation == generations[device] + moved
    log = messages(store)
    assert any(
        "rollout rolled back: gate failed: install failures 40.0% (2 of 5), limit 10.0%; "
        "5 devices return to their previous version" in m
        for m in log
    ), log
    assert store.driven_rollouts() == []
    with pytest.raises(ValidationError, match="takes no pause"):
        store.add_rollout_command(new.id, "pause", now_ms=clock.now)


def test_pause_holds_the_waves_and_resume_lets_them_go_on(store: Store) -> None:
    clock, new, loop = canary_opened(store)
    canary = admitted_devices(store, new.id)
    store.add_rollout_command(new.id, "pause", now_ms=clock.now)
    for device in canary:
        report(store, device, "2.0.0", "running", "2.0.0", clock.now)
    for _ in range(3):
        step(loop, clock)
    assert admitted_devices(store, new.id) == canary
    assert phase(store, new.id) == "paused"
    assert any("rollout paused: paused by operator" in m for m in messages(store))

    store.add_rollout_command(new.id, "resume", now_ms=clock.now)
    step(loop, clock)
    assert len(admitted_devices(store, new.id)) == 20
    assert any("rollout resumed" in m for m in messages(store))


def test_a_rolling_deployment_refills_each_freed_place_and_records_when(store: Store) -> None:
    clock = Clock()
    fleet_on_v1(store, clock)
    plan = plan_from_dict(
        {"strategy": "rolling", "rolling": {"max_in_flight": 5}, "min_samples": 5}
    )
    new = store.create_deployment("face", "2.0.0", "cams", plan=plan, now_ms=clock.now)
    assert new.strategy == "rolling"
    loop = RolloutLoop(store, clock=clock)
    deployments = DeploymentService(store, clock, devices=DeviceService(store, clock))
    step(loop, clock)
    first = admitted_devices(store, new.id)
    assert len(first) == 5
    assert deployments.admissions(new.id) == dict.fromkeys(first, clock.now)
    opened = clock.now
    for device in first:
        report(store, device, "2.0.0", "running", "2.0.0", clock.now)
    step(loop, clock)  # the first wave reported: 5 more, its places taken at once
    second = admitted_devices(store, new.id).keys() - first.keys()
    assert len(second) == 5
    for device in sorted(second)[:2]:
        report(store, device, "2.0.0", "running", "2.0.0", clock.now)
    step(loop, clock)  # two places freed: exactly two more
    third = admitted_devices(store, new.id).keys() - first.keys() - second
    assert len(third) == 2
    for device in DEVICES:
        moved = device in first or device in second or device in third
        assert desired(store, device) == ("2.0.0" if moved else "1.0.0")
    admissions = deployments.admissions(new.id)
    assert {admissions[d] for d in first} == {opened}
    assert {admissions[d] for d in third} == {clock.now}
    assert phase(store, new.id) == "wave"
    assert deployments.admissions(new.id - 1) == {}  # the all-at-once deployment
    log = messages(store)  # each fill is a wave; the gates are said leaving the first only
    assert sum("gates passed" in m for m in log) == 1
    assert sum(" opened: " in m for m in log) == 3
    assert loop.pause_s == ROLLING_TICK_S  # under way: freed places are filled sooner
    for device in DEVICES:
        report(store, device, "2.0.0", "running", "2.0.0", clock.now)
    for _ in range(3):
        step(loop, clock)
    assert phase(store, new.id) == "completed" and loop.pause_s == ROLLOUT_TICK_S
    assert sum("gates passed" in m for m in messages(store)) == 2


def test_only_a_rolling_rollout_under_way_shortens_the_pause(store: Store) -> None:
    _, _, loop = canary_opened(store)
    assert (loop.rolling, loop.pause_s) == (False, ROLLOUT_TICK_S)
    with pytest.raises(ValueError, match="rolling_tick_s"):
        RolloutLoop(store, tick_s=1.0, rolling_tick_s=2.0)


class Counted(RolloutLoop):
    """A rollout loop that counts its passes."""

    passes = 0

    def pass_once(self) -> int:
        self.passes += 1
        return super().pass_once()


def test_settled_reports_start_a_rolling_pass_once_half_its_places_may_be_free(
    store: Store,
) -> None:
    clock = Clock()
    fleet_on_v1(store, clock)
    plan = plan_from_dict({"strategy": "rolling", "rolling": {"max_in_flight": 4}})
    store.create_deployment("face", "2.0.0", "cams", plan=plan, now_ms=clock.now)
    # Pauses a test never waits out: only what it is told starts a pass.
    loop = Counted(store, clock=clock, tick_s=600.0, rolling_tick_s=600.0)

    async def drive() -> None:
        async with in_background(loop.factory()()):
            await async_wait_until(lambda: loop.passes == 1 and loop.rolling, 10, "the first pass")
            assert loop.wake_at == 2
            loop.heard("cam-1")  # one of four places: not worth a pass yet
            for _ in range(20):
                await asyncio.sleep(0)
            assert loop.passes == 1
            loop.heard("cam-2")  # half of them
            await async_wait_until(lambda: loop.passes == 2, 10, "a pass woken by two devices")
            for _ in range(50):  # one device's report after report frees one place at most
                loop.heard("cam-3")
            for _ in range(20):
                await asyncio.sleep(0)
            assert loop.passes == 2
            loop.heard("cam-4")
            await async_wait_until(lambda: loop.passes == 3, 10, "a pass woken by a second one")

    asyncio.run(drive())


def test_settled_reports_wake_nothing_without_a_rolling_rollout(store: Store) -> None:
    clock = Clock()
    fleet_on_v1(store, clock)
    store.create_deployment("face", "2.0.0", "cams", plan=plan_from_dict(CANARY), now_ms=clock.now)
    loop = Counted(store, clock=clock, tick_s=600.0, rolling_tick_s=600.0)

    async def drive() -> None:
        async with in_background(loop.factory()()):
            await async_wait_until(lambda: loop.passes == 1, 10, "the first pass")
            for i in range(100):  # a canary holds: reports wait for the next tick
                loop.heard(f"cam-{i}")
            for _ in range(20):
                await asyncio.sleep(0)
            assert loop.passes == 1 and not loop.rolling and loop.wake_at == 0

    asyncio.run(drive())


def test_the_fleet_stop_switch_holds_every_rollout(store: Store) -> None:
    clock = Clock()
    fleet_on_v1(store, clock)
    assert store.set_fleet_stop(True, now_ms=clock.now)
    assert not store.set_fleet_stop(True, now_ms=clock.now)
    assert store.fleet_stopped()
    new = store.create_deployment(
        "face", "2.0.0", "cams", plan=plan_from_dict(CANARY), now_ms=clock.now
    )
    loop = RolloutLoop(store, clock=clock)
    step(loop, clock)
    assert admitted_devices(store, new.id) == {}
    assert phase(store, new.id) == "paused"
    assert store.set_fleet_stop(False, now_ms=clock.now)
    step(loop, clock)
    assert len(admitted_devices(store, new.id)) == 5


def test_operator_rollback_reverts_and_abort_keeps_the_moved_devices(store: Store) -> None:
    clock = Clock()
    old_id = fleet_on_v1(store, clock)
    plan = plan_from_dict(CANARY)
    first = store.create_deployment("face", "2.0.0", "cams", plan=plan, now_ms=clock.now)
    loop = RolloutLoop(store, clock=clock)
    step(loop, clock)
    canary = admitted_devices(store, first.id)
    store.add_rollout_command(first.id, "abort", now_ms=clock.now)
    step(loop, clock)
    assert phase(store, first.id) == "aborted"
    assert store.get_deployment(first.id).state == "active"  # the moved devices keep 2.0.0
    for device in DEVICES:
        assert desired(store, device) == ("2.0.0" if device in canary else "1.0.0")
    step(loop, clock)
    assert admitted_devices(store, first.id) == canary  # an aborted rollout moves nothing

    store.abort_deployment(first.id, now_ms=clock.now)
    second = store.create_deployment("face", "2.0.0", "cams", plan=plan, now_ms=clock.now)
    step(loop, clock)
    assert len(admitted_devices(store, second.id)) == 5
    store.add_rollout_command(second.id, "rollback", now_ms=clock.now)
    step(loop, clock)
    assert phase(store, second.id) == "rolled_back"
    assert {desired(store, d) for d in DEVICES} == {"1.0.0"}
    assert store.get_deployment(old_id).state == "active"


def test_a_stale_pass_is_refused_and_changes_nothing(store: Store) -> None:
    clock = Clock()
    fleet_on_v1(store, clock)
    new = store.create_deployment(
        "face", "2.0.0", "cams", plan=plan_from_dict(CANARY), now_ms=clock.now
    )
    stale = store.rollouts_of([new.id])[new.id]
    RolloutLoop(store, clock=clock).pass_once()  # another leader got there first
    moved = RolloutState(version="2.0.0").to_json()
    change = RolloutUpdate(
        new.id, stale.revision, moved, "wave", dict.fromkeys(DEVICES, "2.0.0"), frozenset(DEVICES)
    )
    assert not store.save_rollout(change, now_ms=clock.now)
    assert len(admitted_devices(store, new.id)) == 5
    assert sum(desired(store, d) == "2.0.0" for d in DEVICES) == 5


def test_rollout_commands_are_refused_with_one_clear_line(store: Store) -> None:
    clock = Clock()
    old_id = fleet_on_v1(store, clock)
    with pytest.raises(ValidationError, match=f"deployment {old_id} rolls out all at once"):
        store.add_rollout_command(old_id, "pause", now_ms=clock.now)
    with pytest.raises(NotFoundError, match="no deployment 999"):
        store.add_rollout_command(999, "pause", now_ms=clock.now)
    with pytest.raises(ValidationError, match="unknown rollout command 'stop'"):
        store.add_rollout_command(old_id, "stop", now_ms=clock.now)


def test_a_higher_priority_wins_over_a_newer_deployment(store: Store) -> None:
    clock = Clock()
    fleet_on_v1(store, clock)
    store.create_group("night", "kind=camera")
    special = plan_from_dict({"priority": 10})
    store.create_deployment("face", "2.0.0", "night", plan=special, now_ms=clock.now)
    store.create_deployment("face", "1.0.0", "cams", now_ms=clock.now)  # newer, priority 0
    assert {desired(store, d) for d in DEVICES} == {"2.0.0"}


def test_an_ab_rollout_splits_the_group_and_compares_kpis(store: Store) -> None:
    clock = Clock()
    fleet_on_v1(store, clock)
    add_skill(store, "3.0.0")
    plan = plan_from_dict(
        {"strategy": "ab", "ab": {"control": "1.0.0", "weight": 50}, "min_samples": 5}
    )
    new = store.create_deployment("face", "3.0.0", "cams", plan=plan, now_ms=clock.now)
    loop = RolloutLoop(store, clock=clock)
    step(loop, clock)
    split = admitted_devices(store, new.id)
    assert set(split) == set(DEVICES) and set(split.values()) == {"1.0.0", "3.0.0"}
    for device, version in split.items():
        skill = store.desired_for(device).skills[0]
        assert (skill.version, skill.target_name) == (version, f"face-{version}.skill")
        p95 = 5.0 if version == "3.0.0" else 0.0  # 1.0.0 as from an agent without p95
        record = TelemetryRecord(
            "face",
            version,
            100,
            100,
            90,
            2.0,
            9.0,
            clock.now - 500,
            clock.now,
            received_ms=0,
            latency_p95_ms=p95,
            errors=4 if version == "3.0.0" else 0,
        )
        store.add_telemetry(f"{device}-1", device, record)
    step(loop, clock)
    state = RolloutState.from_json(store.rollouts_of([new.id])[new.id].state)
    assert {(d, v) for d, v in state.kpis} == set(split.items())
    # the gates compare p95s; a window without one counts with its p99
    assert {k: w.p95_ms for k, w in state.kpis.items()} == {
        (d, v): 5.0 if v == "3.0.0" else 9.0 for d, v in split.items()
    }
    assert {k: w.errors for k, w in state.kpis.items()} == {
        (d, v): 4 if v == "3.0.0" else 0 for d, v in split.items()
    }


def test_corrupt_rollout_rows_are_skipped_not_fatal(store: Store) -> None:
    clock = Clock()
    fleet_on_v1(store, clock)
    new = store.create_deployment(
        "face", "2.0.0", "cams", plan=plan_from_dict(CANARY), now_ms=clock.now
    )
    with store.engine.begin() as conn:
        conn.execute(text('UPDATE rollouts SET plan = \'{"strategy": "nope"}\''))
    assert RolloutLoop(store, clock=clock).pass_once() == 0
    assert admitted_devices(store, new.id) == {}


def test_a_state_and_reports_read_again_are_parsed_once_and_corrupt_ones_always_refused(
    store: Store,
) -> None:
    clock = Clock()
    fleet_on_v1(store, clock)
    new = store.create_deployment(
        "face", "2.0.0", "cams", plan=plan_from_dict(CANARY), now_ms=clock.now
    )
    step(RolloutLoop(store, clock=clock), clock)
    rollout = store.rollouts_of([new.id])[new.id]
    first = RolloutState.from_json(rollout.state)
    assert RolloutState.from_json(rollout.state) is first  # immutable: kept by its text
    assert first.to_json() == rollout.state
    assert first == RolloutState._parse(rollout.state)  # the state the pass wrote, kept
    facts = store.rollout_facts(rollout)
    assert len(facts.reports) == len(DEVICES)
    assert len({id(status) for _, status in facts.reports.values()}) == 1  # one text, one parse
    with store.engine.begin() as conn:
        conn.execute(
            text("UPDATE reported_states SET skills = :s WHERE device_id = 'cam-03'"),
            {"s": '[{"name": "face", "bogus": 1}]'},
        )
    for _ in range(2):  # a failure is not kept: refused every time, naming the device
        with pytest.raises(StoreError, match="cam-03"):
            store.rollout_facts(rollout)
        with pytest.raises(ValidationError, match="not a stored rollout state"):
            RolloutState.from_json(rollout.state[:-1])


def test_an_admitted_map_read_again_is_parsed_once_and_a_corrupt_one_always_refused(
    store: Store,
) -> None:
    clock, new, _ = canary_opened(store)
    admitted = admitted_devices(store, new.id)
    assert len(admitted) == 5
    # Each desired-state write reads every active deployment: the canary's map is
    # parsed once, and the devices it names get 2.0.0, the others keep 1.0.0.
    stored = json.dumps(dict(sorted(admitted.items())), sort_keys=True, separators=(",", ":"))
    first, versions = _ADMITTED.get(stored)
    assert _ADMITTED.get(stored)[0] is first and versions == {"2.0.0"}
    with pytest.raises(TypeError):
        first["cam-99"] = "2.0.0"  # type: ignore[index]  # kept, so read-only
    store.register_device("cam-20", CAMERA, {}, now_ms=clock.now)
    for device in DEVICES:
        want = "2.0.0" if device in admitted else "1.0.0"
        assert [s.version for s in store.desired_for(device).skills] == [want]
    with store.engine.begin() as conn:
        conn.execute(text("UPDATE rollouts SET admitted = '{\"cam-00\": [1]}'"))
    for _ in range(2):  # a failure is not kept: refused every time, and nothing written
        with pytest.raises(StoreError, match="corrupt"):
            store.register_device("cam-21", CAMERA, {}, now_ms=clock.now)
    assert "cam-21" not in store.desired_generations()
    with store.engine.begin() as conn:
        conn.execute(
            text("UPDATE rollouts SET admitted = :a WHERE deployment_id = :d"),
            {"a": stored, "d": new.id},
        )
    store.register_device("cam-21", CAMERA, {}, now_ms=clock.now)
    assert [s.version for s in store.desired_for("cam-21").skills] == ["1.0.0"]


def test_a_pass_joins_only_the_outcomes_the_state_does_not_hold(store: Store) -> None:
    clock, new, loop = canary_opened(store)
    canary = sorted(admitted_devices(store, new.id))
    for device in canary:
        report(store, device, "2.0.0", "running", "2.0.0", clock.now)
    rollout = store.rollouts_of([new.id])[new.id]
    state = RolloutState.from_json(rollout.state)
    facts = store.rollout_facts(rollout)
    first, _ = engine_events(state, facts, rollout.commands, clock.now)
    # The first pass joined every target running 1.0.0; only the canary's news is new.
    assert {(e.device_id, e.version) for e in first if isinstance(e, DeviceOutcome)} == {
        (d, "2.0.0") for d in canary
    }
    step(loop, clock)  # joined and stored
    rollout = store.rollouts_of([new.id])[new.id]
    state = RolloutState.from_json(rollout.state)
    again, _ = engine_events(state, store.rollout_facts(rollout), rollout.commands, clock.now)
    assert not [e for e in again if isinstance(e, DeviceOutcome)]
    report(store, canary[0], "1.0.0", "rolled_back", "2.0.0", clock.now + 1)  # news again
    rollout = store.rollouts_of([new.id])[new.id]
    news, _ = engine_events(state, store.rollout_facts(rollout), rollout.commands, clock.now)
    assert [(e.device_id, e.version, e.outcome) for e in news if isinstance(e, DeviceOutcome)] == [
        (canary[0], "2.0.0", "rolled_back")
    ]


def test_the_leader_reads_back_the_state_it_stored_without_parsing_it(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock, new, loop = canary_opened(store)
    parse = RolloutState._parse
    parsed: list[str] = []

    def counted(cls: type[RolloutState], text: str) -> RolloutState:
        parsed.append(text)
        return parse(text)

    monkeypatch.setattr(RolloutState, "_parse", classmethod(counted))
    for device in admitted_devices(store, new.id):
        report(store, device, "2.0.0", "running", "2.0.0", clock.now)
    before = store.rollouts_of([new.id])[new.id].state
    states = set()
    for _ in range(3):  # the canary's outcomes joined and the rest opened, then quiet passes
        step(loop, clock)
        states.add(store.rollouts_of([new.id])[new.id].state)
    assert len(states) == 1 and before not in states  # a new state stored...
    assert parsed == []  # ...and neither it nor the one before parsed again
    for stored in (before, *states):  # what was kept is what the text says
        assert RolloutState.from_json(stored) == parse(stored)


class Seconds:
    """A settable monotonic clock in seconds (a KPI tally's)."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def window(device: str, version: str, at: int, n: int, p95: float) -> tuple[str, TelemetryRecord]:
    """A telemetry window of ``n`` inferences, ``n - 1`` labelled, ``n - 2`` right."""
    record = TelemetryRecord(
        "face", version, n, n - 1, n - 2, 2.0, 9.5, at - 500, at, received_ms=at,
        latency_p95_ms=p95, errors=n % 3,
    )  # fmt: skip
    return f"{device}-{version}-{at}-{n}", record


def test_a_kpi_tally_read_on_pass_after_pass_sums_what_a_full_read_sums(store: Store) -> None:
    clock = Clock()
    fleet_on_v1(store, clock)
    for i, device in enumerate(DEVICES):  # the baseline: windows from before the deployment
        store.add_telemetry_batch(device, [window(device, "1.0.0", clock.now - 1000, 10 + i, 7.0)])
    new = store.create_deployment(
        "face", "2.0.0", "cams", plan=plan_from_dict(CANARY), now_ms=clock.now
    )
    rollout = store.rollouts_of([new.id])[new.id]
    seconds = Seconds()
    tally = KpiTally(clock=seconds)
    for round_ in range(6):
        clock.now += 1000
        for i, device in enumerate(DEVICES[round_ : round_ + 7]):
            version = "2.0.0" if i % 2 else "1.0.0"
            p95 = 0.0 if i == 3 else 4.5 + i  # an agent without p95: its p99 counts
            store.add_telemetry_batch(device, [window(device, version, clock.now, 5 + i, p95)])
        tallied = store.rollout_facts(rollout, tally).kpis
        assert sorted(tallied) == sorted(store.rollout_facts(rollout).kpis), round_
        seconds.now += KPI_COMMIT_LAG_S / 2
    assert len(tallied) == len(DEVICES) + 10  # 1.0.0 everywhere, 2.0.0 where it reported
    assert tally.floor is not None  # seeded: later reads take only the rows added since


def test_a_row_that_commits_late_below_the_highest_id_seen_is_still_counted(
    pg_store_url: str,
) -> None:
    store = open_store(pg_store_url)
    try:
        clock = Clock()
        fleet_on_v1(store, clock)
        plan = plan_from_dict(CANARY)
        new = store.create_deployment("face", "2.0.0", "cams", plan=plan, now_ms=clock.now)
        rollout = store.rollouts_of([new.id])[new.id]
        seconds = Seconds()
        tally = KpiTally(clock=seconds)
        store.add_telemetry_batch("cam-00", [window("cam-00", "2.0.0", clock.now, 10, 5.0)])
        assert store.rollout_facts(rollout, tally).kpis[0][2] == 10  # summed in full, marked
        seconds.now += KPI_COMMIT_LAG_S  # the mark is settled: the next read seeds the tally
        assert store.rollout_facts(rollout, tally).kpis[0][2] == 10
        # A writer took ids 1000 and 999; 1000 commits first and is read...
        late = window("cam-00", "2.0.0", clock.now + 1, 7, 5.0)
        with store.engine.begin() as conn:
            conn.execute(text("SELECT setval(pg_get_serial_sequence('telemetry', 'id'), 999)"))
        store.add_telemetry_batch("cam-00", [window("cam-00", "2.0.0", clock.now + 2, 20, 5.0)])
        assert store.rollout_facts(rollout, tally).kpis[0][2] == 30
        # ...then 999 commits, below the highest id seen, within the commit lag.
        with store.engine.begin() as conn:
            conn.execute(text("SELECT setval(pg_get_serial_sequence('telemetry', 'id'), 998)"))
        store.add_telemetry_batch("cam-00", [late])
        seconds.now += 1
        assert store.rollout_facts(rollout, tally).kpis[0][2] == 37
        seconds.now += KPI_COMMIT_LAG_S
        assert store.rollout_facts(rollout, tally).kpis[0][2] == 37  # counted once
        assert tally.floor == 1000
    finally:
        store.close()


def test_a_pass_that_stored_something_says_so_to_the_hub(store: Store) -> None:
    clock = Clock()
    fleet_on_v1(store, clock)
    store.create_deployment("face", "2.0.0", "cams", plan=plan_from_dict(CANARY), now_ms=clock.now)
    writes: list[int] = []
    loop = RolloutLoop(store, clock=clock, on_write=lambda: writes.append(clock.now))
    step(loop, clock)  # the canary opens: desired state written, the notifier nudged
    assert writes == [clock.now]
    step(loop, clock)  # nothing reported: nothing stored, no nudge
    assert len(writes) == 1
