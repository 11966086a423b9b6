"""Metered usage of the console: inferences per project, device, skill and version.

Usage comes from the telemetry windows devices send (each window counted
once: its message id is unique), folded per UTC day by the leader's
metering loop (:mod:`cloud.metering_loop`, or :meth:`MeteringService.fold`).
So the resolution of a report's period is a UTC day: a period covers every
day it overlaps, whole, by the day a window *ended* in. Windows not folded
yet (the last few seconds) are not in a report.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from dataclasses import dataclass

from cloud.errors import ValidationError
from cloud.store import Store
from cloud.store import checks as check
from cloud.store.metering import DAY_MS, USAGE_KEYS, MeteringTables, UsageRecord, day_of

__all__ = ["CSV_COLUMNS", "DAY_MS", "MeteringService", "UsageReport", "UsageRow"]

#: One line of a usage report: already a frozen record the store computes.
UsageRow = UsageRecord

#: The columns of :meth:`MeteringService.usage_csv`, in order.
CSV_COLUMNS = ("project", "device_id", "skill", "version", "inferences", "windows")

#: Rows one fold transaction takes at most.
FOLD_BATCH = 5000


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
        check.counter(since_ms, "since_ms")
        check.counter(until_ms, "until_ms")
        if until_ms <= since_ms:
            raise ValidationError(f"empty period: until {until_ms} is not after since {since_ms}")
        if project is not None:
            check.name(project, "project")
        first, last = day_of(since_ms), day_of(until_ms - 1)
        rows = tuple(self._tables.usage_rows(project, first, last, _by(by)))
        total = sum(r.inferences for r in rows)
        return UsageReport(rows, total, first * DAY_MS, (last + 1) * DAY_MS)

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
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(CSV_COLUMNS)
        for r in report.rows:
            writer.writerow((r.project, r.device_id, r.skill, r.version, r.inferences, r.windows))
        return out.getvalue()
