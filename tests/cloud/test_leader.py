"""Leader election: the serve lock on SQLite, an advisory lock on a real PostgreSQL."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url

from cloud.leader import (
    SERVE_LOCK_FILE,
    AlreadyServingError,
    PostgresElection,
    ServeLock,
    lock_key,
    open_election,
)
from tests.cloud.conftest import postgres_schema_url
from tests.support import async_wait_until, in_background


class Terms:
    """Records the leadership changes one election reports."""

    def __init__(self) -> None:
        self.changes: list[bool] = []

    @property
    def leading(self) -> bool:
        return bool(self.changes) and self.changes[-1]

    async def __call__(self, leader: bool) -> None:
        if not self.changes or self.changes[-1] != leader:
            self.changes.append(leader)


@contextlib.asynccontextmanager
async def campaigning(election: PostgresElection | ServeLock, terms: Terms) -> AsyncIterator[None]:
    try:
        async with in_background(election.campaign(terms)):
            yield
    finally:
        election.close()


def test_a_second_serve_lock_on_one_home_names_the_first_holder(tmp_path: Path) -> None:
    first = ServeLock(tmp_path)
    try:
        assert (tmp_path / SERVE_LOCK_FILE).read_text() == f"{os.getpid()}\n"
        with pytest.raises(AlreadyServingError) as caught:
            ServeLock(tmp_path)
        assert str(caught.value) == (
            f"another `hub serve` (pid {os.getpid()}) already serves {tmp_path}; "
            "with a SQLite store only one process may serve a hub home"
        )
    finally:
        first.close()
    second = ServeLock(tmp_path)  # released on close
    second.close()


def test_the_serve_lock_leads_at_once_and_steps_down_when_cancelled(tmp_path: Path) -> None:
    terms = Terms()

    async def main() -> None:
        async with campaigning(ServeLock(tmp_path), terms):
            await async_wait_until(lambda: terms.leading, 5.0, "the serve lock to lead")

    asyncio.run(main())
    assert terms.changes == [True, False]


def test_the_election_follows_the_store(tmp_path: Path) -> None:
    election = open_election(tmp_path, f"sqlite:///{tmp_path / 'hub.db'}")
    assert isinstance(election, ServeLock)
    election.close()
    election = open_election(tmp_path, "postgresql+psycopg2://nobody@127.0.0.1:1/none")
    assert isinstance(election, PostgresElection)
    election.close()


def test_keys_differ_per_store_and_fit_in_a_bigint() -> None:
    keys = {lock_key("test", "es_a"), lock_key("test", "es_b"), lock_key("prod", "es_a")}
    assert len(keys) == 3
    assert all(-(2**63) <= k < 2**63 for k in keys)
    assert lock_key("test", "es_a") == lock_key("test", "es_a")


def holder_pids(url: str) -> list[int]:
    """Backends that hold this store's leader lock, seen from an outside connection."""
    options = make_url(url).query["options"]
    assert isinstance(options, str)
    schema = options.removeprefix("-csearch_path=")
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            database = conn.execute(text("SELECT current_database()")).scalar_one()
            unsigned = lock_key(database, str(schema)) & 0xFFFF_FFFF_FFFF_FFFF
            rows = conn.execute(
                text(
                    "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted"
                    " AND objsubid = 1 AND classid::bigint = :hi AND objid::bigint = :lo"
                ),
                {"hi": unsigned >> 32, "lo": unsigned & 0xFFFF_FFFF},
            )
            return [int(r.pid) for r in rows]
    finally:
        engine.dispose()


def terminate(url: str, pid: int) -> None:
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            assert conn.execute(text("SELECT pg_terminate_backend(:p)"), {"p": pid}).scalar()
    finally:
        engine.dispose()


@pytest.mark.postgres
def test_exactly_one_of_two_leads_and_the_other_takes_over_when_it_quits(
    pg_store_url: str,
) -> None:
    first, second = Terms(), Terms()

    async def main() -> None:
        a = PostgresElection(pg_store_url, retry_s=0.05, check_s=0.05)
        b = PostgresElection(pg_store_url, retry_s=0.05, check_s=0.05)
        quitter = asyncio.create_task(a.campaign(first))
        await async_wait_until(lambda: first.leading, 10.0, "the first to lead")
        async with campaigning(b, second):
            tried = b.attempts
            await async_wait_until(lambda: b.attempts >= tried + 5, 10.0, "five tries by the other")
            assert second.changes == []
            assert len(await asyncio.to_thread(holder_pids, pg_store_url)) == 1
            quitter.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await quitter
            a.close()
            assert first.changes == [True, False]
            await async_wait_until(lambda: second.leading, 10.0, "the other to take over")
            assert len(await asyncio.to_thread(holder_pids, pg_store_url)) == 1

    asyncio.run(main())


@pytest.mark.postgres
def test_a_leader_whose_connection_dies_steps_down_and_someone_leads_again(
    pg_store_url: str,
) -> None:
    terms = Terms()

    async def main() -> None:
        election = PostgresElection(pg_store_url, retry_s=0.1, check_s=0.1)
        async with campaigning(election, terms):
            await async_wait_until(lambda: terms.leading, 10.0, "the election to lead")
            (pid,) = await asyncio.to_thread(holder_pids, pg_store_url)
            await asyncio.to_thread(terminate, pg_store_url, pid)
            await async_wait_until(lambda: len(terms.changes) >= 2, 10.0, "a step down")
            await async_wait_until(lambda: terms.leading, 10.0, "a new term")
            (new_pid,) = await asyncio.to_thread(holder_pids, pg_store_url)
            assert new_pid != pid

    asyncio.run(main())
    assert terms.changes == [True, False, True, False]


@pytest.mark.postgres
def test_stores_in_different_schemas_each_have_a_leader(pg_store_url: str) -> None:
    first, second = Terms(), Terms()

    async def main() -> None:
        with postgres_schema_url() as other_url:
            a = PostgresElection(pg_store_url, retry_s=0.1, check_s=0.1)
            b = PostgresElection(other_url, retry_s=0.1, check_s=0.1)
            async with campaigning(a, first), campaigning(b, second):
                await async_wait_until(
                    lambda: first.leading and second.leading, 10.0, "both stores to have a leader"
                )

    asyncio.run(main())


def test_an_unreachable_store_means_no_lead_no_crash_and_one_log_line(
    caplog: pytest.LogCaptureFixture,
) -> None:
    terms = Terms()

    async def main() -> None:
        election = PostgresElection(
            "postgresql+psycopg2://postgres@127.0.0.1:1/test", retry_s=0.05, check_s=0.05
        )
        task = asyncio.create_task(election.campaign(terms))
        await async_wait_until(lambda: election.attempts >= 3, 10.0, "three tries")
        assert not task.done()
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        election.close()

    with caplog.at_level(logging.INFO, logger="cloud.leader"):
        asyncio.run(main())
    assert terms.changes == [False]
    lines = [r.getMessage() for r in caplog.records if r.name == "cloud.leader"]
    assert len(lines) == 1
    assert lines[0].startswith("leader election: cannot reach the store (retrying): ")
