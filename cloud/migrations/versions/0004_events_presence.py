"""The hub's event log, and each device's heartbeat interval for derived presence.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None

_BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    """Create ``hub_events`` and add ``devices.heartbeat_ms``."""
    op.create_table(
        "hub_events",
        sa.Column("id", _BIG_ID, autoincrement=True, nullable=False),
        sa.Column("at_ms", sa.BigInteger(), nullable=False),
        sa.Column("kind", sa.String(64), nullable=False),
        sa.Column("device_id", sa.String(128), nullable=False),
        sa.Column("subject", sa.String(255), nullable=False),
        sa.Column("message", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_hub_events"),
    )
    op.create_index("ix_hub_events_device_id_id", "hub_events", ["device_id", "id"])
    op.create_index("ix_hub_events_kind_id", "hub_events", ["kind", "id"])
    with op.batch_alter_table("devices") as batch:
        batch.add_column(
            sa.Column("heartbeat_ms", sa.BigInteger(), nullable=False, server_default="0")
        )


def downgrade() -> None:
    """Drop the column and the table."""
    with op.batch_alter_table("devices") as batch:
        batch.drop_column("heartbeat_ms")
    op.drop_table("hub_events")
