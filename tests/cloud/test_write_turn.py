"""The writers of one process take turns on SQLite before they ask for its lock.

SQLite's busy handler naps (1, 2, 5, ... 100 ms) between tries, and a writer can
keep missing the moment the lock is free; within one process the writers queue on
:func:`cloud.store.engine.write_turn` instead.
"""

from __future__ import annotations

import contextlib
import threading
from pathlib import Path

import pytest
from sqlalchemy import event

from cloud.store import engine as engine_module
from cloud.store import open_store
from cloud.store.engine import write_turn
from tests.support import wait_until


class _Turn:
    """The write turn of one database, telling which threads asked for it."""

    def __init__(self) -> None:
        self.lock = threading.RLock()
        self.asked: list[str] = []

    def __enter__(self) -> None:
        self.asked.append(threading.current_thread().name)
        self.lock.acquire()

    def __exit__(self, *exc: object) -> None:
        self.lock.release()


def test_a_second_writer_waits_for_its_turn_without_asking_sqlite_and_then_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "hub.db"
    turn = _Turn()
    monkeypatch.setitem(engine_module._WRITE_TURNS, str(path), turn)
    first, second = open_store(f"sqlite:///{path}"), open_store(f"sqlite:///{path}")
    begins: list[str] = []
    # Runs before the BEGIN goes to SQLite (which would then wait in its busy handler).
    event.listen(second.engine, "begin", lambda _conn: begins.append("second"), insert=True)
    first.register_device("cam-1", {}, {}, now_ms=1, heartbeat_ms=1000)
    holding, release = threading.Event(), threading.Event()
    failures: list[BaseException] = []

    def hold_a_write() -> None:
        try:
            with first._tx(write=True) as conn:
                conn.exec_driver_sql("UPDATE devices SET heartbeat_ms = 2000")
                holding.set()
                release.wait(30)
        except BaseException as exc:
            failures.append(exc)

    def write_beside() -> None:
        try:
            second.touch_device("cam-1", now_ms=5, online=True)
        except BaseException as exc:
            failures.append(exc)

    holder = threading.Thread(target=hold_a_write, name="holder")
    holder.start()
    wait_until(holding.is_set, 10, "the first write to hold the lock")
    writer = threading.Thread(target=write_beside, name="beside")
    writer.start()
    try:
        # Two stores on one file share one turn: the second writer asks for it and
        # waits there, before any BEGIN reaches SQLite.
        wait_until(lambda: "beside" in turn.asked, 10, "the second writer to ask its turn")
        assert writer.is_alive() and begins == []
    finally:
        release.set()
        holder.join(30)
        writer.join(30)
    assert failures == []
    assert begins == ["second"]
    device = second.get_device("cam-1")
    assert device is not None
    assert (device.heartbeat_ms, device.last_seen_ms, device.online) == (2000, 5, True)
    first.close()
    second.close()


def test_a_thread_may_write_inside_its_own_turn_and_postgresql_writers_take_none(
    tmp_path: Path, pg_store_url: str
) -> None:
    lite = open_store(f"sqlite:///{tmp_path / 'hub.db'}")
    try:
        with write_turn(lite.engine):  # the write below takes it again: no deadlock
            lite.register_device("cam-1", {}, {}, now_ms=1, heartbeat_ms=1000)
        assert lite.get_device("cam-1") is not None
    finally:
        lite.close()
    pg = open_store(pg_store_url)
    try:
        assert isinstance(write_turn(pg.engine), contextlib.nullcontext)
    finally:
        pg.close()
