"""Devices and groups: who is in the fleet and how it is sliced."""

from __future__ import annotations

import builtins
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from cloud.enrolment import Enroller
from cloud.errors import NotFoundError, StoreError, ValidationError
from cloud.presence import fleet_presence
from cloud.selectors import check_labels, matches, parse_selector
from cloud.service.views import (
    DeviceDetailView,
    DeviceView,
    EventView,
    GroupView,
    SkillDetailView,
    SkillStateView,
)
from cloud.store import DeviceRecord, DeviceStateRecord, GroupRecord, ReportedRecord, Store
from cloud.store.events import EVENT_SKILL
from protos.envelope import now_ms

__all__ = ["DeviceService", "GroupService", "IdentityService"]


def device_view(state: DeviceStateRecord, now_ms: int) -> DeviceView:
    """A device as every face shows it: labels, presence at ``now_ms``, board, report."""
    device, report = state.device, state.reported
    seen = fleet_presence(device.last_seen_ms, device.heartbeat_ms, device.online, now_ms)
    skills = tuple(
        SkillStateView(
            s.name, s.version, s.state, s.error, s.variant, s.desired_version, s.previous_version
        )
        for s in (report.skills if report else ())
    )
    return DeviceView(
        device_id=device.device_id,
        labels=dict(device.labels),
        online=seen == "online",
        board=str(device.profile.get("board", "")),
        last_seen_ms=device.last_seen_ms,
        desired_generation=state.desired_generation,
        reported_generation=report.generation if report else None,
        reported=skills,
        profile=dict(device.profile),
        presence=seen,
        heartbeat_ms=device.heartbeat_ms,
        project=device.project,
        reported_ms=report.reported_ms if report else None,
    )


#: The latest skill events of a device read to find each skill's last transitions.
_HISTORY = 200


def _skill_details(
    desired: Mapping[str, str],
    report: ReportedRecord | None,
    history: Sequence[EventView],
    keep: int,
) -> tuple[SkillDetailView, ...]:
    reported = {s.name: s for s in (report.skills if report else ())}
    details = []
    for name in sorted(desired.keys() | reported.keys()):
        s = reported.get(name)
        changes = tuple(e for e in history if e.subject == name)[-keep:] if keep > 0 else ()
        details.append(
            SkillDetailView(
                name=name,
                desired_version=desired.get(name, ""),
                reported_version=s.version if s else "",
                state=s.state if s else "",
                error=s.error if s else "",
                variant=s.variant if s else "",
                previous_version=s.previous_version if s else "",
                transitions=changes,
            )
        )
    return tuple(details)


