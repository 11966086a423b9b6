"""Devices and groups: who is in the fleet, with which labels, and named selectors."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from sqlalchemy import Connection, Row, bindparam, case, delete, func, select, update

from cloud.errors import ConflictError, NotFoundError
from cloud.presence import online_clause
from cloud.selectors import check_labels, format_selector, parse_selector
from cloud.store import checks as check
from cloud.store.base import StoreBase
from cloud.store.desired import recompute, selector_clause
from cloud.store.events import EVENT_DEVICE, NewEvent, insert_events
from cloud.store.records import DeviceRecord, GroupRecord
from cloud.store.schema import device_groups, device_labels, devices

__all__ = ["DeviceTables", "device_record"]


def device_record(row: Row[Any], labels: dict[str, str]) -> DeviceRecord:
    """Turn a ``devices`` row and the device's labels into a record."""
    return DeviceRecord(
        row.device_id,
        labels,
        json.loads(row.profile),
        row.last_seen_ms,
        row.online,
        row.heartbeat_ms,
    )


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
        through :meth:`set_device_labels`), whatever it sends.

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
            if added.rowcount:
                _write_labels(conn, device_id, labels)
            else:
                conn.execute(
                    update(devices).where(devices.c.device_id == device_id).values(**values)
                )
                labels = _read_labels(conn, device_id)
            recompute(conn, devices.c.device_id == device_id)
        return DeviceRecord(device_id, labels, json.loads(profile_text), now_ms, True, heartbeat_ms)

    def enroll_device(self, device_id: str, labels: Mapping[str, str], *, now_ms: int) -> None:
        """Record an enrolled device with the labels its claim gave it, before it connects.

        A new device is stored offline with an empty profile; a device the hub
        knew gets these labels instead of its old ones. Its desired state is
        recomputed either way.

        Raises:
            ValidationError: A malformed id or label.
            StoreError: The database failed.
        """
        check.device_id(device_id)
        labels = check_labels(labels)
        check.counter(now_ms, "now_ms")
        insert = self._dialect.insert(devices).values(
            device_id=device_id, profile="{}", last_seen_ms=now_ms, online=False
        )
        with self._tx(write=True, lock="shared") as conn:
            conn.execute(insert.on_conflict_do_nothing(index_elements=["device_id"]))
            _write_labels(conn, device_id, labels)
            recompute(conn, devices.c.device_id == device_id)
            shown = ",".join(f"{k}={v}" for k, v in sorted(labels.items())) or "no labels"
            note = NewEvent(EVENT_DEVICE, f"{device_id} enrolled ({shown})", device_id)
            insert_events(conn, [note], at_ms=now_ms)

    def set_device_labels(self, device_id: str, labels: Mapping[str, str]) -> DeviceRecord:
        """Replace a device's labels (the hub's API; devices cannot) and recompute its state.

        Raises:
            ValidationError: A malformed id or label.
            NotFoundError: No such device.
            StoreError: The database failed.
        """
        check.device_id(device_id)
        labels = check_labels(labels)
        with self._tx(write=True, lock="shared") as conn:
            row = conn.execute(select(devices).where(devices.c.device_id == device_id)).first()
            if row is None:
                raise NotFoundError(f"no device {device_id!r}")
            _write_labels(conn, device_id, labels)
            recompute(conn, devices.c.device_id == device_id)
        return device_record(row, dict(labels))

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

    def touch_devices(self, seen: Mapping[str, int]) -> None:
        """:meth:`touch_device` (online) for many devices in one transaction.

        ``seen`` maps device ids to the time each was last heard from; ids the
        store does not know are skipped (they can only have been heard through a
        session that registered them, so they were deleted meanwhile).

        Raises:
            ValidationError: A malformed id or time (nothing is written).
            StoreError: The database failed.
        """
        rows = []
        for device_id, at_ms in seen.items():
            check.device_id(device_id)
            check.counter(at_ms, "now_ms")
            rows.append({"b_device_id": device_id, "b_seen": at_ms})
        if not rows:
            return
        stmt = (
            update(devices)
            .where(devices.c.device_id == bindparam("b_device_id"))
            .values(last_seen_ms=bindparam("b_seen"), online=True)
        )
        with self._tx(write=True) as conn:
            conn.execute(stmt, rows)

    def set_device_connected(self, device_id: str, *, connected: bool) -> None:
        """Record that a device's connection began or ended, leaving its last-seen time.

        For what the hub learns about a connection rather than hears from the
        device itself (a stream that closed, a broker's retained or last-will
        status): such news must not make a silent device look fresh.

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

    def get_device(self, device_id: str) -> DeviceRecord | None:
        """Return one device, or None if it never registered.

        Raises:
            StoreError: The database failed.
        """
        found = self._devices(devices.c.device_id == device_id)
        return found[0] if found else None

    def list_devices(self, selector: Mapping[str, str] | None = None) -> list[DeviceRecord]:
        """Return the devices ``selector`` selects (all when None or empty), by id.

        Raises:
            ValidationError: The selector is malformed.
            StoreError: The database failed.
        """
        return self._devices(selector_clause(check_labels(selector or {})))

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

    def create_group(self, name: str, selector: str) -> GroupRecord:
        """Create a named group; its selector is stored in canonical form.

        Raises:
            ValidationError: A malformed name or selector.
            ConflictError: A group of that name exists.
            StoreError: The database failed.
        """
        check.name(name, "group name")
        canonical = format_selector(parse_selector(selector))
        stmt = (
            self._dialect.insert(device_groups)
            .values(name=name, selector=canonical)
            .on_conflict_do_nothing(index_elements=["name"])
        )
        with self._tx(write=True) as conn:
            if conn.execute(stmt).rowcount == 0:
                raise ConflictError(f"group {name!r} exists")
        return GroupRecord(name, canonical)

    def get_group(self, name: str) -> GroupRecord:
        """Return one group.

        Raises:
            NotFoundError: No group of that name.
            StoreError: The database failed.
        """
        with self._tx() as conn:
            row = conn.execute(select(device_groups).where(device_groups.c.name == name)).first()
        if row is None:
            raise NotFoundError(f"no group {name!r}")
        return GroupRecord(row.name, row.selector)

    def list_groups(self) -> list[GroupRecord]:
        """Return every group, by name.

        Raises:
            StoreError: The database failed.
        """
        with self._tx() as conn:
            rows = conn.execute(select(device_groups).order_by(device_groups.c.name)).all()
        return [GroupRecord(row.name, row.selector) for row in rows]
