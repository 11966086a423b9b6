"""Store fixtures: every store test runs on SQLite and on PostgreSQL.

PostgreSQL tests each get a fresh schema in the ``test`` database
(``search_path`` set through the URL) that is dropped afterwards. When the
server is not reachable the fixture fails, it does not skip: a green run
must mean both databases were tested. The server is the one named by
``EDGESKILL_TEST_PG`` (``make test`` sets it to the project's own), else the
one on 127.0.0.1:5432 (see :mod:`tests.support.services`).
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError

from cloud.store import Store, open_store
from tests.support.services import PG_ENV, postgres_urls

PG_HOW_TO_START = (
    f"PostgreSQL for the tests is not reachable at {PG_ENV} (when it is unset: 127.0.0.1:5432, "
    f"database 'test', trust auth). `make test` starts the project's own and sets {PG_ENV}; "
    "by hand: bash scripts/services.sh && set -a && . .build/services/env && set +a"
)

_pg_base: str | None = None


def postgres_base_url() -> str:
    """The first PostgreSQL URL that accepts a connection (cached); fails the test if none."""
    global _pg_base  # noqa: PLW0603 - one probe per test session
    if _pg_base is not None:
        return _pg_base
    errors = []
    for url in postgres_urls():
        engine = create_engine(url)
        try:
            with engine.connect() as conn:
                conn.execute(text("SELECT 1"))
        except OperationalError as exc:
            errors.append(f"{url}: {str(exc).splitlines()[0]}")
            continue
        finally:
            engine.dispose()
        _pg_base = url
        return url
    pytest.fail(f"{PG_HOW_TO_START}\n" + "\n".join(errors), pytrace=False)


@contextmanager
def postgres_schema_url() -> Iterator[str]:
    """Yield a URL whose connections use a fresh schema; drop the schema afterwards."""
    base = postgres_base_url()
    schema = f"es_{secrets.token_hex(6)}"
    admin = create_engine(base, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f"CREATE SCHEMA {schema}"))
        url = make_url(base).update_query_dict({"options": f"-csearch_path={schema}"})
        yield url.render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text("SET lock_timeout = '10s'"))
            conn.execute(text(f"DROP SCHEMA IF EXISTS {schema} CASCADE"))
        admin.dispose()


def sqlite_url(path: Path) -> str:
    """A SQLite store URL for a file path."""
    return f"sqlite:///{path}"


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A URL for an empty store, once for SQLite and once for PostgreSQL."""
    if request.param == "sqlite":
        yield sqlite_url(tmp_path / "hub.db")
        return
    with postgres_schema_url() as url:
        yield url


@pytest.fixture
def pg_store_url() -> Iterator[str]:
    """A URL for an empty PostgreSQL store (for tests that only make sense there)."""
    with postgres_schema_url() as url:
        yield url


@pytest.fixture
def store(store_url: str) -> Iterator[Store]:
    """An open, migrated, empty store on each database; closed afterwards."""
    opened = open_store(store_url)
    try:
        yield opened
    finally:
        opened.close()