class DeviceService:
    """Devices as the hub knows them: labels, presence, desired and reported state."""

    def __init__(self, store: Store, clock: Callable[[], int] = now_ms) -> None:
        """Serve devices from ``store``; ``clock`` (wall-clock milliseconds) judges presence."""
        self._store = store
        self._clock = clock

    def list(
        self, selector: Mapping[str, str] | str | None = None, *, project: str | None = None
    ) -> list[DeviceView]:
        """Every device ``selector`` selects (all by default), by id.

        Costs a fixed number of queries however many devices there are.

        Args:
            selector: Required labels, as a mapping or as text such as ``kind=camera``.
            project: Only devices of this project (None: every project).

        Raises:
            ValidationError: A malformed selector.
            StoreError: The store failed or holds corrupt data.
        """
        wanted = parse_selector(selector) if isinstance(selector, str) else selector
        states = self._store.device_states(check_labels(wanted or {}), project=project)
        now = self._clock()
        return [device_view(s, now) for s in states]

    def ids(
        self, selector: Mapping[str, str] | str | None = None, *, project: str | None = None
    ) -> set[str]:
        """The ids of the devices ``selector`` selects (all by default): one query, no views.

        Raises:
            ValidationError: A malformed selector.
            StoreError: The store failed.
        """
        wanted = parse_selector(selector) if isinstance(selector, str) else selector
        return self._store.device_ids(wanted, project=project)

    def get(self, device_id: str, *, project: str | None = None) -> DeviceView:
        """One device.

        Args:
            device_id: The device.
            project: Only a device of this project (None: any); one of another
                project is not found, as if it did not exist.

        Raises:
            NotFoundError: No device of that id ever registered (in ``project``).
            StoreError: The store failed or holds corrupt data.
        """
        found = self._store.device_states(device_id=device_id, project=project)
        if not found:
            raise NotFoundError(f"no device {device_id!r}")
        return device_view(found[0], self._clock())

    def show(
        self, device_id: str, *, transitions: int = 5, project: str | None = None
    ) -> DeviceDetailView:
        """The whole story of one device: desired against reported, per skill, with history.

        Args:
            device_id: The device.
            transitions: How many of each skill's latest state changes to include.
            project: Only a device of this project (None: any).

        Raises:
            NotFoundError: No device of that id ever registered (in ``project``).
            StoreError: The store failed or holds corrupt data.
        """
        view = self.get(device_id, project=project)
        desired = {s.name: s.version for s in self._store.desired_for(device_id).skills}
        report = self._store.reported_for(device_id)
        history = self._store.events(device_id=device_id, kind=EVENT_SKILL, limit=_HISTORY)
        recent = self._store.events(device_id=device_id, limit=10)
        skills = _skill_details(desired, report, history, transitions)
        return DeviceDetailView(view, report.reported_ms if report else None, skills, tuple(recent))

    def label(
        self, device_id: str, labels: Mapping[str, str] | str, *, project: str | None = None
    ) -> DeviceView:
        """Replace a device's labels; its desired state follows at once.

        This is the only way labels change: a device that registers again with
        other labels keeps the ones the hub gave it.

        Args:
            device_id: the device.
            labels: the new labels, as a mapping or as text such as ``kind=camera,site=3``.
            project: only a device of this project (None: any).

        Raises:
            ValidationError: a malformed id or label.
            NotFoundError: no such device (in ``project``).
            StoreError: the store failed.
        """
        wanted = parse_selector(labels) if isinstance(labels, str) else labels
        self._store.set_device_labels(device_id, check_labels(wanted), project=project)
        return self.get(device_id, project=project)

    def label_many(
        self, changes: Mapping[str, Mapping[str, str] | str], *, project: str | None = None
    ) -> builtins.list[DeviceView]:
        """Replace the labels of several devices at once: every one changes, or none does.

        Their desired state follows in the same transaction. A fixed number of
        queries however many devices change.

        Args:
            changes: Each device's new labels (all of them), as a mapping or as
                text such as ``kind=camera,site=3``, by device id.
            project: Only devices of this project (None: any).

        Returns:
            The changed devices, in the order of ``changes``.

        Raises:
            ValidationError: A malformed id or label, or too many devices.
            NotFoundError: A device that does not exist (in ``project``).
            StoreError: The store failed.
        """
        wanted = {
            device_id: check_labels(parse_selector(labels) if isinstance(labels, str) else labels)
            for device_id, labels in changes.items()
        }
        changed = self._store.set_labels_many(wanted, project=project)
        if not changed:
            return []
        projects = {r.project for r in changed}
        scope = projects.pop() if project is None and len(projects) == 1 else project
        views = {v.device_id: v for v in self.list(project=scope)}
        return [views[r.device_id] for r in changed if r.device_id in views]


