"""Metered usage: telemetry windows folded into inference counts per UTC day and month.

A usage report over a month would read every telemetry window of the month;
instead the leader folds new telemetry rows, in id order, into ``usage_daily``
(one row per project, UTC day, device, skill and version), the same per UTC
month into ``usage_monthly``, and per project and day into
``usage_daily_totals``; reports read those. A period is split into the whole
months it covers (read from ``usage_monthly``) and the days at its edges (read
from ``usage_daily``), which sums to exactly what the days alone would. Each
batch is one transaction that adds its rows' counts to all three and moves
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

from sqlalchemy import (
    ColumnElement,
    Connection,
    Table,
    and_,
    func,
    literal,
    or_,
    select,
    text,
    true,
    tuple_,
    union_all,
    update,
)

from cloud.errors import StoreError
from cloud.store.access_schema import (
    metering_cursor,
    usage_daily,
    usage_daily_totals,
    usage_monthly,
)
from cloud.store.base import StoreBase, values_clause
from cloud.store.schema import devices, telemetry
from cloud.store.usage_period import Period, month_days, month_of, split_period

__all__ = [
    "DAY_MS",
    "USAGE_KEYS",
    "MeteringTables",
    "Period",
    "UsageKey",
    "UsageRecord",
    "day_of",
    "month_days",
    "month_of",
    "split_period",
]

#: The resolution of metered usage: one UTC day.
DAY_MS: Final = 86_400_000
#: What usage can be broken down by (besides the project).
USAGE_KEYS: Final = ("device", "skill", "version")
_CURSOR_ID: Final = 1
_COLUMNS: Final = {"device": "device_id", "skill": "skill", "version": "version"}


#: A row's place in a report: (project, device_id, skill, version).
UsageKey = tuple[str, str, str, str]


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


def _fold_query(after: int, horizon: int, batch: int) -> Any:
    """The next ``batch`` telemetry rows after ``after`` (up to ``horizon``), summed in SQL.

    One row per (project, day, device, skill, version), in that order, with its
    inferences, its window count and its highest telemetry id: the database adds
    up thousands of windows where Python would walk each of them.
    """
    t = telemetry.c
    taken = (
        select(t.id, t.device_id, t.skill, t.version, t.inferences, t.window_end_ms)
        .where(t.id > after, t.id <= horizon)
        .order_by(t.id)
        .limit(batch)
        .subquery()
    )
    project = func.coalesce(devices.c.project, "default")
    day = taken.c.window_end_ms // DAY_MS  # integer division: window ends are never negative
    keys = (project, day, taken.c.device_id, taken.c.skill, taken.c.version)
    return (
        select(
            project.label("project"),
            day.label("day"),
            taken.c.device_id,
            taken.c.skill,
            taken.c.version,
            func.sum(taken.c.inferences).label("inferences"),
            func.count().label("windows"),
            func.max(taken.c.id).label("last_id"),
        )
        .select_from(taken.outerjoin(devices, devices.c.device_id == taken.c.device_id))
        .group_by(*keys)
        .order_by(*keys)
    )


def _fold_rows(rows: Sequence[Any]) -> list[dict[str, Any]]:
    """The summed rows of :func:`_fold_query` (in key order) as ``usage_daily`` rows."""
    return [
        {
            "project": row.project,
            "day": int(row.day),
            "device_id": row.device_id,
            "skill": row.skill,
            "version": row.version,
            "inferences": int(row.inferences),
            "windows": int(row.windows),
        }
        for row in rows
    ]


def _rollups(daily: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The monthly sums per key, and the totals per project and day, of the daily sums."""
    months: dict[tuple[str, str, str, str, int], list[int]] = {}
    totals: dict[tuple[str, int], list[int]] = {}
    for row in daily:
        month = month_of(row["day"])
        key = (row["project"], row["device_id"], row["skill"], row["version"], month)
        for acc in (
            months.setdefault(key, [0, 0]),
            totals.setdefault((row["project"], row["day"]), [0, 0]),
        ):
            acc[0] += row["inferences"]
            acc[1] += row["windows"]
    monthly = [
        dict(zip(("project", "device_id", "skill", "version", "month"), k, strict=True))
        | {"inferences": v[0], "windows": v[1]}
        for k, v in sorted(months.items())
    ]
    per_day = [
        {"project": k[0], "day": k[1], "inferences": v[0], "windows": v[1]}
        for k, v in sorted(totals.items())
    ]
    return monthly, per_day


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
            rows = conn.execute(_fold_query(after, horizon, batch)).all()
            if not rows:
                return 0
            self._add_usage(conn, _fold_rows(rows))
            _advance(conn, after, max(int(row.last_id) for row in rows))
        return sum(int(row.windows) for row in rows)

    def _ensure_cursor(self, conn: Connection) -> None:
        stmt = self._dialect.insert(metering_cursor).values(id=_CURSOR_ID, telemetry_id=0)
        conn.execute(stmt.on_conflict_do_nothing(index_elements=["id"]))

    @staticmethod
    def _add_usage(conn: Connection, sums: list[dict[str, Any]]) -> None:
        monthly, totals = _rollups(sums)
        for table, rows in (
            (usage_daily, sums),
            (usage_monthly, monthly),
            (usage_daily_totals, totals),
        ):
            _upsert_adding(conn, table, rows)

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
        if not by:
            return self._project_rows(project, first_day, last_day)
        parts = [
            select(*_key_columns(table), table.c.inferences, table.c.windows).where(where)
            for table, where in _sources(split_period(first_day, last_day), project)
        ]
        both = union_all(*parts).subquery() if len(parts) > 1 else parts[0].subquery()
        keys = [both.c.project] + [both.c[_COLUMNS[k]] for k in USAGE_KEYS if k in by]
        query = (
            select(*keys, func.sum(both.c.inferences), func.sum(both.c.windows))
            .group_by(*keys)
            .order_by(*keys)
        )
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

    def _project_rows(
        self, project: str | None, first_day: int, last_day: int
    ) -> list[UsageRecord]:
        t = usage_daily_totals.c
        query = (
            select(t.project, func.sum(t.inferences), func.sum(t.windows))
            .where(t.day >= first_day, t.day <= last_day)
            .group_by(t.project)
            .order_by(t.project)
        )
        if project is not None:
            query = query.where(t.project == project)
        with self._tx() as conn:
            rows = conn.execute(query).all()
        return [UsageRecord(str(r[0]), "", "", "", int(r[1]), int(r[2])) for r in rows]

    def usage_totals(self, project: str | None, first_day: int, last_day: int) -> tuple[int, int]:
        """Inferences and windows of ``project`` (None: every one) over the days, both included.

        Raises:
            StoreError: The database failed.
        """
        rows = self._project_rows(project, first_day, last_day)
        return sum(r.inferences for r in rows), sum(r.windows for r in rows)

    def usage_page(
        self,
        project: str | None,
        first_day: int,
        last_day: int,
        *,
        after: UsageKey | None,
        limit: int,
    ) -> list[UsageRecord]:
        """The first ``limit`` rows per device, skill and version with keys above ``after``.

        Rows come in key order (project, device, skill, version), as :meth:`usage_rows`
        gives them; each source (whole months, edge days) is read in that order and
        stops after ``limit`` keys, so a page costs about ``limit`` rows a month or day.

        Raises:
            StoreError: The database failed.
        """
        streams = []
        with self._tx() as conn:
            for table, where in _sources(split_period(first_day, last_day), project):
                keys = _key_columns(table)
                above = true() if after is None else _after(keys, after, whole=project is None)
                query = (
                    select(*keys, func.sum(table.c.inferences), func.sum(table.c.windows))
                    .where(where, above)
                    .group_by(*keys)
                    .order_by(*keys)
                    .limit(limit)
                )
                found = [
                    ((str(r[0]), str(r[1]), str(r[2]), str(r[3])), int(r[4]), int(r[5]))
                    for r in conn.execute(query)
                ]
                streams.append((found, len(found) >= limit))
        return _merge(streams, limit)


