"""A rollout pass that reads and stores what moved: a report stamp and time, a rollout revision.

The leader's rollout pass reads the fleet stamp first; when only reports moved
it since its last read (``fleet_stamp.reports``), it reads the reports stored
since then (``reported_states.stored_ms``, by its index) instead of every
target's row (:mod:`cloud.store.fleet_stamp`). Reports stored before this have
no time and are found by the full reads. ``rollouts.revision`` moves with each
pass stored: a pass stores over the revision it read, and the leader reads a
rollout's state again only when another process moved it.

Revision ID: 0011
Revises: 0010
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Add ``fleet_stamp.reports`` (0), ``reported_states.stored_ms`` (NULL) with its index
    and ``rollouts.revision`` (0)."""
    with op.batch_alter_table("rollouts") as batch:
        batch.add_column(sa.Column("revision", sa.BigInteger(), nullable=False, server_default="0"))
    with op.batch_alter_table("fleet_stamp") as batch:
        batch.add_column(sa.Column("reports", sa.BigInteger(), nullable=False, server_default="0"))
    with op.batch_alter_table("reported_states") as batch:
        batch.add_column(sa.Column("stored_ms", sa.BigInteger(), nullable=True))
        batch.create_index("ix_reported_states_stored_ms", ["stored_ms"])


def downgrade() -> None:
    """Drop them."""
    with op.batch_alter_table("reported_states") as batch:
        batch.drop_index("ix_reported_states_stored_ms")
        batch.drop_column("stored_ms")
    with op.batch_alter_table("fleet_stamp") as batch:
        batch.drop_column("reports")
    with op.batch_alter_table("rollouts") as batch:
        batch.drop_column("revision")
