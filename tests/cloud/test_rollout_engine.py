"""The staged-rollout engine: invariants under random fleets, and the rollouts the issue names.

A small simulated fleet answers the engine's decisions: each admitted device
reports ``running`` or ``failed`` a few seconds later (or never), may roll
back after running, and sends KPI windows for the version it runs. Every
step is checked against the engine's invariants.
"""

from __future__ import annotations

import heapq
import json
import math
import random
from collections.abc import Iterable, Iterator, KeysView, Mapping
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cloud.errors import ValidationError
from cloud.rollout.engine import (
    Aborted,
    Admit,
    Command,
    Completed,
    Decision,
    DeviceOutcome,
    DevicePresence,
    Event,
    FleetStop,
    KpiWindow,
    Paused,
    Phase,
    Revert,
    RolloutState,
    Targets,
    Tick,
    _evaluate,
    gate_results,
    in_flight,
    observations,
    run,
    step,
)
from cloud.rollout.gates import Verdict
from cloud.rollout.plan import RolloutPlan, plan_from_dict
from cloud.rollout.state import _SCALARS, ENDED, Admission, FactDraft, apply_control

T0 = 1_704_067_200_000  # 2024-01-01 00:00 UTC, a Monday
OLD, NEW = "1.0.0", "2.0.0"
FACTS = (DeviceOutcome, DevicePresence, KpiWindow)


def _at(event: Event) -> int:
    return event.now_ms if isinstance(event, Tick) else event.at_ms


@dataclass
class World:
    """How the simulated devices behave."""

    size: int
    fail: float = 0.0  # share of installs of NEW that fail
    unhealthy: float = 0.0  # share that run NEW, then roll back
    silent: float = 0.0  # share that never answer
    flaky: float = 0.0  # share that go offline after installing
    accuracy: Mapping[str, float] = field(default_factory=lambda: {OLD: 0.96, NEW: 0.96})
    p95_ms: Mapping[str, float] = field(default_factory=lambda: {OLD: 40.0, NEW: 40.0})
    seed: int = 0
    controls: tuple[tuple[int, Event], ...] = ()  # (seconds after start, event)

    def pick(self, share: float, salt: str) -> frozenset[str]:
        rng = random.Random(f"{self.seed}:{salt}")
        ids = [f"cam-{i:03d}" for i in range(self.size)]
        return frozenset(rng.sample(ids, round(share * self.size)))


