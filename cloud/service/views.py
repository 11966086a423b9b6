"""What the fleet service hands out: frozen views, independent of the store's rows.

The CLI and the REST API print or serialise these; they never see store records.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from cloud.store.records import DeviceSkillSummary, EventRecord, TelemetryRecord

__all__ = [
    "DeploymentStatusView",
    "DeploymentView",
    "DeviceDetailView",
    "DeviceRolloutView",
    "DeviceView",
    "EventView",
    "GroupView",
    "PublishedSkill",
    "RolloutView",
    "SkillDetailView",
    "SkillStateView",
    "SkillVersionView",
    "TelemetrySummaryView",
    "TelemetryWindowView",
]


@dataclass(frozen=True)
class SkillStateView:
    """One skill as a device last reported it."""

    name: str
    version: str
    state: str
    error: str = ""
    variant: str = ""
    #: The version the device was asked for when it reported ('' when not said).
    desired_version: str = ""
    #: The version it ran before (after a rollback: the version that failed).
    previous_version: str = ""


@dataclass(frozen=True)
class DeviceView:
    """A device with its labels, presence, hardware and state.

    ``desired_generation`` is 0 until the hub wanted something on the device;
    ``reported`` is empty until the device reported. ``presence`` (and
    ``online``, the same as a bool) is derived when the view is made, from
    ``last_seen_ms`` and ``heartbeat_ms`` (see :mod:`cloud.presence`).
    """

    device_id: str
    labels: Mapping[str, str]
    online: bool
    board: str
    last_seen_ms: int
    desired_generation: int
    reported_generation: int | None
    reported: tuple[SkillStateView, ...] = ()
    profile: Mapping[str, object] = field(default_factory=dict)
    #: ``"online"`` or ``"offline"``.
    presence: str = "offline"
    #: The heartbeat interval the hub gave the device (0: not known yet; 5 s is assumed).
    heartbeat_ms: int = 0
    #: The project (tenant) the device belongs to.
    project: str = "default"
    #: When the hub recorded the device's last report (wall-clock ms); None before one.
    reported_ms: int | None = None

    def skill(self, name: str) -> SkillStateView | None:
        """The reported state of one skill, or None when the device did not report it."""
        return next((s for s in self.reported if s.name == name), None)


@dataclass(frozen=True)
class GroupView:
    """A named label selector and how many devices (of its project) it selects now."""

    name: str
    selector: str
    devices: int
    project: str = "default"


@dataclass(frozen=True)
class SkillVersionView:
    """One published, immutable skill version."""

    name: str
    version: str
    target_name: str
    sha256: str
    size: int
    created_ms: int
    project: str = "default"


@dataclass(frozen=True)
class PublishedSkill:
    """The outcome of publishing a bundle: the version and how many model artefacts it ships."""

    version: SkillVersionView
    linked_artifacts: int


@dataclass(frozen=True)
class DeploymentView:
    """A skill version rolled out to a group with a strategy."""

    id: int
    skill: str
    version: str
    group: str
    strategy: str
    config: Mapping[str, str]
    state: str
    created_ms: int
    #: Higher wins over lower on the devices two deployments of a skill both select.
    priority: int = 0
    project: str = "default"


@dataclass(frozen=True)
class RolloutView:
    """Where a staged deployment's rollout stands.

    ``phase`` is ``pending``, ``canary``, ``soaking``, ``wave``, ``paused``,
    ``completed``, ``aborted`` or ``rolled_back``; ``reason`` says why it
    paused or ended. ``gates`` are each gate's verdict and one-line reason now.
    ``candidate`` and ``baseline`` are the KPIs the gates compare (for an A/B
    test: the new version and the control).
    """

    phase: str
    reason: str
    waves_opened: int
    admitted: int
    targets: int
    gates: tuple[tuple[str, str, str], ...]
    plan: Mapping[str, object]
    candidate: Mapping[str, float] = field(default_factory=dict)
    baseline: Mapping[str, float] = field(default_factory=dict)


#: Telemetry of one skill on one device, summed over every window: already a frozen
#: record the store computes, so the service hands it out as it is.
TelemetrySummaryView = DeviceSkillSummary

#: One telemetry window of one skill on one device, with its metrics map: already a
#: frozen record, handed out as it is.
TelemetryWindowView = TelemetryRecord


#: One entry of the hub's event log: already a frozen record, handed out as it is.
EventView = EventRecord


@dataclass(frozen=True)
class SkillDetailView:
    """One skill on one device: what the hub wants against what the device says.

    ``desired_version`` is '' when the hub no longer wants the skill there;
    ``reported_version`` and ``state`` are '' until the device reported it.
    ``transitions`` are its last state changes on the device, oldest first.
    """

    name: str
    desired_version: str
    reported_version: str
    state: str
    error: str = ""
    variant: str = ""
    previous_version: str = ""
    transitions: tuple[EventView, ...] = ()


@dataclass(frozen=True)
class DeviceDetailView:
    """The whole story of one device: itself, each skill, and its latest events."""

    device: DeviceView
    #: When the device made its latest report (None: it never reported).
    reported_ms: int | None
    skills: tuple[SkillDetailView, ...]
    #: The device's latest events of every kind, oldest first.
    events: tuple[EventView, ...] = ()


@dataclass(frozen=True)
class DeviceRolloutView:
    """Where one target device of a deployment stands.

    ``status`` is ``pending``, ``in progress``, ``succeeded``, ``failed`` or
    ``offline``; ``reason`` is the device's error when it failed.
    """

    device_id: str
    status: str
    reason: str = ""


@dataclass(frozen=True)
class DeploymentStatusView:
    """A deployment with its state computed from the devices its group selects now.

    ``state`` is ``pending``, ``in progress``, ``succeeded``, ``partially failed``,
    ``failed``, ``superseded`` or ``aborted`` (see :mod:`cloud.service.status`).
    """

    deployment: DeploymentView
    state: str
    devices: tuple[DeviceRolloutView, ...]
    #: The rollout of a staged deployment (None for one rolled out all at once).
    rollout: RolloutView | None = None

    def count(self, status: str) -> int:
        """How many target devices have this status."""
        return sum(d.status == status for d in self.devices)

    @property
    def total(self) -> int:
        """How many devices the group selects now."""
        return len(self.devices)

    @property
    def first_failure(self) -> DeviceRolloutView | None:
        """The first failed device (by id), or None."""
        return next((d for d in self.devices if d.status == "failed"), None)
