"""Transactions, devices, groups and skill versions: the first half of the store.

:class:`cloud.store.Store` adds deployments, device state and telemetry on top.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any, Self

from sqlalchemy import Connection, Engine, Row, delete, select, text, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import SQLAlchemyError

from cloud.errors import ConflictError, NotFoundError, StoreError
from cloud.selectors import check_labels, format_selector, parse_selector
from cloud.store import _validate as check
from cloud.store.desired import recompute, selector_clause
from cloud.store.engine import IMMEDIATE
from cloud.store.records import (
    DeploymentRecord,
    DeviceRecord,
    GroupRecord,
    SkillVersionRecord,
)
from cloud.store.schema import (
    device_groups,
    device_labels,
    devices,
    skill_versions,
)

__all__ = ["DESIRED_LOCK_KEY", "Registry", "deployment_record"]

# PostgreSQL advisory lock ordering desired-state writers. Registrations share
# it (they touch one device each); deployment changes take it exclusively.
DESIRED_LOCK_KEY = 0x4553444553  # "ESDES"


def _device(row: Row[Any], labels: dict[str, str]) -> DeviceRecord:
    return DeviceRecord(
        row.device_id, labels, json.loads(row.profile), row.last_seen_ms, row.online
    )


def _skill_version(row: Row[Any]) -> SkillVersionRecord:
    return SkillVersionRecord(
        row.name, row.version, row.target_name, row.sha256, row.size, row.manifest, row.created_ms
    )


def deployment_record(row: Row[Any]) -> DeploymentRecord:
    """Turn a ``deployments`` row into a record."""
    return DeploymentRecord(
        row.id,
        row.skill,
        row.version,
        row.group_name,
        row.strategy,
        json.loads(row.config),
        row.state,
        row.created_ms,
    )


class Registry:
    """Transactional access to devices, groups and skill versions."""

    def __init__(self, engine: Engine) -> None:
        """Wrap an engine whose schema is already migrated."""
        self._engine = engine
        self._dialect = sqlite if engine.dialect.name == "sqlite" else postgresql

    @property
    def engine(self) -> Engine:
        """The underlying engine, for health checks and tests; prefer the methods."""
        return self._engine

    @property
    def dialect(self) -> str:
        """``"sqlite"`` or ``"postgresql"``."""
        return self._engine.dialect.name

    def close(self) -> None:
        """Close every pooled connection."""
        self._engine.dispose()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _tx(self, *, write: bool = False, lock: str = "") -> Iterator[Connection]:
        """One transaction; ``lock`` is "", "shared" or "exclusive" (desired state)."""
        try:
            with self._engine.connect() as conn:
                if write:
                    conn.execution_options(**{IMMEDIATE: True})
                with conn.begin():
                    if lock and self.dialect == "postgresql":
                        fn = (
                            "pg_advisory_xact_lock_shared"
                            if lock == "shared"
                            else "pg_advisory_xact_lock"
                        )
                        conn.execute(text(f"SELECT {fn}(:key)"), {"key": DESIRED_LOCK_KEY})
                    yield conn
        except SQLAlchemyError as exc:
            raise StoreError(f"store transaction failed: {exc}") from exc

    # devices

    def register_device(
        self,
        device_id: str,
        labels: Mapping[str, str],
        profile: Mapping[str, object],
        *,
        now_ms: int,
    ) -> DeviceRecord:
        """Insert or update a device, mark it online and recompute its desired state.

        Raises:
            ValidationError: A malformed id, label or profile, or a profile over the cap.
            StoreError: The database failed.
        """
        check.device_id(device_id)
        labels = check_labels(labels)
        profile_text = check.profile_json(profile)
        check.counter(now_ms, "now_ms")
        values = {"profile": profile_text, "last_seen_ms": now_ms, "online": True}
        upsert = self._dialect.insert(devices).values(device_id=device_id, **values)
        with self._tx(write=True, lock="shared") as conn:
            conn.execute(upsert.on_conflict_do_update(index_elements=["device_id"], set_=values))
            conn.execute(delete(device_labels).where(device_labels.c.device_id == device_id))
            if labels:
                rows = [{"device_id": device_id, "key": k, "value": v} for k, v in labels.items()]
                conn.execute(device_labels.insert(), rows)
            recompute(conn, devices.c.device_id == device_id)
        return DeviceRecord(device_id, labels, json.loads(profile_text), now_ms, True)

    def touch_device(self, device_id: str, *, now_ms: int, online: bool | None = None) -> None:
        """Record that a device was heard from, optionally changing its presence.

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
            return [_device(row, labels.get(row.device_id, {})) for row in rows]

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

    # skills

    def add_skill_version(
        self,
        name: str,
        version: str,
        *,
        target_name: str,
        sha256: str,
        size: int,
        manifest: str,
        now_ms: int,
    ) -> SkillVersionRecord:
        """Register an immutable skill version; re-adding the same bundle is a no-op.

        Raises:
            ValidationError: A malformed field or a manifest over the cap.
            ConflictError: The version exists with a different sha256.
            StoreError: The database failed.
        """
        check.name(name, "skill name")
        check.version(version)
        check.target_name(target_name)
        check.sha256(sha256)
        check.counter(size, "size")
        check.text(manifest, "manifest", check.MAX_MANIFEST_BYTES)
        check.counter(now_ms, "now_ms")
        row = {
            "name": name,
            "version": version,
            "target_name": target_name,
            "sha256": sha256,
            "size": size,
            "manifest": manifest,
            "created_ms": now_ms,
        }
        stmt = (
            self._dialect.insert(skill_versions)
            .values(**row)
            .on_conflict_do_nothing(index_elements=["name", "version"])
        )
        with self._tx(write=True) as conn:
            if conn.execute(stmt).rowcount == 1:
                return SkillVersionRecord(**row)  # type: ignore[arg-type]
            existing = self._skill_version(conn, name, version)
        if existing.sha256 != sha256:
            raise ConflictError(
                f"skill {name} {version} exists with another sha256 ({existing.sha256}); "
                "versions are immutable"
            )
        return existing

    @staticmethod
    def _skill_version(conn: Connection, name: str, version: str) -> SkillVersionRecord:
        row = conn.execute(
            select(skill_versions).where(
                skill_versions.c.name == name, skill_versions.c.version == version
            )
        ).first()
        if row is None:
            raise NotFoundError(f"no skill {name} version {version}")
        return _skill_version(row)

    def get_skill_version(self, name: str, version: str) -> SkillVersionRecord:
        """Return one skill version.

        Raises:
            NotFoundError: No such skill version.
            StoreError: The database failed.
        """
        with self._tx() as conn:
            return self._skill_version(conn, name, version)

    def list_skill_versions(self, name: str | None = None) -> list[SkillVersionRecord]:
        """Return skill versions (of one skill when ``name`` is given), oldest first per skill.

        Raises:
            StoreError: The database failed.
        """
        query = select(skill_versions).order_by(
            skill_versions.c.name, skill_versions.c.created_ms, skill_versions.c.version
        )
        if name is not None:
            query = query.where(skill_versions.c.name == name)
        with self._tx() as conn:
            return [_skill_version(row) for row in conn.execute(query)]
