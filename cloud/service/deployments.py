"""Deployments: a skill version on a group with a strategy, and what it became.

A deployment rolls out all at once, or staged by a rollout plan
(:mod:`cloud.rollout.plan`): a canary, exponential waves or an A/B test, with
gates, maintenance windows and a priority. The leader's rollout loop moves a
staged deployment; here it is created, paused, resumed, aborted or rolled back,
and the fleet-wide stop switch is set.
"""

from __future__ import annotations

import builtins
import json
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from cloud.errors import NotFoundError, ValidationError
from cloud.presence import presence
from cloud.rollout import parse_strategy
from cloud.rollout.plan import RolloutPlan, parse_plan, plan_from_dict
from cloud.rollout.state import RolloutState
from cloud.selectors import parse_selector
from cloud.service.devices import DeviceService
from cloud.service.status import RolloutTarget, deployment_status, rollout_view
from cloud.service.views import DeploymentStatusView, DeploymentView, RolloutView, SkillStateView
from cloud.skill_config import ConfigInput, config_from
from cloud.store import DeploymentRecord, SkillStatusRecord, Store

__all__ = ["DeploymentService", "build_plan"]

PlanInput = str | Mapping[str, Any] | None


def _view(rec: DeploymentRecord, priority: int = 0) -> DeploymentView:
    return DeploymentView(
        rec.id, rec.skill, rec.version, rec.group, rec.strategy, dict(rec.config), rec.state,
        rec.created_ms, priority, rec.project,
    )  # fmt: skip


def _by_name(skills: Sequence[SkillStatusRecord]) -> dict[str, SkillStateView]:
    """A report's skills by name (the first of a name, as :meth:`DeviceView.skill` finds it)."""
    found: dict[str, SkillStateView] = {}
    for s in skills:
        if s.name not in found:
            found[s.name] = SkillStateView(
                s.name, s.version, s.state, s.error, s.variant, s.desired_version,
                s.previous_version,
            )  # fmt: skip
    return found


def _canary(value: str | int) -> str | int:
    text = str(value).strip()
    return int(text) if text.isdigit() else text


def build_plan(
    plan: PlanInput = None,
    *,
    strategy: str | None = None,
    canary: str | int | None = None,
    priority: int | None = None,
    windows: Sequence[str] = (),
) -> RolloutPlan:
    """A rollout plan from a plan (TOML text, a strategy name or a mapping) and overrides.

    Args:
        plan: The plan; None for the defaults of ``strategy``.
        strategy: The strategy, over the plan's.
        canary: The canary's size (``"10%"`` or a device count), over the plan's.
        priority: The priority, over the plan's.
        windows: Maintenance windows added to the plan's (``"mon-fri 01:00-05:00"``).

    Raises:
        ValidationError: Unreadable TOML, an unknown key or strategy, or a bad value.
    """
    if isinstance(plan, str):
        data: dict[str, Any] = parse_plan(plan).to_dict()
    elif plan is None:
        data = {}
    elif isinstance(plan, Mapping):
        data = dict(plan_from_dict(plan).to_dict())
    else:
        raise ValidationError(f"a rollout plan must be TOML text or a table, not {plan!r}")
    if strategy is not None:
        data["strategy"] = parse_strategy(strategy).value
    if canary is not None:
        data["canary"] = _canary(canary)
    if priority is not None:
        data["priority"] = priority
    if windows:
        data["windows"] = [*data.get("windows", []), *windows]
    return plan_from_dict(data)


