"""The first registry schema: devices, groups, skills, deployments, state, telemetry.

Revision ID: 0001
Revises:
Create Date: 2026-01-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

_BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    """Create every table of the first schema."""
    op.create_table(
        "devices",
        sa.Column("device_id", sa.String(128), nullable=False),
        sa.Column("profile", sa.Text(), nullable=False),
        sa.Column("last_seen_ms", sa.BigInteger(), nullable=False),
        sa.Column("online", sa.Boolean(), nullable=False),
        sa.PrimaryKeyConstraint("device_id", name="pk_devices"),
    )
    op.create_table(
        "device_labels",
        sa.Column("device_id", sa.String(128), nullable=False),
        sa.Column("key", sa.String(64), nullable=False),
        sa.Column("value", sa.String(64), nullable=False),
        sa.ForeignKeyConstraint(
            ["device_id"],
            ["devices.device_id"],
            name="fk_device_labels_device_id_devices",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("device_id", "key", name="pk_device_labels"),
    )
    op.create_index("ix_device_labels_key_value", "device_labels", ["key", "value"])
    op.create_table(
        "device_groups",
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("selector", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_device_groups"),
    )
    op.create_table(
        "skill_versions",
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("version", sa.String(64), nullable=False),
        sa.Column("target_name", sa.String(255), nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("size", sa.BigInteger(), nullable=False),
        sa.Column("manifest", sa.Text(), nullable=False),
        sa.Column("created_ms", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("name", "version", name="pk_skill_versions"),
    )
    op.create_table(
        "deployments",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("skill", sa.String(64), nullable=False),
        sa.Column("version", sa.String(64), nullable=False),
        sa.Column("group_name", sa.String(64), nullable=False),
        sa.Column("strategy", sa.String(64), nullable=False),
        sa.Column("config", sa.Text(), nullable=False),
        sa.Column("state", sa.String(16), nullable=False),
        sa.Column("created_ms", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["group_name"], ["device_groups.name"], name="fk_deployments_group_name_device_groups"
        ),
        sa.ForeignKeyConstraint(
            ["skill", "version"],
            ["skill_versions.name", "skill_versions.version"],
            name="fk_deployments_skill_skill_versions",
        ),
        sa.PrimaryKeyConstraint("id", name="pk_deployments"),
    )
    op.create_index("ix_deployments_state_skill", "deployments", ["state", "skill"])
    op.create_table(
        "desired_states",
        sa.Column("device_id", sa.String(128), nullable=False),
        sa.Column("generation", sa.BigInteger(), nullable=False),
        sa.Column("skills", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(
            ["device_id"],
            ["devices.device_id"],
            name="fk_desired_states_device_id_devices",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("device_id", name="pk_desired_states"),
    )
    op.create_table(
        "reported_states",
        sa.Column("device_id", sa.String(128), nullable=False),
        sa.Column("generation", sa.BigInteger(), nullable=False),
        sa.Column("skills", sa.Text(), nullable=False),
        sa.Column("reported_ms", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["device_id"],
            ["devices.device_id"],
            name="fk_reported_states_device_id_devices",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("device_id", name="pk_reported_states"),
    )
    _create_telemetry()


def _create_telemetry() -> None:
    op.create_table(
        "telemetry",
        sa.Column("id", _BIG_ID, autoincrement=True, nullable=False),
        sa.Column("msg_id", sa.String(128), nullable=False),
        sa.Column("device_id", sa.String(128), nullable=False),
        sa.Column("skill", sa.String(64), nullable=False),
        sa.Column("version", sa.String(64), nullable=False),
        sa.Column("inferences", sa.BigInteger(), nullable=False),
        sa.Column("labelled", sa.BigInteger(), nullable=False),
        sa.Column("correct", sa.BigInteger(), nullable=False),
        sa.Column("latency_p50_ms", sa.Float(), nullable=False),
        sa.Column("latency_p99_ms", sa.Float(), nullable=False),
        sa.Column("window_start_ms", sa.BigInteger(), nullable=False),
        sa.Column("window_end_ms", sa.BigInteger(), nullable=False),
        sa.Column("dropped_messages", sa.BigInteger(), nullable=False),
        sa.Column("metrics", sa.Text(), nullable=False),
        sa.Column("received_ms", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_telemetry"),
        sa.UniqueConstraint("msg_id", name="uq_telemetry_msg_id"),
    )
    op.create_index(
        "ix_telemetry_device_id_skill_window_end_ms",
        "telemetry",
        ["device_id", "skill", "window_end_ms"],
    )
    op.create_index("ix_telemetry_skill", "telemetry", ["skill"])


def downgrade() -> None:
    """Drop every table, children first."""
    for table in (
        "telemetry",
        "reported_states",
        "desired_states",
        "deployments",
        "skill_versions",
        "device_groups",
        "device_labels",
        "devices",
    ):
        op.drop_table(table)
