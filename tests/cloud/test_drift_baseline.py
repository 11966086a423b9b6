"""A drift canary's baseline is judged on telemetry from after the shift, on SQLite and PostgreSQL.

The running version did well before the input shift and badly after it; the
retrained candidate is in between. Against the running version's whole record
the candidate looks worse and its accuracy gate fails; against the running
version on the shifted inputs only (the plan's ``baseline_since_ms``, which
the drift loop sets) it is better and the gate passes.
"""

from __future__ import annotations

from typing import Any

import pytest

from cloud.errors import ValidationError
from cloud.rollout.plan import parse_plan, plan_from_dict
from cloud.rollout.state import RolloutState
from cloud.rollout_loop import RolloutLoop
from cloud.store import SkillStatusRecord, Store, TelemetryRecord

NOW = 50_000_000
MIN = 60_000
SHIFT = NOW - 10 * MIN
DEVICES = [f"cam-{i:02d}" for i in range(10)]
#: A canary of 3 whose accuracy may lose at most 2 points, then the rest at once.
CANARY: dict[str, Any] = {
    "strategy": "canary", "canary": 3, "min_samples": 3, "wave_interval_s": 0,
    "gates": {"accuracy_drop": {"max": 2.0, "min_samples": 50}},
}  # fmt: skip


class Clock:
    def __init__(self) -> None:
        self.now = NOW

    def __call__(self) -> int:
        return self.now


def window(store: Store, device: str, version: str, end_ms: int, correct: int) -> None:
    """A telemetry window of 100 labelled inferences, ``correct`` of them right."""
    record = TelemetryRecord(
        "face", version, 100, 100, correct, 2.0, 9.0, end_ms - MIN, end_ms, latency_p95_ms=5.0
    )
    store.add_telemetry(f"{device}-{version}-{end_ms}", device, record)


def report(store: Store, device: str, version: str) -> None:
    generation = store.desired_for(device).generation
    status = SkillStatusRecord("face", version, "running", desired_version=version)
    store.save_report(device, generation, [status], now_ms=NOW)


def shifted_fleet(store: Store) -> None:
    """Ten cameras on face 1.0.0: 99 % right before the shift, 60 % after it."""
    for device in DEVICES:
        store.register_device(device, {"kind": "camera"}, {}, now_ms=NOW - 30 * MIN)
    store.create_group("cams", "kind=camera")
    for version in ("1.0.0", "1.0.1"):
        store.add_skill_version(
            "face", version, target_name=f"face-{version}.skill", sha256="a" * 64, size=1,
            manifest="[skill]", now_ms=1,
        )  # fmt: skip
    store.create_deployment("face", "1.0.0", "cams", now_ms=NOW - 30 * MIN)
    for device in DEVICES:
        report(store, device, "1.0.0")
        window(store, device, "1.0.0", SHIFT - 5 * MIN, correct=99)
        window(store, device, "1.0.0", SHIFT + 5 * MIN, correct=60)


def canary_outcome(store: Store, plan: dict[str, Any]) -> tuple[str, RolloutState]:
    """Roll 1.0.1 (75 % right on the canary) out under ``plan``: the phase after its gates."""
    clock = Clock()
    dep = store.create_deployment(
        "face", "1.0.1", "cams", plan=plan_from_dict(plan), now_ms=clock.now
    )
    loop = RolloutLoop(store, clock=clock)
    clock.now += 1000
    loop.pass_once()
    canary = store.rollouts_of([dep.id])[dep.id].admitted or {}
    assert len(canary) == 3
    for device in canary:
        report(store, device, "1.0.1")
        window(store, device, "1.0.1", clock.now, correct=75)
    clock.now += 1000
    loop.pass_once()
    rollout = store.rollouts_of([dep.id])[dep.id]
    return rollout.phase, RolloutState.from_json(rollout.state)


def test_the_canary_beats_the_running_version_on_the_shifted_inputs(store: Store) -> None:
    shifted_fleet(store)
    phase, state = canary_outcome(store, {**CANARY, "baseline_since_ms": SHIFT})
    assert phase != "rolled_back"
    assert len(state.admitted) == len(DEVICES)  # the gate passed: the rest of the group opened
    baseline = [w for (_, v), w in state.kpis.items() if v == "1.0.0"]
    assert {(w.labelled, w.correct) for w in baseline} == {(100, 60)}  # after the shift only
    candidate = [w for (_, v), w in state.kpis.items() if v == "1.0.1"]
    assert {(w.labelled, w.correct) for w in candidate} == {(100, 75)}


def test_without_the_cut_the_record_from_before_the_shift_fails_the_canary(store: Store) -> None:
    shifted_fleet(store)
    phase, state = canary_outcome(store, CANARY)
    assert phase == "rolled_back"  # 75 % against (99 + 60) / 2 = 79.5 %: 4.5 points lost
    baseline = [w for (_, v), w in state.kpis.items() if v == "1.0.0"]
    assert {(w.labelled, w.correct) for w in baseline} == {(200, 159)}


def test_the_cut_never_removes_the_candidates_own_windows(store: Store) -> None:
    shifted_fleet(store)
    # A cut after every window: the baseline has nothing to show, the candidate keeps its own.
    phase, state = canary_outcome(store, {**CANARY, "baseline_since_ms": NOW + 60 * MIN})
    assert phase == "soaking"  # the accuracy gate waits for baseline samples: no pass, no fail
    assert len(state.admitted) == 3
    assert {v for _, v in state.kpis} == {"1.0.1"}


# --- the plan ----------------------------------------------------------------------------


def test_a_plan_keeps_its_baseline_cut_through_its_stored_form() -> None:
    plan = plan_from_dict({**CANARY, "baseline_since_ms": SHIFT})
    assert plan.baseline_since_ms == SHIFT
    assert plan.to_dict()["baseline_since_ms"] == SHIFT
    assert plan_from_dict(plan.to_dict()) == plan
    toml = parse_plan(f'strategy = "waves"\nbaseline_since_ms = {SHIFT}\n')
    assert toml.baseline_since_ms == SHIFT


def test_a_plan_stored_before_the_cut_existed_loads_without_one() -> None:
    old = plan_from_dict(CANARY).to_dict()
    assert "baseline_since_ms" not in old  # unset: the stored form is what it always was
    assert plan_from_dict(old).baseline_since_ms is None
    assert plan_from_dict({**old, "baseline_since_ms": None}).baseline_since_ms is None


@pytest.mark.parametrize("bad", [-1, 1.5, "yesterday", True, 2**60])
def test_a_bad_baseline_cut_is_refused_in_one_line(bad: object) -> None:
    with pytest.raises(ValidationError, match="baseline_since_ms") as err:
        plan_from_dict({**CANARY, "baseline_since_ms": bad})
    assert "\n" not in str(err.value)
