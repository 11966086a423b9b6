"""Devices and groups: who is in the fleet, with which labels, and named selectors."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    Row,
    and_,
    bindparam,
    case,
    delete,
    func,
    select,
    update,
)

from cloud.errors import ConflictError, NotFoundError, ValidationError
from cloud.presence import online_clause
from cloud.selectors import check_labels, format_selector, parse_selector
from cloud.store import checks as check
from cloud.store.base import StoreBase
from cloud.store.desired import recompute, selector_clause
from cloud.store.events import EVENT_DEVICE, NewEvent, insert_events
from cloud.store.fleet_stamp import bump, lock_presence, only_refreshes
from cloud.store.projects import DEFAULT_PROJECT, require_project
from cloud.store.records import DeviceRecord, GroupRecord
from cloud.store.schema import device_groups, device_labels, devices

__all__ = ["MAX_LABEL_BATCH", "DeviceTables", "device_record", "group_record"]

#: Most devices one :meth:`DeviceTables.set_labels_many` call relabels (a bulk action's cap).
MAX_LABEL_BATCH = 1000


def device_record(row: Row[Any], labels: dict[str, str]) -> DeviceRecord:
    """Turn a ``devices`` row and the device's labels into a record."""
    return DeviceRecord(
        row.device_id,
        labels,
        json.loads(row.profile),
        row.last_seen_ms,
        row.online,
        row.heartbeat_ms,
        row.project,
    )


def group_record(row: Row[Any]) -> GroupRecord:
    """Turn a ``device_groups`` row into a record."""
    return GroupRecord(row.name, row.selector, row.project)


def _in_project(where: ColumnElement[bool], project: str | None) -> ColumnElement[bool]:
    """``where`` kept to the devices of ``project`` (unchanged for None: every project)."""
    return where if project is None else and_(where, devices.c.project == project)


def _project_of(conn: Connection, device_id: str) -> str:
    row = conn.execute(select(devices.c.project).where(devices.c.device_id == device_id)).first()
    return DEFAULT_PROJECT if row is None else str(row.project)


def _write_labels(conn: Connection, device_id: str, labels: Mapping[str, str]) -> None:
    conn.execute(delete(device_labels).where(device_labels.c.device_id == device_id))
    if labels:
        rows = [{"device_id": device_id, "key": k, "value": v} for k, v in labels.items()]
        conn.execute(device_labels.insert(), rows)


def _read_labels(conn: Connection, device_id: str) -> dict[str, str]:
    rows = conn.execute(select(device_labels).where(device_labels.c.device_id == device_id))
    return {row.key: row.value for row in rows}