class Sim:
    """Feeds a world's answers to the engine, tick by tick, checking every step."""

    def __init__(self, plan: RolloutPlan, world: World, *, check: bool = True) -> None:
        self.plan, self.world, self.check = plan, world, check
        self.devices = [f"cam-{i:03d}" for i in range(world.size)]
        self.fail = world.pick(world.fail, "fail")
        self.unhealthy = world.pick(world.unhealthy, "unhealthy")
        self.silent = world.pick(world.silent, "silent")
        self.flaky = world.pick(world.flaky, "flaky")
        self.rng = random.Random(world.seed)
        self.state = RolloutState(version=NEW)
        self.queue: list[tuple[int, int, Event]] = []
        self.seq = 0
        self.log: list[Event] = []
        self.decisions: list[Decision] = []
        self.admitted_ever: set[str] = set()
        self.previous_when_admitted: dict[str, str] = {}
        self.paused = (-1, False)
        self.stopped = (-1, False)
        self.steps = 0
        self.allowance = 0

    def later(self, at_ms: int, event: Event) -> None:
        self.seq += 1
        heapq.heappush(self.queue, (at_ms, self.seq, event))

    def feed(self, event: Event) -> None:
        prev = self.state
        new, decisions = step(self.plan, prev, event)
        if self.check:
            self._check(prev, event, new, decisions)
        self.state = new
        self.log.append(event)
        self.decisions.extend(decisions)
        for decision in decisions:
            self._answer(decision, max(prev.clock_ms, _at(event)))

    def _answer(self, decision: Decision, now: int) -> None:
        if isinstance(decision, Admit):
            for device in sorted(decision.devices):
                self.admitted_ever.add(device)
                self._install(device, decision.version, now)
        elif isinstance(decision, Revert):
            for device, version in sorted(decision.previous.items()):
                self.later(now + 2_000, DeviceOutcome(device, version, "running", now + 2_000))

    def _install(self, device: str, version: str, now: int) -> None:
        if device in self.silent:
            return
        done = now + self.rng.randint(1_000, 20_000)
        if version == NEW and device in self.fail:
            self.later(done, DeviceOutcome(device, version, "failed", done))
            return
        self.later(done, DeviceOutcome(device, version, "running", done))
        if version == NEW and device in self.unhealthy:
            bad = done + self.rng.randint(5_000, 30_000)
            self.later(bad, DeviceOutcome(device, version, "rolled_back", bad))
        if version == NEW and device in self.flaky:
            gone = done + self.rng.randint(1_000, 10_000)
            self.later(gone, DevicePresence(device, False, gone))
        self.later(done + self.rng.randint(5_000, 30_000), self._window(device, version, done))

    def _window(self, device: str, version: str, done: int) -> KpiWindow:
        at = done + self.rng.randint(5_000, 30_000)
        labelled = 200
        correct = round(self.world.accuracy[version] * labelled)
        return KpiWindow(device, version, 500, labelled, correct, 2, self.world.p95_ms[version], at)

    def start(self) -> None:
        for device in self.devices:
            self.feed(self._window(device, OLD, T0 - 60_000))
        for after_s, event in self.world.controls:
            self.later(T0 + after_s * 1000, replace(event, at_ms=T0 + after_s * 1000))  # type: ignore[type-var]
        self.feed(Targets(frozenset(self.devices), dict.fromkeys(self.devices, OLD), T0))

    def go(self, *, tick_s: int = 5, horizon_s: int = 4 * 3600) -> Sim:
        self.start()
        now = T0
        while now < T0 + horizon_s * 1000:
            now += tick_s * 1000
            while self.queue and self.queue[0][0] <= now:
                self.feed(heapq.heappop(self.queue)[2])
            self.feed(Tick(now))
            if self.state.stage in ENDED or (
                self.state.stage is Phase.COMPLETED and not self.queue
            ):
                break
        return self

    # --- the invariants ---------------------------------------------------------------------

    def _check(
        self, prev: RolloutState, event: Event, new: RolloutState, decisions: tuple[Decision, ...]
    ) -> None:
        plan = self.plan
        if isinstance(event, Command) and event.kind in ("pause", "resume"):
            self.paused = max(self.paused, (event.at_ms, event.kind == "pause"))
        if isinstance(event, FleetStop):
            self.stopped = max(self.stopped, (event.at_ms, event.on))
        if isinstance(event, FACTS) or prev.stage in ENDED:
            assert decisions == ()  # facts alone decide nothing; an ended rollout stays ended
            return
        now = new.clock_ms
        probe = apply_control(prev, event)
        verdicts = [r.verdict for r in gate_results(plan, probe)]
        running = prev.stage not in (Phase.PENDING, Phase.COMPLETED)
        admits = [d for d in decisions if isinstance(d, Admit)]
        reverts = [d for d in decisions if isinstance(d, Revert)]
        if running and Verdict.FAIL in verdicts:  # never past a failing gate
            assert new.stage is Phase.ROLLED_BACK and not admits
        for revert in reverts:  # every admitted device goes back to what it ran before
            assert revert.devices == set(prev.admitted)
            assert dict(revert.previous) == {
                d: self.previous_when_admitted[d] for d in revert.devices
            }
            assert not new.admitted and new.stage is Phase.ROLLED_BACK
        for admit in admits:
            assert plan.in_window(now)
            assert not self.paused[1] and not self.stopped[1]
            assert admit.devices <= new.targets
            assert admit.devices.isdisjoint(self.admitted_ever)  # nobody moves twice
            assert admit.version == NEW or (
                plan.ab is not None and admit.version == plan.ab.control
            )
            if running:  # a wave after the first opens only past passing gates
                assert all(v is Verdict.PASS for v in verdicts)
            for device in admit.devices:
                self.previous_when_admitted[device] = new.previous.get(device, "")
        if Completed() in decisions:  # completion, too, only past passing gates
            assert all(r.verdict is Verdict.PASS for r in gate_results(plan, new))
        if admits and prev.stage is not Phase.COMPLETED:
            self.allowance = _allowance(
                plan, new.waves_opened - 1, len(new.targets), len(prev.admitted)
            )
        if new.stage not in ENDED and new.stage is not Phase.COMPLETED:
            assert len(in_flight(plan, new)) <= min(new.wave_limit, self.allowance)
        self.steps += 1
        if self.steps % 50 == 0 or decisions:
            assert RolloutState._parse(new.to_json()) == new  # parsed, not the kept object


def _allowance(plan: RolloutPlan, k: int, targets: int, admitted_before: int) -> int:
    """The most devices wave ``k`` may have in flight, from the plan and what went before."""
    floor = plan.device_samples
    if plan.canary is not None:
        if k == 0:
            share = math.ceil(targets * plan.canary.percent / 100)
            return min(targets, plan.canary.count or max(share, floor))
        k -= 1
    if plan.rolling is not None:
        return max(plan.rolling.max_in_flight, floor - admitted_before)
    if plan.waves is None:
        return targets
    rate = plan.waves.base_rate_per_min * plan.waves.increment_factor ** min(k, 64)
    return max(min(int(rate), plan.waves.max_per_min), floor - admitted_before)


def _plan(**data: Any) -> RolloutPlan:
    return plan_from_dict(data)


def _kinds(decisions: Iterable[Decision]) -> list[type]:
    return [type(d) for d in decisions]


# --- the rollouts the issue names ------------------------------------------------------------

