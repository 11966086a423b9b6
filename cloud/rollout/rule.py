"""The desired-state rule: which skill versions the hub wants on which device.

The rule is level-triggered and has no memory: for each skill name, the
newest active deployment of that skill whose group selects the device, and
whose strategy admits it, wins. Newest means the highest deployment id, so
deploying an older version after a newer one is a deliberate rollback and
wins. The result is sorted by skill name, so equal inputs give equal output.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from cloud.errors import ValidationError
from cloud.rollout.strategy import DEFAULT_STRATEGY, Strategy, parse_strategy
from cloud.selectors import matches

__all__ = ["ActiveDeployment", "DesiredSkill", "compute_desired", "compute_fleet"]


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
    the rule never meets a strategy it cannot apply.

    Raises:
        ValidationError: An unknown strategy, or a negative id.
    """

    id: int
    skill: str
    version: str
    target_name: str
    selector: Mapping[str, str]
    config: Mapping[str, str]
    strategy: Strategy = field(default=DEFAULT_STRATEGY)

    def __post_init__(self) -> None:
        """Normalise the strategy and check the id."""
        object.__setattr__(self, "strategy", parse_strategy(self.strategy))
        if isinstance(self.id, bool) or not isinstance(self.id, int) or self.id < 0:
            raise ValidationError(f"bad deployment id {self.id!r}")

    def reaches(self, device_id: str, labels: Mapping[str, str]) -> bool:
        """Whether this deployment applies to a device with these labels."""
        return matches(self.selector, labels) and self.strategy.admits(device_id)


def _newest_first(active: Iterable[ActiveDeployment]) -> list[ActiveDeployment]:
    return sorted(active, key=lambda d: d.id, reverse=True)


def _apply(
    device_id: str, labels: Mapping[str, str], newest_first: list[ActiveDeployment]
) -> tuple[DesiredSkill, ...]:
    chosen: dict[str, ActiveDeployment] = {}
    for dep in newest_first:
        if dep.skill not in chosen and dep.reaches(device_id, labels):
            chosen[dep.skill] = dep
    return tuple(
        DesiredSkill(dep.skill, dep.version, dep.target_name, dict(dep.config))
        for _, dep in sorted(chosen.items())
    )


def compute_desired(
    labels: Mapping[str, str], active: Iterable[ActiveDeployment], device_id: str = ""
) -> tuple[DesiredSkill, ...]:
    """Apply the rule to one device.

    Args:
        labels: The device's labels.
        active: Every active deployment, in any order.
        device_id: The device's id (strategies that pick devices read it).

    Returns:
        The desired skills, sorted by name.
    """
    return _apply(device_id, labels, _newest_first(active))


def compute_fleet(
    devices: Mapping[str, Mapping[str, str]], active: Iterable[ActiveDeployment]
) -> dict[str, tuple[DesiredSkill, ...]]:
    """Apply the rule to many devices at once.

    Args:
        devices: Each device's id mapped to its labels.
        active: Every active deployment, in any order.

    Returns:
        Each device's desired skills (sorted by name), keyed and ordered by device id.
    """
    ordered = _newest_first(active)
    return {d: _apply(d, devices[d], ordered) for d in sorted(devices)}
