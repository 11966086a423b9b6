"""Deployment status computed from its devices' reports (pure: views in, a view out).

A deployment's stored state says only whether it is still wanted (active,
superseded, aborted). What it achieved is computed here, each time, from the
devices its group selects now:

per device
    ``succeeded``: it runs this version. ``failed``: it failed this version, or
    rolled back from it. ``in progress``: it is installing this version.
    ``offline``: none of those, and it is offline. ``pending``: none of those.

the deployment
    ``superseded`` and ``aborted`` as stored; otherwise ``succeeded`` when every
    target runs this version, ``failed`` when every target failed it,
    ``partially failed`` when some failed, ``in progress`` when some succeeded or
    are installing, else ``pending`` (no target did anything yet, or there is none).

the rollout (staged deployments only)
    its phase and why it paused or ended, as the engine stored them, and each
    gate's verdict judged now from the stored state (:func:`rollout_view`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Protocol

from cloud.rollout.engine import gate_results, observations
from cloud.rollout.gates import KpiTotals
from cloud.rollout.plan import RolloutPlan
from cloud.rollout.state import RolloutState
from cloud.service.views import (
    DeploymentStatusView,
    DeploymentView,
    DeviceRolloutView,
    RolloutView,
    SkillStateView,
)

__all__ = [
    "DEPLOYMENT_STATUSES",
    "DEVICE_STATUSES",
    "RolloutTarget",
    "Target",
    "deployment_status",
    "device_status",
    "rollout_view",
    "short_reason",
]

PENDING = "pending"
IN_PROGRESS = "in progress"
SUCCEEDED = "succeeded"
FAILED = "failed"
OFFLINE = "offline"
PARTIALLY_FAILED = "partially failed"
DEVICE_STATUSES = (PENDING, IN_PROGRESS, SUCCEEDED, FAILED, OFFLINE)
DEPLOYMENT_STATUSES = (PENDING, IN_PROGRESS, SUCCEEDED, PARTIALLY_FAILED, FAILED)
_FINAL_STORED = ("superseded", "aborted")


class Target(Protocol):
    """What a device's standing is computed from (a :class:`DeviceView` is one)."""

    @property
    def device_id(self) -> str:
        """The device."""
        ...

    @property
    def online(self) -> bool:
        """Whether it is online now."""
        ...

    def skill(self, name: str) -> SkillStateView | None:
        """The reported state of one skill, or None when the device did not report it."""
        ...


@dataclass(frozen=True)
class RolloutTarget:
    """A target device as deployment status needs it: presence and reported skills by name.

    Lighter than a :class:`DeviceView` (no labels, profile or desired state), so
    the status of a group of thousands of devices is cheap to compute.
    """

    device_id: str
    online: bool
    skills: Mapping[str, SkillStateView] = field(default_factory=dict)

    def skill(self, name: str) -> SkillStateView | None:
        """The reported state of one skill, or None when the device did not report it."""
        return self.skills.get(name)


def short_reason(error: str, width: int = 60) -> str:
    """The gist of an error in one line of at most ``width`` characters.

    The first non-empty line; when it ends with a colon (a heading such as
    "setup failed:" over a traceback), the last non-empty line is added.
    """
    lines = [line.strip() for line in error.splitlines() if line.strip()]
    if not lines:
        return ""
    text = lines[0]
    if text.endswith(":") and len(lines) > 1:
        text = f"{text} {lines[-1]}"
    return text if len(text) <= width else text[: max(width - 1, 0)] + "…"


def _failed_here(skill: SkillStateView, version: str) -> str | None:
    """The reason the device failed ``version``, or None if it did not."""
    if skill.state == "failed" and (skill.desired_version or skill.version) == version:
        return skill.error or "failed"
    if skill.state == "rolled_back" and version in (skill.desired_version, skill.previous_version):
        back = f"rolled back to {skill.version}" if skill.version else "rolled back"
        return f"{back}: {skill.error}" if skill.error else back
    return None


def device_status(deployment: DeploymentView, device: Target) -> DeviceRolloutView:
    """Where one device stands with ``deployment`` (see the module's table)."""
    skill = device.skill(deployment.skill)
    if skill is not None:
        if skill.state == "running" and skill.version == deployment.version:
            return DeviceRolloutView(device.device_id, SUCCEEDED)
        reason = _failed_here(skill, deployment.version)
        if reason is not None:
            return DeviceRolloutView(device.device_id, FAILED, reason)
        if skill.state == "installing" and skill.desired_version == deployment.version:
            return DeviceRolloutView(device.device_id, IN_PROGRESS)
    return DeviceRolloutView(device.device_id, PENDING if device.online else OFFLINE)


def _overall(stored: str, devices: Sequence[DeviceRolloutView]) -> str:
    if stored in _FINAL_STORED:
        return stored
    counts = Counter(d.status for d in devices)
    failed = counts[FAILED]
    if devices and counts[SUCCEEDED] == len(devices):
        return SUCCEEDED
    if devices and failed == len(devices):
        return FAILED
    if failed:
        return PARTIALLY_FAILED
    if counts[SUCCEEDED] or counts[IN_PROGRESS]:
        return IN_PROGRESS
    return PENDING


def _kpis(totals: KpiTotals) -> dict[str, float]:
    out: dict[str, float] = {k: float(v) for k, v in asdict(totals).items()}
    if totals.labelled:
        out["accuracy"] = totals.accuracy
    return out


def rollout_view(plan: RolloutPlan, state: RolloutState, now_ms: int) -> RolloutView:
    """A rollout as its stored state shows it, its gates judged at ``now_ms``."""
    judged = replace(state, clock_ms=max(state.clock_ms, now_ms))
    obs = observations(plan, judged)
    gates = tuple(
        (r.gate.kind.value, r.verdict.value, r.reason) for r in gate_results(plan, judged)
    )
    return RolloutView(
        phase=state.phase.value,
        reason=state.paused_reason or state.reason,
        waves_opened=state.waves_opened,
        admitted=len(state.admitted),
        targets=len(state.targets),
        gates=gates,
        plan=plan.to_dict(),
        candidate=_kpis(obs.candidate),
        baseline=_kpis(obs.baseline),
    )


def deployment_status(
    deployment: DeploymentView,
    targets: Sequence[Target],
    rollout: RolloutView | None = None,
) -> DeploymentStatusView:
    """A deployment's computed state and each target's standing, targets sorted by id.

    Args:
        deployment: The deployment as stored.
        targets: The devices its group selects now, with their presence and report
            (device views, or the lighter :class:`RolloutTarget`).
        rollout: Its rollout's view, for a staged deployment.
    """
    devices = tuple(
        device_status(deployment, d) for d in sorted(targets, key=lambda d: d.device_id)
    )
    return DeploymentStatusView(deployment, _overall(deployment.state, devices), devices, rollout)
