"""Deployments: a skill version on a group with a strategy, and what it became."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from cloud.rollout import DEFAULT_STRATEGY, parse_strategy
from cloud.service.views import DeploymentView
from cloud.store import DeploymentRecord, Store

__all__ = ["DeploymentService"]


def _view(rec: DeploymentRecord) -> DeploymentView:
    return DeploymentView(
        rec.id, rec.skill, rec.version, rec.group, rec.strategy, dict(rec.config), rec.state,
        rec.created_ms,
    )  # fmt: skip


class DeploymentService:
    """Creating, listing and aborting deployments."""

    def __init__(self, store: Store, clock: Callable[[], int]) -> None:
        """Deploy through ``store``; ``clock`` gives milliseconds."""
        self._store = store
        self._clock = clock

    def create(
        self,
        skill: str,
        version: str,
        group: str,
        *,
        strategy: str = DEFAULT_STRATEGY.value,
        config: Mapping[str, str] | None = None,
    ) -> DeploymentView:
        """Deploy a skill version to a group; its devices' desired state changes at once.

        Raises:
            ValidationError: An unknown strategy or a malformed config.
            NotFoundError: No such skill version or group.
            StoreError: The store failed.
        """
        chosen = parse_strategy(strategy)
        rec = self._store.create_deployment(
            skill, version, group, strategy=chosen, config=config, now_ms=self._clock()
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
