"""Alembic environment: runs on the connection that the store hands over.

There is no alembic.ini: :func:`cloud.store.engine.upgrade_schema` builds the
configuration in code and passes an open connection, already inside a locked
transaction, as ``config.attributes["connection"]``.
"""

from __future__ import annotations

from alembic import context

from cloud.store.schema import metadata

connection = context.config.attributes.get("connection")
if connection is None:
    raise RuntimeError("run migrations through cloud.store.open_store, not the alembic command")

context.configure(
    connection=connection,
    target_metadata=metadata,
    compare_type=True,
    # SQLite cannot ALTER most things; batch mode rebuilds tables instead.
    render_as_batch=connection.dialect.name == "sqlite",
)
with context.begin_transaction():
    context.run_migrations()
