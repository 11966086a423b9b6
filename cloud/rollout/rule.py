"""The desired-state rule: which skill versions the hub wants on which device.

The rule is level-triggered and has no memory: for each skill name, the
first active deployment of that skill whose group selects the device, and
which reaches it, wins. A deployment only ever reaches devices of its own
project (tenant), whatever their labels. First means the highest priority, then the newest
(the highest deployment id), so a more specific deployment with a higher
priority overrides a broader one on the devices both select, and deploying
an older version after a newer one at the same priority is a deliberate
rollback and wins. A staged deployment reaches only the devices its rollout
admitted, each with the version admitted for it (A/B tests give two); the
others keep what the next deployment gives them. The result is sorted by
skill name, so equal inputs give equal output.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from cloud.errors import ValidationError
from cloud.rollout.strategy import DEFAULT_STRATEGY, Strategy, parse_strategy
from cloud.selectors import matches

__all__ = [
    "DEFAULT_PROJECT",
    "ActiveDeployment",
    "DesiredSkill",
    "compute_desired",
    "compute_fleet",
]

#: The project of a device or deployment that names none.
DEFAULT_PROJECT = "default"


@dataclass(frozen=True)
class DesiredSkill:
    """One skill the hub wants on a device."""

    name: str
    version: str
    target_name: str
    config: dict[str, str]


@dataclass(frozen=True)
class ActiveDeployment:
    """What the rule needs to know about one active deployment.

    ``strategy`` may be given as its name; an unknown name is refused here, so
    the rule never meets a strategy it cannot apply. ``admitted`` is None for
    a deployment that reaches every selected device (all at once, or a
    finished rollout); otherwise it maps each device the rollout admitted to
    the version it gets, and the deployment reaches no other device.
    ``version_targets`` names the bundle of each admitted version other than
    ``version`` (an A/B test's control). ``project`` is the deployment's
    project: it reaches no device of another.

    Raises:
        ValidationError: An unknown strategy, a negative id, a non-integer
            priority, or an admitted version without its bundle's name.
    """

    id: int
    skill: str
    version: str
    target_name: str
    selector: Mapping[str, str]
    config: Mapping[str, str]
    strategy: Strategy = field(default=DEFAULT_STRATEGY)
    priority: int = 0
    admitted: Mapping[str, str] | None = None
    version_targets: Mapping[str, str] = field(default_factory=dict)
    project: str = DEFAULT_PROJECT

    def __post_init__(self) -> None:
        """Normalise the strategy and check the id and priority."""
        object.__setattr__(self, "strategy", parse_strategy(self.strategy))
        if isinstance(self.id, bool) or not isinstance(self.id, int) or self.id < 0:
            raise ValidationError(f"bad deployment id {self.id!r}")
        if isinstance(self.priority, bool) or not isinstance(self.priority, int):
            raise ValidationError(f"bad deployment priority {self.priority!r}")
        unknown = set((self.admitted or {}).values()) - {self.version, *self.version_targets}
        if unknown:
            raise ValidationError(f"deployment {self.id} admits {min(unknown)!r} with no bundle")

    def reaches(
        self, device_id: str, labels: Mapping[str, str], project: str = DEFAULT_PROJECT
    ) -> bool:
        """Whether this deployment applies to a device of ``project`` with these labels."""
        if project != self.project:
            return False
        if self.admitted is not None and device_id not in self.admitted:
            return False
        return matches(self.selector, labels) and self.strategy.admits(device_id)

    def desired(self, device_id: str) -> DesiredSkill:
        """What this deployment wants on a device it reaches."""
        version = self.version if self.admitted is None else self.admitted[device_id]
        target = self.target_name if version == self.version else self.version_targets[version]
        return DesiredSkill(self.skill, version, target, dict(self.config))


def _newest_first(active: Iterable[ActiveDeployment]) -> list[ActiveDeployment]:
    """Deployments in the order the rule tries them: priority, then id, highest first."""
    return sorted(active, key=lambda d: (d.priority, d.id), reverse=True)


def _apply(
    device_id: str,
    labels: Mapping[str, str],
    project: str,
    newest_first: list[ActiveDeployment],
) -> tuple[DesiredSkill, ...]:
    chosen: dict[str, ActiveDeployment] = {}
    for dep in newest_first:
        if dep.skill not in chosen and dep.reaches(device_id, labels, project):
            chosen[dep.skill] = dep
    return tuple(dep.desired(device_id) for _, dep in sorted(chosen.items()))


def compute_desired(
    labels: Mapping[str, str],
    active: Iterable[ActiveDeployment],
    device_id: str = "",
    project: str = DEFAULT_PROJECT,
) -> tuple[DesiredSkill, ...]:
    """Apply the rule to one device.

    Args:
        labels: The device's labels.
        active: Every active deployment, in any order.
        device_id: The device's id (strategies that pick devices read it).
        project: The device's project; deployments of other projects are skipped.

    Returns:
        The desired skills, sorted by name.
    """
    return _apply(device_id, labels, project, _newest_first(active))


def compute_fleet(
    devices: Mapping[str, Mapping[str, str]],
    active: Iterable[ActiveDeployment],
    projects: Mapping[str, str] | None = None,
) -> dict[str, tuple[DesiredSkill, ...]]:
    """Apply the rule to many devices at once.

    Args:
        devices: Each device's id mapped to its labels.
        active: Every active deployment, in any order.
        projects: Each device's project; a device missing here is in ``default``
            (so it gets nothing from another project's deployments).

    Returns:
        Each device's desired skills (sorted by name), keyed and ordered by device id.
    """
    ordered = _newest_first(active)
    of = projects or {}
    return {d: _apply(d, devices[d], of.get(d, DEFAULT_PROJECT), ordered) for d in sorted(devices)}