CANARY = {
    "strategy": "canary",
    "canary": "10%",
    "then": "waves",
    "waves": {"base_rate_per_min": 20, "increment_factor": 2.0, "max_per_min": 200},
    "min_samples": 20,
    "soak_s": 60,
    "wave_interval_s": 30,
}


def test_twenty_percent_failing_installs_abort_at_the_first_gate_and_revert_all() -> None:
    plan = _plan(**CANARY, gates={"install_failure": "10%"})
    sim = Sim(plan, World(200, fail=0.2, seed=1)).go()
    admits = [d for d in sim.decisions if isinstance(d, Admit)]
    assert len(admits) == 1 and len(admits[0].devices) == 20  # only the canary ever moved
    assert len(admits[0].devices & sim.fail) >= 3  # this seed's canary sees > 10% failing
    assert sim.state.phase is Phase.ROLLED_BACK
    assert sim.state.reason.startswith("gate failed: install failures")
    reverts = [d for d in sim.decisions if isinstance(d, Revert)]
    assert len(reverts) == 1 and reverts[0].devices == admits[0].devices
    assert set(reverts[0].previous.values()) == {OLD}
    assert not sim.state.admitted


def test_one_percent_failing_completes() -> None:
    plan = _plan(**CANARY, gates={"install_failure": "10%"})
    sim = Sim(plan, World(200, fail=0.01, seed=1)).go()
    assert sim.state.phase is Phase.COMPLETED
    assert set(sim.state.admitted) == set(sim.devices)
    assert _kinds(sim.decisions).count(Completed) == 1
    assert Revert not in _kinds(sim.decisions)
    waves = [len(d.devices) for d in sim.decisions if isinstance(d, Admit)]
    assert waves[:3] == [20, 20, 40] and sum(waves) == 200


KPI_GATES = {"accuracy_drop": 2.0, "p95_ratio": 1.5, "install_failure": "10%"}


@pytest.mark.parametrize(
    ("accuracy", "p95", "reason"),
    [
        (0.91, 40.0, "accuracy 0.91 vs 0.96 baseline: -5.0 points, limit -2.0"),
        (0.96, 80.0, "p95 latency 80.0 ms vs 40.0 ms baseline: 2.00x, limit 1.50x"),
    ],
)
def test_a_worse_model_is_stopped_at_the_canary(accuracy: float, p95: float, reason: str) -> None:
    plan = _plan(**CANARY, gates=KPI_GATES)
    world = World(200, accuracy={OLD: 0.96, NEW: accuracy}, p95_ms={OLD: 40.0, NEW: p95})
    sim = Sim(plan, world).go()
    assert sim.state.phase is Phase.ROLLED_BACK
    assert sim.state.reason == f"gate failed: {reason}"
    assert [len(d.devices) for d in sim.decisions if isinstance(d, Admit)] == [20]
    assert sim.decisions[-1] == Aborted(f"gate failed: {reason}")


def test_an_equally_good_model_is_promoted_to_completion() -> None:
    plan = _plan(**CANARY, gates=KPI_GATES)
    sim = Sim(plan, World(200)).go()
    assert sim.state.phase is Phase.COMPLETED
    assert all(r.verdict is Verdict.PASS for r in gate_results(plan, sim.state))
    obs = observations(plan, sim.state)
    assert obs.candidate.accuracy == pytest.approx(obs.baseline.accuracy)


# --- the strategies --------------------------------------------------------------------------


def test_all_at_once_admits_every_target_at_the_first_step() -> None:
    devices = frozenset({"a", "b", "c"})
    state, decisions = step(RolloutPlan(), RolloutState(NEW), Targets(devices, {}, T0))
    assert decisions == (Admit(devices, NEW),)
    assert set(state.admitted) == devices and state.phase is Phase.WAVE


def test_nothing_moves_before_the_group_is_known() -> None:
    state, decisions = step(RolloutPlan(), RolloutState(NEW), Tick(T0))
    assert decisions == () and state.phase is Phase.PENDING


def test_ab_splits_by_weight_and_judges_the_new_version_against_the_control() -> None:
    plan = _plan(strategy="ab", ab={"control": OLD, "weight": 30}, gates={"accuracy_drop": 2.0})
    world = World(300, accuracy={OLD: 0.96, NEW: 0.90})
    sim = Sim(plan, world).go()
    first = [d for d in sim.decisions if isinstance(d, Admit)]
    assert {d.version for d in first} == {OLD, NEW}
    share = len(next(d for d in first if d.version == NEW).devices) / 300
    assert 0.2 < share < 0.4
    assert sim.state.phase is Phase.ROLLED_BACK
    assert "accuracy 0.90 vs 0.96" in sim.state.reason


def test_ab_kpis_side_by_side_when_equal_completes() -> None:
    plan = _plan(strategy="ab", ab={"control": OLD, "weight": 50}, gates={"accuracy_drop": 2.0})
    sim = Sim(plan, World(100)).go()
    obs = observations(plan, sim.state)
    assert sim.state.phase is Phase.COMPLETED
    assert 35 <= obs.candidate.devices <= 65 and obs.baseline.devices == 100
    assert obs.candidate.accuracy == obs.baseline.accuracy == 0.96


