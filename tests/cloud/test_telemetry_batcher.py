"""Telemetry group commit: batching, answers only after commit, failures, and HubCore's use."""

from __future__ import annotations

import asyncio
import sqlite3
import time
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path

import pytest

from cloud.errors import StoreError, ValidationError
from cloud.hubcore import HubCore, HubLimits
from cloud.store import Store, TelemetryRecord, open_store
from cloud.store.telemetry import record_window
from cloud.telemetry_batcher import BatcherClosedError, BatcherSettings, TelemetryBatcher
from protos import ProtocolError, kind_of, make_envelope, pb
from skills.trust import TrustRepository
from tests.support import async_wait_until


def window(n: int) -> TelemetryRecord:
    return TelemetryRecord(
        skill="digits",
        version="1.0.0",
        inferences=n,
        labelled=0,
        correct=0,
        latency_p50_ms=1.0,
        latency_p99_ms=2.0,
        window_start_ms=0,
        window_end_ms=n,
        dropped_messages=0,
        metrics={},
        received_ms=1,
    )


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Iterator[Store]:
    opened = open_store(f"sqlite:///{tmp_path / 'hub.db'}")
    yield opened
    opened.close()


def batcher_for(store: Store, **settings: float) -> TelemetryBatcher:
    return TelemetryBatcher(
        store.add_telemetry_windows,
        store.check_telemetry_window,
        BatcherSettings(**settings),  # type: ignore[arg-type]
    )


def test_concurrent_devices_share_one_transaction(store: Store) -> None:
    batcher = batcher_for(store, linger_s=0.2)

    async def main() -> list[bool]:
        results = await asyncio.gather(
            *(batcher.submit(f"m-{i}", f"cam-{i}", window(i + 1)) for i in range(50))
        )
        await batcher.close()
        return results

    assert asyncio.run(main()) == [True] * 50
    assert (batcher.batches, batcher.items) == (1, 50)
    assert sorted(r.inferences for r in store.telemetry_for()) == list(range(1, 51))


def test_a_full_batch_is_written_without_waiting_for_the_linger(sqlite_store: Store) -> None:
    batcher = batcher_for(sqlite_store, max_items=4, linger_s=1.0)

    async def main() -> float:
        start = time.monotonic()
        await asyncio.gather(*(batcher.submit(f"m-{i}", "cam-1", window(1)) for i in range(8)))
        return time.monotonic() - start

    assert asyncio.run(main()) < 0.5
    assert (batcher.batches, batcher.items) == (2, 8)


def test_a_lone_item_is_written_after_the_linger_and_is_then_durable(
    sqlite_store: Store,
) -> None:
    batcher = batcher_for(sqlite_store, linger_s=0.02)

    async def main() -> bool:
        stored = await batcher.submit("m-1", "cam-1", window(7))
        # The answer comes after the commit: a fresh read already sees the row.
        assert [r.inferences for r in sqlite_store.telemetry_for("cam-1")] == [7]
        return stored

    assert asyncio.run(main()) is True
    assert asyncio.run(batcher.submit("m-1", "cam-1", window(7))) is False  # a resend


def test_one_submitter_s_items_share_a_transaction_and_get_a_verdict_each(
    sqlite_store: Store,
) -> None:
    batcher = batcher_for(sqlite_store, linger_s=0.0, max_items=8)
    bad = replace(window(1), skill="")

    async def main() -> list[object]:
        first = await batcher.submit_many([record_window("m-1", "cam-1", window(1))])
        verdicts = await batcher.submit_many(
            [
                record_window("m-2", "cam-1", window(2)),
                record_window("m-1", "cam-1", window(1)),
                record_window("m-3", "cam-2", bad),
            ]
        )
        with pytest.raises(ValidationError):
            await batcher.submit_many(
                [record_window(f"m-{i}", "cam-3", window(i)) for i in range(9)]
            )
        await batcher.close()
        return [*first, *verdicts]

    stored, fresh, again, refused = asyncio.run(main())
    assert (stored, fresh, again) == (True, True, False)  # the resend is a duplicate
    assert isinstance(refused, ValidationError)
    assert batcher.batches == 2 and batcher.items == 4
    assert sorted(r.window_end_ms for r in sqlite_store.telemetry_for()) == [1, 2]


