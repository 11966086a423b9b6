"""The rollout loop's passes look only at what changed since the last one, on SQLite and PostgreSQL.

A pass reads every target's row but joins only the devices whose rows changed,
and every target's presence once one may have gone quiet. These tests hold it
to what a pass that joins everything sees: nothing new on a quiet pass, one
device's news on the next pass, and decisions that time alone brings.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import cloud.rollout_loop
from cloud.rollout.events import DeviceOutcome, DevicePresence, Event
from cloud.rollout.plan import RolloutPlan, plan_from_dict
from cloud.rollout.state import RolloutState
from cloud.rollout_loop import RolloutLoop
from cloud.store import Store
from cloud.store.rollouts import RolloutRecord, RolloutUpdate
from tests.cloud.test_rollout_store import (
    CANARY,
    DEVICES,
    Clock,
    admitted_devices,
    fleet_on_v1,
    report,
    step,
    window,
)

#: The canary, then the rest once the canary ran and half a minute passed.
PATIENT = {**CANARY, "wave_interval_s": 30}


class Passes:
    """What each pass of the loop handed the engine and stored."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, store: Store) -> None:
        self.facts: list[list[Event]] = []
        self.saved = 0
        run_engine = cloud.rollout_loop.update_for
        save = store.save_rollout

        def update_for(
            rollout: RolloutRecord, plan: RolloutPlan, events: tuple[list[Event], list[Event]]
        ) -> RolloutUpdate | None:
            self.facts.append(events[0])
            return run_engine(rollout, plan, events)

        def save_rollout(change: RolloutUpdate, *, now_ms: int) -> bool:
            self.saved += 1
            return save(change, now_ms=now_ms)

        monkeypatch.setattr(cloud.rollout_loop, "update_for", update_for)
        monkeypatch.setattr(store, "save_rollout", save_rollout)

    def last(self) -> list[Event]:
        return self.facts[-1]


@pytest.fixture
def started(
    store: Store, monkeypatch: pytest.MonkeyPatch
) -> Iterator[tuple[Clock, int, RolloutLoop, Passes]]:
    """The 20 cameras on 1.0.0, a patient canary of 2.0.0 opened, every pass watched."""
    clock = Clock()
    fleet_on_v1(store, clock)
    dep = store.create_deployment(
        "face", "2.0.0", "cams", plan=plan_from_dict(PATIENT), now_ms=clock.now
    )
    passes = Passes(monkeypatch, store)
    loop = RolloutLoop(store, clock=clock)
    step(loop, clock)  # the first pass joins everything and opens the canary
    assert len(passes.last()) > len(DEVICES) and passes.saved == 1
    yield clock, dep.id, loop, passes


def test_a_quiet_pass_joins_nothing_and_stores_nothing(
    store: Store, started: tuple[Clock, int, RolloutLoop, Passes]
) -> None:
    clock, dep_id, loop, passes = started
    canary = admitted_devices(store, dep_id)
    for _ in range(3):
        step(loop, clock)
        assert passes.last() == []
    assert passes.saved == 1
    assert admitted_devices(store, dep_id) == canary


def test_one_device_changed_after_quiet_passes_is_joined_on_the_next_pass(
    store: Store, started: tuple[Clock, int, RolloutLoop, Passes]
) -> None:
    clock, dep_id, loop, passes = started
    step(loop, clock)
    first = sorted(admitted_devices(store, dep_id))[0]
    report(store, first, "2.0.0", "running", "2.0.0", clock.now)
    step(loop, clock)
    assert passes.last() == [DeviceOutcome(first, "2.0.0", "running", clock.now - 1000)]
    step(loop, clock)
    assert passes.last() == []
    store.set_device_connected("cam-07", connected=False)  # its row changes, not its time
    step(loop, clock)
    assert [(e.device_id, e.online) for e in passes.last() if isinstance(e, DevicePresence)] == [
        ("cam-07", False)
    ]
    store.set_device_labels("cam-08", {"kind": "doorbell"})  # leaves the group
    step(loop, clock)
    assert passes.last() == []
    state = RolloutState.from_json(store.rollouts_of([dep_id])[dep_id].state)
    assert "cam-08" not in state.targets and len(state.targets) == len(DEVICES) - 1