def test_devices_that_never_answer_time_out_as_failed_installs() -> None:
    plan = _plan(install_timeout_s=120, gates={"install_failure": "10%"}, min_samples=5)
    sim = Sim(plan, World(40, silent=0.25)).go()
    assert sim.state.phase is Phase.ROLLED_BACK
    assert "install failures 25.0% (10 of 40)" in sim.state.reason


def test_devices_going_offline_after_the_update_stop_the_rollout() -> None:
    plan = _plan(**CANARY, gates={"offline": "10%"})
    sim = Sim(plan, World(200, flaky=0.5)).go()
    assert sim.state.phase is Phase.ROLLED_BACK and "offline" in sim.state.reason


def test_unhealthy_after_start_stops_the_rollout() -> None:
    plan = _plan(**CANARY, gates={"health": "5%"})
    sim = Sim(plan, World(200, unhealthy=0.3)).go()
    assert sim.state.phase is Phase.ROLLED_BACK and "unhealthy after start" in sim.state.reason


ROLLING = {"strategy": "rolling", "rolling": {"max_in_flight": 30}, "min_samples": 20}


def test_rolling_keeps_its_places_filled_and_completes() -> None:
    plan = _plan(**ROLLING, soak_s=60, gates={"install_failure": "10%"})
    sim = Sim(plan, World(200, fail=0.01, seed=3))
    sim.start()
    fills: list[tuple[int, int]] = []  # (devices admitted, devices still in flight beside them)
    now = T0
    while sim.state.stage is not Phase.COMPLETED and now < T0 + 3600_000:
        now += 5_000
        while sim.queue and sim.queue[0][0] <= now:
            sim.feed(heapq.heappop(sim.queue)[2])
        before, seen = in_flight(plan, sim.state), len(sim.decisions)
        sim.feed(Tick(now))  # Sim._check asserts the invariants at every step
        admitted = [d for d in sim.decisions[seen:] if isinstance(d, Admit)]
        if admitted and sim.state.waves_opened > 1:
            fills.append((len(admitted[-1].devices), len(before)))
            # past the first wave, every free place is taken at once while gates pass
            assert len(in_flight(plan, sim.state)) == min(
                30, len(before) + len(admitted[-1].devices)
            )
    assert sim.state.phase is Phase.COMPLETED and set(sim.state.admitted) == set(sim.devices)
    first = next(d for d in sim.decisions if isinstance(d, Admit))
    assert len(first.devices) == 30  # the first wave: a canary of max_in_flight devices
    assert len(fills) > 5 and any(flying for _, flying in fills)  # filled while others install
    assert sim.state.wave_limit == 30


def test_rolling_with_twenty_percent_failing_stops_at_its_first_wave() -> None:
    plan = _plan(**ROLLING, gates={"install_failure": "10%"})
    sim = Sim(plan, World(200, fail=0.2, seed=1)).go()
    admits = [d for d in sim.decisions if isinstance(d, Admit)]
    assert [len(d.devices) for d in admits] == [30]
    assert sim.state.phase is Phase.ROLLED_BACK
    assert sim.state.reason.startswith("gate failed: install failures")


def test_rolling_stopped_by_failures_after_its_first_wave_reverts_every_moved_device() -> None:
    plan = _plan(**ROLLING, gates={"install_failure": "10%"})
    devices = frozenset(f"cam-{i:03d}" for i in range(100))
    state, first = step(plan, RolloutState(NEW), Targets(devices, dict.fromkeys(devices, OLD), T0))
    canary = first[0].devices  # type: ignore[union-attr]
    state, _ = run(plan, state, [DeviceOutcome(d, NEW, "running", T0 + 1) for d in canary])
    state, filled = step(plan, state, Tick(T0 + 2))
    moved = filled[0].devices  # type: ignore[union-attr]
    assert len(moved) == 30 and moved.isdisjoint(canary)  # every place refilled
    state, _ = run(
        plan, state, [DeviceOutcome(d, NEW, "failed", T0 + 3) for d in sorted(moved)[:10]]
    )
    state, decisions = step(plan, state, Tick(T0 + 4))
    assert _kinds(decisions) == [Revert, Aborted]  # 10 of 40 failed: no place refilled
    assert decisions[0].devices == canary | moved  # type: ignore[union-attr]
    assert "install failures 25.0% (10 of 40)" in state.reason


def test_rolling_fills_no_place_while_paused() -> None:
    plan = _plan(**ROLLING, gates={"install_failure": "10%"})
    devices = frozenset(f"cam-{i:03d}" for i in range(100))
    state, first = step(plan, RolloutState(NEW), Targets(devices, dict.fromkeys(devices, OLD), T0))
    canary = first[0].devices  # type: ignore[union-attr]
    state, _ = step(plan, state, Command("pause", T0 + 1))
    state, _ = run(plan, state, [DeviceOutcome(d, NEW, "running", T0 + 2) for d in canary])
    state, decisions = step(plan, state, Tick(T0 + 3))
    assert decisions == () and state.phase is Phase.PAUSED and len(state.admitted) == 30
    state, decisions = step(plan, state, Command("resume", T0 + 4))
    assert [len(d.devices) for d in decisions if isinstance(d, Admit)] == [30]


