"""Database engines for the store, and schema migration on open.

SQLite is set up so that several processes (hub, CLI) can share one file:
WAL journal, foreign keys on, a busy timeout, and SQLAlchemy (not the sqlite3
module) emitting BEGIN, so that writers can ask for ``BEGIN IMMEDIATE`` and
queue on the database lock instead of failing when a read turns into a write.
On PostgreSQL, writers that change desired state take an advisory lock.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from alembic.util import CommandError
from sqlalchemy import Connection, Engine, create_engine, event, text
from sqlalchemy.engine import URL, make_url
from sqlalchemy.exc import ArgumentError, SQLAlchemyError
from sqlalchemy.pool import StaticPool

from cloud.errors import StoreError, ValidationError

__all__ = [
    "BUSY_TIMEOUT_S",
    "IMMEDIATE",
    "MIGRATIONS_DIR",
    "SUPPORTED_BACKENDS",
    "create_store_engine",
    "upgrade_schema",
]

BUSY_TIMEOUT_S = 30.0
#: Execution option asking for ``BEGIN IMMEDIATE`` on SQLite.
IMMEDIATE = "edgeskill_immediate"
MIGRATIONS_DIR = Path(__file__).resolve().parent.parent / "migrations"
SUPPORTED_BACKENDS = ("sqlite", "postgresql")
# Advisory lock keys (PostgreSQL), arbitrary but fixed across hub versions.
MIGRATION_LOCK_KEY = 0x45534D4947  # "ESMIG"


def _sqlite_on_connect(dbapi_conn: sqlite3.Connection, _record: object) -> None:
    # Hand transaction control to SQLAlchemy's "begin" event below.
    dbapi_conn.isolation_level = None
    cursor = dbapi_conn.cursor()
    try:
        cursor.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
        cursor.execute("PRAGMA foreign_keys = ON")
        cursor.execute("PRAGMA journal_mode = WAL")
    finally:
        cursor.close()


def _sqlite_on_begin(conn: Connection) -> None:
    immediate = conn.get_execution_options().get(IMMEDIATE, False)
    conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")


def _parse(url: str) -> URL:
    try:
        parsed = make_url(url)
    except ArgumentError as exc:
        raise ValidationError(f"bad database URL: {exc}") from exc
    if parsed.get_backend_name() not in SUPPORTED_BACKENDS:
        raise ValidationError(
            f"unsupported database {parsed.get_backend_name()!r}; use one of {SUPPORTED_BACKENDS}"
        )
    return parsed


def create_store_engine(url: str) -> Engine:
    """Create an engine for ``url`` with the settings the store relies on.

    Args:
        url: ``sqlite:///path/hub.db`` or ``postgresql+psycopg2://user@host/db``.

    Returns:
        A configured engine (nothing is connected yet).

    Raises:
        ValidationError: The URL is malformed or names an unsupported database.
        StoreError: The database driver cannot be loaded.
    """
    parsed = _parse(url)
    kwargs: dict[str, Any] = {}
    try:
        if parsed.get_backend_name() == "sqlite":
            connect_args: dict[str, Any] = {"timeout": BUSY_TIMEOUT_S}
            if parsed.database in (None, "", ":memory:"):
                # One shared connection, or every checkout would see its own empty database.
                kwargs["poolclass"] = StaticPool
                connect_args["check_same_thread"] = False
            engine = create_engine(parsed, connect_args=connect_args, **kwargs)
            event.listen(engine, "connect", _sqlite_on_connect)
            event.listen(engine, "begin", _sqlite_on_begin)
        else:
            engine = create_engine(parsed, pool_pre_ping=True)
    except (SQLAlchemyError, ImportError) as exc:
        raise StoreError(f"cannot set up the database engine: {exc}") from exc
    return engine


def upgrade_schema(engine: Engine) -> None:
    """Bring the database schema to the newest migration (``alembic upgrade head``).

    Concurrent callers are serialised (an advisory lock on PostgreSQL, the
    write lock on SQLite), so several hub processes may start at once.

    Args:
        engine: An engine from :func:`create_store_engine`.

    Raises:
        StoreError: The database is unreachable or a migration failed.
    """
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    try:
        with engine.connect() as conn:
            conn.execution_options(**{IMMEDIATE: True})
            with conn.begin():
                if conn.dialect.name == "postgresql":
                    conn.execute(
                        text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK_KEY}
                    )
                config.attributes["connection"] = conn
                command.upgrade(config, "head")
    except (SQLAlchemyError, CommandError) as exc:
        raise StoreError(f"cannot migrate the store schema: {exc}") from exc
