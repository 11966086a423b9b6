"""The hub's registry store: devices, groups, skills, deployments and their state.

Every public method is one database transaction and returns frozen records.
Input is validated before anything is written; any failure inside a
transaction rolls all of it back.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict

from sqlalchemy import ColumnElement, Connection, select, update

from cloud.errors import NotFoundError, StoreError, ValidationError
from cloud.selectors import parse_selector
from cloud.store import _validate as check
from cloud.store import telemetry as tele
from cloud.store.desired import decode_skills, recompute, selector_clause
from cloud.store.engine import create_store_engine, upgrade_schema
from cloud.store.records import (
    DEPLOYMENT_ABORTED,
    DEPLOYMENT_ACTIVE,
    DeploymentRecord,
    DesiredRecord,
    DeviceSkillSummary,
    ReportedRecord,
    SkillStatusRecord,
    TelemetryRecord,
)
from cloud.store.registry import Registry, deployment_record
from cloud.store.schema import (
    deployments,
    desired_states,
    device_groups,
    devices,
    reported_states,
)

__all__ = ["Store", "open_store"]


def open_store(url: str) -> Store:
    """Open the store at ``url`` and migrate its schema to the newest version.

    Args:
        url: ``sqlite:///path/hub.db`` or ``postgresql+psycopg2://user@host:5432/db``.

    Returns:
        An open store; close it with :meth:`Store.close`.

    Raises:
        ValidationError: The URL is malformed or names an unsupported database.
        StoreError: The database is unreachable or the migration failed.
    """
    engine = create_store_engine(url)
    try:
        upgrade_schema(engine)
    except StoreError:
        engine.dispose()
        raise
    return Store(engine)


def _group_clause(conn: Connection, group: str) -> ColumnElement[bool]:
    row = conn.execute(
        select(device_groups.c.selector).where(device_groups.c.name == group)
    ).first()
    if row is None:
        raise NotFoundError(f"no group {group!r}")
    try:
        return selector_clause(parse_selector(row.selector))
    except ValidationError as exc:
        raise StoreError(f"group {group!r} has a corrupt selector: {exc}") from exc


class Store(Registry):
    """The hub's registry; build it with :func:`open_store`.

    Safe to share between threads (each call checks out its own connection)
    and between processes on the same database.
    """

    # deployments

    def create_deployment(
        self,
        skill: str,
        version: str,
        group: str,
        *,
        strategy: str = "all-at-once",
        config: Mapping[str, str] | None = None,
        now_ms: int,
    ) -> DeploymentRecord:
        """Deploy a skill version to a group and update the desired state of its devices.

        The deployment row and every desired-state change commit together or not at all.

        Raises:
            ValidationError: A malformed strategy or config.
            NotFoundError: The skill version or the group does not exist.
            StoreError: The database failed or holds corrupt data.
        """
        check.strategy(strategy)
        values = check.config(config)
        check.counter(now_ms, "now_ms")
        row = {
            "skill": skill,
            "version": version,
            "group_name": group,
            "strategy": strategy,
            "config": json.dumps(values, sort_keys=True),
            "state": DEPLOYMENT_ACTIVE,
            "created_ms": now_ms,
        }
        with self._tx(write=True, lock="exclusive") as conn:
            self._skill_version(conn, skill, version)
            which = _group_clause(conn, group)
            result = conn.execute(deployments.insert().values(**row).returning(deployments.c.id))
            deployment_id = result.scalar_one()
            recompute(conn, which)
        return DeploymentRecord(
            deployment_id, skill, version, group, strategy, values, DEPLOYMENT_ACTIVE, now_ms
        )

    def get_deployment(self, deployment_id: int) -> DeploymentRecord:
        """Return one deployment.

        Raises:
            NotFoundError: No deployment with that id.
            StoreError: The database failed.
        """
        with self._tx() as conn:
            return self._deployment(conn, deployment_id)

    @staticmethod
    def _deployment(conn: Connection, deployment_id: int) -> DeploymentRecord:
        row = conn.execute(select(deployments).where(deployments.c.id == deployment_id)).first()
        if row is None:
            raise NotFoundError(f"no deployment {deployment_id}")
        return deployment_record(row)

    def list_deployments(self) -> list[DeploymentRecord]:
        """Return every deployment, oldest first.

        Raises:
            StoreError: The database failed.
        """
        with self._tx() as conn:
            rows = conn.execute(select(deployments).order_by(deployments.c.id)).all()
        return [deployment_record(row) for row in rows]

    def abort_deployment(self, deployment_id: int, *, now_ms: int) -> DeploymentRecord:
        """Abort a deployment; its devices fall back to what the remaining deployments say.

        Aborting an aborted deployment changes nothing.

        Raises:
            ValidationError: A malformed time.
            NotFoundError: No deployment with that id.
            StoreError: The database failed or holds corrupt data.
        """
        check.counter(now_ms, "now_ms")
        with self._tx(write=True, lock="exclusive") as conn:
            found = self._deployment(conn, deployment_id)
            if found.state == DEPLOYMENT_ABORTED:
                return found
            conn.execute(
                update(deployments)
                .where(deployments.c.id == deployment_id)
                .values(state=DEPLOYMENT_ABORTED)
            )
            recompute(conn, _group_clause(conn, found.group))
        return DeploymentRecord(**{**asdict(found), "state": DEPLOYMENT_ABORTED})

    # desired and reported state

    def desired_for(self, device_id: str) -> DesiredRecord:
        """Return what the hub wants on a device (generation 0 and nothing if unknown).

        Raises:
            StoreError: The database failed or holds corrupt data.
        """
        query = select(desired_states).where(desired_states.c.device_id == device_id)
        with self._tx() as conn:
            row = conn.execute(query).first()
        if row is None:
            return DesiredRecord(device_id, 0, ())
        return DesiredRecord(device_id, row.generation, decode_skills(row.skills))

    def desired_generations(self) -> dict[str, int]:
        """Every registered device's desired generation (0 when nothing was ever desired).

        One query for the whole fleet, so a hub can poll it for changes.

        Raises:
            StoreError: The database failed.
        """
        joined = devices.outerjoin(
            desired_states, desired_states.c.device_id == devices.c.device_id
        )
        query = select(devices.c.device_id, desired_states.c.generation).select_from(joined)
        with self._tx() as conn:
            return {row.device_id: int(row.generation or 0) for row in conn.execute(query)}

    def desired_many(self, device_ids: Sequence[str]) -> list[DesiredRecord]:
        """Return the desired state of several devices, in one query per 500 ids.

        Devices with no stored desired state get generation 0 and no skills.

        Raises:
            StoreError: The database failed or holds corrupt data.
        """
        ids = list(dict.fromkeys(device_ids))
        found: dict[str, DesiredRecord] = {}
        with self._tx() as conn:
            for start in range(0, len(ids), 500):
                batch = ids[start : start + 500]
                query = select(desired_states).where(desired_states.c.device_id.in_(batch))
                for row in conn.execute(query):
                    found[row.device_id] = DesiredRecord(
                        row.device_id, row.generation, decode_skills(row.skills)
                    )
        return [found.get(d, DesiredRecord(d, 0, ())) for d in ids]

    def save_report(
        self,
        device_id: str,
        generation: int,
        skills: Sequence[SkillStatusRecord],
        *,
        now_ms: int,
    ) -> None:
        """Store a device's report of its skills, replacing an older one.

        ``now_ms`` is when the device made the report. A report that arrives late
        (redelivered after a newer one) changes nothing: it replaces the stored one
        only when it answers a newer desired generation, or the same one and was
        made no earlier.

        Raises:
            ValidationError: A malformed id, generation, time or status.
            NotFoundError: The device never registered.
            StoreError: The database failed.
        """
        check.device_id(device_id)
        check.counter(generation, "generation")
        check.counter(now_ms, "now_ms")
        encoded = json.dumps([asdict(s) for s in check.statuses(skills)], sort_keys=True)
        values = {"generation": generation, "skills": encoded, "reported_ms": now_ms}
        stmt = (
            self._dialect.insert(reported_states)
            .values(device_id=device_id, **values)
            .on_conflict_do_update(
                index_elements=["device_id"],
                set_=values,
                where=(reported_states.c.generation < generation)
                | (
                    (reported_states.c.generation == generation)
                    & (reported_states.c.reported_ms <= now_ms)
                ),
            )
        )
        with self._tx(write=True) as conn:
            known = select(devices.c.device_id).where(devices.c.device_id == device_id)
            if conn.execute(known).first() is None:
                raise NotFoundError(f"no device {device_id!r}")
            conn.execute(stmt)

    def reported_for(self, device_id: str) -> ReportedRecord | None:
        """Return a device's latest report, or None if it never reported.

        Raises:
            StoreError: The database failed or holds corrupt data.
        """
        query = select(reported_states).where(reported_states.c.device_id == device_id)
        with self._tx() as conn:
            row = conn.execute(query).first()
        if row is None:
            return None
        try:
            skills = tuple(SkillStatusRecord(**item) for item in json.loads(row.skills))
        except (ValueError, TypeError) as exc:
            raise StoreError(f"stored report of {device_id!r} is corrupt: {exc}") from exc
        return ReportedRecord(device_id, row.generation, skills, row.reported_ms)

    # telemetry

    def add_telemetry(self, msg_id: str, device_id: str, record: TelemetryRecord) -> bool:
        """Store one telemetry window unless its message id was seen before.

        Returns:
            True when stored, False for a duplicate (nothing changed).

        Raises:
            ValidationError: A malformed id or window.
            StoreError: The database failed.
        """
        return self.add_telemetry_batch(device_id, [(msg_id, record)])[0]

    def add_telemetry_batch(
        self, device_id: str, items: Sequence[tuple[str, TelemetryRecord]]
    ) -> list[bool]:
        """Store several windows of one device in one transaction, skipping duplicates.

        Returns:
            For each item, True when stored, False for a duplicate (also of an
            earlier item in the same batch).

        Raises:
            ValidationError: A malformed item or a batch over the cap; nothing is stored.
            StoreError: The database failed; nothing is stored.
        """
        rows = tele.prepare_rows(device_id, items)
        with self._tx(write=True) as conn:
            return tele.insert_telemetry(conn, rows)

    def add_telemetry_many(self, items: Sequence[tuple[str, str, TelemetryRecord]]) -> list[bool]:
        """Store windows of any devices in one transaction, skipping duplicates.

        Every item is validated before anything is written; callers that must
        not let one bad item refuse the others check each one first with
        :meth:`check_telemetry`.

        Args:
            items: ``(msg_id, device_id, record)`` triples, at most 10000.

        Returns:
            For each item, True when stored, False for a duplicate (also of an
            earlier item in the same batch).

        Raises:
            ValidationError: A malformed item or a batch over the cap; nothing is stored.
            StoreError: The database failed; nothing is stored.
        """
        rows = tele.prepare_rows_many(items)
        with self._tx(write=True) as conn:
            return tele.insert_telemetry(conn, rows)

    @staticmethod
    def check_telemetry(msg_id: str, device_id: str, record: TelemetryRecord) -> None:
        """Check one window as :meth:`add_telemetry_many` would, without writing.

        Raises:
            ValidationError: The message id, the device id or the window is malformed.
        """
        tele.prepare_row(msg_id, device_id, record)

    def telemetry_for(
        self, device_id: str | None = None, skill: str | None = None, *, limit: int = 10_000
    ) -> list[TelemetryRecord]:
        """Return the latest ``limit`` windows (of a device and/or skill), oldest first.

        Raises:
            ValidationError: ``limit`` is not in 1..100000.
            StoreError: The database failed or holds corrupt data.
        """
        if not 1 <= limit <= tele.MAX_TELEMETRY_ROWS:
            raise ValidationError(f"limit must be in 1..{tele.MAX_TELEMETRY_ROWS}")
        with self._tx() as conn:
            return tele.select_telemetry(conn, device_id, skill, limit)

    def telemetry_summary(self) -> list[DeviceSkillSummary]:
        """Sum telemetry per device and skill (sorted by device, then skill).

        Raises:
            StoreError: The database failed.
        """
        with self._tx() as conn:
            return tele.summarise(conn)
