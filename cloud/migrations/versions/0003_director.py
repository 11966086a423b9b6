"""Signed desired state (the director's latest instruction per device) and device security events.

Revision ID: 0003
Revises: 0002
Create Date: 2026-03-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

_BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    """Create the director's and the security events' tables."""
    op.create_table(
        "director_instructions",
        sa.Column("device_id", sa.String(128), nullable=False),
        sa.Column("counter", sa.BigInteger(), nullable=False),
        sa.Column("generation", sa.BigInteger(), nullable=False),
        sa.Column("expires_ms", sa.BigInteger(), nullable=False),
        sa.Column("signed_ms", sa.BigInteger(), nullable=False),
        sa.Column("payload_sha256", sa.String(64), nullable=False),
        sa.Column("instruction", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("device_id", name="pk_director_instructions"),
    )
    op.create_table(
        "device_security_events",
        sa.Column("id", _BIG_ID, autoincrement=True, nullable=False),
        sa.Column("msg_id", sa.String(128), nullable=False),
        sa.Column("device_id", sa.String(128), nullable=False),
        sa.Column("kind", sa.String(64), nullable=False),
        sa.Column("reason", sa.String(64), nullable=False),
        sa.Column("subject", sa.String(255), nullable=False),
        sa.Column("detail", sa.Text(), nullable=False),
        sa.Column("count", sa.BigInteger(), nullable=False),
        sa.Column("received_ms", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_device_security_events"),
        sa.UniqueConstraint("msg_id", name="uq_device_security_events_msg_id"),
    )
    op.create_index(
        "ix_device_security_events_device_id_received_ms",
        "device_security_events",
        ["device_id", "received_ms"],
    )
    op.create_index(
        "ix_device_security_events_kind_reason", "device_security_events", ["kind", "reason"]
    )


def downgrade() -> None:
    """Drop both tables."""
    op.drop_table("device_security_events")
    op.drop_table("director_instructions")