class DeviceTables(StoreBase):
    """Transactional access to devices and groups."""

    # devices

    def register_device(
        self,
        device_id: str,
        labels: Mapping[str, str],
        profile: Mapping[str, object],
        *,
        now_ms: int,
        heartbeat_ms: int = 0,
    ) -> DeviceRecord:
        """Insert or update a device, mark it connected and recompute its desired state.

        ``labels`` are stored only for a device the hub did not know: a device
        that registers again keeps the labels the hub gave it (at enrolment or
        through :meth:`set_device_labels`), whatever it sends. A device the hub
        did not know (one that never enrolled: insecure mode) lands in project
        ``default``; a known one keeps its project.

        Args:
            device_id: the device.
            labels: its labels, kept only for a device the hub did not know.
            profile: its hardware profile.
            now_ms: when it registered (its last-seen time from now on).
            heartbeat_ms: the heartbeat interval the hub gave it (0: not known);
                its presence is derived from it (:mod:`cloud.presence`).

        Raises:
            ValidationError: A malformed id, label, profile or interval, or a profile over the cap.
            StoreError: The database failed.
        """
        check.device_id(device_id)
        labels = check_labels(labels)
        profile_text = check.profile_json(profile)
        check.counter(now_ms, "now_ms")
        check.counter(heartbeat_ms, "heartbeat_ms")
        values = {
            "profile": profile_text,
            "last_seen_ms": now_ms,
            "online": True,
            "heartbeat_ms": heartbeat_ms,
        }
        insert = self._dialect.insert(devices).values(device_id=device_id, **values)
        with self._tx(write=True, lock="shared") as conn:
            added = conn.execute(insert.on_conflict_do_nothing(index_elements=["device_id"]))
            project = DEFAULT_PROJECT
            if added.rowcount:
                _write_labels(conn, device_id, labels)
            else:
                conn.execute(
                    update(devices).where(devices.c.device_id == device_id).values(**values)
                )
                labels = _read_labels(conn, device_id)
                project = _project_of(conn, device_id)
            recompute(conn, devices.c.device_id == device_id)
            bump(conn)
        profile_back = json.loads(profile_text)
        return DeviceRecord(device_id, labels, profile_back, now_ms, True, heartbeat_ms, project)

    def enroll_device(
        self,
        device_id: str,
        labels: Mapping[str, str],
        *,
        now_ms: int,
        project: str = DEFAULT_PROJECT,
    ) -> None:
        """Record an enrolled device with the labels its claim gave it, before it connects.

        A new device is stored offline with an empty profile, in ``project``; a
        device the hub knew gets these labels instead of its old ones and keeps
        its project (only a hub admin moves a device). Its desired state is
        recomputed either way.

        Raises:
            ValidationError: A malformed id, label or project name.
            NotFoundError: No such project.
            StoreError: The database failed.
        """
        check.device_id(device_id)
        labels = check_labels(labels)
        check.counter(now_ms, "now_ms")
        check.name(project, "project name")
        insert = self._dialect.insert(devices).values(
            device_id=device_id, profile="{}", last_seen_ms=now_ms, online=False, project=project
        )
        with self._tx(write=True, lock="shared") as conn:
            require_project(conn, project)
            conn.execute(insert.on_conflict_do_nothing(index_elements=["device_id"]))
            _write_labels(conn, device_id, labels)
            recompute(conn, devices.c.device_id == device_id)
            shown = ",".join(f"{k}={v}" for k, v in sorted(labels.items())) or "no labels"
            note = NewEvent(EVENT_DEVICE, f"{device_id} enrolled ({shown})", device_id)
            insert_events(conn, [note], at_ms=now_ms)
            bump(conn)

    def set_device_labels(
        self, device_id: str, labels: Mapping[str, str], *, project: str | None = None
    ) -> DeviceRecord:
        """Replace a device's labels (the hub's API; devices cannot) and recompute its state.

        Args:
            device_id: The device.
            labels: Its new labels.
            project: Only a device of this project (None: any).

        Raises:
            ValidationError: A malformed id or label.
            NotFoundError: No such device (in ``project``).
            StoreError: The database failed.
        """
        check.device_id(device_id)
        labels = check_labels(labels)
        where = _in_project(devices.c.device_id == device_id, project)
        with self._tx(write=True, lock="shared") as conn:
            row = conn.execute(select(devices).where(where)).first()
            if row is None:
                raise NotFoundError(f"no device {device_id!r}")
            _write_labels(conn, device_id, labels)
            recompute(conn, devices.c.device_id == device_id)
            bump(conn)
        return device_record(row, dict(labels))

    def set_labels_many(
        self, changes: Mapping[str, Mapping[str, str]], *, project: str | None = None
    ) -> list[DeviceRecord]:
        """Replace the labels of several devices in one transaction: all change, or none.

        The desired state of the changed devices is recomputed once, in the same
        transaction, as :meth:`set_device_labels` does for one.

        Args:
            changes: Each device's new labels (all of them), by device id.
            project: Only devices of this project (None: any).

        Returns:
            The changed devices, in the order of ``changes``.

        Raises:
            ValidationError: A malformed id or label, or more than
                :data:`MAX_LABEL_BATCH` devices.
            NotFoundError: A device that does not exist (in ``project``); nothing changed.
            StoreError: The database failed; nothing changed.
        """
        if len(changes) > MAX_LABEL_BATCH:
            raise ValidationError(
                f"{len(changes)} devices in one label change; at most {MAX_LABEL_BATCH}"
            )
        wanted = {check.device_id(d): check_labels(labels) for d, labels in changes.items()}
        if not wanted:
            return []
        which = devices.c.device_id.in_(list(wanted))
        with self._tx(write=True, lock="shared") as conn:
            rows = {
                r.device_id: r
                for r in conn.execute(select(devices).where(_in_project(which, project)))
            }
            missing = [d for d in wanted if d not in rows]
            if missing:
                raise NotFoundError(f"no device {missing[0]!r}")
            conn.execute(delete(device_labels).where(device_labels.c.device_id.in_(list(wanted))))
            new = [
                {"device_id": d, "key": k, "value": v}
                for d, labels in wanted.items()
                for k, v in labels.items()
            ]
            if new:
                conn.execute(device_labels.insert(), new)
            recompute(conn, which)
            bump(conn)
        return [device_record(rows[d], dict(labels)) for d, labels in wanted.items()]

    def touch_device(self, device_id: str, *, now_ms: int, online: bool | None = None) -> None:
        """Record that a device was heard from (its last message), optionally setting ``online``.

        ``online`` is the connected flag: whether a device is online is derived
        from it, ``last_seen_ms`` and ``heartbeat_ms`` (:mod:`cloud.presence`).

        Raises:
            ValidationError: A malformed id or time.
            NotFoundError: The device never registered.
            StoreError: The database failed.
        """
        check.device_id(device_id)
        check.counter(now_ms, "now_ms")
        values: dict[str, object] = {"last_seen_ms": now_ms}
        if online is not None:
            values["online"] = bool(online)
        stmt = update(devices).where(devices.c.device_id == device_id).values(**values)
        with self._tx(write=True) as conn:
            if conn.execute(stmt).rowcount == 0:
                raise NotFoundError(f"no device {device_id!r}")
            bump(conn)

    def record_presence(
        self, news: Mapping[str, tuple[int | None, bool]], *, now_ms: int | None = None
    ) -> set[str]:
        """Record what the hub learned of many devices' connections, in one transaction.

        ``news`` maps device ids to ``(heard_ms, online)``. ``heard_ms`` is when the
        device itself was last heard from (a heartbeat), and sets ``last_seen_ms``;
        None means news about its connection only (a stream that closed, a broker's
        retained or last-will status), which leaves ``last_seen_ms``: such news must
        not make a silent device look fresh. ``online`` is the connected flag. Ids the
        store does not know are skipped (a broker's retained status may name a device
        that never registered).

        ``now_ms`` (the wall clock when None) tells the fleet stamp whether the news
        only refreshes devices online anyway (:func:`cloud.store.fleet_stamp.only_refreshes`).

        Returns:
            The ids of ``news`` the store does not know: nothing was written for them.

        Raises:
            ValidationError: A malformed id or time (nothing is written).
            StoreError: The database failed.
        """
        rows = []
        for device_id, (heard_ms, online) in news.items():
            check.device_id(device_id)
            if heard_ms is not None:
                check.counter(heard_ms, "heard_ms")
            rows.append({"b_device_id": device_id, "b_seen": heard_ms, "b_online": bool(online)})
        if now_ms is not None:
            check.counter(now_ms, "now_ms")
        if not rows:
            return set()
        seen = bindparam("b_seen", type_=devices.c.last_seen_ms.type)
        stmt = (
            update(devices)
            .where(devices.c.device_id == bindparam("b_device_id"))
            .values(
                last_seen_ms=func.coalesce(seen, devices.c.last_seen_ms),
                online=bindparam("b_online", type_=devices.c.online.type),
            )
        )
        with self._tx(write=True) as conn:
            stored = lock_presence(conn, news)
            known = [row for row in rows if row["b_device_id"] in stored]
            if known:
                conn.execute(stmt, known)
                # Taken with the rows locked: a pass that misses this write reads before
                # it commits, a moment from now (the margin covers that and clock skew).
                at_ms = time.time_ns() // 1_000_000 if now_ms is None else now_ms
                bump(conn, refresh=only_refreshes(news, stored, at_ms))
        return news.keys() - stored.keys()

    def set_device_connected(self, device_id: str, *, connected: bool) -> None:
        """Record that a device's connection began or ended, leaving its last-seen time.

        One device's connection news, as :meth:`record_presence` writes it for
        many (the hub batches its news there): such news must not make a silent
        device look fresh.

        Raises:
            ValidationError: A malformed id.
            NotFoundError: The device never registered.
            StoreError: The database failed.
        """
        check.device_id(device_id)
        stmt = (
            update(devices).where(devices.c.device_id == device_id).values(online=bool(connected))
        )
        with self._tx(write=True) as conn:
            if conn.execute(stmt).rowcount == 0:
                raise NotFoundError(f"no device {device_id!r}")
            bump(conn)

    def count_devices(self, *, now_ms: int) -> tuple[int, int]:
        """How many devices the hub knows, and how many of them are online at ``now_ms``.

        Online by the rule of :func:`cloud.presence.presence`, counted in the database.

        Raises:
            StoreError: The database failed.
        """
        online = online_clause(
            devices.c.last_seen_ms, devices.c.heartbeat_ms, devices.c.online, now_ms
        )
        query = select(func.count(), func.coalesce(func.sum(case((online, 1), else_=0)), 0))
        with self._tx() as conn:
            known, counted = conn.execute(query).one()
        return int(known), int(counted)

    def get_device(self, device_id: str, *, project: str | None = None) -> DeviceRecord | None:
        """Return one device, or None if it never registered (in ``project``, when given).

        Raises:
            StoreError: The database failed.
        """
        found = self._devices(_in_project(devices.c.device_id == device_id, project))
        return found[0] if found else None

    def list_devices(
        self, selector: Mapping[str, str] | None = None, *, project: str | None = None
    ) -> list[DeviceRecord]:
        """Return the devices ``selector`` selects (all when None or empty), by id.

        Args:
            selector: Required labels.
            project: Only devices of this project (None: every project).

        Raises:
            ValidationError: The selector is malformed.
            StoreError: The database failed.
        """
        return self._devices(_in_project(selector_clause(check_labels(selector or {})), project))

    def device_ids(
        self, selector: Mapping[str, str] | None = None, *, project: str | None = None
    ) -> set[str]:
        """The ids of the devices ``selector`` selects (all when None or empty): one query.

        Raises:
            ValidationError: The selector is malformed.
            StoreError: The database failed.
        """
        where = _in_project(selector_clause(check_labels(selector or {})), project)
        with self._tx() as conn:
            return {row.device_id for row in conn.execute(select(devices.c.device_id).where(where))}

    def _devices(self, where: Any) -> list[DeviceRecord]:
        ids = select(devices.c.device_id).where(where)
        with self._tx() as conn:
            labels: dict[str, dict[str, str]] = {}
            for row in conn.execute(
                select(device_labels).where(device_labels.c.device_id.in_(ids))
            ):
                labels.setdefault(row.device_id, {})[row.key] = row.value
            rows = conn.execute(select(devices).where(where).order_by(devices.c.device_id))
            return [device_record(row, labels.get(row.device_id, {})) for row in rows]

    # groups

    def create_group(self, name: str, selector: str, project: str = DEFAULT_PROJECT) -> GroupRecord:
        """Create a named group in ``project``; its selector is stored in canonical form.

        Group names are unique across projects: a name another project uses is
        refused as taken, without saying by whom.

        Raises:
            ValidationError: A malformed name, selector or project name.
            NotFoundError: No such project.
            ConflictError: A group of that name exists (in any project).
            StoreError: The database failed.
        """
        check.name(name, "group name")
        check.name(project, "project name")
        canonical = format_selector(parse_selector(selector))
        stmt = (
            self._dialect.insert(device_groups)
            .values(name=name, selector=canonical, project=project)
            .on_conflict_do_nothing(index_elements=["name"])
        )
        with self._tx(write=True) as conn:
            require_project(conn, project)
            if conn.execute(stmt).rowcount == 0:
                raise ConflictError(f"group {name!r} exists (group names are taken hub-wide)")
            bump(conn)
        return GroupRecord(name, canonical, project)

    def get_group(self, name: str, *, project: str | None = None) -> GroupRecord:
        """Return one group (of ``project``, when given).

        Raises:
            NotFoundError: No group of that name (in ``project``).
            StoreError: The database failed.
        """
        query = select(device_groups).where(device_groups.c.name == name)
        if project is not None:
            query = query.where(device_groups.c.project == project)
        with self._tx() as conn:
            row = conn.execute(query).first()
        if row is None:
            raise NotFoundError(f"no group {name!r}")
        return group_record(row)

    def list_groups(self, *, project: str | None = None) -> list[GroupRecord]:
        """Return every group (of ``project``, when given), by name.

        Raises:
            StoreError: The database failed.
        """
        query = select(device_groups).order_by(device_groups.c.name)
        if project is not None:
            query = query.where(device_groups.c.project == project)
        with self._tx() as conn:
            rows = conn.execute(query).all()
        return [group_record(row) for row in rows]
