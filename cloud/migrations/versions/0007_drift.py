"""The drift loop: devices' drift samples, drift incidents with their stages, group policies.

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-20
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

_BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    """Create the drift sample, incident, stage and policy tables."""
    op.create_table(
        "drift_sample_messages",
        sa.Column("msg_id", sa.String(128), nullable=False),
        sa.Column("device_id", sa.String(128), nullable=False),
        sa.Column("samples", sa.Integer(), nullable=False),
        sa.Column("received_ms", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("msg_id", name="pk_drift_sample_messages"),
    )
    op.create_index(
        "ix_drift_sample_messages_received_ms", "drift_sample_messages", ["received_ms"]
    )
    op.create_table(
        "drift_samples",
        sa.Column("id", _BIG_ID, autoincrement=True, nullable=False),
        sa.Column("msg_id", sa.String(128), nullable=False),
        sa.Column("device_id", sa.String(128), nullable=False),
        sa.Column("skill", sa.String(64), nullable=False),
        sa.Column("version", sa.String(64), nullable=False),
        sa.Column("label", sa.Integer(), nullable=False),
        sa.Column("predicted", sa.Integer(), nullable=False),
        sa.Column("confidence", sa.Float(), nullable=False),
        sa.Column("seen_at_ms", sa.BigInteger(), nullable=False),
        sa.Column("received_ms", sa.BigInteger(), nullable=False),
        sa.Column("shape", sa.String(128), nullable=False),
        sa.Column("tensor", sa.LargeBinary(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_drift_samples"),
    )
    op.create_index(
        "ix_drift_samples_skill_version_id", "drift_samples", ["skill", "version", "id"]
    )
    _incidents()
    op.create_table(
        "drift_policies",
        sa.Column("group_name", sa.String(64), nullable=False),
        sa.Column("settings", sa.Text(), nullable=False),
        sa.Column("updated_ms", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("group_name", name="pk_drift_policies"),
    )


def _incidents() -> None:
    op.create_table(
        "drift_incidents",
        sa.Column("id", _BIG_ID, autoincrement=True, nullable=False),
        sa.Column("skill", sa.String(64), nullable=False),
        sa.Column("version", sa.String(64), nullable=False),
        sa.Column("group_name", sa.String(64), nullable=False),
        sa.Column("stage", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("numbers", sa.Text(), nullable=False),
        sa.Column("detail", sa.Text(), nullable=False),
        sa.Column("opened_ms", sa.BigInteger(), nullable=False),
        sa.Column("closed_ms", sa.BigInteger(), nullable=True),
        sa.Column("job_id", sa.BigInteger(), nullable=True),
        sa.Column("model_id", sa.BigInteger(), nullable=True),
        sa.Column("skill_version", sa.String(64), nullable=True),
        sa.Column("deployment_id", sa.BigInteger(), nullable=True),
        sa.Column("outcome", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_drift_incidents"),
    )
    op.create_index(
        "ix_drift_incidents_skill_version_group_name_closed_ms",
        "drift_incidents",
        ["skill", "version", "group_name", "closed_ms"],
    )
    op.create_index("ix_drift_incidents_stage", "drift_incidents", ["stage"])
    op.create_table(
        "drift_incident_stages",
        sa.Column("incident_id", _BIG_ID, nullable=False),
        sa.Column("seq", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("stage", sa.String(16), nullable=False),
        sa.Column("at_ms", sa.BigInteger(), nullable=False),
        sa.Column("note", sa.Text(), nullable=False),
        sa.ForeignKeyConstraint(
            ["incident_id"],
            ["drift_incidents.id"],
            name="fk_drift_incident_stages_incident_id_drift_incidents",
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("incident_id", "seq", name="pk_drift_incident_stages"),
    )


def downgrade() -> None:
    """Drop the tables."""
    op.drop_table("drift_policies")
    op.drop_table("drift_incident_stages")
    op.drop_index("ix_drift_incidents_stage", table_name="drift_incidents")
    op.drop_index(
        "ix_drift_incidents_skill_version_group_name_closed_ms", table_name="drift_incidents"
    )
    op.drop_table("drift_incidents")
    op.drop_index("ix_drift_samples_skill_version_id", table_name="drift_samples")
    op.drop_table("drift_samples")
    op.drop_index("ix_drift_sample_messages_received_ms", table_name="drift_sample_messages")
    op.drop_table("drift_sample_messages")
