"""The drift loop's decisions: a fake clock, a real SQLite store, a scripted retrainer.

The retrainer is the only stand-in (training takes minutes; it is tested for
real in ``tests/integration/test_drift_retrain.py``): it says how many usable
samples there are and what the new model scores on the shifted hold-out, and
publishes its "build" as a real skill version in the real store. Everything
else (policy, incidents, stages, deployments, rollouts, events) is the hub's
own code on a real store.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from cloud.drift import IncidentState, Stage
from cloud.drift.settings import DriftSettings
from cloud.drift_loop import DriftLoop
from cloud.drift_retrain import Labelled, next_patch
from cloud.hub import Hub
from cloud.rollout_loop import RolloutLoop
from cloud.service import FleetService
from cloud.store.model_records import JobRecord, ModelRecord
from cloud.store.records import TelemetryRecord

START = 1_800_000_000_000
DEVICES = [f"cam-{i}" for i in range(5)]


def model(model_id: int) -> ModelRecord:
    return ModelRecord(model_id, f"m{model_id}", "digits-cnn", 1, 1, "a" * 64, "b" * 64, 1,
                       0.97, 8, 0, 0)  # fmt: skip


@dataclass
class ScriptedRetrainer:
    """Usable samples and hold-out accuracies as the test says; builds real versions."""

    hub: Hub
    samples: int = 40
    before: float = 0.5
    after: float = 0.9
    calls: list[str] = field(default_factory=list)

    def running_model(self, skill: str, version: str) -> ModelRecord | None:
        return model(1)

    def usable(self, incident: IncidentState, settings: DriftSettings) -> Labelled:
        n = self.samples
        return Labelled(tuple(range(n)), np.zeros((n, 1, 8, 8), np.float32),
                        np.zeros(n, np.int64), 0)  # fmt: skip

    def submit(
        self, incident: IncidentState, data: Labelled, *, now_ms: int
    ) -> tuple[int, dict[str, Any]]:
        self.calls.append("submit")
        return 11, {"labels": "device", "shifted_train": len(data.part(holdout=False).ids)}

    def train(self, job_id: int) -> tuple[JobRecord, ModelRecord | None] | None:
        self.calls.append(f"train {job_id}")
        job = JobRecord(job_id, 1, "m2", "digits-cnn", {}, 1, "succeeded", None, None, 0, 0, 0, 0)
        return job, model(2)

    def check(self, incident: IncidentState, data: Labelled, new: ModelRecord) -> dict[str, Any]:
        return {"holdout": 10, "accuracy_before": self.before, "accuracy_after": self.after}

    def build(self, incident: IncidentState, new: ModelRecord, work: Path) -> str:
        self.calls.append("build")
        version = next_patch(incident.version, set())
        add_version(self.hub, version)
        return version


def add_version(hub: Hub, version: str) -> None:
    hub.store.add_skill_version(
        "digits", version, target_name=f"digits/digits-{version}.skill", sha256="c" * 64,
        size=1, manifest="[skill]", now_ms=START,
    )  # fmt: skip


@pytest.fixture
def hub(tmp_path: Path) -> Iterator[Hub]:
    """A hub with five cameras in group cams, running digits 1.0.0."""
    hub = Hub.init(tmp_path / "hub", insecure=True)
    for device in DEVICES:
        hub.store.register_device(device, {"kind": "camera"}, {}, now_ms=START)
    hub.store.create_group("cams", "kind=camera")
    add_version(hub, "1.0.0")
    hub.store.create_deployment("digits", "1.0.0", "cams", now_ms=START)
    yield hub
    hub.close()


class Clock:
    def __init__(self) -> None:
        self.ms = START

    def __call__(self) -> int:
        return self.ms


def report(hub: Hub, at_ms: int, drifting: int, *, version: str = "1.0.0") -> None:
    """One drift window per camera ending at ``at_ms``; the first ``drifting`` drift."""
    for i, device in enumerate(DEVICES):
        psi = 0.6 if i < drifting else 0.01
        record = TelemetryRecord(
            "digits", version, 200, 0, 0, 1.0, 2.0, at_ms - 60_000, at_ms,
            metrics={"drift.n": 200.0, "drift.psi_class": psi, "drift.psi_confidence": psi},
        )  # fmt: skip
        hub.store.add_telemetry(f"{device}-{at_ms}-{version}", device, record)


def loop_of(hub: Hub, clock: Clock, retrainer: ScriptedRetrainer) -> tuple[DriftLoop, FleetService]:
    fleet = FleetService(hub, clock=clock)
    return DriftLoop(fleet, retrainer, clock=clock), fleet


def test_drift_on_enough_devices_opens_one_incident_even_across_restarts(hub: Hub) -> None:
    clock = Clock()
    retrainer = ScriptedRetrainer(hub)
    loop, fleet = loop_of(hub, clock, retrainer)
    report(hub, START, drifting=2)
    assert loop.observe() == 0  # 2 of 5: under min_devices (3)
    clock.ms += 60_000
    report(hub, clock.ms, drifting=4)
    assert loop.observe() == 1
    clock.ms += 60_000
    report(hub, clock.ms, drifting=5)
    again, _ = loop_of(hub, clock, retrainer)  # a new leader, or the hub restarted
    assert again.observe() == 0 and loop.observe() == 0
    [incident] = fleet.drift.incidents()
    assert (incident.state.key.group, incident.state.stage) == ("cams", Stage.OPEN)
    assert "4 of 5 devices drifting" in incident.state.reason
    assert incident.numbers["devices"] == ["cam-0", "cam-1", "cam-2", "cam-3"]


def test_a_calm_fleet_clears_an_untouched_incident_after_the_hold(hub: Hub) -> None:
    clock = Clock()
    loop, fleet = loop_of(hub, clock, ScriptedRetrainer(hub))
    fleet.drift.set_settings("cams", retrain=False, hold_s=120.0)
    report(hub, START, drifting=5)
    assert loop.observe() == 1
    for _ in range(4):
        clock.ms += 60_000
        report(hub, clock.ms, drifting=0)
        loop.observe()
    [ended] = fleet.drift.incidents(everything=True)
    assert ended.state.stage is Stage.CLEARED and "calm for 120s" in ended.state.outcome
    assert loop.observe() == 0  # the cooldown holds the next one back


def test_an_improving_model_is_built_and_canaried_with_the_accuracy_gate(hub: Hub) -> None:
    clock = Clock()
    retrainer = ScriptedRetrainer(hub)
    loop, fleet = loop_of(hub, clock, retrainer)
    report(hub, START, drifting=5)
    loop.observe()
    [opened] = fleet.drift.incidents()
    stages = [loop.step(opened.id) for _ in range(4)]
    assert stages == [Stage.RETRAINING, Stage.BUILT, Stage.CANARY, None]  # canary: waiting
    got = fleet.drift.show(opened.id)
    s = got.state
    assert (s.job_id, s.model_id, s.skill_version) == (11, 2, "1.0.1")
    dep = fleet.deployments.get(s.deployment_id or 0)
    assert (dep.skill, dep.version, dep.group, dep.strategy) == (
        "digits",
        "1.0.1",
        "cams",
        "canary",
    )
    rollout = fleet.deployments.rollout(dep.id)
    assert rollout is not None and rollout.plan["gates"] == {
        "accuracy_drop": {"max": 2.0, "min_samples": 10},
        "health": {"max": 0.1},
        "install_failure": {"max": 0.1},
    }
    # the running version is judged from the start of the window that opened the incident on
    assert rollout.plan["baseline_since_ms"] == opened.state.opened_ms - 600_000
    assert got.detail["accuracy_before"] == 0.5 and got.detail["accuracy_after"] == 0.9
    assert retrainer.calls == ["submit", "train 11", "build"]
    events = [e.message for e in hub.store.events(kind="drift")]
    assert [m.split(": ")[1] for m in events] == ["opened", "retraining", "built", "canary"]
    # An operator rolls the canary back: the incident ends rolled_back.
    fleet.deployments.rollback(dep.id)
    RolloutLoop(hub.store, clock=clock).pass_once()
    assert loop.step(opened.id) is Stage.ROLLED_BACK
    assert fleet.drift.show(opened.id).state.closed_ms == clock.ms


def test_a_model_that_does_not_beat_the_running_one_is_failed_not_deployed(hub: Hub) -> None:
    clock = Clock()
    retrainer = ScriptedRetrainer(hub, before=0.8, after=0.8)
    loop, fleet = loop_of(hub, clock, retrainer)
    report(hub, START, drifting=5)
    loop.observe()
    [opened] = fleet.drift.incidents()
    assert loop.step(opened.id) is Stage.RETRAINING
    assert loop.step(opened.id) is Stage.FAILED
    ended = fleet.drift.show(opened.id)
    assert "does not beat 1.0.0 on the shifted hold-out: 0.800 vs 0.800" in ended.state.outcome
    assert "build" not in retrainer.calls
    assert [d.version for d in fleet.deployments.list()] == ["1.0.0"]
    assert loop.step(opened.id) is None  # ended: nothing more to do


def test_an_incident_waits_for_enough_usable_samples(hub: Hub) -> None:
    clock = Clock()
    retrainer = ScriptedRetrainer(hub, samples=5)
    loop, fleet = loop_of(hub, clock, retrainer)
    report(hub, START, drifting=5)
    loop.observe()
    [opened] = fleet.drift.incidents()
    assert loop.step(opened.id) is None and retrainer.calls == []
    retrainer.samples = 20
    assert loop.step(opened.id) is Stage.RETRAINING


def test_a_restart_mid_incident_resumes_from_the_stored_stage(hub: Hub) -> None:
    clock = Clock()
    loop, fleet = loop_of(hub, clock, ScriptedRetrainer(hub))
    report(hub, START, drifting=5)
    loop.observe()
    [opened] = fleet.drift.incidents()
    assert loop.step(opened.id) is Stage.RETRAINING
    fresh = ScriptedRetrainer(hub)
    restarted, _ = loop_of(hub, clock, fresh)  # the hub was killed during training
    assert restarted.step(opened.id) is Stage.BUILT
    assert fresh.calls == ["train 11", "build"]  # the same job, resumed; not a new one


def test_only_the_groups_devices_count_and_a_pass_without_windows_reads_no_devices(
    hub: Hub, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = Clock()
    loop, fleet = loop_of(hub, clock, ScriptedRetrainer(hub))
    reads: list[object] = []
    members = fleet.devices.ids

    def counted(*args: Any, **kwargs: Any) -> set[str]:
        reads.append(args)
        return members(*args, **kwargs)

    monkeypatch.setattr(fleet.devices, "ids", counted)
    assert loop.observe() == 0 and reads == []  # nothing reported: the fleet is not read
    # Two drifting devices outside the group, and two of its five cameras: under min_devices.
    for stranger in ("dog-1", "dog-2"):
        hub.store.register_device(stranger, {"kind": "dog"}, {}, now_ms=START)
        record = TelemetryRecord(
            "digits", "1.0.0", 200, 0, 0, 1.0, 2.0, START - 60_000, START,
            metrics={"drift.n": 200.0, "drift.psi_class": 0.6, "drift.psi_confidence": 0.6},
        )  # fmt: skip
        hub.store.add_telemetry(f"{stranger}-w", stranger, record)
    report(hub, START, drifting=2)
    assert loop.observe() == 0 and len(reads) == 1
    assert fleet.drift.incidents() == []
