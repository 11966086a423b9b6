"""Metered usage: folding telemetry into daily counts exactly once, on SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import csv
import io

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import update

from cloud.errors import StoreError, ValidationError
from cloud.metering_loop import MeteringLoop
from cloud.service.metering import CSV_COLUMNS, DAY_MS, MeteringService
from cloud.store import Store, TelemetryRecord, open_store
from cloud.store import metering as store_metering
from cloud.store import telemetry as tele
from cloud.store.schema import devices

DAY0 = 20_000 * DAY_MS  # a UTC midnight
HOUR = 3_600_000


def window(skill: str, version: str, inferences: int, end_ms: int) -> TelemetryRecord:
    return TelemetryRecord(
        skill, version, inferences, 0, 0, 1.0, 2.0, window_start_ms=end_ms - 1000,
        window_end_ms=end_ms, received_ms=end_ms,
    )  # fmt: skip


def add(store: Store, device: str, *items: tuple[str, str, int, int]) -> None:
    base = len(store.telemetry_for(limit=100_000))
    store.add_telemetry_many(
        [(f"m-{base + i}", device, window(*item)) for i, item in enumerate(items)]
    )


def set_project(store: Store, device: str, project: str) -> None:
    with store.engine.begin() as conn:
        conn.execute(update(devices).where(devices.c.device_id == device).values(project=project))


@pytest.fixture
def metering(store: Store) -> MeteringService:
    for device in ("cam-1", "cam-2", "gate-1"):
        store.register_device(device, {}, {}, now_ms=DAY0)
    set_project(store, "gate-1", "acme")
    return MeteringService(store)


def totals(report: object) -> dict[tuple[str, str, str, str], tuple[int, int]]:
    return {
        (r.project, r.device_id, r.skill, r.version): (r.inferences, r.windows)
        for r in report.rows  # type: ignore[attr-defined]
    }


def test_fold_sums_per_day_device_skill_version(store: Store, metering: MeteringService) -> None:
    add(store, "cam-1", ("face", "1.0", 10, DAY0 + HOUR), ("face", "1.0", 5, DAY0 + 2 * HOUR))
    add(store, "cam-1", ("face", "2.0", 7, DAY0 + DAY_MS + HOUR))
    add(store, "cam-2", ("face", "1.0", 1, DAY0 + HOUR), ("plates", "1.0", 2, DAY0 + HOUR))
    assert metering.fold() == 5
    assert metering.fold() == 0
    day = metering.usage("default", DAY0, DAY0 + DAY_MS)
    assert totals(day) == {
        ("default", "cam-1", "face", "1.0"): (15, 2),
        ("default", "cam-2", "face", "1.0"): (1, 1),
        ("default", "cam-2", "plates", "1.0"): (2, 1),
    }
    assert day.total_inferences == 18 and day.total_windows == 4
    assert (day.first_day_ms, day.end_day_ms) == (DAY0, DAY0 + DAY_MS)
    both = metering.usage("default", DAY0, DAY0 + 2 * DAY_MS)
    assert both.total_inferences == 25
    by_skill = metering.usage("default", DAY0, DAY0 + 2 * DAY_MS, by=("skill",))
    assert totals(by_skill) == {
        ("default", "", "face", ""): (23, 4),
        ("default", "", "plates", ""): (2, 1),
    }


def test_period_resolution_is_a_utc_day(store: Store, metering: MeteringService) -> None:
    add(store, "cam-1", ("face", "1.0", 3, DAY0 + 23 * HOUR))
    metering.fold()
    # any period overlapping the day counts the day whole
    assert metering.usage("default", DAY0 + 22 * HOUR, DAY0 + 22 * HOUR + 1).total_inferences == 3
    assert metering.usage("default", DAY0 - DAY_MS, DAY0).total_inferences == 0
    assert metering.usage("default", DAY0 + DAY_MS, DAY0 + 2 * DAY_MS).total_inferences == 0


def test_usage_is_per_project(store: Store, metering: MeteringService) -> None:
    add(store, "cam-1", ("face", "1.0", 10, DAY0 + HOUR))
    add(store, "gate-1", ("face", "1.0", 4, DAY0 + HOUR))
    add(store, "ghost", ("face", "1.0", 1, DAY0 + HOUR))  # no device row: 'default'
    metering.fold()
    acme = metering.usage("acme", DAY0, DAY0 + DAY_MS)
    assert totals(acme) == {("acme", "gate-1", "face", "1.0"): (4, 1)}
    default = metering.usage("default", DAY0, DAY0 + DAY_MS)
    assert {r.device_id for r in default.rows} == {"cam-1", "ghost"}
    everyone = metering.usage(None, DAY0, DAY0 + DAY_MS, by=())
    assert totals(everyone) == {("acme", "", "", ""): (4, 1), ("default", "", "", ""): (11, 2)}
    assert metering.usage("nobody", DAY0, DAY0 + DAY_MS).rows == ()


def test_usage_csv_columns(store: Store, metering: MeteringService) -> None:
    add(store, "cam-1", ("face", "1.0", 10, DAY0 + HOUR), ("face", "2.0", 1, DAY0 + HOUR))
    metering.fold()
    lines = list(csv.reader(io.StringIO(metering.usage_csv("default", DAY0, DAY0 + DAY_MS))))
    assert tuple(lines[0]) == CSV_COLUMNS
    assert lines[1:] == [
        ["default", "cam-1", "face", "1.0", "10", "1"],
        ["default", "cam-1", "face", "2.0", "1", "1"],
    ]


def test_bad_arguments(metering: MeteringService) -> None:
    with pytest.raises(ValidationError, match="empty period"):
        metering.usage("default", DAY0, DAY0)
    with pytest.raises(ValidationError, match="break usage down"):
        metering.usage("default", DAY0, DAY0 + 1, by=("site",))
    with pytest.raises(ValidationError):
        metering.usage("default", -1, DAY0)
    with pytest.raises(ValidationError, match="batch"):
        metering.fold(batch=0)


def test_a_failed_fold_counts_nothing_twice(
    store: Store, metering: MeteringService, monkeypatch: pytest.MonkeyPatch
) -> None:
    add(store, "cam-1", *[("face", "1.0", i, DAY0 + i * 1000) for i in range(1, 8)])
    real = store_metering._advance
    calls = {"n": 0}

    def crash_on_second(conn: object, after: int, to: int) -> None:
        calls["n"] += 1
        if calls["n"] == 2:
            raise StoreError("the hub died mid-fold")
        real(conn, after, to)  # type: ignore[arg-type]

    monkeypatch.setattr(store_metering, "_advance", crash_on_second)
    with pytest.raises(StoreError, match="mid-fold"):
        metering.fold(batch=3)
    assert metering.usage("default", DAY0, DAY0 + DAY_MS).total_inferences == 1 + 2 + 3
    monkeypatch.setattr(store_metering, "_advance", real)
    assert metering.fold(batch=3) == 4
    assert metering.usage("default", DAY0, DAY0 + DAY_MS).total_inferences == sum(range(1, 8))
    assert metering.fold(batch=3) == 0


def test_a_fold_of_more_keys_than_one_statement_holds_adds_to_stored_rows(
    store: Store, metering: MeteringService
) -> None:
    keys = store_metering._ROWS_PER_UPSERT + 30
    for day in (0, 0, 1):  # the second pass adds to the rows the first one made
        add(store, "cam-1", *[("face", f"{v}.0", v + 1, DAY0 + day * DAY_MS) for v in range(keys)])
        assert metering.fold(batch=10_000) == keys
    report = metering.usage("default", DAY0, DAY0 + 2 * DAY_MS, by=("version",))
    assert totals(report) == {("default", "", "", f"{v}.0"): (3 * (v + 1), 3) for v in range(keys)}
    first_day = metering.usage("default", DAY0, DAY0 + DAY_MS)
    assert first_day.total_windows == 2 * keys
    assert first_day.total_inferences == 2 * sum(range(1, keys + 1))


@settings(
    max_examples=10, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(st.tuples(st.sampled_from(["cam-1", "gate-1"]), st.integers(0, 50)), max_size=20),
    st.integers(1, 6),
)
def test_folding_in_any_batches_matches_raw_telemetry(
    store: Store, metering: MeteringService, windows: list[tuple[str, int]], batch: int
) -> None:
    before = metering.usage(None, DAY0, DAY0 + DAY_MS, by=()).total_inferences
    for device, n in windows:
        add(store, device, ("face", "1.0", n, DAY0 + HOUR))
    metering.fold(batch=batch)
    after = metering.usage(None, DAY0, DAY0 + DAY_MS, by=()).total_inferences
    assert after - before == sum(n for _, n in windows)


def test_the_loop_folds(store: Store, metering: MeteringService) -> None:
    add(store, "cam-1", ("face", "1.0", 9, DAY0 + HOUR))
    loop = MeteringLoop(store, tick_s=0.01)
    assert loop.fold_once() == 1

    async def run_briefly() -> None:
        run = loop.factory()

        async def forever() -> None:
            await run()

        task = asyncio.create_task(forever())
        await asyncio.sleep(0.05)
        add(store, "cam-1", ("face", "1.0", 1, DAY0 + HOUR))
        for _ in range(200):
            await asyncio.sleep(0.01)
            if metering.usage("default", DAY0, DAY0 + DAY_MS).total_inferences == 10:
                break
        task.cancel()

    asyncio.run(run_briefly())
    assert metering.usage("default", DAY0, DAY0 + DAY_MS).total_inferences == 10


@pytest.mark.postgres
def test_a_row_committed_late_under_a_lower_id_is_not_skipped(pg_store_url: str) -> None:
    """PostgreSQL hands out ids at insert: the fold waits for inserts in flight, then folds both."""
    with open_store(pg_store_url) as store:
        metering = MeteringService(store)
        store.register_device("cam-1", {}, {}, now_ms=DAY0)
        slow = store.engine.connect()
        tx = slow.begin()
        rows = tele.prepare_rows("cam-1", [("late", window("face", "1.0", 5, DAY0 + HOUR))])
        tele.insert_telemetry(slow, rows)  # takes the lower id, not committed yet
        add(store, "cam-1", ("face", "1.0", 1, DAY0 + HOUR))  # higher id, committed

        async def fold_while_slow_commits() -> int:
            folding = asyncio.create_task(asyncio.to_thread(metering.fold))
            await asyncio.sleep(0.3)
            assert not folding.done()  # waits for the insert in flight
            tx.commit()
            return await folding

        assert asyncio.run(fold_while_slow_commits()) == 2
        slow.close()
        assert metering.usage("default", DAY0, DAY0 + DAY_MS).total_inferences == 6