def test_a_bad_item_is_refused_alone(sqlite_store: Store) -> None:
    batcher = batcher_for(sqlite_store, linger_s=0.05)
    bad = replace(window(1), correct=1)  # more correct than labelled

    async def main() -> Sequence[object]:
        return await asyncio.gather(
            batcher.submit("m-1", "cam-1", window(1)),
            batcher.submit("m-2", "cam-2", bad),
            batcher.submit("bad id!", "cam-3", window(3)),
            batcher.submit("m-4", "cam-4", window(4)),
            return_exceptions=True,
        )

    first, second, third, fourth = asyncio.run(main())
    assert (first, fourth) == (True, True)
    assert isinstance(second, ValidationError) and isinstance(third, ValidationError)
    assert sorted(r.device_id for r in sqlite_store.telemetry_for()) == ["cam-1", "cam-4"]


def test_a_failed_batch_fails_every_waiter_and_a_resend_is_stored(
    sqlite_store: Store, tmp_path: Path
) -> None:
    batcher = batcher_for(sqlite_store, linger_s=0.02)
    items = [(f"m-{i}", f"cam-{i}", window(i + 1)) for i in range(5)]

    def rename(old: str, new: str) -> None:
        with sqlite3.connect(tmp_path / "hub.db") as db:
            db.execute(f"ALTER TABLE {old} RENAME TO {new}")

    async def send_all() -> list[object]:
        return await asyncio.gather(*(batcher.submit(*i) for i in items), return_exceptions=True)

    rename("telemetry", "telemetry_away")
    failed = asyncio.run(send_all())
    assert all(isinstance(r, StoreError) for r in failed)
    rename("telemetry_away", "telemetry")
    assert sqlite_store.telemetry_for() == []
    assert asyncio.run(send_all()) == [True] * 5
    assert len(sqlite_store.telemetry_for()) == 5


def test_close_writes_what_waits_and_refuses_what_comes_later(sqlite_store: Store) -> None:
    batcher = batcher_for(sqlite_store, linger_s=1.0)

    async def main() -> list[bool]:
        waiting = [
            asyncio.ensure_future(batcher.submit(f"m-{i}", "cam-1", window(1))) for i in range(3)
        ]
        await async_wait_until(lambda: batcher.waiting == 3, 5, "three windows lingering")
        start = time.monotonic()
        await batcher.close()
        assert time.monotonic() - start < 0.5  # close does not wait out the linger
        with pytest.raises(BatcherClosedError):
            await batcher.submit("m-9", "cam-1", window(1))
        await batcher.close()
        return await asyncio.gather(*waiting)

    assert asyncio.run(main()) == [True, True, True]
    assert len(sqlite_store.telemetry_for()) == 3


@pytest.mark.parametrize(
    "settings",
    [{"max_items": 0}, {"max_items": 10_001}, {"linger_s": -1.0}, {"max_waiting": 1}],
)
def test_bad_settings_are_refused(settings: dict[str, float]) -> None:
    with pytest.raises(ValidationError):
        BatcherSettings(**settings)  # type: ignore[arg-type]


def telemetry_env(device_id: str, **fields: int | str) -> pb.Envelope:
    body = pb.Telemetry(skill="digits", version="1.0.0", inferences=3)
    for key, value in fields.items():
        setattr(body, key, value)
    return make_envelope(device_id, telemetry=body)


def test_hubcore_acks_concurrent_telemetry_only_once_stored(
    sqlite_store: Store, tmp_path: Path
) -> None:
    store = sqlite_store
    limits = HubLimits(telemetry_batch_items=64, telemetry_linger_s=0.02)
    core = HubCore(store, TrustRepository.init(tmp_path / "trust"), limits)
    envs = {f"cam-{i}": telemetry_env(f"cam-{i}") for i in range(40)}
    bad = telemetry_env("cam-bad", skill="")  # the store refuses an empty skill name

    async def main() -> Sequence[object]:
        jobs = [core.handle(device, env) for device, env in envs.items()]
        results = await asyncio.gather(*jobs, core.handle("cam-bad", bad), return_exceptions=True)
        await core.close()
        return results

    *replies, refused = asyncio.run(main())
    assert isinstance(refused, ProtocolError)
    for env, reply in zip(envs.values(), replies, strict=True):
        assert isinstance(reply, list)
        (ack,) = reply
        assert kind_of(ack) == "ack" and list(ack.ack.ids) == [env.id]
    assert sorted(r.device_id for r in store.telemetry_for()) == sorted(envs)
    assert core.telemetry.batches < 5  # shared transactions, not one per message
