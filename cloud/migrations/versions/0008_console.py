"""The console: projects (tenants) on devices, groups, skills and deployments; API tokens,
the audit log and metered usage.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

_BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
_TENANTED = ("devices", "device_groups", "skill_versions", "deployments")


def upgrade() -> None:
    """Put everything there is in project ``default``; create the console's tables."""
    for table in _TENANTED:
        with op.batch_alter_table(table) as batch:
            batch.add_column(
                sa.Column("project", sa.String(64), nullable=False, server_default="default")
            )
    op.create_index("ix_devices_project_device_id", "devices", ["project", "device_id"])
    op.create_table(
        "projects",
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("created_ms", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("name", name="pk_projects"),
    )
    op.execute("INSERT INTO projects (name, created_ms) VALUES ('default', 0)")
    op.create_table(
        "api_tokens",
        sa.Column("id", sa.String(32), nullable=False),
        sa.Column("name", sa.String(64), nullable=False),
        sa.Column("secret_sha256", sa.String(64), nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("project", sa.String(64), nullable=True),
        sa.Column("group_name", sa.String(64), nullable=True),
        sa.Column("created_ms", sa.BigInteger(), nullable=False),
        sa.Column("expires_ms", sa.BigInteger(), nullable=True),
        sa.Column("revoked", sa.Boolean(), nullable=False),
        sa.Column("created_by", sa.String(255), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_api_tokens"),
    )
    op.create_index("ix_api_tokens_project", "api_tokens", ["project"])
    op.create_table(
        "audit_log",
        sa.Column("id", _BIG_ID, autoincrement=True, nullable=False),
        sa.Column("at_ms", sa.BigInteger(), nullable=False),
        sa.Column("actor", sa.String(255), nullable=False),
        sa.Column("project", sa.String(64), nullable=False),
        sa.Column("action", sa.String(64), nullable=False),
        sa.Column("target", sa.String(255), nullable=False),
        sa.Column("before", sa.Text(), nullable=False),
        sa.Column("after", sa.Text(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_audit_log"),
    )
    op.create_index("ix_audit_log_project_id", "audit_log", ["project", "id"])
    op.create_index("ix_audit_log_at_ms", "audit_log", ["at_ms"])
    op.create_table(
        "usage_daily",
        sa.Column("project", sa.String(64), nullable=False),
        sa.Column("day", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("device_id", sa.String(128), nullable=False),
        sa.Column("skill", sa.String(64), nullable=False),
        sa.Column("version", sa.String(64), nullable=False),
        sa.Column("inferences", sa.BigInteger(), nullable=False),
        sa.Column("windows", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint(
            "project", "day", "device_id", "skill", "version", name="pk_usage_daily"
        ),
    )
    op.create_table(
        "metering_cursor",
        sa.Column("id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("telemetry_id", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("id", name="pk_metering_cursor"),
    )


def downgrade() -> None:
    """Drop the console's tables and the project columns."""
    op.drop_table("metering_cursor")
    op.drop_table("usage_daily")
    op.drop_index("ix_audit_log_at_ms", table_name="audit_log")
    op.drop_index("ix_audit_log_project_id", table_name="audit_log")
    op.drop_table("audit_log")
    op.drop_index("ix_api_tokens_project", table_name="api_tokens")
    op.drop_table("api_tokens")
    op.drop_table("projects")
    op.drop_index("ix_devices_project_device_id", table_name="devices")
    for table in reversed(_TENANTED):
        with op.batch_alter_table(table) as batch:
            batch.drop_column("project")
