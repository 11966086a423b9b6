"""Usage rolled up per UTC month and per project and day, back-filled from usage_daily.

A month-long usage report summed some 450,000 daily rows for 10,000 devices;
whole months now read ``usage_monthly`` and the totals ``usage_daily_totals``.
Pages of a report walk ``ix_usage_daily_by_key`` in key order.

Revision ID: 0009
Revises: 0008
Create Date: 2026-12-02
"""

from __future__ import annotations

import datetime as dt

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None

_EPOCH = dt.date(1970, 1, 1)


def _month_of(day: int) -> int:
    d = _EPOCH + dt.timedelta(days=day)
    return (d.year - 1970) * 12 + d.month - 1


def _first_day(month: int) -> int:
    year, index = divmod(month, 12)
    return (dt.date(1970 + year, index + 1, 1) - _EPOCH).days


def upgrade() -> None:
    """Create the rollups and fill them from the days folded so far."""
    op.create_index(
        "ix_usage_daily_by_key",
        "usage_daily",
        ["project", "device_id", "skill", "version", "day", "inferences", "windows"],
    )
    op.create_table(
        "usage_monthly",
        sa.Column("project", sa.String(64), nullable=False),
        sa.Column("device_id", sa.String(128), nullable=False),
        sa.Column("skill", sa.String(64), nullable=False),
        sa.Column("version", sa.String(64), nullable=False),
        sa.Column("month", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("inferences", sa.BigInteger(), nullable=False),
        sa.Column("windows", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint(
            "project", "device_id", "skill", "version", "month", name="pk_usage_monthly"
        ),
    )
    op.create_table(
        "usage_daily_totals",
        sa.Column("project", sa.String(64), nullable=False),
        sa.Column("day", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("inferences", sa.BigInteger(), nullable=False),
        sa.Column("windows", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("project", "day", name="pk_usage_daily_totals"),
    )
    op.execute(
        "INSERT INTO usage_daily_totals (project, day, inferences, windows)"
        " SELECT project, day, sum(inferences), sum(windows) FROM usage_daily"
        " GROUP BY project, day"
    )
    bind = op.get_bind()
    low, high = bind.execute(sa.text("SELECT min(day), max(day) FROM usage_daily")).one()
    if low is None:
        return
    fill = sa.text(
        "INSERT INTO usage_monthly"
        " (project, device_id, skill, version, month, inferences, windows)"
        " SELECT project, device_id, skill, version, :month, sum(inferences), sum(windows)"
        " FROM usage_daily WHERE day >= :first AND day < :end"
        " GROUP BY project, device_id, skill, version"
    )
    for month in range(_month_of(int(low)), _month_of(int(high)) + 1):
        bind.execute(
            fill, {"month": month, "first": _first_day(month), "end": _first_day(month + 1)}
        )


def downgrade() -> None:
    """Drop the rollups (usage_daily keeps every count)."""
    op.drop_table("usage_daily_totals")
    op.drop_table("usage_monthly")
    op.drop_index("ix_usage_daily_by_key", table_name="usage_daily")
