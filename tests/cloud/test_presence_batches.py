"""The hub writes heartbeats and connection news in batches: one transaction per linger.

Every test runs on SQLite and on PostgreSQL (the ``store`` fixture).
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Iterator, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import pytest
from sqlalchemy import Connection

from cloud import hubcore
from cloud.errors import StoreError
from cloud.hubcore import HubCore
from cloud.session import DropReason
from cloud.store import Store
from protos.envelope import now_ms
from skills.trust import TrustRepository
from tests.fakes.failing_store import FailingStore
from tests.support import async_wait_until

News = Mapping[str, tuple[int | None, bool]]


def _core(store: Store | FailingStore, tmp_path: Path) -> HubCore:
    return HubCore(cast(Any, store), TrustRepository.init(tmp_path / "trust"))


def _enroll(store: Store, *device_ids: str) -> None:
    """Devices that connected at time 1 and have not been heard from since."""
    for device_id in device_ids:
        store.register_device(device_id, {}, {}, now_ms=1, heartbeat_ms=1000)


def _flag_and_seen(store: Store, device_id: str) -> tuple[bool, int]:
    device = store.get_device(device_id)
    assert device is not None
    return device.online, device.last_seen_ms


def _count_transactions(
    store: Store, monkeypatch: pytest.MonkeyPatch, *, reads: bool = False
) -> list[bool]:
    """Count the store's write transactions (and the reads too, with ``reads``) from now
    on: one item each, whether it wrote."""
    writes: list[bool] = []
    tx = store._tx

    def counted(*, write: bool = False, lock: str = "") -> AbstractContextManager[Connection]:
        if write or reads:
            writes.append(write)
        return tx(write=write, lock=lock)

    monkeypatch.setattr(store, "_tx", counted)
    return writes


def test_news_and_heartbeats_of_many_devices_are_written_in_one_transaction(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gone = [f"gone-{i}" for i in range(100)]
    heard = [f"heard-{i}" for i in range(100)]
    _enroll(store, *gone, *heard)
    core = _core(store, tmp_path)
    writes = _count_transactions(store, monkeypatch)

    async def run() -> None:
        before = now_ms()
        for device_id in gone:
            await core.disconnected(device_id)  # a broker restarted: every last will at once
        for device_id in heard:
            await core.heard(device_id)

        def all_written() -> bool:
            flags = {d.device_id: (d.online, d.last_seen_ms) for d in store.list_devices()}
            return all(flags[d] == (False, 1) for d in gone) and all(
                flags[d][0] and flags[d][1] >= before for d in heard
            )

        await async_wait_until(all_written, 10, "the news and heartbeats written")
        await core.close()

    asyncio.run(run())
    assert len(writes) == 1


@pytest.mark.parametrize(("heartbeat_s", "linger_s"), [(1, 0.1), (3, 0.3), (30, 0.5)])
def test_a_heartbeat_waits_for_its_batch_a_tenth_of_its_interval_at_most(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, heartbeat_s: int, linger_s: float
) -> None:
    """A device is online while its last stored beat is at most two intervals old: the
    batch's wait must not eat that margin at short intervals (half a second of two)."""
    _enroll(store, "cam-1")
    core = HubCore(
        cast(Any, store), TrustRepository.init(tmp_path / "trust"), heartbeat_s=heartbeat_s
    )
    waits: list[float | None] = []
    wait = asyncio.wait

    async def timed(fs: Any, *, timeout: float | None = None, **kwargs: Any) -> Any:
        waits.append(timeout)
        return await wait(fs, timeout=timeout, **kwargs)

    monkeypatch.setattr(hubcore.asyncio, "wait", timed)

    async def run() -> None:
        before = now_ms()
        await core.heard("cam-1")
        await async_wait_until(
            lambda: _flag_and_seen(store, "cam-1")[1] >= before, 10, "the heartbeat written"
        )
        await core.close()

    asyncio.run(run())
    assert waits and max(w for w in waits if w is not None) == pytest.approx(linger_s)


