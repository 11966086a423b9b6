"""Telemetry rows: idempotent inserts and the per-device summary.

Deduplication rests on the unique constraint on ``msg_id`` and
``INSERT ... ON CONFLICT DO NOTHING``, so it holds across hub processes
inserting at the same time, not only within one.
"""

from __future__ import annotations

import functools
import json
import math
import operator
from collections.abc import Callable, Iterable, Sequence
from itertools import chain
from typing import Any

from sqlalchemy import ColumnElement, Connection, Row, func, select

from cloud.errors import StoreError, ValidationError
from cloud.store import checks as check
from cloud.store.base import values_clause
from cloud.store.records import DeviceSkillSummary, TelemetryRecord
from cloud.store.schema import telemetry

__all__ = [
    "WINDOW_FIELDS",
    "TelemetryRow",
    "TelemetryWindow",
    "check_window",
    "insert_telemetry",
    "prepare_row",
    "prepare_rows",
    "prepare_windows",
    "record_window",
    "select_telemetry",
    "summarise",
    "window_fields",
]

MAX_TELEMETRY_ROWS = 100_000
#: ``json.dumps(..., sort_keys=True)`` without making an encoder per call (one per window).
_metrics_encoder = json.JSONEncoder(sort_keys=True).encode


def _metrics_json(metrics: dict[str, float]) -> str:
    return _metrics_encoder({k: float(v) for k, v in metrics.items()}) if metrics else "{}"


#: A window as a table row: its values in the order of ``_COLUMNS``, the message id first.
TelemetryRow = tuple[Any, ...]
#: A window's scalar fields in column order. :class:`TelemetryRecord` and the wire's
#: ``Telemetry`` both name them so: :data:`window_fields` reads them off either in one call.
WINDOW_FIELDS = (
    "skill",
    "version",
    "inferences",
    "labelled",
    "correct",
    "latency_p50_ms",
    "latency_p99_ms",
    "latency_p95_ms",
    "errors",
    "window_start_ms",
    "window_end_ms",
    "dropped_messages",
)
window_fields = operator.attrgetter(*WINDOW_FIELDS)
#: A window to store, not yet checked: a row whose metrics are still a mapping,
#: ``(msg_id, device_id, *WINDOW_FIELDS, metrics, received_ms)``.
TelemetryWindow = tuple[Any, ...]
_METRICS = 2 + len(WINDOW_FIELDS)
#: Where the counters and the latencies sit in a window.
_COUNTERS = (4, 5, 6, 10, 11, 12, 13, _METRICS + 1)
_LATENCIES = (7, 8, 9)


def record_window(msg_id: str, device_id: str, record: TelemetryRecord) -> TelemetryWindow:
    """The window to store for ``record`` of ``device_id``, not yet checked.

    Raises:
        ValidationError: The record names another device.
    """
    if record.device_id and record.device_id != device_id:
        raise ValidationError(f"telemetry of {record.device_id!r} sent for {device_id!r}")
    return (msg_id, device_id, *window_fields(record), record.metrics, record.received_ms)


def prepare_row(msg_id: str, device_id: str, record: TelemetryRecord) -> TelemetryRow:
    """Validate one telemetry window of one device and turn it into a table row.

    Raises:
        ValidationError: The message id, the device id or the window is malformed,
            or the record names another device.
    """
    check.device_id(device_id)
    check.msg_id(msg_id)
    check.telemetry(record)
    if record.device_id and record.device_id != device_id:
        raise ValidationError(f"telemetry of {record.device_id!r} sent for {device_id!r}")
    return (
        msg_id,
        device_id,
        record.skill,
        record.version,
        record.inferences,
        record.labelled,
        record.correct,
        float(record.latency_p50_ms),
        float(record.latency_p99_ms),
        float(record.latency_p95_ms),
        record.errors,
        record.window_start_ms,
        record.window_end_ms,
        record.dropped_messages,
        _metrics_json(record.metrics),
        record.received_ms,
    )


def prepare_windows(windows: Sequence[TelemetryWindow]) -> list[TelemetryRow]:
    """Validate windows of any devices and turn them into table rows.

    The hub's ingest stores thousands of windows a second, so the batch is checked
    column by column, each distinct name once; only a batch that fails that is
    checked window by window, which says what is wrong with the first bad one.

    Raises:
        ValidationError: A window is malformed or the batch is over the cap.
    """
    _check_batch_size(len(windows))
    if not windows:
        return []
    if _well_formed(windows):
        return [(*w[:_METRICS], _checked_metrics_json(w[_METRICS]), w[-1]) for w in windows]
    return [check_window(w) for w in windows]


def check_window(window: TelemetryWindow) -> TelemetryRow:
    """Validate one window as :func:`prepare_windows` would; its row.

    Raises:
        ValidationError: The message id, the device id or the window is malformed.
    """
    msg_id, device_id, *values, metrics, received_ms = window
    fields = dict(zip(WINDOW_FIELDS, values, strict=True))
    record = TelemetryRecord(**fields, metrics=metrics, received_ms=received_ms)
    return prepare_row(msg_id, device_id, record)


