"""Telemetry windows carry their p95 latency and error count, which the rollout gates compare.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Add ``telemetry.latency_p95_ms`` and ``errors`` (0 for windows stored before them)."""
    with op.batch_alter_table("telemetry") as batch:
        batch.add_column(
            sa.Column("latency_p95_ms", sa.Float(), nullable=False, server_default="0")
        )
        batch.add_column(sa.Column("errors", sa.BigInteger(), nullable=False, server_default="0"))


def downgrade() -> None:
    """Drop the columns."""
    with op.batch_alter_table("telemetry") as batch:
        batch.drop_column("errors")
        batch.drop_column("latency_p95_ms")
