"""A usage report's period as whole UTC months and the days at its edges (pure).

Whole months are read from the monthly rollup, the edge days from the daily
one; together they cover each day of the period exactly once.
"""

from __future__ import annotations

import datetime as dt
import functools
from dataclasses import dataclass
from typing import Final

__all__ = ["Period", "month_days", "month_of", "split_period"]

_EPOCH: Final = dt.date(1970, 1, 1)


@functools.lru_cache(maxsize=4096)
def month_of(day: int) -> int:
    """The UTC month (months since 1970-01) that ``day`` (days since the epoch) falls in."""
    d = _EPOCH + dt.timedelta(days=day)
    return (d.year - 1970) * 12 + d.month - 1


def month_days(month: int) -> tuple[int, int]:
    """The first and the last day of ``month`` (months since 1970-01), in days since the epoch."""
    year, index = divmod(month, 12)
    first = dt.date(1970 + year, index + 1, 1)
    after = dt.date(1970 + year + (index + 1) // 12, (index + 1) % 12 + 1, 1)
    return (first - _EPOCH).days, (after - _EPOCH).days - 1


@dataclass(frozen=True)
class Period:
    """Days ``first_day`` to ``last_day`` as whole months plus the days at the edges.

    ``months`` are the first and last whole month (None: no whole month);
    ``days`` the day ranges (first, last; both included) outside them, at most two.
    """

    months: tuple[int, int] | None
    days: tuple[tuple[int, int], ...]


def split_period(first_day: int, last_day: int) -> Period:
    """Split the days ``first_day`` to ``last_day`` (both included) into months and edge days."""
    first_month, last_month = month_of(first_day), month_of(last_day)
    if month_days(first_month)[0] != first_day:
        first_month += 1
    if month_days(last_month)[1] != last_day:
        last_month -= 1
    if first_month > last_month:
        return Period(None, ((first_day, last_day),))
    lead = (first_day, month_days(first_month)[0] - 1)
    tail = (month_days(last_month)[1] + 1, last_day)
    return Period((first_month, last_month), tuple(r for r in (lead, tail) if r[0] <= r[1]))
