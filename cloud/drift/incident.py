"""A drift incident's life as the drift loop drives it: a small pure state machine.

An incident opens when the policy fires, then goes ``open -> retraining ->
built -> canary -> promoted | rolled_back``. Any stage before the end may
go to ``failed``, and an ``open`` incident whose fleet calmed down before
work started is ``cleared``. The four end stages close the incident.

Each transition is a function that returns a new :class:`IncidentState`
(records are frozen) or raises :class:`IllegalTransitionError`. Each stage
change is kept in ``history`` with its time, and the ids it links are kept
on the record, so the chain incident -> training job -> model -> skill
version -> deployment -> outcome can always be read back.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace
from typing import Any

from cloud.drift.aggregate import DriftKey
from cloud.errors import IllegalTransitionError, ValidationError

__all__ = [
    "ENDED",
    "IllegalTransitionError",
    "IncidentState",
    "Stage",
    "StageChange",
    "clear",
    "fail",
    "mark_built",
    "open_incident",
    "promote",
    "roll_back",
    "start_canary",
    "start_retraining",
]


class Stage(enum.StrEnum):
    """Where a drift incident is."""

    OPEN = "open"
    RETRAINING = "retraining"
    BUILT = "built"
    CANARY = "canary"
    PROMOTED = "promoted"
    ROLLED_BACK = "rolled_back"
    FAILED = "failed"
    CLEARED = "cleared"


#: Stages that close an incident; none has a way out.
ENDED = frozenset({Stage.PROMOTED, Stage.ROLLED_BACK, Stage.FAILED, Stage.CLEARED})

_NEXT: dict[Stage, frozenset[Stage]] = {
    Stage.OPEN: frozenset({Stage.RETRAINING, Stage.FAILED, Stage.CLEARED}),
    Stage.RETRAINING: frozenset({Stage.BUILT, Stage.FAILED}),
    Stage.BUILT: frozenset({Stage.CANARY, Stage.FAILED}),
    Stage.CANARY: frozenset({Stage.PROMOTED, Stage.ROLLED_BACK, Stage.FAILED}),
}


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ValidationError(message)


def _check_id(name: str, value: object) -> None:
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= 0
    _check(ok, f"bad {name} {value!r}")


@dataclass(frozen=True)
class StageChange:
    """One stage an incident entered, and when (ms since the Unix epoch)."""

    stage: Stage
    at_ms: int
    note: str = ""


@dataclass(frozen=True)
class IncidentState:
    """A drift incident of one skill version on one group, and what was done about it.

    Build it with :func:`open_incident` and move it with the transition
    functions; a record put together by hand is checked the same way.

    Attributes:
        closed_ms: When it reached an end stage; None while it is open.
        job_id: The retraining job (from ``retraining`` on).
        model_id: The model the job produced (from ``built`` on).
        skill_version: The skill version built from that model (from ``built`` on).
        deployment_id: The canary deployment of that version (from ``canary`` on).
        outcome: Why it ended (empty while open).
        history: Every stage entered, oldest first; the first is ``open``.

    Raises:
        ValidationError: A bad id or time, a history that does not start at
            ``open`` or runs back in time, or links missing for the stage.
    """

    id: int
    skill: str
    version: str
    group: str
    opened_ms: int
    reason: str
    stage: Stage = Stage.OPEN
    closed_ms: int | None = None
    job_id: int | None = None
    model_id: int | None = None
    skill_version: str | None = None
    deployment_id: int | None = None
    outcome: str = ""
    history: tuple[StageChange, ...] = ()

    def __post_init__(self) -> None:
        """Check the record is one the transitions could have made."""
        _check_id("incident id", self.id)
        DriftKey(self.skill, self.version, self.group)
        _check_id("open time", self.opened_ms)
        object.__setattr__(self, "stage", Stage(self.stage))
        if not self.history:
            object.__setattr__(self, "history", (StageChange(Stage.OPEN, self.opened_ms),))
        first = self.history[0]
        _check(first == StageChange(Stage.OPEN, self.opened_ms), "history must start at open")
        _check(self.history[-1].stage is self.stage, "history must end at the stage")
        times = [c.at_ms for c in self.history]
        _check(times == sorted(times), f"incident {self.id} history runs back in time")
        ended = self.stage in ENDED
        _check((self.closed_ms is not None) == ended, "closed_ms is set exactly when it ended")
        _check(not ended or self.closed_ms == times[-1], "closed_ms is the end stage's time")
        self._check_links()

    def _check_links(self) -> None:
        reached = {c.stage for c in self.history}
        needs: list[tuple[str, Any, Stage]] = [
            ("job_id", self.job_id, Stage.RETRAINING),
            ("model_id", self.model_id, Stage.BUILT),
            ("skill_version", self.skill_version, Stage.BUILT),
            ("deployment_id", self.deployment_id, Stage.CANARY),
        ]
        for name, value, stage in needs:
            _check((value is not None) == (stage in reached), f"{name} goes with {stage}")
            if value is not None and name != "skill_version":
                _check_id(name, value)

    @property
    def key(self) -> DriftKey:
        """The skill version and group the incident is about."""
        return DriftKey(self.skill, self.version, self.group)

    def entered_ms(self, stage: Stage) -> int | None:
        """When the incident entered ``stage`` (None if it never did)."""
        return next((c.at_ms for c in self.history if c.stage is stage), None)


def open_incident(incident_id: int, key: DriftKey, reason: str, at_ms: int) -> IncidentState:
    """A new incident in stage ``open``.

    Raises:
        ValidationError: A bad id or time.
    """
    return IncidentState(incident_id, key.skill, key.version, key.group, at_ms, reason)


def _move(
    incident: IncidentState, to: Stage, at_ms: int, note: str = "", **links: Any
) -> IncidentState:
    allowed = _NEXT.get(incident.stage, frozenset())
    if to not in allowed:
        froms = sorted(s for s, nexts in _NEXT.items() if to in nexts)
        raise IllegalTransitionError(
            f"incident {incident.id} is {incident.stage}; it cannot go to {to} "
            f"(only from {', '.join(froms)})"
        )
    last = incident.history[-1].at_ms
    ok = isinstance(at_ms, int) and not isinstance(at_ms, bool) and at_ms >= last
    _check(ok, f"{to} at {at_ms!r} is before {last}")
    history = (*incident.history, StageChange(to, at_ms, note))
    closed = at_ms if to in ENDED else None
    outcome = note if to in ENDED else ""
    return replace(incident, stage=to, history=history, closed_ms=closed, outcome=outcome, **links)


def start_retraining(incident: IncidentState, job_id: int, at_ms: int) -> IncidentState:
    """``open -> retraining``: the retraining job ``job_id`` started.

    Raises:
        IllegalTransitionError: The incident is not ``open``.
        ValidationError: A bad job id, or a time before the last change.
    """
    _check_id("job id", job_id)
    return _move(incident, Stage.RETRAINING, at_ms, f"job {job_id}", job_id=job_id)


def mark_built(
    incident: IncidentState, model_id: int, skill_version: str, at_ms: int
) -> IncidentState:
    """``retraining -> built``: the job made model ``model_id``, packed as ``skill_version``.

    Raises:
        IllegalTransitionError: The incident is not ``retraining``.
        ValidationError: A bad model id, a skill version that is empty or the
            drifting one itself, or a time before the last change.
    """
    _check_id("model id", model_id)
    ok = isinstance(skill_version, str) and bool(skill_version)
    _check(ok and skill_version != incident.version, f"bad new skill version {skill_version!r}")
    note = f"model {model_id} as {incident.skill} {skill_version}"
    return _move(incident, Stage.BUILT, at_ms, note, model_id=model_id, skill_version=skill_version)


def start_canary(incident: IncidentState, deployment_id: int, at_ms: int) -> IncidentState:
    """``built -> canary``: deployment ``deployment_id`` rolls the new version out as a canary.

    Raises:
        IllegalTransitionError: The incident is not ``built``.
        ValidationError: A bad deployment id, or a time before the last change.
    """
    _check_id("deployment id", deployment_id)
    note = f"deployment {deployment_id}"
    return _move(incident, Stage.CANARY, at_ms, note, deployment_id=deployment_id)


def promote(incident: IncidentState, at_ms: int, note: str = "promoted") -> IncidentState:
    """``canary -> promoted``: the canary passed its gates; the incident closes.

    Raises:
        IllegalTransitionError: The incident is not ``canary``.
        ValidationError: A time before the last change.
    """
    return _move(incident, Stage.PROMOTED, at_ms, note)


def roll_back(incident: IncidentState, at_ms: int, note: str) -> IncidentState:
    """``canary -> rolled_back``: the canary failed a gate and was reverted; the incident closes.

    Raises:
        IllegalTransitionError: The incident is not ``canary``.
        ValidationError: A time before the last change.
    """
    return _move(incident, Stage.ROLLED_BACK, at_ms, note)


def fail(incident: IncidentState, at_ms: int, note: str) -> IncidentState:
    """Any stage before the end ``-> failed`` (a job or build broke); the incident closes.

    Raises:
        IllegalTransitionError: The incident has already ended.
        ValidationError: A time before the last change.
    """
    return _move(incident, Stage.FAILED, at_ms, note)


def clear(incident: IncidentState, at_ms: int, note: str) -> IncidentState:
    """``open -> cleared``: the drift went away before work started; the incident closes.

    Raises:
        IllegalTransitionError: The incident is not ``open``.
        ValidationError: A time before the last change.
    """
    return _move(incident, Stage.CLEARED, at_ms, note)