class DeploymentService:
    """Creating, listing and aborting deployments.

    Every method that names a deployment takes ``project``: None reaches every
    project (the local CLI); a project name reaches only its deployments, and
    one of another project is not found, as if it did not exist.
    """

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
        strategy: str | None = None,
        config: ConfigInput = None,
        plan: PlanInput = None,
        canary: str | int | None = None,
        priority: int | None = None,
        windows: Sequence[str] = (),
        project: str = "default",
    ) -> DeploymentView:
        """Deploy a skill version to a group.

        The deployment is in ``project``, and its group and skill version must
        be too: one of another project is not found. It only ever reaches
        devices of its project.

        All at once (the default), its devices' desired state changes at once and
        older deployments of the skill on the group are superseded. Staged (a
        canary, waves, an A/B test, or any plan with a maintenance window), the
        leader's rollout loop moves its devices, and the devices not yet moved
        keep the older deployment until the rollout completes.

        Args:
            skill: The skill's name.
            version: A published version of it.
            group: The group whose devices get it.
            strategy: The rollout strategy's name, over the plan's (default all-at-once).
            config: The skill's config: a mapping, or ``k=v[,k=v]`` text (one or
                several, as repeated ``--config`` options give it); every pair
                must be well formed.
            plan: A rollout plan: TOML text (see :mod:`cloud.rollout.plan`) or a mapping.
            canary: The canary's size, ``"10%"`` or a device count.
            priority: Higher overrides lower on devices two deployments both select.
            windows: Maintenance windows (UTC) to add, e.g. ``"mon-fri 01:00-05:00"``.
            project: The deployment's project.

        Raises:
            ValidationError: An unknown strategy, a bad plan, a malformed config
                pair or project name.
            NotFoundError: No such project, or no such skill version (or A/B
                control version) or group in it.
            StoreError: The store failed.
        """
        chosen = build_plan(
            plan, strategy=strategy, canary=canary, priority=priority, windows=windows
        )
        checked = config_from(config)
        rec = self._store.create_deployment(
            skill, version, group, config=checked, plan=chosen, now_ms=self._clock(),
            project=project,
        )  # fmt: skip
        return _view(rec, chosen.priority)

    def get(self, deployment_id: int, *, project: str | None = None) -> DeploymentView:
        """One deployment.

        Raises:
            NotFoundError: No deployment with that id (in ``project``).
            StoreError: The store failed.
        """
        rec = self._store.get_deployment(deployment_id, project=project)
        return _view(rec, self._store.deployment_priorities().get(rec.id, 0))

    def list(self, *, project: str | None = None) -> list[DeploymentView]:
        """Every deployment (of ``project``, when given), oldest first.

        Raises:
            StoreError: The store failed.
        """
        priorities = self._store.deployment_priorities()
        found = self._store.list_deployments(project=project)
        return [_view(r, priorities.get(r.id, 0)) for r in found]

    def _staged(self, deployment_id: int, project: str | None) -> bool:
        """Whether a deployment is staged; NotFoundError when it is not in ``project``."""
        if project is not None:
            self._store.get_deployment(deployment_id, project=project)
        return deployment_id in self._store.rollouts_of([deployment_id])

    def abort(self, deployment_id: int, *, project: str | None = None) -> DeploymentView:
        """Abort a deployment.

        All at once: it is no longer wanted and its devices fall back to what the
        remaining deployments say. Staged: its rollout stops where it is, the
        devices it moved keep the new version, the others the old one (use
        :meth:`rollback` to move them back too).

        Raises:
            ValidationError: A staged rollout that has already ended.
            NotFoundError: No deployment with that id (in ``project``).
            StoreError: The store failed.
        """
        if self._staged(deployment_id, project):
            return self._command(deployment_id, "abort", project)
        return self._abort_now(deployment_id, project)

    def _abort_now(self, deployment_id: int, project: str | None) -> DeploymentView:
        rec = self._store.abort_deployment(deployment_id, now_ms=self._clock(), project=project)
        return self.get(rec.id, project=project)

    def pause(self, deployment_id: int, *, project: str | None = None) -> DeploymentView:
        """Hold a staged rollout: no new wave opens until :meth:`resume`.

        Raises:
            ValidationError: The deployment is not staged, or its rollout has ended.
            NotFoundError: No deployment with that id (in ``project``).
            StoreError: The store failed.
        """
        if project is not None:
            self._store.get_deployment(deployment_id, project=project)
        return self._command(deployment_id, "pause", project)

    def resume(self, deployment_id: int, *, project: str | None = None) -> DeploymentView:
        """Let a paused staged rollout carry on.

        Raises:
            ValidationError: The deployment is not staged, or its rollout has ended.
            NotFoundError: No deployment with that id (in ``project``).
            StoreError: The store failed.
        """
        if project is not None:
            self._store.get_deployment(deployment_id, project=project)
        return self._command(deployment_id, "resume", project)

    def rollback(self, deployment_id: int, *, project: str | None = None) -> DeploymentView:
        """Return every device a deployment moved to the version it ran before.

        Staged: the rollout loop reverts the devices it admitted and the
        deployment ends; the older deployment, never superseded, keeps the
        group. All at once: the same as :meth:`abort` (the superseded deployment
        is active again).

        Raises:
            ValidationError: A staged rollout that has already ended.
            NotFoundError: No deployment with that id (in ``project``).
            StoreError: The store failed.
        """
        if self._staged(deployment_id, project):
            return self._command(deployment_id, "rollback", project)
        return self._abort_now(deployment_id, project)

    def _command(self, deployment_id: int, kind: str, project: str | None) -> DeploymentView:
        self._store.add_rollout_command(deployment_id, kind, now_ms=self._clock())
        return self.get(deployment_id, project=project)

    def fleet_stop(self, on: bool) -> bool:
        """Turn the fleet-wide stop switch on (no rollout moves a device) or off.

        Returns:
            Whether the switch changed.

        Raises:
            StoreError: The store failed.
        """
        return self._store.set_fleet_stop(on, now_ms=self._clock())

    def fleet_stopped(self) -> bool:
        """Whether the fleet-wide stop switch is on.

        Raises:
            StoreError: The store failed.
        """
        return self._store.fleet_stopped()

    def status(
        self, deployment_id: int | None = None, *, project: str | None = None
    ) -> builtins.list[DeploymentStatusView]:
        """Deployments (all, oldest first, or one) with their state computed from their devices.

        The targets are the devices each group selects now (in the group's
        project); see :mod:`cloud.service.status` for how states are computed.
        Each group's devices are read once, however many deployments it has.

        Raises:
            NotFoundError: No deployment with that id (in ``project``).
            StoreError: The store failed or holds corrupt data.
        """
        chosen = (
            self.list(project=project)
            if deployment_id is None
            else [self.get(deployment_id, project=project)]
        )
        targets: dict[str, builtins.list[RolloutTarget]] = {}
        for dep in chosen:
            if dep.group not in targets:
                targets[dep.group] = self._group_devices(dep.group, dep.project)
        rollouts = self._rollouts([d.id for d in chosen])
        return [deployment_status(d, targets[d.group], rollouts.get(d.id)) for d in chosen]

    def rollout(self, deployment_id: int, *, project: str | None = None) -> RolloutView | None:
        """Where a deployment's rollout stands (None when it rolls out all at once).

        Cheaper than :meth:`status`: the group's devices are not read.

        Raises:
            NotFoundError: ``project`` is given and has no deployment with that id.
            StoreError: The store failed or holds corrupt data.
        """
        if project is not None:
            self._store.get_deployment(deployment_id, project=project)
        return self._rollouts([deployment_id]).get(deployment_id)

    def admissions(self, deployment_id: int, *, project: str | None = None) -> dict[str, int]:
        """When a staged rollout admitted each device it has moved and still holds.

        The hub's own record (ms since the Unix epoch, the leader's clock): the
        instant the device's wave opened, just before its desired state was
        written. Empty all at once, and after a rollback (the devices are back).

        Raises:
            NotFoundError: ``project`` is given and has no deployment with that id.
            StoreError: The store failed or holds corrupt data.
        """
        if project is not None:
            self._store.get_deployment(deployment_id, project=project)
        rec = self._store.rollouts_of([deployment_id]).get(deployment_id)
        if rec is None:
            return {}
        return {d: a.at_ms for d, a in RolloutState.from_json(rec.state).admitted.items()}

    def _rollouts(self, ids: builtins.list[int]) -> dict[int, RolloutView]:
        now = self._clock()
        views = {}
        for dep_id, rec in self._store.rollouts_of(ids).items():
            plan = plan_from_dict(json.loads(rec.plan))
            views[dep_id] = rollout_view(plan, RolloutState.from_json(rec.state), now)
        return views

    def _group_devices(self, group: str, project: str) -> builtins.list[RolloutTarget]:
        try:
            selector = self._store.get_group(group, project=project).selector
        except NotFoundError:
            return []  # groups are not deleted while deployments name them; be safe anyway
        chosen = parse_selector(selector) if selector else {}
        now = self._clock()
        return [
            RolloutTarget(
                t.device_id,
                presence(t.last_seen_ms, t.heartbeat_ms, t.connected, now) == "online",
                _by_name(t.skills),
            )
            for t in self._store.deployment_targets(chosen, project=project)
        ]
