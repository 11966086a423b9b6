"""Which hub process leads: the one that runs the loops that must run once per fleet.

Every hub process serves devices; only the leader runs the leader-only loops
of its :class:`~cloud.loops.LoopHost` (the TUF timestamp refresh today, the
rollout engine and drift policies later).

- **PostgreSQL**: the leader holds a session-level advisory lock on a
  connection of its own, kept open for as long as it leads and checked with a
  cheap query every ``check_s``. If that connection fails the process steps
  down at once and campaigns again. PostgreSQL frees the lock when the
  holder's session ends; a killed process's TCP connection closes, so a
  follower (trying every ``retry_s``) takes over about one retry later.
- **SQLite** (the embedded default): one ``hub serve`` per home. It takes an
  exclusive lock on ``serve.lock`` in the hub home, writes its pid there, and
  always leads; a second one fails with :class:`AlreadyServingError` naming
  the pid of the first.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import logging
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Protocol

from sqlalchemy import Connection, Engine, create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.pool import NullPool

from cloud.errors import HubError

__all__ = [
    "SERVE_LOCK_FILE",
    "AlreadyServingError",
    "Election",
    "PostgresElection",
    "ServeLock",
    "lock_key",
    "open_election",
]

log = logging.getLogger(__name__)

SERVE_LOCK_FILE = "serve.lock"
#: Told when this process gains (True) or loses (False) the lead.
OnLeadership = Callable[[bool], Awaitable[None]]
#: Most bytes read back from ``serve.lock`` (a pid and a newline).
_MAX_PID_BYTES = 32
#: Libpq settings for the election's connection: give up connecting after a few
#: seconds, and let TCP keepalives notice a silent peer within about ten.
_PG_CONNECT_ARGS = {
    "connect_timeout": 5,
    "keepalives": 1,
    "keepalives_idle": 5,
    "keepalives_interval": 2,
    "keepalives_count": 3,
}


class AlreadyServingError(HubError):
    """Another ``hub serve`` process already serves this (SQLite) hub home."""


class Election(Protocol):
    """A way of deciding whether this process leads."""

    async def campaign(self, on_change: OnLeadership) -> None:
        """Run until cancelled, calling ``on_change`` whenever leadership changes.

        Leadership is given up (``on_change(False)``) before this returns or raises.
        """

    def close(self) -> None:
        """Release what the election holds (locks, connections)."""


class ServeLock:
    """The SQLite election: this process serves the home alone, so it always leads."""

    def __init__(self, home: Path) -> None:
        """Take the home's serve lock.

        Raises:
            AlreadyServingError: another process holds it.
            HubError: the lock file cannot be opened or written.
        """
        path = home / SERVE_LOCK_FILE
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as exc:
            raise HubError(f"cannot open {path}: {exc}") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as exc:
            holder = os.pread(fd, _MAX_PID_BYTES, 0).decode(errors="replace").strip()
            os.close(fd)
            raise AlreadyServingError(
                f"another `hub serve` (pid {holder or 'unknown'}) already serves {home}; "
                "with a SQLite store only one process may serve a hub home"
            ) from exc
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        except OSError as exc:
            os.close(fd)
            raise HubError(f"cannot write {path}: {exc}") from exc
        self._fd: int | None = fd

    async def campaign(self, on_change: OnLeadership) -> None:
        """Lead at once and until cancelled."""
        try:
            await on_change(True)
            await asyncio.Event().wait()
        finally:
            await on_change(False)

    def close(self) -> None:
        """Release the serve lock (the pid stays in the file; the lock is what counts)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class PostgresElection:
    """The PostgreSQL election: a session advisory lock held on a connection of its own."""

    def __init__(self, store_url: str, *, retry_s: float = 1.0, check_s: float = 1.0) -> None:
        """Prepare to campaign on the database of ``store_url``; nothing connects yet.

        Raises:
            HubError: the URL cannot be used to build an engine.
        """
        try:
            self._engine: Engine = create_engine(
                make_url(store_url), poolclass=NullPool, connect_args=_PG_CONNECT_ARGS
            )
        except (SQLAlchemyError, ImportError) as exc:
            raise HubError(f"cannot set up the leader election: {exc}") from exc
        self.retry_s = retry_s
        self.check_s = check_s
        #: Times this process asked for the lock (successful or not).
        self.attempts = 0
        self._conn: Connection | None = None
        self._reachable = True  # logged once per outage, not once per retry

    async def campaign(self, on_change: OnLeadership) -> None:
        """Try for the lock every ``retry_s``; while held, check the connection every ``check_s``.

        Database failures are logged and end the current term; they never end the campaign.
        """
        try:
            while True:
                if await self._try_acquire():
                    await on_change(True)
                    await self._hold()
                    await on_change(False)
                await asyncio.sleep(self.retry_s)
        finally:
            await on_change(False)
            await asyncio.to_thread(self._drop_connection)

    def close(self) -> None:
        """Close the election's connection (which releases the lock) and its engine."""
        self._drop_connection()
        self._engine.dispose()

    async def _try_acquire(self) -> bool:
        self.attempts += 1
        try:
            acquired = await asyncio.to_thread(self._acquire_blocking)
        except SQLAlchemyError as exc:
            if self._reachable:
                log.warning("leader election: cannot reach the store (retrying): %s", exc)
            self._reachable = False
            await asyncio.to_thread(self._drop_connection)
            return False
        if not self._reachable:
            log.info("leader election: the store is reachable again")
        self._reachable = True
        return acquired

    async def _hold(self) -> None:
        """Return as soon as the lock may be lost (the connection failed or stalled)."""
        while True:
            await asyncio.sleep(self.check_s)
            try:
                async with asyncio.timeout(self.check_s * 5):
                    await asyncio.to_thread(self._check_blocking)
            except (SQLAlchemyError, TimeoutError) as exc:
                log.error("leader election: lost the store connection: %s", exc or "timed out")
                await asyncio.to_thread(self._drop_connection)
                return

    def _connection(self) -> Connection:
        if self._conn is None:
            conn = self._engine.connect().execution_options(isolation_level="AUTOCOMMIT")
            self._conn = conn
        return self._conn

    def _acquire_blocking(self) -> bool:
        conn = self._connection()
        key = _store_lock_key(conn)
        return bool(conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": key}).scalar())

    def _check_blocking(self) -> None:
        conn = self._conn
        if conn is None:
            raise TimeoutError("no connection")
        conn.execute(text("SELECT 1")).scalar()

    def _drop_connection(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(SQLAlchemyError):
                conn.invalidate()
                conn.close()


def lock_key(database: str, schema: str) -> int:
    """The advisory lock key of the store in ``database``/``schema`` (signed 64 bits).

    Each store (database and schema) has its own key, so hubs of different
    fleets on one PostgreSQL server never compete.
    """
    digest = hashlib.sha256(f"edgeskill-leader\0{database}\0{schema}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


def _store_lock_key(conn: Connection) -> int:
    database, schema = conn.execute(text("SELECT current_database(), current_schema()")).one()
    return lock_key(str(database), str(schema))


def open_election(home: Path, store_url: str) -> Election:
    """The election that fits the store: the serve lock on SQLite, an advisory lock on PostgreSQL.

    Raises:
        AlreadyServingError: SQLite, and another process serves this home.
        HubError: the lock file or the election's engine cannot be set up.
    """
    if make_url(store_url).get_backend_name() == "sqlite":
        return ServeLock(home)
    return PostgresElection(store_url)
