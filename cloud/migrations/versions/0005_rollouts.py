"""Staged rollouts: each staged deployment's plan and engine state, the fleet stop switch,
and deployment priorities.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-10
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    """Create ``rollouts`` and ``fleet_controls``; add ``deployments.priority``."""
    op.create_table(
        "rollouts",
        sa.Column("deployment_id", sa.Integer(), nullable=False),
        sa.Column("plan", sa.Text(), nullable=False),
        sa.Column("state", sa.Text(), nullable=False),
        sa.Column("phase", sa.String(16), nullable=False),
        sa.Column("admitted", sa.Text(), nullable=True),
        sa.Column("commands", sa.Text(), nullable=False),
        sa.Column("updated_ms", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["deployment_id"],
            ["deployments.id"],
            name="fk_rollouts_deployment_id_deployments",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("deployment_id", name="pk_rollouts"),
    )
    op.create_index("ix_rollouts_phase", "rollouts", ["phase"])
    op.create_table(
        "fleet_controls",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("stopped", sa.Boolean(), nullable=False),
        sa.Column("changed_ms", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_fleet_controls"),
    )
    with op.batch_alter_table("deployments") as batch:
        batch.add_column(sa.Column("priority", sa.Integer(), nullable=False, server_default="0"))


def downgrade() -> None:
    """Drop the column and both tables."""
    with op.batch_alter_table("deployments") as batch:
        batch.drop_column("priority")
    op.drop_table("fleet_controls")
    op.drop_index("ix_rollouts_phase", table_name="rollouts")
    op.drop_table("rollouts")
