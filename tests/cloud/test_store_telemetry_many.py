"""Cross-device telemetry batches in one transaction, on SQLite and PostgreSQL."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from cloud.errors import ValidationError
from cloud.store import Store, TelemetryRecord
from cloud.store import telemetry as tele
from cloud.store.checks import MAX_METRICS
from cloud.store.telemetry import TelemetryWindow


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


def wire_window(n: int, device_id: str = "cam-1", **changes: object) -> TelemetryWindow:
    """A window as the ingest makes it from the wire: floats where the wire has doubles."""
    record = replace(window(n), **{"latency_p95_ms": 2.0, **changes})  # type: ignore[arg-type]
    return tele.record_window(f"m-{n}", device_id, record)


def test_a_batch_checked_at_once_gives_the_rows_one_by_one_checks_give() -> None:
    windows = [
        wire_window(1),
        wire_window(2, "cam-2", metrics={}),
        wire_window(3, metrics={"b/x": 2.5, "a": 1e300, "c": -0.0, "d.e_f-1": 1 / 3}),
        wire_window(4, latency_p50_ms=0.0, labelled=3, correct=2, errors=4),
    ]
    assert tele._well_formed(windows)  # the batch's own path, not the one-by-one fallback
    rows = tele.prepare_windows(windows)
    assert rows == [tele.check_window(w) for w in windows]
    assert rows[2][14] == json.dumps(
        {"b/x": 2.5, "a": 1e300, "c": -0.0, "d.e_f-1": 1 / 3}, sort_keys=True
    )
    # Ints where a row keeps floats (a record may hold them) are converted as before.
    mixed = [*windows, wire_window(5, latency_p99_ms=4, metrics={"fps": 30})]
    assert tele.prepare_windows(mixed)[-1][8] == 4.0
    assert tele.prepare_windows(mixed)[-1][14] == '{"fps": 30.0}'
    assert tele.prepare_windows(mixed)[:-1] == rows


@pytest.mark.parametrize(
    "bad",
    [
        tele.record_window("bad id!", "cam-1", window(9)),
        tele.record_window("m-9", "../cam", window(9)),
        wire_window(9, skill=""),
        wire_window(9, version="1.0 beta"),
        wire_window(9, inferences=-1),
        wire_window(9, dropped_messages=True),
        wire_window(9, window_end_ms=2**62 + 1),
        wire_window(9, correct=1),  # more correct than labelled
        wire_window(9, labelled=10),  # more labelled than inferences
        wire_window(9, errors=10),  # more errors than inferences
        wire_window(9, latency_p50_ms=float("nan")),
        wire_window(9, latency_p95_ms=float("inf")),
        wire_window(9, latency_p99_ms=-1.0),
        wire_window(9, metrics={f"m{i}": 1.0 for i in range(MAX_METRICS + 1)}),
        wire_window(9, metrics={"bad name": 1.0}),
        wire_window(9, metrics={"fps": float("nan")}),
        wire_window(9, metrics={"fps": "30"}),
    ],
)
def test_one_bad_window_in_a_batch_is_found_and_refuses_the_batch(
    store: Store, bad: TelemetryWindow
) -> None:
    good = [wire_window(1), wire_window(2, "cam-2")]
    with pytest.raises(ValidationError):
        Store.check_telemetry_window(bad)
    for window_ in good:
        Store.check_telemetry_window(window_)
    with pytest.raises(ValidationError):
        store.add_telemetry_windows([good[0], bad, good[1]])
    assert store.telemetry_for() == []
    assert store.add_telemetry_windows(good) == [True, True]


def test_windows_are_stored_and_deduplicated_as_records_are(store: Store) -> None:
    assert store.add_telemetry_windows([wire_window(1), wire_window(2), wire_window(1)]) == [
        True,
        True,
        False,
    ]
    assert store.add_telemetry_many([("m-2", "cam-1", window(2))]) == [False]
    stored = store.telemetry_for("cam-1")
    assert [(r.inferences, r.metrics) for r in stored] == [(1, {"fps": 30.0}), (2, {"fps": 30.0})]


def test_a_record_naming_another_device_is_refused() -> None:
    with pytest.raises(ValidationError, match="sent for 'cam-1'"):
        tele.record_window("m-1", "cam-1", replace(window(1), device_id="cam-2"))