def test_a_replay_of_retained_statuses_is_one_transaction_and_drops_unknown_devices(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    known = [f"cam-{i:04d}" for i in range(800)]
    ghosts = [f"ghost-{i:04d}" for i in range(200)]
    _enroll(store, *known)
    core = _core(store, tmp_path)  # a hub just started: it knows of no device yet
    monkeypatch.setattr(core, "heard_linger_s", 3600.0)
    transactions = _count_transactions(store, monkeypatch, reads=True)

    async def run() -> None:
        for device_id in known + ghosts:  # as the MQTT adapter's workers hand them over
            await core.session(device_id).presence(online=False)
        assert transactions == []  # no read of its own per status
        await core.close()  # writes the batch at once

    asyncio.run(run())
    assert transactions == [True]
    assert core.dropped == {}  # an unknown device's status is ignored, not counted, as before
    assert all(core.believed_unknown(g) for g in ghosts)
    assert not any(core.believed_unknown(d) for d in known)

    async def again() -> None:
        for device_id in ghosts:
            await core.session(device_id).presence(online=True)

    asyncio.run(again())
    assert core._presence == {}  # dropped before the batch: no store call at all
    assert transactions == [True]
    assert {d.device_id: d.online for d in store.list_devices()} == dict.fromkeys(known, False)


def test_the_last_news_of_a_device_wins_and_news_never_freshens_it(
    store: Store, tmp_path: Path
) -> None:
    _enroll(store, "gone", "back", "silent")
    store.set_device_connected("silent", connected=False)
    core = _core(store, tmp_path)

    async def run() -> int:
        before = now_ms()
        await core.heard("gone")
        await core.disconnected("gone")  # its heartbeat is written offline, and its time kept
        await core.disconnected("back")
        await core.heard("back")  # a heartbeat after the news: connected again
        await core.presence("silent", online=True)  # a retained status: no sign of life
        await async_wait_until(lambda: _flag_and_seen(store, "silent")[0], 10, "the batch written")
        await core.close()
        return before

    before = asyncio.run(run())
    online, seen = _flag_and_seen(store, "gone")
    assert not online and seen >= before
    online, seen = _flag_and_seen(store, "back")
    assert online and seen >= before
    assert _flag_and_seen(store, "silent") == (True, 1)


def _held_writes(
    store: Store, monkeypatch: pytest.MonkeyPatch, *, fail: bool = False
) -> tuple[threading.Event, threading.Event]:
    """Make the first presence batch wait for ``release`` (and then fail, if asked)."""
    writing, release = threading.Event(), threading.Event()
    record = store.record_presence

    def held(news: News) -> set[str]:
        if not writing.is_set():
            writing.set()
            release.wait(10)
            if fail:
                raise StoreError("the database went away")
        return record(news)

    monkeypatch.setattr(store, "record_presence", held)
    return writing, release


@pytest.fixture
def released() -> Iterator[list[threading.Event]]:
    """Events set at the end of the test, so no held write outlives it."""
    events: list[threading.Event] = []
    yield events
    for event in events:
        event.set()


@dataclass(frozen=True)
class _HeldHeartbeat:
    """One device, ``cam-1``, whose first presence batch is held until ``release``."""

    store: Store
    core: HubCore
    writing: threading.Event
    release: threading.Event

    async def goes_offline_meanwhile(self) -> int:
        """Send a heartbeat, and the news that the device went while it is being written.

        Returns:
            The time (ms) just before the heartbeat.
        """
        before = now_ms()
        await self.core.heard("cam-1")
        await async_wait_until(self.writing.is_set, 10, "the heartbeat's batch being written")
        await self.core.disconnected("cam-1")  # while the heartbeat is on its way to the store
        return before

    def offline_but_heard_since(self, before: int) -> bool:
        """Whether the store has the device offline, with its heartbeat's time kept."""
        online, seen = _flag_and_seen(self.store, "cam-1")
        return not online and seen >= before


@pytest.fixture
def held(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, released: list[threading.Event]
) -> _HeldHeartbeat:
    _enroll(store, "cam-1")
    core = _core(store, tmp_path)
    writing, release = _held_writes(store, monkeypatch)
    released.append(release)
    return _HeldHeartbeat(store, core, writing, release)


def test_news_that_comes_while_a_batch_is_written_lands_after_it(
    held: _HeldHeartbeat,
) -> None:
    async def run() -> None:
        before = await held.goes_offline_meanwhile()
        held.release.set()
        # Not left waiting for more news, and not overtaken by the heartbeat.
        await async_wait_until(
            lambda: held.offline_but_heard_since(before), 10, "the news written after the heartbeat"
        )
        await held.core.close()

    asyncio.run(run())


def test_a_batch_the_store_fails_is_kept_under_the_news_that_came_meanwhile(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, released: list[threading.Event]
) -> None:
    _enroll(store, "cam-1", "cam-2", "cam-3")
    core = _core(store, tmp_path)
    writing, release = _held_writes(store, monkeypatch, fail=True)
    released.append(release)

    async def run() -> int:
        before = now_ms()
        await core.heard("cam-1")
        await core.disconnected("cam-1")
        await core.disconnected("cam-2")  # nothing else would say it went
        await core.disconnected("cam-3")
        await async_wait_until(writing.is_set, 10, "the first batch being written")
        await core.presence("cam-1", online=True)  # news only: the heartbeat's time stays
        await core.heard("cam-3")  # a heartbeat: online and seen now
        release.set()  # the first batch fails
        await async_wait_until(
            lambda: not _flag_and_seen(store, "cam-2")[0], 10, "the kept batch written"
        )
        await core.close()
        return before

    before = asyncio.run(run())
    assert core.dropped == {DropReason.STORE_ERROR: 1}  # the failed batch, counted once
    assert _flag_and_seen(store, "cam-2") == (False, 1)
    for device_id in ("cam-1", "cam-3"):
        online, seen = _flag_and_seen(store, device_id)
        assert online and seen >= before, device_id


def test_close_writes_the_news_still_waiting_at_once(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _enroll(store, "cam-1", "cam-2")
    core = _core(store, tmp_path)
    monkeypatch.setattr(core, "heard_linger_s", 3600.0)

    async def run() -> None:
        await core.disconnected("cam-1")
        await core.heard("cam-2")
        still = await asyncio.to_thread(_flag_and_seen, store, "cam-1")
        assert still == (True, 1)  # the batch lingers
        async with asyncio.timeout(10):  # not for the rest of the linger
            await core.close()

    asyncio.run(run())
    assert _flag_and_seen(store, "cam-1") == (False, 1)
    assert _flag_and_seen(store, "cam-2")[1] > 1


def test_close_lets_the_batch_being_written_land_before_the_news_after_it(
    held: _HeldHeartbeat,
) -> None:
    async def run() -> int:
        before = await held.goes_offline_meanwhile()
        closing = asyncio.create_task(held.core.close())
        await async_wait_until(lambda: held.core._closing, 10, "the core closing")
        held.release.set()
        async with asyncio.timeout(10):
            await closing
        return before

    before = asyncio.run(run())
    assert held.offline_but_heard_since(before)


def test_closing_while_the_store_fails_tries_once_and_gives_up_logged(
    store: Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    _enroll(store, "cam-1")
    failing = FailingStore(store)
    failing.failing.add("record_presence")
    core = _core(failing, tmp_path)
    monkeypatch.setattr(core, "heard_linger_s", 3600.0)

    async def run() -> None:
        await core.disconnected("cam-1")
        async with asyncio.timeout(10):
            await core.close()

    with caplog.at_level(logging.WARNING, logger="cloud.hubcore"):
        asyncio.run(run())
    assert failing.refused == {"record_presence": 1}
    assert core.dropped == {DropReason.STORE_ERROR: 1}
    assert "closing with the presence of 1 devices unwritten" in caplog.text
    assert _flag_and_seen(store, "cam-1") == (True, 1)
