"""Immutable records the store hands out (never ORM objects)."""

from __future__ import annotations

from dataclasses import dataclass, field

from cloud.rollout import DesiredSkill

__all__ = [
    "DEPLOYMENT_ABORTED",
    "DEPLOYMENT_ACTIVE",
    "DEPLOYMENT_STATES",
    "DEPLOYMENT_SUPERSEDED",
    "DeploymentRecord",
    "DesiredRecord",
    "DesiredSkill",
    "DeviceRecord",
    "DeviceSkillSummary",
    "DeviceStateRecord",
    "EventRecord",
    "GroupRecord",
    "InstructionRecord",
    "ProjectRecord",
    "ReportedRecord",
    "SecurityEventRecord",
    "SkillStatusRecord",
    "SkillVersionRecord",
    "TelemetryRecord",
]

DEPLOYMENT_ACTIVE = "active"
DEPLOYMENT_ABORTED = "aborted"
#: A newer deployment of the same skill on the same group took this one's place.
DEPLOYMENT_SUPERSEDED = "superseded"
DEPLOYMENT_STATES = (DEPLOYMENT_ACTIVE, DEPLOYMENT_ABORTED, DEPLOYMENT_SUPERSEDED)


@dataclass(frozen=True)
class ProjectRecord:
    """A project (tenant): devices, groups, skills and deployments are seen only inside one."""

    name: str
    created_ms: int


@dataclass(frozen=True)
class DeviceRecord:
    """One device as the hub knows it."""

    device_id: str
    labels: dict[str, str]
    profile: dict[str, object]
    last_seen_ms: int
    #: The connected flag; whether the device is online is derived (:mod:`cloud.presence`).
    online: bool
    #: The heartbeat interval the hub gave the device when it last connected (0: not known).
    heartbeat_ms: int = 0
    #: The project (tenant) the device belongs to, fixed at enrolment.
    project: str = "default"


@dataclass(frozen=True)
class GroupRecord:
    """A named selector over device labels; ``selector`` is in canonical form."""

    name: str
    selector: str
    project: str = "default"


@dataclass(frozen=True)
class SkillVersionRecord:
    """One immutable skill bundle the hub publishes."""

    name: str
    version: str
    target_name: str
    sha256: str
    size: int
    manifest: str
    created_ms: int
    project: str = "default"


@dataclass(frozen=True)
class DeploymentRecord:
    """Skill version ``version`` of ``skill`` rolled out to ``group``."""

    id: int
    skill: str
    version: str
    group: str
    strategy: str
    config: dict[str, str]
    state: str
    created_ms: int
    project: str = "default"


@dataclass(frozen=True)
class DesiredRecord:
    """Everything the hub wants on a device; ``generation`` grows when it changes."""

    device_id: str
    generation: int
    skills: tuple[DesiredSkill, ...]


@dataclass(frozen=True)
class SkillStatusRecord:
    """What a device says about one of its skills."""

    name: str
    version: str
    state: str
    error: str = ""
    desired_version: str = ""
    previous_version: str = ""
    variant: str = ""  # the model variants it runs, as the device describes them


@dataclass(frozen=True)
class ReportedRecord:
    """A device's latest report of its installed skills."""

    device_id: str
    generation: int
    skills: tuple[SkillStatusRecord, ...]
    reported_ms: int


@dataclass(frozen=True)
class DeviceStateRecord:
    """A device with its desired generation (0 when nothing was desired) and last report."""

    device: DeviceRecord
    desired_generation: int
    reported: ReportedRecord | None


@dataclass(frozen=True)
class TelemetryRecord:
    """One telemetry window of one skill on one device.

    ``device_id`` is filled in by the store when reading; on writing, the
    device id passed to the store wins and a different non-empty value here is
    refused.
    """

    skill: str
    version: str
    inferences: int
    labelled: int
    correct: int
    latency_p50_ms: float
    latency_p99_ms: float
    window_start_ms: int
    window_end_ms: int
    dropped_messages: int = 0
    metrics: dict[str, float] = field(default_factory=dict)
    received_ms: int = 0
    device_id: str = ""
    #: 0 when the device did not say (agents older than the field).
    latency_p95_ms: float = 0.0
    #: Items the skill raised on; counted in ``inferences`` too.
    errors: int = 0


@dataclass(frozen=True)
class DeviceSkillSummary:
    """Telemetry of one skill on one device, summed over every window.

    ``accuracy`` is None until some inference was labelled; ``version`` and
    ``latency_p50_ms`` come from the latest window.
    """

    device_id: str
    skill: str
    version: str
    inferences: int
    labelled: int
    correct: int
    accuracy: float | None
    latency_p50_ms: float
    windows: int


@dataclass(frozen=True)
class InstructionRecord:
    """The director's latest signed instruction for one device.

    ``counter`` only grows per device; ``payload_sha256`` names the serialized
    desired state it carries, so an unchanged state is not signed again.
    """

    device_id: str
    counter: int
    generation: int
    expires_ms: int
    signed_ms: int
    payload_sha256: str
    instruction: bytes


@dataclass(frozen=True)
class SecurityEventRecord:
    """Something a device refused or contained, as it reported it."""

    device_id: str
    kind: str
    reason: str
    subject: str
    detail: str
    count: int
    received_ms: int


@dataclass(frozen=True)
class EventRecord:
    """One entry of the hub's event log; ``device_id`` is '' when no single device is concerned."""

    id: int
    at_ms: int
    kind: str
    device_id: str
    subject: str
    message: str
