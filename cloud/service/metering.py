"""Metered usage of the console: inferences per project, device, skill and version.

Usage comes from the telemetry windows devices send (each window counted
once: its message id is unique), folded per UTC day (and month) by the leader's
metering loop (:mod:`cloud.metering_loop`, or :meth:`MeteringService.fold`).
So the resolution of a report's period is a UTC day: a period covers every
day it overlaps, whole, by the day a window *ended* in. Windows not folded
yet (the last few seconds) are not in a report.
"""

from __future__ import annotations

import base64
import binascii
import csv
import io
import json
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

from cloud.errors import ValidationError
from cloud.store import Store
from cloud.store import checks as check
from cloud.store.metering import (
    DAY_MS,
    USAGE_KEYS,
    MeteringTables,
    UsageKey,
    UsageRecord,
    day_of,
)

__all__ = [
    "CSV_COLUMNS",
    "DAY_MS",
    "MAX_USAGE_PAGE",
    "MeteringService",
    "UsagePage",
    "UsageReport",
    "UsageRow",
]

#: One line of a usage report: already a frozen record the store computes.
UsageRow = UsageRecord

#: The columns of :meth:`MeteringService.usage_csv`, in order.
CSV_COLUMNS = ("project", "device_id", "skill", "version", "inferences", "windows")

#: Rows one fold transaction takes at most.
FOLD_BATCH = 5000
#: The most rows one page of a usage report holds (and the rows a CSV download reads at once).
MAX_USAGE_PAGE = 5000
_CURSOR_PREFIX = "u1:"


@dataclass(frozen=True)
class UsageReport:
    """Usage over a period; ``first_day_ms``/``end_day_ms`` are the whole UTC days it covers."""

    rows: tuple[UsageRow, ...]
    total_inferences: int
    first_day_ms: int = 0
    end_day_ms: int = 0

    @property
    def total_windows(self) -> int:
        """How many telemetry windows the report counts."""
        return sum(r.windows for r in self.rows)


@dataclass(frozen=True)
class UsagePage:
    """One page of a usage report per device, skill and version, with the period's totals.

    ``rows`` come in (project, device, skill, version) order; ``next_cursor`` is
    None on the last page. The totals count the whole period, every page alike.
    """

    rows: tuple[UsageRow, ...]
    total_inferences: int
    total_windows: int
    first_day_ms: int
    end_day_ms: int
    next_cursor: str | None


def encode_cursor(key: UsageKey) -> str:
    """The opaque cursor of the page after the row of ``key``."""
    raw = (_CURSOR_PREFIX + json.dumps(list(key), separators=(",", ":"))).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str) -> UsageKey:
    """The row key a cursor continues after.

    Raises:
        ValidationError: Not a cursor this service handed out.
    """
    try:
        padded = cursor + "=" * (-len(cursor) % 4)
        text = base64.urlsafe_b64decode(padded.encode("ascii")).decode()
        key = json.loads(text[len(_CURSOR_PREFIX) :]) if text.startswith(_CURSOR_PREFIX) else None
    except (ValueError, binascii.Error, UnicodeError):
        key = None
    if not (isinstance(key, list) and len(key) == 4 and all(isinstance(k, str) for k in key)):
        raise ValidationError("bad cursor: pass back the next_cursor of a page unchanged")
    return (key[0], key[1], key[2], key[3])


def _days(since_ms: int, until_ms: int, project: str | None) -> tuple[int, int]:
    """The first and last UTC day of a period, checked.

    Raises:
        ValidationError: A malformed or empty period, or a malformed project.
    """
    check.counter(since_ms, "since_ms")
    check.counter(until_ms, "until_ms")
    if until_ms <= since_ms:
        raise ValidationError(f"empty period: until {until_ms} is not after since {since_ms}")
    if project is not None:
        check.name(project, "project")
    return day_of(since_ms), day_of(until_ms - 1)


def _by(by: Sequence[str]) -> tuple[str, ...]:
    if isinstance(by, str):
        by = (by,)
    unknown = [k for k in by if k not in USAGE_KEYS]
    if unknown:
        raise ValidationError(
            f"cannot break usage down by {', '.join(map(repr, unknown))}: "
            f"use any of {', '.join(USAGE_KEYS)}"
        )
    return tuple(k for k in USAGE_KEYS if k in by)


