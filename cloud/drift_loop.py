"""The leader's drift loop: fleet drift in, incidents out, and each incident driven to its end.

Every tick it **observes**: the recent telemetry windows with drift metrics
of each group's deployed skills become :class:`~cloud.drift.DriftAggregate`
values per (skill, version, group); the group's :class:`~cloud.drift.DriftPolicy`
(from its drift settings) and the stored incidents go into the pure
:func:`~cloud.drift.evaluate`, and its decisions are written through the
drift service (the store refuses a second open incident for a key, so a
restarted loop cannot open one twice).

Then it **drives** each open incident one stage at a time, in a bounded
worker thread (training and building take minutes and never run on the
event loop): ``open`` -> a retraining job on the original data plus the
drift samples (:class:`cloud.drift_retrain.Retrainer`) -> ``retraining`` ->
the job's model checked on the shifted hold-out and, only if it beats the
running version, built and published -> ``built`` -> a canary deployment
gated on accuracy against the running version -> ``canary`` -> ``promoted``
or ``rolled_back`` as the rollout ends. A model that does not beat the
running one ends the incident ``failed``, undeployed. Every stage is stored
(with its links and numbers) and logged in the event log before the next
starts, so a hub killed mid-incident carries on from the stored stage.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from cloud.drift import (
    DriftAggregate,
    DriftKey,
    DriftWindow,
    IncidentState,
    OpenIncident,
    Stage,
    evaluate,
    fail,
    mark_built,
    promote,
    roll_back,
    start_canary,
    start_retraining,
)
from cloud.drift.settings import DriftSettings
from cloud.errors import HubError, StoreError, ValidationError
from cloud.loops import LoopFactory, periodic
from protos.envelope import now_ms

if TYPE_CHECKING:
    from cloud.drift_retrain import Labelled
    from cloud.service import FleetService
    from cloud.store import TelemetryRecord
    from cloud.store.model_records import JobRecord, ModelRecord

__all__ = ["DRIFT_TICK_S", "DriftLoop", "RetrainSteps"]

log = logging.getLogger(__name__)

#: How often the leader reads fleet drift and moves incidents along.
DRIFT_TICK_S = 30.0
#: A canary keeps the default device gates beside its accuracy gate.
_SAFETY_GATES = {"install_failure": 0.1, "health": 0.1}


class RetrainSteps(Protocol):
    """What the loop needs of :class:`cloud.drift_retrain.Retrainer` (blocking calls)."""

    def running_model(self, skill: str, version: str) -> ModelRecord | None: ...
    def usable(self, incident: IncidentState, settings: DriftSettings) -> Labelled: ...
    def submit(
        self, incident: IncidentState, data: Labelled, *, now_ms: int
    ) -> tuple[int, dict[str, Any]]: ...
    def train(self, job_id: int) -> tuple[JobRecord, ModelRecord | None] | None: ...
    def check(
        self, incident: IncidentState, data: Labelled, new: ModelRecord
    ) -> dict[str, Any]: ...
    def build(self, incident: IncidentState, new: ModelRecord, work: Path) -> str: ...


class DriftLoop:
    """Opens, drives and closes drift incidents of one hub, on the leader only.

    Args:
        fleet: The hub's fleet service.
        retrainer: The blocking retraining steps.
        clock: Milliseconds since the epoch.
        tick_s: Seconds between passes.
    """

    def __init__(
        self,
        fleet: FleetService,
        retrainer: RetrainSteps,
        *,
        clock: Callable[[], int] = now_ms,
        tick_s: float = DRIFT_TICK_S,
    ) -> None:
        self._fleet = fleet
        self._retrainer = retrainer
        self._clock = clock
        self._tick_s = tick_s
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self._busy: set[int] = set()

    def factory(self) -> LoopFactory:
        """The loop for :class:`cloud.loops.LoopHost` (register it leader-only)."""
        tick = periodic(self._pass, self._tick_s, first_now=True)

        async def run() -> None:
            self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="drift")
            try:
                await tick()
            finally:  # the step in flight finishes; its stage write is checked
                self._pool.shutdown(wait=False, cancel_futures=True)
                self._pool, self._busy = None, set()

        return run

    async def _pass(self) -> None:
        await asyncio.to_thread(self.observe)
        for incident in await asyncio.to_thread(self._fleet.drift.incidents):
            if incident.id in self._busy or self._pool is None:
                continue
            self._busy.add(incident.id)
            work = asyncio.get_running_loop().run_in_executor(self._pool, self.step, incident.id)
            work.add_done_callback(functools.partial(self._done, incident.id))

    def _done(self, incident_id: int, future: asyncio.Future[Stage | None]) -> None:
        self._busy.discard(incident_id)
        if not future.cancelled() and future.exception() is not None:
            log.error("drift incident %d: step failed: %s", incident_id, future.exception())

    # -- observing -----------------------------------------------------------------------

    def observe(self) -> int:
        """Run the policies once over the fleet's recent drift; how many decisions were stored.

        Raises:
            StoreError: The store failed.
        """
        now = self._clock()
        stored = 0
        settings = self._fleet.drift.all_settings()
        deployed = self._deployed()
        if not deployed:
            return 0
        chosen = {group: settings.get(group, DriftSettings()) for group in deployed}
        # One read of the windows for every group (the longest retention), and the
        # devices of a group only when it has windows to judge.
        oldest = max(0, now - max(c.policy.retention_ms for c in chosen.values()))
        windows = self._fleet.drift.windows(oldest)
        for group, skills in deployed.items():
            stored += self._observe_group(group, skills, chosen[group], windows, now)
        return stored

    def _deployed(self) -> dict[str, set[str]]:
        out: dict[str, set[str]] = {}
        for dep in self._fleet.deployments.list():
            if dep.state == "active":
                out.setdefault(dep.group, set()).add(dep.skill)
        return out

    def _observe_group(
        self,
        group: str,
        skills: set[str],
        settings: DriftSettings,
        windows: list[TelemetryRecord],
        now: int,
    ) -> int:
        policy = settings.policy
        aggregates = self._aggregates(group, skills, windows, max(0, now - policy.retention_ms))
        incidents = [
            r.state
            for r in self._fleet.drift.recent(max(0, now - round(policy.cooldown_s * 1000)))
            if r.state.group == group
        ]
        stored = 0
        for decision in evaluate(policy, aggregates.values(), incidents, now):
            if isinstance(decision, OpenIncident):
                stored += self._fleet.drift.open(decision) is not None
            else:
                stored += self._fleet.drift.close(decision)
        return stored

    def _aggregates(
        self, group: str, skills: set[str], windows: list[TelemetryRecord], since_ms: int
    ) -> dict[DriftKey, DriftAggregate]:
        records = [w for w in windows if w.skill in skills and w.window_end_ms >= since_ms]
        if not records:
            return {}
        # The selector alone: a group view would count the fleet's devices to say how many.
        members = self._fleet.devices.ids(self._fleet.groups.selector(group))
        found: dict[DriftKey, list[DriftWindow]] = {}
        for record in records:
            if record.device_id not in members:
                continue
            try:
                window = DriftWindow.from_metrics(
                    record.device_id, record.skill, record.version, group,
                    record.window_end_ms, record.metrics,
                )  # fmt: skip
            except ValidationError as exc:
                log.debug("drift window of %s skipped: %s", record.device_id, exc)
                continue
            if window is not None:
                found.setdefault(window.key, []).append(window)
        return {k: DriftAggregate(k, self._reference(k), frozenset(w)) for k, w in found.items()}

    def _reference(self, key: DriftKey) -> float | None:
        model = self._retrainer.running_model(key.skill, key.version)
        return None if model is None else model.test_accuracy

    # -- driving -------------------------------------------------------------------------

    def step(self, incident_id: int) -> Stage | None:
        """Move one incident one stage along (blocking); the stage it reached, or None.

        A step that fails for a reason of the hub's (a job or build error) ends
        the incident ``failed`` with the reason; a store failure leaves it as it
        was, to be tried again on the next pass.

        Raises:
            StoreError: The store failed.
        """
        record = self._fleet.drift.show(incident_id)
        incident = record.state
        settings = self._fleet.drift.settings(incident.group)
        try:
            moved = self._advance(incident, settings, dict(record.detail))
        except HubError as exc:  # a job, build or check error; a missing record; a conflict
            if type(exc) is StoreError:
                raise  # the database itself: try again next pass
            moved = (fail(incident, self._now(incident), f"{type(exc).__name__}: {exc}"), {})
        if moved is None:
            return None
        new, detail = moved
        return new.stage if self._fleet.drift.move(incident, new, detail) else None

    def _now(self, incident: IncidentState) -> int:
        return max(self._clock(), incident.history[-1].at_ms)

    def _advance(
        self, incident: IncidentState, settings: DriftSettings, detail: dict[str, Any]
    ) -> tuple[IncidentState, dict[str, Any]] | None:
        if incident.stage is Stage.OPEN:
            return self._start(incident, settings)
        if incident.stage is Stage.RETRAINING:
            return self._finish_training(incident, settings)
        if incident.stage is Stage.BUILT:
            return self._deploy(incident, settings, detail)
        if incident.stage is Stage.CANARY:
            return self._follow(incident)
        return None

    def _start(
        self, incident: IncidentState, settings: DriftSettings
    ) -> tuple[IncidentState, dict[str, Any]] | None:
        if not settings.retrain:
            return None
        data = self._retrainer.usable(incident, settings)
        if len(data.ids) < settings.retrain_samples:
            return None  # wait for more labels (or for the policy to clear it)
        job_id, detail = self._retrainer.submit(incident, data, now_ms=self._clock())
        return start_retraining(incident, job_id, self._now(incident)), detail

    def _finish_training(
        self, incident: IncidentState, settings: DriftSettings
    ) -> tuple[IncidentState, dict[str, Any]] | None:
        done = self._retrainer.train(_link(incident.job_id, "job"))
        if done is None:
            return None  # another process runs the job
        job, model = done
        if model is None:
            return fail(
                incident, self._now(incident), f"job {job.id} {job.status}: {job.error}"
            ), {}
        data = self._retrainer.usable(incident, settings)
        checked = {**self._retrainer.check(incident, data, model), "model": model.id}
        gain = (checked["accuracy_after"] - checked["accuracy_before"]) * 100
        if gain <= settings.min_gain:
            why = (
                f"model {model.id} does not beat {incident.version} on the shifted hold-out: "
                f"{checked['accuracy_after']:.3f} vs {checked['accuracy_before']:.3f}"
            )
            return fail(incident, self._now(incident), why), checked
        with tempfile.TemporaryDirectory(prefix="edgeskill-drift-build-") as tmp:
            version = self._retrainer.build(incident, model, Path(tmp))
        return mark_built(incident, model.id, version, self._now(incident)), checked

    def _deploy(
        self, incident: IncidentState, settings: DriftSettings, detail: dict[str, Any]
    ) -> tuple[IncidentState, dict[str, Any]]:
        version = incident.skill_version
        existing = [
            d
            for d in self._fleet.deployments.list()
            if (d.skill, d.version, d.group) == (incident.skill, version, incident.group)
        ]  # a deployment made before a restart cut the stage write short
        if existing:
            dep_id = existing[-1].id
        else:
            canary = _canary(settings.canary)
            accuracy = {"max": settings.accuracy_gate, "min_samples": settings.canary_min_samples}
            plan = {
                "strategy": "canary", "canary": canary, "then": "all",
                "wave_interval_s": settings.canary_wait_s,
                # Device gates need no more devices than a small canary has.
                "min_samples": min(10, canary) if isinstance(canary, int) else 10,
                "gates": {**_SAFETY_GATES, "accuracy_drop": accuracy},
                # The running version is judged on the shifted inputs only, like the candidate.
                "baseline_since_ms": settings.policy.shift_start_ms(incident.opened_ms),
            }  # fmt: skip
            project = self._fleet.groups.get(incident.group).project
            dep_id = self._fleet.deployments.create(
                incident.skill, str(version), incident.group, plan=plan, project=project
            ).id
        return start_canary(incident, dep_id, self._now(incident)), {"canary_plan": settings.canary}

    def _follow(self, incident: IncidentState) -> tuple[IncidentState, dict[str, Any]] | None:
        dep_id = _link(incident.deployment_id, "deployment")
        rollout = self._fleet.deployments.rollout(dep_id)
        at = self._now(incident)
        if rollout is None:
            dep = self._fleet.deployments.get(dep_id)
            if dep.state == "aborted":
                return roll_back(incident, at, f"deployment {dep.id} aborted"), {}
            return None
        if rollout.phase == "completed":
            return promote(incident, at, f"deployment {dep_id} completed"), {}
        if rollout.phase in ("rolled_back", "aborted"):
            note = f"deployment {dep_id} {rollout.phase}: {rollout.reason}"
            return roll_back(incident, at, note), {
                "rollout_gates": [list(g) for g in rollout.gates]
            }
        return None


def _link(value: int | None, what: str) -> int:
    if value is None:  # the stage machine never lets this happen
        raise ValidationError(f"an incident at this stage has no {what}")
    return value


def _canary(size: str) -> str | int:
    text = size.strip()
    return int(text) if text.isdigit() else text
