"""Rollout strategies: how a deployment reaches the devices its group selects.

A strategy only narrows: it says whether a device the group selects takes the
deployment now. A device a strategy leaves out keeps what older deployments
give it, which is exactly what a canary or a wave needs (the rest of the fleet
stays on the previous version). ``all-at-once`` reaches every selected device
at once; the staged strategies (``canary``, ``waves``, ``rolling``, ``ab``) reach only the
devices their rollout engine (:mod:`cloud.rollout.engine`) has admitted, which
the rule receives as :attr:`ActiveDeployment.admitted`.
"""

from __future__ import annotations

import enum

from cloud.errors import ValidationError

__all__ = ["DEFAULT_STRATEGY", "Strategy", "parse_strategy"]


class Strategy(enum.StrEnum):
    """The rollout strategies the hub knows; the value is the stored and typed name."""

    ALL_AT_ONCE = "all-at-once"
    CANARY = "canary"
    WAVES = "waves"
    ROLLING = "rolling"
    AB = "ab"

    @property
    def staged(self) -> bool:
        """Whether a rollout engine decides which devices the deployment reaches."""
        return self is not Strategy.ALL_AT_ONCE

    def admits(self, device_id: str) -> bool:
        """Whether a device the deployment's group selects takes the deployment.

        Args:
            device_id: The selected device.

        Returns:
            True: the staged strategies narrow through the engine's admitted
            devices, not here.
        """
        del device_id  # narrowing is the rollout engine's (ActiveDeployment.admitted)
        return True


DEFAULT_STRATEGY = Strategy.ALL_AT_ONCE


def parse_strategy(text: str | Strategy) -> Strategy:
    """Read a strategy name as given by a user or stored with a deployment.

    Args:
        text: A strategy name such as ``"all-at-once"``.

    Returns:
        The strategy.

    Raises:
        ValidationError: No strategy of that name (the message lists the known ones).
    """
    if isinstance(text, Strategy):
        return text
    try:
        return Strategy(text)
    except ValueError as exc:
        known = ", ".join(s.value for s in Strategy)
        raise ValidationError(f"unknown rollout strategy {text!r}; known: {known}") from exc
