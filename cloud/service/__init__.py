"""The fleet service layer: the one way people and scripts reach the hub's data.

The CLI and the REST API are thin faces of :class:`FleetService`; the hub's
transport servers never use it (they go through the session core). Every
method returns frozen views from :mod:`cloud.service.views` and raises only
:class:`cloud.errors.HubError` subclasses.
"""

from cloud.service.deployments import DeploymentService
from cloud.service.devices import DeviceService, GroupService
from cloud.service.drift import DriftService, IncidentView
from cloud.service.events import EventService
from cloud.service.fleet import FleetService
from cloud.service.skills import SkillService
from cloud.service.telemetry import TelemetryService
from cloud.service.views import (
    DeploymentStatusView,
    DeploymentView,
    DeviceDetailView,
    DeviceRolloutView,
    DeviceView,
    EventView,
    GroupView,
    PublishedSkill,
    RolloutView,
    SkillDetailView,
    SkillStateView,
    SkillVersionView,
    TelemetrySummaryView,
    TelemetryWindowView,
)

__all__ = [
    "DeploymentService",
    "DeploymentStatusView",
    "DeploymentView",
    "DeviceDetailView",
    "DeviceRolloutView",
    "DeviceService",
    "DeviceView",
    "DriftService",
    "EventService",
    "EventView",
    "FleetService",
    "GroupService",
    "GroupView",
    "IncidentView",
    "PublishedSkill",
    "RolloutView",
    "SkillDetailView",
    "SkillService",
    "SkillStateView",
    "SkillVersionView",
    "TelemetryService",
    "TelemetrySummaryView",
    "TelemetryWindowView",
]
