"""Deployments: a skill version on a group with a strategy, and what it became."""

from __future__ import annotations

import builtins
from collections.abc import Callable

from cloud.errors import NotFoundError
from cloud.rollout import DEFAULT_STRATEGY, parse_strategy
from cloud.selectors import parse_selector
from cloud.service.devices import DeviceService
from cloud.service.status import deployment_status
from cloud.service.views import DeploymentStatusView, DeploymentView, DeviceView
from cloud.skill_config import ConfigInput, config_from
from cloud.store import DeploymentRecord, Store

__all__ = ["DeploymentService"]


def _view(rec: DeploymentRecord) -> DeploymentView:
    return DeploymentView(
        rec.id, rec.skill, rec.version, rec.group, rec.strategy, dict(rec.config), rec.state,
        rec.created_ms,
    )  # fmt: skip


class DeploymentService:
    """Creating, listing and aborting deployments."""

    def __init__(self, store: Store, clock: Callable[[], int], *, devices: DeviceService) -> None:
        """Deploy through ``store``; ``clock`` gives milliseconds.

        ``devices`` gives the device views (with their presence) that deployment
        status is computed from.
        """
        self._store = store
        self._clock = clock
        self._devices = devices

    def create(
        self,
        skill: str,
        version: str,
        group: str,
        *,
        strategy: str = DEFAULT_STRATEGY.value,
        config: ConfigInput = None,
    ) -> DeploymentView:
        """Deploy a skill version to a group; its devices' desired state changes at once.

        Args:
            skill: The skill's name.
            version: A published version of it.
            group: The group whose devices get it.
            strategy: The rollout strategy's name.
            config: The skill's config: a mapping, or ``k=v[,k=v]`` text (one or
                several, as repeated ``--config`` options give it); every pair
                must be well formed.

        Raises:
            ValidationError: An unknown strategy or a malformed config pair.
            NotFoundError: No such skill version or group.
            StoreError: The store failed.
        """
        chosen = parse_strategy(strategy)
        checked = config_from(config)
        rec = self._store.create_deployment(
            skill, version, group, strategy=chosen, config=checked, now_ms=self._clock()
        )
        return _view(rec)

    def get(self, deployment_id: int) -> DeploymentView:
        """One deployment.

        Raises:
            NotFoundError: No deployment with that id.
            StoreError: The store failed.
        """
        return _view(self._store.get_deployment(deployment_id))

    def list(self) -> list[DeploymentView]:
        """Every deployment, oldest first.

        Raises:
            StoreError: The store failed.
        """
        return [_view(r) for r in self._store.list_deployments()]

    def abort(self, deployment_id: int) -> DeploymentView:
        """Abort a deployment; its devices fall back to what the remaining deployments say.

        Raises:
            NotFoundError: No deployment with that id.
            StoreError: The store failed.
        """
        return _view(self._store.abort_deployment(deployment_id, now_ms=self._clock()))

    def status(self, deployment_id: int | None = None) -> builtins.list[DeploymentStatusView]:
        """Deployments (all, oldest first, or one) with their state computed from their devices.

        The targets are the devices each group selects now; see
        :mod:`cloud.service.status` for how states are computed. Each group's
        devices are read once, however many deployments it has.

        Raises:
            NotFoundError: No deployment with that id.
            StoreError: The store failed or holds corrupt data.
        """
        chosen = self.list() if deployment_id is None else [self.get(deployment_id)]
        targets: dict[str, builtins.list[DeviceView]] = {}
        for dep in chosen:
            if dep.group not in targets:
                targets[dep.group] = self._group_devices(dep.group)
        return [deployment_status(dep, targets[dep.group]) for dep in chosen]

    def _group_devices(self, group: str) -> builtins.list[DeviceView]:
        try:
            selector = self._store.get_group(group).selector
        except NotFoundError:
            return []  # groups are not deleted while deployments name them; be safe anyway
        return self._devices.list(parse_selector(selector) if selector else {})
