"""The rollout engine's vocabulary: the events it reads and the decisions it takes.

Events are facts about devices (:class:`DeviceOutcome`, :class:`DevicePresence`,
:class:`KpiWindow`), the passing of time (:class:`Tick`), and changes made by
people or the group (:class:`Command`, :class:`FleetStop`, :class:`Targets`).
Each carries the time it happened at, in ms since the Unix epoch, as the hub saw it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from cloud.errors import ValidationError

__all__ = [
    "COMMANDS",
    "OUTCOMES",
    "Aborted",
    "Admit",
    "Command",
    "Completed",
    "Decision",
    "DeviceOutcome",
    "DevicePresence",
    "Event",
    "FleetStop",
    "KpiWindow",
    "Paused",
    "Revert",
    "Targets",
    "Tick",
]

OUTCOMES = ("running", "rolled_back", "failed")  # later is worse: it wins a tie
COMMANDS = ("pause", "resume", "abort", "rollback")


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ValidationError(message)


@dataclass(frozen=True)
class DeviceOutcome:
    """A device's install or run result for a version (``running``, ``failed``, ``rolled_back``)."""

    device_id: str
    version: str
    outcome: str
    at_ms: int

    def __post_init__(self) -> None:
        """Refuse an unknown outcome."""
        _check(self.outcome in OUTCOMES, f"unknown outcome {self.outcome!r}; known: {OUTCOMES}")


@dataclass(frozen=True)
class DevicePresence:
    """A device came online or went offline."""

    device_id: str
    online: bool
    at_ms: int


@dataclass(frozen=True)
class KpiWindow:
    """A device's running KPI totals for one version; the newest per device and version wins."""

    device_id: str
    version: str
    inferences: int
    labelled: int
    correct: int
    errors: int
    p95_ms: float
    at_ms: int

    def __post_init__(self) -> None:
        """Refuse counts that cannot be."""
        ok = 0 <= self.correct <= self.labelled and min(self.inferences, self.errors) >= 0
        _check(ok and self.p95_ms >= 0, f"inconsistent KPI window {self!r}")


@dataclass(frozen=True)
class Tick:
    """Time passes: evaluate the rollout at ``now_ms``."""

    now_ms: int


@dataclass(frozen=True)
class Command:
    """An operator's ``pause``, ``resume``, ``abort`` (stop, keep moved devices) or ``rollback``."""

    kind: str
    at_ms: int

    def __post_init__(self) -> None:
        """Refuse an unknown command."""
        _check(self.kind in COMMANDS, f"unknown rollout command {self.kind!r}; known: {COMMANDS}")


@dataclass(frozen=True)
class FleetStop:
    """The fleet-wide stop switch: while on, no rollout moves a device."""

    on: bool
    at_ms: int


@dataclass(frozen=True)
class Targets:
    """The devices the deployment's group selects now and the version each runs ("" for none)."""

    devices: frozenset[str]
    previous: Mapping[str, str]
    at_ms: int


Event = DeviceOutcome | DevicePresence | KpiWindow | Tick | Command | FleetStop | Targets


@dataclass(frozen=True)
class Admit:
    """Move these devices to ``version``."""

    devices: frozenset[str]
    version: str


@dataclass(frozen=True)
class Revert:
    """Return these devices to their previous version (``previous[d]``; "" means remove)."""

    devices: frozenset[str]
    previous: Mapping[str, str]


@dataclass(frozen=True)
class Completed:
    """Every targeted device is admitted and the gates passed."""


@dataclass(frozen=True)
class Aborted:
    """The rollout stopped for good (and was reverted unless the operator asked to abort)."""

    reason: str


@dataclass(frozen=True)
class Paused:
    """The rollout holds: the operator paused it or the fleet stop switch is on."""

    reason: str


Decision = Admit | Revert | Completed | Aborted | Paused
