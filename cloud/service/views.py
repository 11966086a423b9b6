"""What the fleet service hands out: frozen views, independent of the store's rows.

The CLI and the REST API print or serialise these; they never see store records.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from cloud.store.records import DeviceSkillSummary

__all__ = [
    "DeploymentView",
    "DeviceView",
    "GroupView",
    "PublishedSkill",
    "SkillStateView",
    "SkillVersionView",
    "TelemetrySummaryView",
]


@dataclass(frozen=True)
class SkillStateView:
    """One skill as a device last reported it."""

    name: str
    version: str
    state: str
    error: str = ""
    variant: str = ""


@dataclass(frozen=True)
class DeviceView:
    """A device with its labels, presence, hardware and state.

    ``desired_generation`` is 0 until the hub wanted something on the device;
    ``reported`` is empty until the device reported.
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

    def skill(self, name: str) -> SkillStateView | None:
        """The reported state of one skill, or None when the device did not report it."""
        return next((s for s in self.reported if s.name == name), None)


@dataclass(frozen=True)
class GroupView:
    """A named label selector and how many devices it selects now."""

    name: str
    selector: str
    devices: int


@dataclass(frozen=True)
class SkillVersionView:
    """One published, immutable skill version."""

    name: str
    version: str
    target_name: str
    sha256: str
    size: int
    created_ms: int


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


#: Telemetry of one skill on one device, summed over every window: already a frozen
#: record the store computes, so the service hands it out as it is.
TelemetrySummaryView = DeviceSkillSummary
