"""Device search and the fleet overview of the console, fast with 10,000 devices.

:class:`DeviceSearch` filters devices in the database (project, group
selector, labels, board, presence, reported skill and version, last seen,
id substring) and pages through them by id with an opaque cursor: a page
never repeats or skips a device that matched before and after it was read.
Presence is three-valued (see :func:`cloud.presence.fleet_presence`): ``online``,
``stale`` (went quiet without the hub seeing its connection end) and
``offline``.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from cloud.errors import ValidationError
from cloud.presence import PRESENCES
from cloud.selectors import check_labels, parse_selector
from cloud.service.devices import device_view
from cloud.service.views import DeviceView
from cloud.store import Store
from cloud.store import checks as check
from cloud.store.search import (
    DeviceFilter,
    GroupPresenceRecord,
    SearchTables,
    VersionCountRecord,
)
from protos.envelope import now_ms

__all__ = [
    "MAX_PAGE",
    "AlertView",
    "DevicePage",
    "DeviceSearch",
    "FleetOverview",
    "GroupPresenceView",
    "VersionCountView",
]

#: The most devices one page holds.
MAX_PAGE = 500
_CURSOR_PREFIX = "d1:"
_MAX_TEXT = 128

#: A group's devices by presence: already a frozen record the store computes.
GroupPresenceView = GroupPresenceRecord
#: How many devices report a skill at a version: already a frozen record.
VersionCountView = VersionCountRecord


@dataclass(frozen=True)
class DevicePage:
    """One page of matching devices, by id; ``next_cursor`` is None on the last page."""

    devices: tuple[DeviceView, ...]
    #: How many devices match the filter in all.
    total: int
    next_cursor: str | None


@dataclass(frozen=True)
class AlertView:
    """Something in the fleet an operator should look at.

    ``kind`` is ``drift`` (an open drift incident; ``ref`` its id),
    ``failed_install`` (devices whose last report says a skill version failed;
    ``devices`` how many, ``device_id`` the first by id) or ``rollout`` (the
    newest deployment of a skill on a group is paused, aborted or rolled back;
    ``ref`` the deployment id).
    """

    kind: str
    skill: str
    version: str
    message: str
    group: str = ""
    ref: int | None = None
    devices: int = 0
    device_id: str = ""


@dataclass(frozen=True)
class FleetOverview:
    """The fleet at a glance: presence overall and per group, versions, alerts."""

    project: str | None
    at_ms: int
    #: Every device of the project (``group`` and ``selector`` are '').
    totals: GroupPresenceView
    groups: tuple[GroupPresenceView, ...]
    versions: tuple[VersionCountView, ...]
    alerts: tuple[AlertView, ...]


def encode_cursor(device_id: str) -> str:
    """The opaque cursor of the page after ``device_id``."""
    raw = (_CURSOR_PREFIX + device_id).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> str:
    """The device id a cursor continues after.

    Raises:
        ValidationError: Not a cursor this service handed out.
    """
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        text = base64.urlsafe_b64decode(padded.encode("ascii")).decode()
    except (ValueError, binascii.Error, UnicodeError):
        text = ""
    if not text.startswith(_CURSOR_PREFIX) or len(text) == len(_CURSOR_PREFIX):
        raise ValidationError("bad cursor: pass back the next_cursor of a page unchanged")
    return text[len(_CURSOR_PREFIX) :]


def _labels(value: Mapping[str, str] | str | None) -> dict[str, str] | None:
    if value is None:
        return None
    return check_labels(parse_selector(value) if isinstance(value, str) else value)


def _check_filter(f: DeviceFilter) -> None:
    if f.presence is not None and f.presence not in PRESENCES:
        raise ValidationError(
            f"bad presence {f.presence!r}: expected one of {', '.join(PRESENCES)}"
        )
    if f.skill is not None:
        check.name(f.skill, "skill name")
    if f.version is not None:
        check.version(f.version)
    for at, when in ((f.seen_before_ms, "seen_before_ms"), (f.seen_after_ms, "seen_after_ms")):
        if at is not None:
            check.counter(at, when)
    for value, what in ((f.board, "board"), (f.text, "text"), (f.project, "project")):
        if value is not None and (not isinstance(value, str) or len(value) > _MAX_TEXT):
            raise ValidationError(f"bad {what} {value!r}: at most {_MAX_TEXT} characters")


class DeviceSearch:
    """Filtered, paged device lists and the fleet overview, answered by the database."""

    def __init__(self, store: Store, clock: Callable[[], int] = now_ms) -> None:
        """Search ``store``; ``clock`` (wall-clock milliseconds) judges presence."""
        self._tables = SearchTables(store.engine)
        self._clock = clock

    def search(
        self,
        project: str | None,
        *,
        group_selector: Mapping[str, str] | str | None = None,
        labels: Mapping[str, str] | str | None = None,
        profile: str | None = None,
        presence: str | None = None,
        skill: str | None = None,
        version: str | None = None,
        seen_before_ms: int | None = None,
        seen_after_ms: int | None = None,
        text: str | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> DevicePage:
        """One page of the devices matching every filter given, by id.

        Args:
            project: Only this project's devices (None: every project).
            group_selector: Only devices this selector selects (a principal's group scope).
            labels: Only devices with all these labels.
            profile: Only devices whose profile names this ``board``.
            presence: ``online``, ``stale`` or ``offline`` now.
            skill: Only devices whose last report lists this skill (in any state).
            version: Only devices whose last report lists a skill at this version
                (with ``skill``: that skill at that version).
            seen_before_ms: Last heard from before this time.
            seen_after_ms: Last heard from at or after this time.
            text: The device id contains this (any case).
            limit: Devices per page, 1 to :data:`MAX_PAGE`.
            cursor: The ``next_cursor`` of the previous page (None: the first page).

        Raises:
            ValidationError: A malformed filter, limit or cursor.
            StoreError: The store failed or holds corrupt data.
        """
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_PAGE:
            raise ValidationError(f"bad limit {limit!r}: expected 1 to {MAX_PAGE}")
        wanted = DeviceFilter(
            project=project,
            group_selector=_labels(group_selector),
            labels=_labels(labels),
            board=profile,
            presence=presence,
            skill=skill,
            version=version,
            seen_before_ms=seen_before_ms,
            seen_after_ms=seen_after_ms,
            text=text or None,
        )
        _check_filter(wanted)
        after = None if cursor is None else decode_cursor(cursor)
        now = self._clock()
        states, total = self._tables.search_devices(
            wanted, now_ms=now, after=after, limit=limit + 1
        )
        more = len(states) > limit
        page = tuple(device_view(s, now) for s in states[:limit])
        next_cursor = encode_cursor(page[-1].device_id) if more and page else None
        return DevicePage(page, total, next_cursor)

    def overview(self, project: str | None) -> FleetOverview:
        """Presence per group, the versions in the field per skill, and the open alerts.

        Args:
            project: One project (None: the whole hub).

        Raises:
            StoreError: The store failed or holds corrupt data.
        """
        now = self._clock()
        found = self._tables.overview(project, now_ms=now)
        alerts = [
            AlertView(
                "drift",
                d.skill,
                d.version,
                f"drift incident {d.incident_id} {d.stage}: {d.reason}",
                group=d.group,
                ref=d.incident_id,
            )
            for d in found.drift
        ]
        alerts += [
            AlertView(
                "failed_install",
                f.skill,
                f.version,
                f"{f.skill} {f.version} failed on {f.devices} device(s), first {f.first_device}",
                devices=f.devices,
                device_id=f.first_device,
            )
            for f in found.failed
        ]
        alerts += [
            AlertView(
                "rollout",
                r.skill,
                r.version,
                f"deployment {r.deployment_id} ({r.skill} {r.version} -> group {r.group}) "
                f"is {r.phase}",
                group=r.group,
                ref=r.deployment_id,
            )
            for r in found.rollouts
        ]
        return FleetOverview(
            project, now, found.totals, found.groups, found.versions, tuple(alerts)
        )