# --- the operator ----------------------------------------------------------------------------


def test_pause_holds_waves_and_resume_continues() -> None:
    controls = ((40, Command("pause", 0)), (900, Command("resume", 0)))
    plan = _plan(**CANARY, gates={"install_failure": "10%"})
    sim = Sim(plan, World(200, controls=controls)).go()
    assert Paused("paused by operator") in sim.decisions
    assert sim.state.phase is Phase.COMPLETED  # the checks saw no admission while paused


def test_the_fleet_stop_switch_holds_every_wave() -> None:
    controls = ((40, FleetStop(True, 0)),)
    plan = _plan(**CANARY, gates={"install_failure": "10%"})
    sim = Sim(plan, World(200, controls=controls)).go(horizon_s=3600)
    assert Paused("fleet stop switch is on") in sim.decisions
    assert sim.state.phase is Phase.PAUSED
    assert len(sim.state.admitted) == 20


def test_abort_keeps_moved_devices_and_rollback_reverts_even_after_completion() -> None:
    plan = _plan(**CANARY, gates={"install_failure": "10%"})
    aborted = Sim(plan, World(200, controls=((30, Command("abort", 0)),))).go()
    assert aborted.state.phase is Phase.ABORTED and len(aborted.state.admitted) == 20
    assert Revert not in _kinds(aborted.decisions)
    done = Sim(plan, World(50)).go()
    assert done.state.phase is Phase.COMPLETED
    state, decisions = step(plan, done.state, Command("rollback", done.state.clock_ms + 1))
    assert _kinds(decisions) == [Revert, Aborted]
    assert decisions[0].devices == frozenset(done.devices)  # type: ignore[union-attr]
    assert state.phase is Phase.ROLLED_BACK and not state.admitted


def test_a_hub_restarted_from_the_stored_state_carries_on_the_same() -> None:
    plan = _plan(**CANARY, gates={"install_failure": "10%"})
    whole = Sim(plan, World(120, fail=0.02), check=False).go()
    cut = len(whole.log) // 2
    first, decided = run(plan, RolloutState(NEW), whole.log[:cut])
    restored = RolloutState._parse(first.to_json())  # as a new process reads it
    final, rest = run(plan, restored, whole.log[cut:])
    assert final == whole.state and decided + rest == tuple(whole.decisions)


def test_devices_joining_after_completion_get_the_version() -> None:
    plan = RolloutPlan()
    state, _ = step(plan, RolloutState(NEW), Targets(frozenset({"a"}), {"a": OLD}, T0))
    state, _ = step(plan, state, DeviceOutcome("a", NEW, "running", T0 + 1))
    state, decisions = step(plan, state, Tick(T0 + 2))
    assert decisions == (Completed(),)
    state, decisions = step(plan, state, Targets(frozenset({"a", "b"}), {"a": NEW}, T0 + 3))
    assert decisions == (Admit(frozenset({"b"}), NEW),)
    assert state.admitted["b"].previous == "" and state.phase is Phase.COMPLETED


def test_bad_events_and_stored_text_are_refused() -> None:
    with pytest.raises(ValidationError, match="'crashed'"):
        DeviceOutcome("a", NEW, "crashed", 0)
    with pytest.raises(ValidationError, match="'restart'"):
        Command("restart", 0)
    with pytest.raises(ValidationError, match="KPI window"):
        KpiWindow("a", NEW, 10, 5, 6, 0, 1.0, 0)
    with pytest.raises(ValidationError, match="not a stored rollout state"):
        RolloutState.from_json('{"schema": 1}')


# --- properties over random fleets -----------------------------------------------------------