_Stream = tuple[list[tuple[UsageKey, int, int]], bool]


def _merge(streams: Sequence[_Stream], limit: int) -> list[UsageRecord]:
    """The first ``limit`` keys of sorted sources, summed; exact up to the shortest cut one.

    A source cut at ``limit`` keys is complete only up to its last key, and has
    ``limit`` keys up to it: so the keys up to the least such last key are exact
    and there are at least ``limit`` of them.
    """
    cuts = [found[-1][0] for found, cut in streams if cut and found]
    bound = min(cuts) if cuts else None
    sums: dict[UsageKey, list[int]] = {}
    for found, _cut in streams:
        for key, inferences, windows in found:
            if bound is None or key <= bound:
                acc = sums.setdefault(key, [0, 0])
                acc[0] += inferences
                acc[1] += windows
    return [UsageRecord(*key, v[0], v[1]) for key, v in sorted(sums.items())[:limit]]


def _key_columns(table: Table) -> list[ColumnElement[Any]]:
    return [table.c.project, table.c.device_id, table.c.skill, table.c.version]


def _after(keys: list[ColumnElement[Any]], after: UsageKey, *, whole: bool) -> ColumnElement[bool]:
    """Keys above ``after``; within one project, without the project (the index then seeks)."""
    if whole:
        return tuple_(*keys) > tuple_(*map(literal, after))
    return tuple_(*keys[1:]) > tuple_(*map(literal, after[1:]))


