"""Metered usage: telemetry windows folded into inference counts per UTC day.

A usage report over a month would read every telemetry window of the month;
instead the leader folds new telemetry rows, in id order, into ``usage_daily``
(one row per project, UTC day, device, skill and version), and reports read
those. Each batch is one transaction that adds its rows' counts and moves
``metering_cursor`` past them, so a fold that fails half-way leaves nothing
behind and the next one counts every window exactly once.

Ids are handed out when a row is inserted, not when it commits: on
PostgreSQL a row with a lower id can commit after one with a higher id was
folded. So a fold first takes a *horizon* while no telemetry insert is in
flight (a ``SHARE`` lock on ``telemetry``, held only to read the newest id)
and folds only ids up to it; ids above it are folded next time. SQLite has
one writer at a time, so its newest committed id is a horizon already.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from sqlalchemy import Connection, func, select, text, update

from cloud.errors import StoreError
from cloud.store.access_schema import metering_cursor, usage_daily
from cloud.store.base import StoreBase
from cloud.store.schema import devices, telemetry

__all__ = ["DAY_MS", "USAGE_KEYS", "MeteringTables", "UsageRecord", "day_of"]

#: The resolution of metered usage: one UTC day.
DAY_MS: Final = 86_400_000
#: What usage can be broken down by (besides the project).
USAGE_KEYS: Final = ("device", "skill", "version")
_CURSOR_ID: Final = 1
_COLUMNS: Final = {"device": "device_id", "skill": "skill", "version": "version"}


def day_of(at_ms: int) -> int:
    """The UTC day (days since 1970-01-01) that ``at_ms`` falls in."""
    return at_ms // DAY_MS


@dataclass(frozen=True)
class UsageRecord:
    """Inferences and windows of a project, per whatever the report breaks down by.

    A key the report does not break down by is ''.
    """

    project: str
    device_id: str
    skill: str
    version: str
    inferences: int
    windows: int


def _fold_rows(rows: Sequence[Any]) -> list[dict[str, Any]]:
    """Sum telemetry rows per (project, day, device, skill, version)."""
    sums: dict[tuple[str, int, str, str, str], list[int]] = {}
    for row in rows:
        key = (
            row.project or "default",
            day_of(row.window_end_ms),
            row.device_id,
            row.skill,
            row.version,
        )
        acc = sums.setdefault(key, [0, 0])
        acc[0] += int(row.inferences)
        acc[1] += 1
    return [
        {
            "project": k[0],
            "day": k[1],
            "device_id": k[2],
            "skill": k[3],
            "version": k[4],
            "inferences": v[0],
            "windows": v[1],
        }
        for k, v in sorted(sums.items())
    ]


class MeteringTables(StoreBase):
    """Folding telemetry into ``usage_daily``, and reading it back."""

    def metering_position(self) -> int:
        """The id of the last telemetry row folded (0: none yet).

        Raises:
            StoreError: The database failed.
        """
        with self._tx() as conn:
            return self._position(conn)

    @staticmethod
    def _position(conn: Connection, *, lock: bool = False) -> int:
        query = select(metering_cursor.c.telemetry_id).where(metering_cursor.c.id == _CURSOR_ID)
        if lock:
            query = query.with_for_update()
        found = conn.execute(query).scalar_one_or_none()
        return 0 if found is None else int(found)

    def telemetry_horizon(self) -> int:
        """The newest telemetry id below which no row can still appear (see the module).

        Raises:
            StoreError: The database failed, or telemetry inserts held the lock over 10 s.
        """
        with self._tx() as conn:
            if self.dialect == "postgresql":
                conn.execute(text("SET LOCAL lock_timeout = '10s'"))
                conn.execute(text(f"LOCK TABLE {telemetry.name} IN SHARE MODE"))
            newest = conn.execute(select(func.max(telemetry.c.id))).scalar_one_or_none()
        return 0 if newest is None else int(newest)

    def fold_usage(self, batch: int) -> int:
        """Fold every telemetry row up to the current horizon, ``batch`` rows a transaction.

        Returns:
            How many telemetry rows were folded.

        Raises:
            StoreError: The database failed; the batches folded before it stay folded.
        """
        horizon = self.telemetry_horizon()
        folded = 0
        while True:
            n = self.fold_usage_batch(horizon, batch)
            folded += n
            if n < batch:
                return folded

    def fold_usage_batch(self, horizon: int, batch: int) -> int:
        """Fold the next ``batch`` telemetry rows with ids up to ``horizon``, in one transaction.

        A device's usage goes to the project the device is in now ('default' for
        telemetry of a device the hub no longer knows).

        Returns:
            How many telemetry rows were folded (0: none left up to the horizon).

        Raises:
            StoreError: The database failed; nothing was folded.
        """
        with self._tx(write=True) as conn:
            self._ensure_cursor(conn)
            after = self._position(conn, lock=True)
            t = telemetry.c
            query = (
                select(
                    t.id,
                    t.device_id,
                    t.skill,
                    t.version,
                    t.inferences,
                    t.window_end_ms,
                    devices.c.project,
                )
                .select_from(telemetry.outerjoin(devices, devices.c.device_id == t.device_id))
                .where(t.id > after, t.id <= horizon)
                .order_by(t.id)
                .limit(batch)
            )
            rows = conn.execute(query).all()
            if not rows:
                return 0
            self._add_usage(conn, _fold_rows(rows))
            _advance(conn, after, int(rows[-1].id))
        return len(rows)

    def _ensure_cursor(self, conn: Connection) -> None:
        stmt = self._dialect.insert(metering_cursor).values(id=_CURSOR_ID, telemetry_id=0)
        conn.execute(stmt.on_conflict_do_nothing(index_elements=["id"]))

    def _add_usage(self, conn: Connection, sums: list[dict[str, Any]]) -> None:
        stmt = self._dialect.insert(usage_daily)
        stmt = stmt.on_conflict_do_update(
            index_elements=["project", "day", "device_id", "skill", "version"],
            set_={
                "inferences": usage_daily.c.inferences + stmt.excluded.inferences,
                "windows": usage_daily.c.windows + stmt.excluded.windows,
            },
        )
        conn.execute(stmt, sums)

    def usage_rows(
        self, project: str | None, first_day: int, last_day: int, by: Sequence[str]
    ) -> list[UsageRecord]:
        """Usage summed over the UTC days ``first_day`` to ``last_day`` (both included).

        Args:
            project: One project (None: every project, each its own rows).
            first_day: The first day, in days since the epoch.
            last_day: The last day.
            by: Which of :data:`USAGE_KEYS` to break down by.

        Raises:
            StoreError: The database failed.
        """
        u = usage_daily.c
        keys = [u.project] + [u[_COLUMNS[k]] for k in USAGE_KEYS if k in by]
        query = (
            select(*keys, func.sum(u.inferences), func.sum(u.windows))
            .where(u.day >= first_day, u.day <= last_day)
            .group_by(*keys)
            .order_by(*keys)
        )
        if project is not None:
            query = query.where(u.project == project)
        with self._tx() as conn:
            rows = conn.execute(query).all()
        out = []
        for row in rows:
            named = dict(zip((k.name for k in keys), row[: len(keys)], strict=True))
            out.append(
                UsageRecord(
                    str(named["project"]),
                    str(named.get("device_id", "")),
                    str(named.get("skill", "")),
                    str(named.get("version", "")),
                    int(row[-2]),
                    int(row[-1]),
                )
            )
        return out


def _advance(conn: Connection, after: int, to: int) -> None:
    """Move the cursor from ``after`` to ``to`` (in the fold's transaction).

    Raises:
        StoreError: Another fold moved it first (the transaction must roll back).
    """
    moved = conn.execute(
        update(metering_cursor)
        .where(metering_cursor.c.id == _CURSOR_ID, metering_cursor.c.telemetry_id == after)
        .values(telemetry_id=to)
    )
    if moved.rowcount != 1:
        raise StoreError("the metering cursor moved during a fold; nothing of it was kept")