GATE_LIMITS = {
    "install_failure": st.sampled_from([0.05, 0.1, 0.3]),
    "offline": st.sampled_from([0.1, 0.3]),
    "health": st.sampled_from([0.05, 0.2]),
    "accuracy_drop": st.sampled_from([1.0, 3.0]),
    "p95_ratio": st.sampled_from([1.2, 2.0]),
    "error_rate": st.sampled_from([0.5, 2.0]),
}
CONTROLS = [
    Command("pause", 0),
    Command("resume", 0),
    FleetStop(True, 0),
    FleetStop(False, 0),
    Command("abort", 0),
    Command("rollback", 0),
]


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[RolloutPlan, World]:
    strategy = draw(
        st.sampled_from(["all-at-once", "canary", "canary", "waves", "waves", "rolling", "ab"])
    )
    data: dict[str, Any] = {
        "strategy": strategy,
        "min_samples": draw(st.integers(1, 30)),
        "soak_s": draw(st.sampled_from([0, 30, 120])),
        "wave_interval_s": draw(st.sampled_from([0, 15, 60])),
        "install_timeout_s": draw(st.sampled_from([60, 300])),
        "gates": {k: draw(v) for k, v in GATE_LIMITS.items() if draw(st.booleans())},
    }
    if strategy == "canary":
        data["canary"] = draw(
            st.integers(data["min_samples"], 60) | st.integers(1, 50).map(lambda p: f"{p}%")
        )
        data["then"] = draw(st.sampled_from(["all", "waves"]))
    if strategy == "waves" or data.get("then") == "waves":
        data["waves"] = {
            "base_rate_per_min": draw(st.integers(1, 50)),
            "increment_factor": draw(st.sampled_from([1.0, 1.5, 2.0, 5.0])),
            "max_per_min": draw(st.integers(50, 200)),
        }
    if strategy == "rolling":
        data["rolling"] = {"max_in_flight": draw(st.integers(1, 80))}
    if strategy == "ab":
        data["ab"] = {"control": OLD, "weight": draw(st.integers(1, 99))}
    day = draw(st.sampled_from(["", "", "daily", "mon", "tue"]))  # "": no window
    if day:  # T0 is Monday 00:00 UTC: daily and mon windows open within the run
        start, length = draw(st.integers(0, 40)), draw(st.integers(5, 60))
        stop = start + length
        data["windows"] = [
            f"{day} {start // 60:02d}:{start % 60:02d}-{stop // 60:02d}:{stop % 60:02d}"
        ]
    world = World(
        size=draw(st.integers(1, 300)),
        fail=draw(st.sampled_from([0.0, 0.0, 0.01, 0.05, 0.2, 0.5])),
        unhealthy=draw(st.sampled_from([0.0, 0.0, 0.02, 0.2])),
        silent=draw(st.sampled_from([0.0, 0.0, 0.05])),
        flaky=draw(st.sampled_from([0.0, 0.0, 0.1])),
        accuracy={OLD: 0.96, NEW: draw(st.sampled_from([0.96, 0.96, 0.95, 0.90]))},
        p95_ms={OLD: 40.0, NEW: draw(st.sampled_from([40.0, 40.0, 50.0, 90.0]))},
        seed=draw(st.integers(0, 2**16)),
        controls=tuple(
            draw(
                st.lists(
                    st.tuples(st.integers(0, 900), st.sampled_from(CONTROLS[:4])),
                    max_size=6,
                )
                | st.lists(st.tuples(st.integers(0, 900), st.sampled_from(CONTROLS)), max_size=2)
            )
        ),
    )
    return plan_from_dict(data), world


PROPERTY = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@PROPERTY
@given(scenario=scenarios())
def test_invariants_hold_on_random_rollouts(scenario: tuple[RolloutPlan, World]) -> None:
    plan, world = scenario
    sim = Sim(plan, world).go(tick_s=15, horizon_s=3600)  # Sim._check asserts at every step
    state = sim.state
    assert RolloutState._parse(state.to_json()) == state
    if state.stage is Phase.COMPLETED:
        assert set(state.admitted) == set(sim.devices)
        assert _kinds(sim.decisions).count(Completed) == 1
    if state.stage is Phase.ROLLED_BACK:
        assert not state.admitted and set(state.reverted) <= sim.admitted_ever
    moved = [
        d for decision in sim.decisions if isinstance(decision, Admit) for d in decision.devices
    ]
    assert len(moved) == len(set(moved))


@st.composite
def healthy_wave_scenarios(draw: st.DrawFn) -> tuple[RolloutPlan, World]:
    then = draw(st.sampled_from(["waves", "canary", "rolling"]))
    data: dict[str, Any] = {
        "strategy": then,
        "min_samples": draw(st.integers(1, 30)),
        "soak_s": draw(st.sampled_from([0, 30, 120])),
        "wave_interval_s": draw(st.sampled_from([0, 30])),
        "waves": {
            "base_rate_per_min": draw(st.integers(1, 40)),
            "increment_factor": draw(st.sampled_from([1.5, 2.0, 3.0])),
            "max_per_min": draw(st.integers(40, 150)),
        },
        "gates": {"install_failure": "10%", "health": "10%", "accuracy_drop": 2.0},
    }
    if then == "canary":
        data |= {"canary": f"{draw(st.integers(1, 20))}%", "then": "waves"}
    if then == "rolling":  # fewer places than devices: it fills them more than once
        data = {k: v for k, v in data.items() if k != "waves"}
        data["rolling"] = {"max_in_flight": draw(st.integers(1, 50))}
    pauses = draw(st.lists(st.integers(0, 1200), max_size=4, unique=True))  # ties: pause wins
    world = World(
        size=draw(st.integers(60, 300)),
        fail=draw(st.sampled_from([0.0, 0.01, 0.03])),
        seed=draw(st.integers(0, 2**16)),
        controls=tuple(
            (t, Command("pause" if i % 2 == 0 else "resume", 0))
            for i, t in enumerate(sorted(pauses))
        ),
    )
    return plan_from_dict(data), world


