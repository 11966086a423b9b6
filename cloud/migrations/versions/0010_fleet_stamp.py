"""The fleet stamp: counters the writers of devices, labels, groups and reports bump.

The leader's rollout pass reads them first and skips reading every target's
row while they stand still (:mod:`cloud.store.fleet_stamp`). Its slots are
created here, each at zero.

Revision ID: 0010
Revises: 0009
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None

#: :data:`cloud.store.fleet_stamp.SLOTS` when this was written (a migration keeps its own).
_SLOTS = 16


def upgrade() -> None:
    """Create ``fleet_stamp`` with its slots."""
    table = op.create_table(
        "fleet_stamp",
        sa.Column("slot", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("changes", sa.BigInteger(), nullable=False),
        sa.Column("refreshes", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("slot", name="pk_fleet_stamp"),
    )
    op.bulk_insert(table, [{"slot": i, "changes": 0, "refreshes": 0} for i in range(_SLOTS)])


def downgrade() -> None:
    """Drop it."""
    op.drop_table("fleet_stamp")