class IdentityService:
    """Device identities: claim tokens for enrolment, and revocation."""

    def __init__(self, home: Path, store: Store | None = None) -> None:
        """Manage the identities of the hub at ``home``; ``store`` checks claims' projects."""
        self._enroller = Enroller(home, store)

    def create_claim(
        self,
        labels: Mapping[str, str] | str,
        uses: int = 1,
        ttl_s: float = 86400,
        *,
        reenroll: bool = False,
        project: str = "default",
    ) -> str:
        """A claim token (shown once) that enrols up to ``uses`` devices with ``labels``.

        Devices enrolled with it are in ``project``.

        Raises:
            ValidationError: bad labels, uses, lifetime or project name.
            NotFoundError: no such project.
            HubError: the claims file cannot be written.
        """
        wanted = parse_selector(labels) if isinstance(labels, str) else labels
        return self._enroller.create_claim(wanted, uses, ttl_s, reenroll=reenroll, project=project)

    def revoke(self, device_id: str) -> Path:
        """Revoke a device's certificate; returns the CRL file the hub and broker honour.

        Raises:
            EnrolmentError: the device is not enrolled.
            HubError: the CRL cannot be written.
        """
        self._enroller.revoke(device_id)
        return self._enroller.crl_path()


def _group_view(group: GroupRecord, fleet: Sequence[DeviceRecord]) -> GroupView:
    try:
        selector = parse_selector(group.selector)
    except ValidationError as exc:
        raise StoreError(f"group {group.name!r} has a corrupt selector: {exc}") from exc
    selected = sum(d.project == group.project and matches(selector, d.labels) for d in fleet)
    return GroupView(group.name, group.selector, selected, group.project)


class GroupService:
    """Named label selectors over devices."""

    def __init__(self, store: Store) -> None:
        """Serve groups from ``store``."""
        self._store = store

    def create(
        self,
        name: str,
        selector: str,
        *,
        all_devices: bool = False,
        project: str = "default",
    ) -> GroupView:
        """Create a group in ``project``; its selector is stored in canonical form.

        A group of every device must be asked for: an empty selector is refused
        unless ``all_devices`` is set, and ``all_devices`` takes no selector. A
        group selects only devices of its project.

        Args:
            name: The group's name (unique across projects).
            selector: Labels such as ``kind=camera,site=plant-3``.
            all_devices: Select every device (``selector`` must be empty).
            project: The group's project.

        Raises:
            ValidationError: A malformed name, selector or project name, an empty
                selector without ``all_devices``, or a selector with it.
            NotFoundError: No such project.
            ConflictError: A group of that name exists (in any project).
            StoreError: The store failed.
        """
        labels = parse_selector(selector)
        if all_devices and labels:
            raise ValidationError(
                f"a group of all devices takes no selector, got {selector!r}; "
                "drop the selector or --all"
            )
        if not all_devices and not labels:
            raise ValidationError(
                f"empty selector {selector!r} would select every device; give labels such as "
                "kind=camera, or --all to mean every device"
            )
        group = self._store.create_group(name, selector, project)
        return self._view([group], project)[0]

    def get(self, name: str, *, project: str | None = None) -> GroupView:
        """One group, with how many devices it selects.

        Args:
            name: The group's name.
            project: Only a group of this project (None: any); one of another
                project is not found, as if it did not exist.

        Raises:
            NotFoundError: No such group (in ``project``).
            StoreError: The store failed or holds a corrupt selector.
        """
        group = self._store.get_group(name, project=project)
        return self._view([group], group.project)[0]

    def selector(self, name: str, *, project: str | None = None) -> str:
        """A group's selector text, without counting its devices (one row read).

        Raises:
            NotFoundError: No such group (in ``project``).
            StoreError: The store failed.
        """
        return self._store.get_group(name, project=project).selector

    def list(self, *, project: str | None = None) -> list[GroupView]:
        """Every group, by name, with how many devices it selects (a fixed number of queries).

        Args:
            project: Only groups of this project (None: every project).

        Raises:
            StoreError: The store failed or holds a corrupt selector.
        """
        return self._view(self._store.list_groups(project=project), project)

    def _view(self, groups: Sequence[GroupRecord], project: str | None) -> builtins.list[GroupView]:
        fleet = self._store.list_devices(project=project) if groups else []
        return [_group_view(g, fleet) for g in groups]