class MeteringService:
    """Folds telemetry into daily usage and reports it per project."""

    def __init__(self, store: Store) -> None:
        """Meter the telemetry of ``store``."""
        self._tables = MeteringTables(store.engine)

    def fold(self, batch: int = FOLD_BATCH) -> int:
        """Fold every telemetry row not folded yet into daily usage, ``batch`` rows a transaction.

        Safe to run again after a failure (a failed batch leaves nothing behind) and
        from several processes (they take turns on the cursor row).

        Returns:
            How many telemetry rows were folded.

        Raises:
            ValidationError: ``batch`` is not in 1..100000.
            StoreError: The store failed; the batches folded before it stay folded.
        """
        if isinstance(batch, bool) or not isinstance(batch, int) or not 1 <= batch <= 100_000:
            raise ValidationError(f"bad fold batch {batch!r}: expected 1 to 100000 rows")
        return self._tables.fold_usage(batch)

    def usage(
        self,
        project: str | None,
        since_ms: int,
        until_ms: int,
        *,
        by: Sequence[str] = USAGE_KEYS,
    ) -> UsageReport:
        """Inferences in ``[since_ms, until_ms)``, whole UTC days, broken down by ``by``.

        Args:
            project: One project (None: every project, each in its own rows).
            since_ms: The period's start; the UTC day it falls in counts whole.
            until_ms: The period's end (excluded); the UTC day of ``until_ms - 1`` counts whole.
            by: Any of ``device``, ``skill`` and ``version``; keys left out are '' in the rows.

        Raises:
            ValidationError: A malformed or empty period, or an unknown key in ``by``.
            StoreError: The store failed.
        """
        first, last = _days(since_ms, until_ms, project)
        rows = tuple(self._tables.usage_rows(project, first, last, _by(by)))
        total = sum(r.inferences for r in rows)
        return UsageReport(rows, total, first * DAY_MS, (last + 1) * DAY_MS)

    def usage_page(
        self,
        project: str | None,
        since_ms: int,
        until_ms: int,
        *,
        limit: int = 500,
        cursor: str | None = None,
    ) -> UsagePage:
        """One page of :meth:`usage` per device, skill and version, and the period's totals.

        A page costs about ``limit`` rows per month and edge day of the period,
        however many devices there are; the totals one row per day.

        Args:
            project: One project (None: every project, each in its own rows).
            since_ms: The period's start, as :meth:`usage`.
            until_ms: The period's end (excluded), as :meth:`usage`.
            limit: Rows per page, 1 to :data:`MAX_USAGE_PAGE`.
            cursor: The ``next_cursor`` of the previous page (None: the first page).

        Raises:
            ValidationError: A malformed or empty period, limit or cursor.
            StoreError: The store failed.
        """
        if (
            isinstance(limit, bool)
            or not isinstance(limit, int)
            or not 1 <= limit <= MAX_USAGE_PAGE
        ):
            raise ValidationError(f"bad limit {limit!r}: expected 1 to {MAX_USAGE_PAGE}")
        first, last = _days(since_ms, until_ms, project)
        after = None if cursor is None else decode_cursor(cursor)
        rows = self._tables.usage_page(project, first, last, after=after, limit=limit + 1)
        inferences, windows = self._tables.usage_totals(project, first, last)
        page = tuple(rows[:limit])
        more = len(rows) > limit
        last_row = page[-1] if page else None
        next_cursor = (
            encode_cursor((last_row.project, last_row.device_id, last_row.skill, last_row.version))
            if more and last_row
            else None
        )
        return UsagePage(
            page, inferences, windows, first * DAY_MS, (last + 1) * DAY_MS, next_cursor
        )

    def usage_csv_chunks(self, project: str | None, since_ms: int, until_ms: int) -> Iterator[str]:
        """:meth:`usage_csv` per device, skill and version, a page of lines at a time.

        The header comes first, checked: a bad period raises before anything is
        yielded. Each page is read when the one before was taken, so a fold in
        between may already count in the later pages.

        Raises:
            ValidationError: A malformed or empty period.
            StoreError: The store failed.
        """
        page = self.usage_page(project, since_ms, until_ms, limit=MAX_USAGE_PAGE)
        return self._csv_pages(page, project, since_ms, until_ms)

    def _csv_pages(
        self, page: UsagePage, project: str | None, since_ms: int, until_ms: int
    ) -> Iterator[str]:
        yield _csv_text([CSV_COLUMNS])
        while True:
            yield _csv_text(
                (r.project, r.device_id, r.skill, r.version, r.inferences, r.windows)
                for r in page.rows
            )
            if page.next_cursor is None:
                return
            page = self.usage_page(
                project, since_ms, until_ms, limit=MAX_USAGE_PAGE, cursor=page.next_cursor
            )

    def usage_csv(
        self,
        project: str | None,
        since_ms: int,
        until_ms: int,
        *,
        by: Sequence[str] = USAGE_KEYS,
    ) -> str:
        """:meth:`usage` as CSV text: a header of :data:`CSV_COLUMNS`, then one line a row.

        Raises:
            ValidationError: As :meth:`usage`.
            StoreError: The store failed.
        """
        report = self.usage(project, since_ms, until_ms, by=by)
        lines = ((r.project, r.device_id, r.skill, r.version, r.inferences, r.windows)
                 for r in report.rows)  # fmt: skip
        return _csv_text([CSV_COLUMNS, *lines])


def _csv_text(rows: Iterable[Sequence[object]]) -> str:
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(rows)
    return out.getvalue()
