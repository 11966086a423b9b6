"""Usage rolled up per month: any period reads exactly what summing the days would, paged or not.

On SQLite and PostgreSQL: telemetry over four months is folded once, then
periods drawn by hypothesis are compared with a plain sum over ``usage_daily``.
"""

from __future__ import annotations

import random
from collections.abc import Iterator

import pytest
from alembic import command
from alembic.config import Config
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import func, select

from cloud.errors import ValidationError
from cloud.service.metering import DAY_MS, MeteringService
from cloud.store import Store, TelemetryRecord, open_store
from cloud.store.access_schema import usage_daily, usage_daily_totals, usage_monthly
from cloud.store.engine import MIGRATIONS_DIR, upgrade_schema
from cloud.store.usage_period import month_days, month_of, split_period

FIRST_DAY = 20_080  # 2024-12-23: the data spans parts of four months
DAYS = 75
Key = tuple[str, str, str, str]


def test_month_of_and_its_days() -> None:
    assert month_of(0) == 0
    assert month_days(0) == (0, 30)
    assert month_days(1) == (31, 58)  # February 1970
    assert month_of(20_089) == (2025 - 1970) * 12  # 2025-01-01
    assert month_days(month_of(20_089)) == (20_089, 20_119)
    assert month_days(11)[1] + 1 == month_days(12)[0]


@given(st.integers(0, 40_000), st.integers(0, 800))
def test_a_period_is_split_into_each_of_its_days_once(first: int, span: int) -> None:
    last = first + span
    period = split_period(first, last)
    days: list[int] = []
    if period.months is not None:
        lo, hi = period.months
        days += range(month_days(lo)[0], month_days(hi)[1] + 1)
    for lo, hi in period.days:
        days += range(lo, hi + 1)
    assert sorted(days) == list(range(first, last + 1))
    assert len(period.days) <= 2


def _window(skill: str, version: str, inferences: int, end_ms: int) -> TelemetryRecord:
    return TelemetryRecord(
        skill, version, inferences, 0, 0, 1.0, 2.0, window_start_ms=end_ms - 1000,
        window_end_ms=end_ms, received_ms=end_ms,
    )  # fmt: skip


def _fill(store: Store) -> MeteringService:
    rng = random.Random(5)
    for i in range(12):
        store.register_device(f"cam-{i:02d}", {}, {}, now_ms=FIRST_DAY * DAY_MS)
    items = []
    for n in range(900):
        device = f"cam-{rng.randrange(12):02d}"
        skill, version = rng.choice([("face", "1.0.0"), ("face", "1.1.0"), ("plates", "0.3.0")])
        end = (FIRST_DAY + rng.randrange(DAYS)) * DAY_MS + rng.randrange(DAY_MS)
        items.append((f"m-{n}", device, _window(skill, version, rng.randrange(0, 50), end)))
    store.add_telemetry_many(items)
    metering = MeteringService(store)
    metering.fold(batch=128)
    return metering


@pytest.fixture
def filled(store: Store) -> Iterator[tuple[Store, MeteringService]]:
    yield store, _fill(store)


def _summed_days(store: Store, first: int, last: int) -> dict[Key, tuple[int, int]]:
    u = usage_daily.c
    keys = (u.project, u.device_id, u.skill, u.version)
    query = (
        select(*keys, func.sum(u.inferences), func.sum(u.windows))
        .where(u.day >= first, u.day <= last)
        .group_by(*keys)
    )
    with store.engine.connect() as conn:
        return {tuple(r[:4]): (int(r[4]), int(r[5])) for r in conn.execute(query)}  # type: ignore[misc]


def _rows(rows: object) -> list[tuple[Key, tuple[int, int]]]:
    return [
        ((r.project, r.device_id, r.skill, r.version), (r.inferences, r.windows))
        for r in rows  # type: ignore[attr-defined]
    ]


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    start=st.integers(-5, DAYS + 5),
    span=st.integers(1, DAYS + 10),
    offsets=st.tuples(st.integers(0, DAY_MS - 1), st.integers(0, DAY_MS - 1)),
    limit=st.integers(1, 40),
)
def test_any_period_reads_what_the_days_sum_to(
    filled: tuple[Store, MeteringService],
    start: int,
    span: int,
    offsets: tuple[int, int],
    limit: int,
) -> None:
    store, metering = filled
    since = (FIRST_DAY + start) * DAY_MS + offsets[0]
    until = (FIRST_DAY + start + span) * DAY_MS + offsets[1]
    expected = _summed_days(store, since // DAY_MS, (until - 1) // DAY_MS)

    report = metering.usage("default", since, until)
    assert _rows(report.rows) == sorted(expected.items())
    assert report.total_inferences == sum(v[0] for v in expected.values())

    paged: list[tuple[Key, tuple[int, int]]] = []
    cursor = None
    while True:
        page = metering.usage_page("default", since, until, limit=limit, cursor=cursor)
        assert len(page.rows) <= limit
        assert page.total_inferences == report.total_inferences
        assert page.total_windows == sum(v[1] for v in expected.values())
        paged += _rows(page.rows)
        if page.next_cursor is None:
            break
        assert len(page.rows) == limit
        cursor = page.next_cursor
    assert paged == sorted(expected.items())

    by_skill = metering.usage(None, since, until, by=("skill",))
    skills: dict[str, int] = {}
    for (_p, _d, skill, _v), (inferences, _w) in expected.items():
        skills[skill] = skills.get(skill, 0) + inferences
    assert {r.skill: r.inferences for r in by_skill.rows} == skills
    assert sum(r.inferences for r in metering.usage(None, since, until, by=()).rows) == sum(
        skills.values()
    )


def test_the_csv_has_every_row_in_pages(filled: tuple[Store, MeteringService]) -> None:
    _store, metering = filled
    since, until = FIRST_DAY * DAY_MS, (FIRST_DAY + DAYS) * DAY_MS
    streamed = "".join(metering.usage_csv_chunks("default", since, until))
    assert streamed == metering.usage_csv("default", since, until)
    assert streamed.count("\n") == len(metering.usage("default", since, until).rows) + 1


def test_a_bad_cursor_or_limit_is_refused(filled: tuple[Store, MeteringService]) -> None:
    _store, metering = filled
    with pytest.raises(ValidationError, match="bad cursor"):
        metering.usage_page("default", 0, DAY_MS, cursor="bm90IGEgY3Vyc29y")
    with pytest.raises(ValidationError, match="bad limit"):
        metering.usage_page("default", 0, DAY_MS, limit=0)


def _rollups(store: Store) -> tuple[list[tuple[object, ...]], list[tuple[object, ...]]]:
    with store.engine.connect() as conn:
        monthly = [
            tuple(r)
            for r in conn.execute(select(usage_monthly).order_by(*usage_monthly.primary_key))
        ]
        totals = [
            tuple(r)
            for r in conn.execute(
                select(usage_daily_totals).order_by(*usage_daily_totals.primary_key)
            )
        ]
    return monthly, totals


def test_the_migration_fills_the_rollups_from_the_days(store_url: str) -> None:
    store = open_store(store_url)
    try:
        _fill(store)
        folded = _rollups(store)
        assert folded[0] and folded[1]
        config = Config()
        config.set_main_option("script_location", str(MIGRATIONS_DIR))
        with store.engine.begin() as conn:
            config.attributes["connection"] = conn
            command.downgrade(config, "0008")
        upgrade_schema(store.engine)
        assert _rollups(store) == folded
    finally:
        store.close()