def _well_formed(windows: Sequence[TelemetryWindow]) -> bool:
    """Whether every window passes what :func:`prepare_row` checks, its values of the
    types a row keeps (counters ints, latencies and metric values floats)."""
    columns = list(zip(*windows, strict=True))
    inferences, labelled, correct, errors = (columns[i] for i in (4, 5, 6, 10))
    return (
        _counters_fit(chain.from_iterable(columns[i] for i in _COUNTERS))
        and all(map(operator.le, correct, labelled))
        and all(map(operator.le, labelled, inferences))
        and all(map(operator.le, errors, inferences))
        and _latencies_fit(chain.from_iterable(columns[i] for i in _LATENCIES))
        and _metrics_fit(columns[_METRICS])
        and _all_pass(check.msg_id, columns[0])
        and _all_pass(check.device_id, columns[1])
        and _all_pass(functools.partial(check.name, what="skill name"), columns[2])
        and _all_pass(check.version, columns[3])
    )


def _counters_fit(values: Iterable[Any]) -> bool:
    counters = list(values)
    return (
        set(map(type, counters)) == {int}
        and min(counters) >= 0
        and max(counters) <= check.MAX_COUNTER
    )


def _latencies_fit(values: Iterable[Any]) -> bool:
    floats = list(values)
    return (
        set(map(type, floats)) == {float} and all(map(math.isfinite, floats)) and min(floats) >= 0
    )


def _metrics_fit(maps: Sequence[Any]) -> bool:
    if set(map(type, maps)) != {dict} or max(map(len, maps)) > check.MAX_METRICS:
        return False
    values = list(chain.from_iterable(m.values() for m in maps))
    return (
        set(map(type, values)) <= {float}
        and all(map(math.isfinite, values))
        and _all_pass(check.metric_name, chain.from_iterable(maps))
    )


def _checked_metrics_json(metrics: dict[str, float]) -> str:
    """:func:`_metrics_json` of metrics :func:`_metrics_fit` passed, a few times faster.

    Their names need no escaping (letters, digits and ``._/-``) and their values are
    finite floats, which ``json`` writes as ``float.__repr__`` does.
    """
    if not metrics:
        return "{}"
    return "{" + ", ".join([f'"{k}": {_float_text(metrics[k])}' for k in sorted(metrics)]) + "}"


_float_text = float.__repr__


def _all_pass(check_one: Callable[[Any], object], values: Iterable[Any]) -> bool:
    """Whether ``check_one`` passes every distinct value (all str: others are refused)."""
    every = list(values)
    if every and set(map(type, every)) != {str}:
        return False
    try:
        for value in set(every):
            check_one(value)
    except ValidationError:
        return False
    return True


def _check_batch_size(count: int) -> None:
    if count > check.MAX_TELEMETRY_BATCH:
        raise ValidationError(f"telemetry batch over {check.MAX_TELEMETRY_BATCH} items")


def prepare_rows(
    device_id: str, items: Sequence[tuple[str, TelemetryRecord]]
) -> list[TelemetryRow]:
    """Validate telemetry windows of one device and turn them into table rows.

    Raises:
        ValidationError: A message id, the device id or a window is malformed,
            or the batch is over the cap.
    """
    check.device_id(device_id)
    _check_batch_size(len(items))
    return prepare_windows([record_window(msg_id, device_id, r) for msg_id, r in items])


#: Rows per INSERT statement: 16 parameters each stays far below SQLite's variable cap.
_ROWS_PER_STATEMENT = 500
_COLUMNS = ("msg_id", "device_id", *WINDOW_FIELDS, "metrics", "received_ms")


def insert_telemetry(conn: Connection, rows: list[TelemetryRow]) -> list[bool]:
    """Insert rows, skipping message ids already stored or repeated in ``rows``.

    The statements are written out here and handed to the driver as they are:
    the group commit inserts thousands of windows a second, and building them
    through the SQL expression layer was most of the hub's time spent storing.
    On SQLite the ids already stored are looked up first rather than the new
    ones returned by the insert: its driver hands the interpreter lock back and
    forth for every returned row, and the hub's event loop keeps it busy, so a
    ``RETURNING`` of hundreds of rows stretched each commit tenfold. The lookup is
    exact there because writers hold the database's write lock from ``BEGIN
    IMMEDIATE``. PostgreSQL lets another hub process insert the same id between a
    lookup and the insert, so there the insert itself says which rows it stored.

    Returns:
        For each row, True when it is stored by this transaction, False for a
        duplicate.
    """
    fresh: dict[str, TelemetryRow] = {}
    for row in rows:
        fresh.setdefault(row[0], row)
    if conn.dialect.name != "sqlite":
        return _insert_returning(conn, rows, fresh)
    mark = "?"  # SQLite's placeholder, for the lookup's IN list
    ids = list(fresh)
    stored_before: set[str] = set()
    for start in range(0, len(ids), _ROWS_PER_STATEMENT):
        some = ids[start : start + _ROWS_PER_STATEMENT]
        # Only our own names and placeholders go into the text; every value is bound.
        sql = (
            f"SELECT msg_id FROM {telemetry.name} WHERE msg_id IN "  # noqa: S608
            f"({', '.join([mark] * len(some))})"
        )
        stored_before.update(conn.exec_driver_sql(sql, tuple(some)).scalars())
    values = [row for msg_id, row in fresh.items() if msg_id not in stored_before]
    for start in range(0, len(values), _ROWS_PER_STATEMENT):
        chunk = values[start : start + _ROWS_PER_STATEMENT]
        params = tuple(chain.from_iterable(chunk))
        conn.exec_driver_sql(_insert_sql(conn, len(chunk), False), params)
    return [fresh[row[0]] is row and row[0] not in stored_before for row in rows]