@PROPERTY
@given(scenario=healthy_wave_scenarios())
def test_waves_open_one_at_a_time_past_passing_gates(scenario: tuple[RolloutPlan, World]) -> None:
    plan, world = scenario
    sim = Sim(plan, world).go(tick_s=15, horizon_s=3 * 3600)  # Sim._check asserts each step
    if sim.state.phase is Phase.ROLLED_BACK:  # a failure seen with few samples may stop it
        assert world.fail and sim.state.reason.startswith("gate failed: install failures")
    elif len(world.controls) % 2 == 0:  # not left paused: the rest get there
        assert sim.state.phase is Phase.COMPLETED, sim.state.reason
        assert sim.state.waves_opened >= 2


def _shadow(fact: Event, rng: random.Random) -> Event:
    """A different, older fact about the same device (and version)."""
    older = _at(fact) - rng.randint(1, 10_000)
    if isinstance(fact, DeviceOutcome):
        return replace(fact, outcome=rng.choice(["failed", "rolled_back"]), at_ms=older)
    if isinstance(fact, DevicePresence):
        return replace(fact, online=not fact.online, at_ms=older)
    assert isinstance(fact, KpiWindow)
    return replace(fact, correct=0, p95_ms=fact.p95_ms * 10, at_ms=older)


def _perturb(log: list[Event], rng: random.Random) -> list[Event]:
    """Shuffle the facts between two evaluations; repeat some, late; add older shadows."""
    out: list[Event] = []
    seen: list[Event] = []
    batch: list[Event] = []
    for event in [*log, None]:
        if isinstance(event, FACTS):
            batch.append(event)
            continue
        seen += batch
        batch += [rng.choice(seen) for _ in range(len(batch) // 5)] if seen else []
        batch += [_shadow(rng.choice(seen), rng) for _ in range(len(batch) // 5)] if seen else []
        rng.shuffle(batch)
        out += batch
        batch = []
        if event is not None:
            out += [event] * rng.choice([1, 1, 2])
    return out


@PROPERTY
@given(scenario=scenarios(), seed=st.integers(0, 2**32))
def test_same_state_under_repeated_delayed_and_reordered_facts(
    scenario: tuple[RolloutPlan, World], seed: int
) -> None:
    plan, world = scenario
    sim = Sim(plan, world, check=False).go(tick_s=15, horizon_s=3600)
    perturbed = _perturb(sim.log, random.Random(seed))
    assert run(plan, RolloutState(NEW), perturbed) == (sim.state, tuple(sim.decisions))
    folded, decisions = RolloutState(NEW), ()
    for event in perturbed[: len(perturbed) // 3]:
        folded, more = step(plan, folded, event)
        decisions += more
    assert (folded, decisions) == run(plan, RolloutState(NEW), perturbed[: len(perturbed) // 3])


class _CountedCopies(Mapping[str, Any]):
    """A state table that counts how often it is copied whole (``dict(table)`` calls keys())."""

    copies = 0

    def __init__(self, items: dict[str, Any]) -> None:
        self._items = items

    def __getitem__(self, key: str) -> Any:
        return self._items[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)

    def keys(self) -> KeysView[str]:
        type(self).copies += 1
        return self._items.keys()


def test_a_draft_copies_each_table_once_however_many_facts_it_joins() -> None:
    fleet = [f"cam-{i}" for i in range(200)]
    outcomes = _CountedCopies(dict.fromkeys(fleet, (T0, OLD, "running")))
    ran = _CountedCopies({d: frozenset({OLD}) for d in fleet})
    state = RolloutState(NEW, outcomes=outcomes, ran=ran)
    draft = FactDraft(state)
    for i, device in enumerate(fleet):
        draft.join(DeviceOutcome(device, NEW, "running", T0 + i + 1))
    joined = draft.freeze()
    # One copy of each table for the whole pass: a copy a fact made 10,000-device passes
    # quadratic. The state the draft started from is left as it was.
    assert _CountedCopies.copies == 2
    assert all(joined.outcomes[d][1:] == (NEW, "running") for d in fleet)
    assert all(joined.ran[d] == {OLD, NEW} for d in fleet)
    assert all(state.outcomes[d] == (T0, OLD, "running") for d in fleet)


def _every_control_evaluated(
    plan: RolloutPlan, state: RolloutState, events: Iterable[Event]
) -> tuple[RolloutState, tuple[Decision, ...]]:
    """:func:`run` as it was before it skipped evaluating a state it had just left as it was."""
    out: list[Decision] = []
    for event in events:
        if isinstance(event, DeviceOutcome | DevicePresence | KpiWindow):
            draft = FactDraft(state)
            draft.join(event)
            state = draft.freeze()
            continue
        state, decisions = _evaluate(plan, apply_control(state, event))
        out.extend(decisions)
    return state, tuple(out)


@PROPERTY
@given(scenario=scenarios(), seed=st.integers(0, 2**32))
def test_skipping_an_evaluation_that_would_find_the_same_state_decides_the_same(
    scenario: tuple[RolloutPlan, World], seed: int
) -> None:
    plan, world = scenario
    sim = Sim(plan, world, check=False).go(tick_s=15, horizon_s=3600)
    rng = random.Random(seed)
    log: list[Event] = []
    for event in sim.log:  # ticks again at the same instant, as the loop's Targets then Tick
        log.append(event)
        if not isinstance(event, FACTS) and rng.random() < 0.5:
            log += [Tick(_at(event))] * rng.randint(1, 2)
    assert run(plan, RolloutState(NEW), log) == _every_control_evaluated(
        plan, RolloutState(NEW), log
    )


def test_a_control_that_changes_nothing_hands_the_state_back_itself() -> None:
    state = RolloutState(NEW, clock_ms=T0, targets=frozenset({"a"}), targets_at_ms=T0)
    paused = apply_control(state, Command("pause", T0))
    assert apply_control(state, Tick(T0)) is state
    assert apply_control(state, Tick(T0 - 1)) is state
    assert apply_control(paused, Command("pause", T0)) is paused
    assert apply_control(state, FleetStop(False, T0 - 5)).fleet_stop == (T0 - 5, False)
    moved = apply_control(state, Targets(frozenset({"a"}), {"a": OLD}, T0 + 1))
    again = apply_control(moved, Targets(frozenset({"a"}), {"a": OLD}, T0 + 2))
    assert again.targets is moved.targets and again.previous is moved.previous  # kept tables
    assert again.targets_at_ms == T0 + 2


def _plain_json(state: RolloutState) -> str:
    """The state's text as one ``json.dumps`` of the whole, before tables' texts were kept."""
    data: dict[str, Any] = {
        "schema": 1,
        "version": state.version,
        "stage": state.stage.value,
        "targets": sorted(state.targets),
        "previous": dict(state.previous),
        "outcomes": {d: list(v) for d, v in state.outcomes.items()},
        "ran": {d: sorted(v) for d, v in state.ran.items()},
        "presence": {d: list(v) for d, v in state.presence.items()},
        "kpis": [
            [*k, w.at_ms, w.inferences, w.labelled, w.correct, w.errors, w.p95_ms]
            for k, w in sorted(state.kpis.items())
        ],
        "admitted": {d: [a.version, a.previous, a.at_ms] for d, a in state.admitted.items()},
        "reverted": dict(state.reverted),
        "hold": list(state.hold),
        "fleet_stop": list(state.fleet_stop),
    }
    for name in _SCALARS:
        data[name] = getattr(state, name)
    return json.dumps(data, sort_keys=True, separators=(",", ":"))


@PROPERTY
@given(scenario=scenarios())
def test_a_state_written_table_by_table_is_the_whole_state_written_at_once(
    scenario: tuple[RolloutPlan, World],
) -> None:
    plan, world = scenario
    log = Sim(plan, world, check=False).go(tick_s=15, horizon_s=3600).log
    state = RolloutState(NEW)
    for i, event in enumerate(log):
        state = step(plan, state, event)[0]
        if i % max(1, len(log) // 30) == 0 or i == len(log) - 1:
            assert state.to_json() == _plain_json(state)
            assert state.to_json() == _plain_json(state)  # with its tables' texts kept


def test_tables_written_entry_by_entry_follow_every_change_of_two_rollouts_in_turn() -> None:
    # The leader writes several rollouts in turn, each pass adding, changing and dropping
    # entries: each text must be the whole state's, whatever was written before it.
    def state(n: int, version: str, at: int) -> RolloutState:
        fleet = [f"cam-{i:03d}" for i in range(n)]
        return RolloutState(
            version,
            outcomes=MappingProxyType(
                {d: (at + i, version, "running") for i, d in enumerate(fleet)}
            ),
            ran=MappingProxyType({d: frozenset({OLD, version}) for d in fleet}),
            admitted=MappingProxyType({d: Admission(version, OLD, at) for d in fleet[::2]}),
            kpis=MappingProxyType(
                {(d, version): KpiWindow(d, version, 5, 2, 1, 0, 9.5, at) for d in fleet[:7]}
            ),
        )

    states = [state(40, NEW, T0), state(25, "3.0.0", T0 + 5), state(40, NEW, T0)]
    grown = replace(
        states[0], outcomes=MappingProxyType({**states[0].outcomes, "cam-zz": (1, NEW, "failed")})
    )
    shrunk = replace(grown, outcomes=MappingProxyType(dict(list(grown.outcomes.items())[5:])))
    changed = replace(
        shrunk, outcomes=MappingProxyType({**shrunk.outcomes, "cam-010": (9, NEW, "failed")})
    )
    for each in [*states, grown, states[1], shrunk, changed, states[0]]:
        assert each.to_json() == _plain_json(each)