def _sources(period: Period, project: str | None) -> list[tuple[Table, ColumnElement[bool]]]:
    """Where the period's counts are: its whole months, then its edge days."""
    found: list[tuple[Table, ColumnElement[bool]]] = []
    if period.months is not None:
        m = usage_monthly.c.month
        found.append((usage_monthly, and_(m >= period.months[0], m <= period.months[1])))
    if period.days:
        # ``day + 0``: not the primary key's (project, day) prefix, but the key order of
        # ix_usage_daily_by_key, so that grouping by key reads rows in order and can stop.
        day = usage_daily.c.day + 0
        found.append((usage_daily, or_(*(and_(day >= lo, day <= hi) for lo, hi in period.days))))
    if project is not None:
        found = [(table, and_(table.c.project == project, where)) for table, where in found]
    return found


#: Rows per upsert statement: seven parameters each, far below SQLite's variable cap.
_ROWS_PER_UPSERT: Final = 500


def _upsert_adding(conn: Connection, table: Table, rows: list[dict[str, Any]]) -> None:
    """Insert ``rows``, adding the counts of a row whose key is stored already.

    Written out and handed to the driver, many rows a statement: built through
    the SQL expression layer, a fold of a thousand devices' windows every few
    seconds took a twentieth of a busy hub's time. Every key appears once in
    ``rows`` (PostgreSQL refuses to update one row twice in a statement).
    """
    if not rows:
        return
    columns = [c.name for c in table.columns]
    keys = ", ".join(c.name for c in table.primary_key.columns)
    for start in range(0, len(rows), _ROWS_PER_UPSERT):
        chunk = rows[start : start + _ROWS_PER_UPSERT]
        # Only our own names and placeholders go into the text; every value is bound.
        sql = (
            f"INSERT INTO {table.name} ({', '.join(columns)}) "
            + values_clause(conn, len(columns), len(chunk))
            + f" ON CONFLICT ({keys}) DO UPDATE SET"
            f" inferences = {table.name}.inferences + excluded.inferences,"
            f" windows = {table.name}.windows + excluded.windows"
        )
        conn.exec_driver_sql(sql, tuple(row[c] for row in chunk for c in columns))


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