def _insert_sql(conn: Connection, rows: int, returning: bool) -> str:
    # Only our own names and placeholders go into the text; every value is bound.
    return (
        f"INSERT INTO {telemetry.name} ({', '.join(_COLUMNS)}) "
        + values_clause(conn, len(_COLUMNS), rows)
        + " ON CONFLICT (msg_id) DO NOTHING"
        + (" RETURNING msg_id" if returning else "")
    )


def _insert_returning(
    conn: Connection, rows: list[TelemetryRow], fresh: dict[str, TelemetryRow]
) -> list[bool]:
    stored: set[str] = set()
    values = list(fresh.values())
    for start in range(0, len(values), _ROWS_PER_STATEMENT):
        chunk = values[start : start + _ROWS_PER_STATEMENT]
        params = tuple(chain.from_iterable(chunk))
        stored.update(conn.exec_driver_sql(_insert_sql(conn, len(chunk), True), params).scalars())
    return [row[0] in stored and fresh[row[0]] is row for row in rows]


def _to_record(row: Row[Any]) -> TelemetryRecord:
    try:
        metrics = {str(k): float(v) for k, v in json.loads(row.metrics).items()}
    except (ValueError, TypeError, AttributeError) as exc:
        raise StoreError(f"telemetry {row.msg_id!r} has corrupt metrics: {exc}") from exc
    return TelemetryRecord(
        skill=row.skill,
        version=row.version,
        inferences=row.inferences,
        labelled=row.labelled,
        correct=row.correct,
        latency_p50_ms=row.latency_p50_ms,
        latency_p99_ms=row.latency_p99_ms,
        latency_p95_ms=row.latency_p95_ms,
        errors=row.errors,
        window_start_ms=row.window_start_ms,
        window_end_ms=row.window_end_ms,
        dropped_messages=row.dropped_messages,
        metrics=metrics,
        received_ms=row.received_ms,
        device_id=row.device_id,
    )


def select_telemetry(
    conn: Connection,
    device_id: str | None,
    skill: str | None,
    limit: int,
    *,
    where: ColumnElement[bool] | None = None,
) -> list[TelemetryRecord]:
    """Read the latest ``limit`` windows (that match ``where``, if given), oldest first.

    Raises:
        StoreError: A stored row is corrupt.
    """
    query = select(telemetry)
    if where is not None:
        query = query.where(where)
    if device_id is not None:
        query = query.where(telemetry.c.device_id == device_id)
    if skill is not None:
        query = query.where(telemetry.c.skill == skill)
    query = query.order_by(telemetry.c.window_end_ms.desc(), telemetry.c.id.desc()).limit(limit)
    return [_to_record(row) for row in reversed(conn.execute(query).all())]


def summarise(conn: Connection) -> list[DeviceSkillSummary]:
    """Sum telemetry per device and skill, with the latest window's version and p50."""
    key = (telemetry.c.device_id, telemetry.c.skill)
    totals = select(
        *key,
        func.sum(telemetry.c.inferences).label("inferences"),
        func.sum(telemetry.c.labelled).label("labelled"),
        func.sum(telemetry.c.correct).label("correct"),
        func.count().label("windows"),
    ).group_by(*key)
    rank = (
        func.row_number()
        .over(partition_by=key, order_by=(telemetry.c.window_end_ms.desc(), telemetry.c.id.desc()))
        .label("rank")
    )
    ranked = select(*key, telemetry.c.version, telemetry.c.latency_p50_ms, rank).subquery()
    latest = {
        (row.device_id, row.skill): row
        for row in conn.execute(select(ranked).where(ranked.c.rank == 1))
    }
    summaries = []
    for row in conn.execute(totals.order_by(*key)):
        last = latest[(row.device_id, row.skill)]
        labelled, correct = int(row.labelled), int(row.correct)
        summaries.append(
            DeviceSkillSummary(
                device_id=row.device_id,
                skill=row.skill,
                version=last.version,
                inferences=int(row.inferences),
                labelled=labelled,
                correct=correct,
                accuracy=correct / labelled if labelled else None,
                latency_p50_ms=float(last.latency_p50_ms),
                windows=int(row.windows),
            )
        )
    return summaries
