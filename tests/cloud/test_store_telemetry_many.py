"""Cross-device telemetry batches in one transaction, on SQLite and PostgreSQL."""

from __future__ import annotations

from dataclasses import replace

import pytest

from cloud.errors import ValidationError
from cloud.store import Store, TelemetryRecord


def window(n: int, skill: str = "digits") -> TelemetryRecord:
    return TelemetryRecord(
        skill=skill,
        version="1.0.0",
        inferences=n,
        labelled=0,
        correct=0,
        latency_p50_ms=1.5,
        latency_p99_ms=4.0,
        window_start_ms=1000 * n,
        window_end_ms=1000 * n + 999,
        dropped_messages=0,
        metrics={"fps": 30.0},
        received_ms=5_000_000 + n,
    )


def test_one_batch_stores_windows_of_many_devices(store: Store) -> None:
    items = [(f"m-{i}", f"cam-{i % 3}", window(i + 1)) for i in range(9)]
    assert store.add_telemetry_many(items) == [True] * 9
    for device in ("cam-0", "cam-1", "cam-2"):
        stored = store.telemetry_for(device)
        assert [r.inferences for r in stored] == [
            i + 1 for i in range(9) if i % 3 == int(device[-1])
        ]
        assert all(r.device_id == device and r.metrics == {"fps": 30.0} for r in stored)


def test_duplicates_are_reported_and_not_stored_twice(store: Store) -> None:
    assert store.add_telemetry_many([("m-1", "cam-1", window(1))]) == [True]
    items = [
        ("m-1", "cam-1", window(1)),  # stored by an earlier batch
        ("m-2", "cam-2", window(2)),
        ("m-2", "cam-2", window(2)),  # repeated in this batch
    ]
    assert store.add_telemetry_many(items) == [False, True, False]
    assert sorted(r.inferences for r in store.telemetry_for()) == [1, 2]


@pytest.mark.parametrize(
    ("msg_id", "device_id", "record"),
    [
        ("bad id!", "cam-1", window(1)),
        ("m-x", "../cam", window(1)),
        ("m-x", "cam-1", window(1, skill="")),
        ("m-x", "cam-1", replace(window(1), correct=1)),  # more correct than labelled
        ("m-x", "cam-1", replace(window(1), latency_p50_ms=float("nan"))),
        ("m-x", "cam-1", replace(window(1), device_id="cam-2")),
    ],
)
def test_one_bad_item_refuses_the_batch_and_stores_nothing(
    store: Store, msg_id: str, device_id: str, record: TelemetryRecord
) -> None:
    with pytest.raises(ValidationError):
        Store.check_telemetry(msg_id, device_id, record)
    good = [("m-1", "cam-1", window(1)), ("m-2", "cam-2", window(2))]
    with pytest.raises(ValidationError):
        store.add_telemetry_many([good[0], (msg_id, device_id, record), good[1]])
    assert store.telemetry_for() == []
    assert store.add_telemetry_many(good) == [True, True]  # the good ones alone go through


def test_batch_cap_is_enforced_before_writing(store: Store) -> None:
    items = [(f"m-{i}", "cam-1", window(1)) for i in range(10_001)]
    with pytest.raises(ValidationError, match="over 10000"):
        store.add_telemetry_many(items)
    assert store.telemetry_for() == []


def test_an_empty_batch_is_a_no_op(store: Store) -> None:
    assert store.add_telemetry_many([]) == []
    assert store.telemetry_for() == []
