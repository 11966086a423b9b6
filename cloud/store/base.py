"""The store's base: an engine, its dialect and one transaction per call."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Self

from sqlalchemy import Connection, Engine, text
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import SQLAlchemyError

from cloud.errors import StoreError
from cloud.store.engine import IMMEDIATE

__all__ = ["DESIRED_LOCK_KEY", "IDS_PER_QUERY", "StoreBase", "values_clause"]

# PostgreSQL advisory lock ordering desired-state writers. Registrations share
# it (they touch one device each); deployment changes take it exclusively.
DESIRED_LOCK_KEY = 0x4553444553  # "ESDES"
#: Most ids in one query's IN list.
IDS_PER_QUERY = 500


def values_clause(conn: Connection, columns: int, rows: int) -> str:
    """``VALUES`` placeholders for ``rows`` rows of ``columns`` values, in the driver's style.

    For statements written out and handed to the driver (``exec_driver_sql``),
    where the expression layer's cost per row is too much for a hot path.
    """
    mark = "?" if conn.dialect.paramstyle == "qmark" else "%s"
    one = "(" + ", ".join([mark] * columns) + ")"
    return "VALUES " + ", ".join([one] * rows)


class StoreBase:
    """An engine whose schema is migrated, and the transaction every method runs in."""

    def __init__(self, engine: Engine) -> None:
        """Wrap an engine whose schema is already migrated."""
        self._engine = engine
        self._dialect = sqlite if engine.dialect.name == "sqlite" else postgresql

    @property
    def engine(self) -> Engine:
        """The underlying engine, for health checks and tests; prefer the methods."""
        return self._engine

    @property
    def dialect(self) -> str:
        """``"sqlite"`` or ``"postgresql"``."""
        return self._engine.dialect.name

    def close(self) -> None:
        """Close every pooled connection."""
        self._engine.dispose()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @contextmanager
    def _tx(self, *, write: bool = False, lock: str = "") -> Iterator[Connection]:
        """One transaction; ``lock`` is "", "shared" or "exclusive" (desired state)."""
        try:
            with self._engine.connect() as conn:
                if write:
                    conn.execution_options(**{IMMEDIATE: True})
                with conn.begin():
                    if lock and self.dialect == "postgresql":
                        fn = (
                            "pg_advisory_xact_lock_shared"
                            if lock == "shared"
                            else "pg_advisory_xact_lock"
                        )
                        conn.execute(text(f"SELECT {fn}(:key)"), {"key": DESIRED_LOCK_KEY})
                    yield conn
        except SQLAlchemyError as exc:
            raise StoreError(f"store transaction failed: {exc}") from exc