def test_devices_gone_quiet_are_seen_offline_though_no_row_changed(
    store: Store, started: tuple[Clock, int, RolloutLoop, Passes]
) -> None:
    clock, _, loop, passes = started
    step(loop, clock)  # heard from at the start; online for 2 heartbeats of 5 s
    assert passes.last() == []
    step(loop, clock, ms=7000)  # 9 s after the last message
    assert passes.last() == []
    step(loop, clock, ms=2000)
    assert {e.device_id for e in passes.last() if isinstance(e, DevicePresence)} == set(DEVICES)
    step(loop, clock)
    assert passes.last() == []


def test_a_wave_falls_due_on_a_pass_where_no_fact_changed(
    store: Store, started: tuple[Clock, int, RolloutLoop, Passes]
) -> None:
    clock, dep_id, loop, passes = started
    canary = admitted_devices(store, dep_id)
    for device in canary:
        report(store, device, "2.0.0", "running", "2.0.0", clock.now)
    step(loop, clock)  # joins the canary's reports: it soaks until the wave is due
    step(loop, clock, ms=15_000)  # the others go quiet: their presence is joined
    saved = passes.saved
    while len(admitted_devices(store, dep_id)) == len(canary):
        step(loop, clock, ms=5000)
        assert passes.last() == []
        assert clock.now < 1_000_000 + 60_000, "the wave never opened"
    assert passes.saved == saved + 1
    assert len(admitted_devices(store, dep_id)) == len(DEVICES)


def test_a_read_against_the_last_read_equals_a_full_read(
    store: Store, started: tuple[Clock, int, RolloutLoop, Passes]
) -> None:
    clock, dep_id, _, _ = started
    rollout = store.rollouts_of([dep_id])[dep_id]
    last = store.rollout_facts(rollout)
    assert last.changed is None
    report(store, "cam-01", "2.0.0", "failed", "2.0.0", clock.now)
    store.touch_device("cam-02", now_ms=clock.now + 5)
    store.set_device_labels("cam-03", {"kind": "doorbell"})
    store.register_device("cam-99", {"kind": "camera"}, {}, now_ms=clock.now)
    read = store.rollout_facts(rollout, last=last)
    full = store.rollout_facts(rollout)
    assert read.changed == {"cam-01", "cam-02", "cam-99"}
    assert (read.targets, read.reports, read.kpis) == (full.targets, full.reports, full.kpis)
    again = store.rollout_facts(rollout, last=read)
    assert again.changed == frozenset()
    assert (again.targets, again.reports) == (full.targets, full.reports)


def _inferences(store: Store, dep_id: int) -> int:
    state = RolloutState.from_json(store.rollouts_of([dep_id])[dep_id].state)
    return sum(w.inferences for w in state.kpis.values())


@pytest.mark.parametrize("judged", [False, True], ids=["device-gates", "accuracy-gate"])
def test_kpis_no_gate_judges_are_read_every_few_seconds_not_every_pass(
    store: Store, monkeypatch: pytest.MonkeyPatch, judged: bool
) -> None:
    clock = Clock()
    fleet_on_v1(store, clock)
    gates = {"install_failure": 0.1, **({"accuracy_drop": 5} if judged else {})}
    plan = plan_from_dict({**PATIENT, "gates": gates})
    dep = store.create_deployment("face", "2.0.0", "cams", plan=plan, now_ms=clock.now)
    loop = RolloutLoop(store, clock=clock)
    step(loop, clock)  # the first pass reads everything
    assert _inferences(store, dep.id) == 0
    store.add_telemetry_batch("cam-00", [window("cam-00", "1.0.0", clock.now, 10, 5.0)])
    step(loop, clock)
    # Shown only, the totals wait up to KPI_STATUS_MS; judged, they are read at once.
    assert _inferences(store, dep.id) == (10 if judged else 0)
    clock.now += cloud.rollout_loop.KPI_STATUS_MS
    loop.pass_once()
    assert _inferences(store, dep.id) == 10
    # The targets changed: the totals are read with them, due or not.
    store.add_telemetry_batch("cam-01", [window("cam-01", "1.0.0", clock.now, 7, 5.0)])
    store.set_device_labels("cam-19", {"kind": "doorbell"})
    step(loop, clock)
    assert _inferences(store, dep.id) == 17
