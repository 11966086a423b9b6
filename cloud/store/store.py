"""The hub's store: devices, groups, skills, deployments, their state and telemetry.

The tables are split by concept (:mod:`cloud.store.devices`,
:mod:`cloud.store.skills`, :mod:`cloud.store.state`, :mod:`cloud.store.projects`);
:class:`Store` joins them
and adds deployments and telemetry.

Every public method is one database transaction and returns frozen records.
Input is validated before anything is written; any failure inside a
transaction rolls all of it back.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict

from sqlalchemy import Connection, select, update

from cloud.errors import NotFoundError, StoreError, ValidationError
from cloud.rollout import Strategy, parse_strategy
from cloud.rollout.plan import RolloutPlan, plan_from_dict
from cloud.store import checks as check
from cloud.store import telemetry as tele
from cloud.store.access import AccessTables
from cloud.store.desired import recompute
from cloud.store.devices import DeviceTables
from cloud.store.director import DirectorTables
from cloud.store.drift import DriftTables
from cloud.store.engine import create_store_engine, upgrade_schema
from cloud.store.events import EVENT_DEPLOYMENT, EventTables, NewEvent, insert_events
from cloud.store.incidents import IncidentTables
from cloud.store.lineage import LineageTables
from cloud.store.projects import DEFAULT_PROJECT, ProjectTables, require_project
from cloud.store.records import (
    DEPLOYMENT_ABORTED,
    DEPLOYMENT_ACTIVE,
    DEPLOYMENT_SUPERSEDED,
    DeploymentRecord,
    DeviceSkillSummary,
    TelemetryRecord,
)
from cloud.store.rollouts import (
    RolloutTables,
    deployment_record,
    insert_rollout,
    staged,
    supersede_older,
)
from cloud.store.rollouts import group_clause as _group_clause
from cloud.store.schema import deployments
from cloud.store.skills import SkillTables
from cloud.store.state import StateTables

__all__ = ["Store", "deployment_record", "open_store"]


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


def _reactivate(conn: Connection, aborted: DeploymentRecord) -> DeploymentRecord | None:
    """Make the newest deployment ``aborted`` had superseded active again; it, or None."""
    t = deployments.c
    row = conn.execute(
        select(deployments)
        .where(
            t.skill == aborted.skill,
            t.group_name == aborted.group,
            t.state == DEPLOYMENT_SUPERSEDED,
            t.id < aborted.id,
        )
        .order_by(t.id.desc())
        .limit(1)
    ).first()
    if row is None:
        return None
    conn.execute(update(deployments).where(t.id == row.id).values(state=DEPLOYMENT_ACTIVE))
    return DeploymentRecord(**{**asdict(deployment_record(row)), "state": DEPLOYMENT_ACTIVE})


class Store(
    AccessTables,
    DeviceTables,
    SkillTables,
    StateTables,
    DirectorTables,
    EventTables,
    RolloutTables,
    DriftTables,
    IncidentTables,
    LineageTables,
    ProjectTables,
):
    """The hub's store; build it with :func:`open_store`.

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
        strategy: str | Strategy = Strategy.ALL_AT_ONCE,
        config: Mapping[str, str] | None = None,
        plan: RolloutPlan | None = None,
        now_ms: int,
        project: str = DEFAULT_PROJECT,
    ) -> DeploymentRecord:
        """Deploy a skill version to a group and update the desired state of its devices.

        The deployment is in ``project``, and so must be its group and skill
        version: one of another project is not found, as if it did not exist.

        The deployment row and every desired-state change commit together or not at all.
        With a staged ``plan`` (see :func:`cloud.store.rollouts.staged`) the deployment
        gets a rollout that admits no device yet: the leader's rollout loop moves
        devices, and only a completed rollout supersedes the older deployments of
        the skill on the group (until then they keep the devices not yet moved).
        Otherwise the older deployments are superseded at once. The plan's strategy
        and priority are the deployment's.

        Raises:
            ValidationError: A strategy the rollout rule does not know, a malformed
                config or project name.
            NotFoundError: The project, the skill version or the group does not exist
                (in ``project``).
            StoreError: The database failed or holds corrupt data.
        """
        if plan is not None:
            strategy = plan.strategy.value
        strategy = parse_strategy(strategy)
        if plan is None and strategy.staged:
            plan = plan_from_dict({"strategy": strategy.value})  # its defaults
        values = check.config(config)
        check.counter(now_ms, "now_ms")
        check.name(project, "project name")
        row = {
            "skill": skill,
            "version": version,
            "group_name": group,
            "strategy": strategy.value,
            "config": json.dumps(values, sort_keys=True),
            "state": DEPLOYMENT_ACTIVE,
            "created_ms": now_ms,
            "priority": plan.priority if plan is not None else 0,
            "project": project,
        }
        with self._tx(write=True, lock="exclusive") as conn:
            require_project(conn, project)
            self._skill_version(conn, skill, version, project)
            if plan is not None and plan.ab is not None:
                self._skill_version(conn, skill, plan.ab.control, project)
            which = _group_clause(conn, group, project)
            result = conn.execute(deployments.insert().values(**row).returning(deployments.c.id))
            deployment_id = result.scalar_one()
            if plan is not None and staged(plan):
                insert_rollout(conn, deployment_id, plan, version, now_ms)
                older = []
            else:
                older = supersede_older(conn, skill, group, deployment_id)
                recompute(conn, which)
            what = f"{skill} {version} -> group {group} ({strategy.value})"
            news = [NewEvent(EVENT_DEPLOYMENT, f"deployment {deployment_id} created: {what}")]
            news += [
                NewEvent(
                    EVENT_DEPLOYMENT,
                    f"deployment {old} superseded by deployment {deployment_id} ({what})",
                )
                for old in older
            ]
            insert_events(conn, news, at_ms=now_ms)
        return DeploymentRecord(
            deployment_id, skill, version, group, strategy.value, values, DEPLOYMENT_ACTIVE,
            now_ms, project,
        )  # fmt: skip

    def get_deployment(self, deployment_id: int, *, project: str | None = None) -> DeploymentRecord:
        """Return one deployment (of ``project``, when given).

        Raises:
            NotFoundError: No deployment with that id (in ``project``).
            StoreError: The database failed.
        """
        with self._tx() as conn:
            return self._deployment(conn, deployment_id, project)

    @staticmethod
    def _deployment(
        conn: Connection, deployment_id: int, project: str | None = None
    ) -> DeploymentRecord:
        query = select(deployments).where(deployments.c.id == deployment_id)
        if project is not None:
            query = query.where(deployments.c.project == project)
        row = conn.execute(query).first()
        if row is None:
            raise NotFoundError(f"no deployment {deployment_id}")
        return deployment_record(row)

    def list_deployments(self, *, project: str | None = None) -> list[DeploymentRecord]:
        """Return every deployment (of ``project``, when given), oldest first.

        Raises:
            StoreError: The database failed.
        """
        query = select(deployments).order_by(deployments.c.id)
        if project is not None:
            query = query.where(deployments.c.project == project)
        with self._tx() as conn:
            rows = conn.execute(query).all()
        return [deployment_record(row) for row in rows]

    def abort_deployment(
        self, deployment_id: int, *, now_ms: int, project: str | None = None
    ) -> DeploymentRecord:
        """Abort a deployment; its devices fall back to what the remaining deployments say.

        Aborting the active deployment of a skill on a group makes the one it
        superseded there (the newest still superseded) active again, so the
        group returns to the previous version. Aborting a superseded deployment
        keeps it from ever coming back. Aborting an aborted one changes nothing.

        Raises:
            ValidationError: A malformed time.
            NotFoundError: No deployment with that id (in ``project``, when given).
            StoreError: The database failed or holds corrupt data.
        """
        check.counter(now_ms, "now_ms")
        with self._tx(write=True, lock="exclusive") as conn:
            found = self._deployment(conn, deployment_id, project)
            if found.state == DEPLOYMENT_ABORTED:
                return found
            conn.execute(
                update(deployments)
                .where(deployments.c.id == deployment_id)
                .values(state=DEPLOYMENT_ABORTED)
            )
            news = [NewEvent(EVENT_DEPLOYMENT, f"deployment {deployment_id} aborted")]
            if found.state == DEPLOYMENT_ACTIVE:
                back = _reactivate(conn, found)
                if back is not None:
                    news.append(
                        NewEvent(
                            EVENT_DEPLOYMENT,
                            f"deployment {back.id} active again ({back.skill} {back.version} "
                            f"-> group {back.group}) after deployment {deployment_id} was aborted",
                        )
                    )
            recompute(conn, _group_clause(conn, found.group))
            insert_events(conn, news, at_ms=now_ms)
        return DeploymentRecord(**{**asdict(found), "state": DEPLOYMENT_ABORTED})

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
        return self.add_telemetry_windows([tele.record_window(*item) for item in items])

    def add_telemetry_windows(self, windows: Sequence[tele.TelemetryWindow]) -> list[bool]:
        """Store windows (see :data:`cloud.store.telemetry.TelemetryWindow`) in one
        transaction, skipping duplicates, as :meth:`add_telemetry_many` stores records.

        Raises:
            ValidationError: A malformed window or a batch over the cap; nothing is stored.
            StoreError: The database failed; nothing is stored.
        """
        rows = tele.prepare_windows(windows)
        with self._tx(write=True) as conn:
            return tele.insert_telemetry(conn, rows)

    @staticmethod
    def check_telemetry_window(window: tele.TelemetryWindow) -> None:
        """Check one window as :meth:`add_telemetry_windows` would, without writing.

        Raises:
            ValidationError: The message id, the device id or the window is malformed.
        """
        tele.check_window(window)

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
