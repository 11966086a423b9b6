"""Alembic migrations of the hub's registry store, run by :func:`cloud.store.open_store`."""
