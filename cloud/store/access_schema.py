"""Tables of the console: projects, API tokens, the audit log and metered usage.

Part of :data:`cloud.store.schema.metadata` (imported there); migration 0008
creates them, 0009 the monthly and total rollups of usage.
"""

from __future__ import annotations

from sqlalchemy import BigInteger, Boolean, Column, Index, Integer, String, Table, Text

from cloud.store.schema import _BIG_ID, ID_LEN, NAME_LEN, metadata

__all__ = [
    "api_tokens",
    "audit_log",
    "metering_cursor",
    "projects",
    "usage_daily",
    "usage_daily_totals",
    "usage_monthly",
]

# Tenants: devices, groups, skills, deployments and their data are seen only inside one.
projects = Table(
    "projects",
    metadata,
    Column("name", String(NAME_LEN), primary_key=True),
    Column("created_ms", BigInteger, nullable=False),
)

# API tokens: the secret is shown once; only its SHA-256 is kept. ``project`` NULL is a
# hub admin's token (every project); ``group_name`` NULL means the whole project.
api_tokens = Table(
    "api_tokens",
    metadata,
    Column("id", String(32), primary_key=True),
    Column("name", String(NAME_LEN), nullable=False),
    Column("secret_sha256", String(64), nullable=False),
    Column("role", String(16), nullable=False),
    Column("project", String(NAME_LEN), nullable=True),
    Column("group_name", String(NAME_LEN), nullable=True),
    Column("created_ms", BigInteger, nullable=False),
    Column("expires_ms", BigInteger, nullable=True),
    Column("revoked", Boolean, nullable=False),
    Column("created_by", String(255), nullable=False),
    Index(None, "project"),
)

# Every change, append-only: who, what, when, the record before and after (JSON text).
audit_log = Table(
    "audit_log",
    metadata,
    Column("id", _BIG_ID, primary_key=True, autoincrement=True),
    Column("at_ms", BigInteger, nullable=False),
    Column("actor", String(255), nullable=False),
    Column("project", String(NAME_LEN), nullable=False),
    Column("action", String(NAME_LEN), nullable=False),
    Column("target", String(255), nullable=False),
    Column("before", Text, nullable=False),
    Column("after", Text, nullable=False),
    Index(None, "project", "id"),
    Index(None, "at_ms"),
)

# Inference counts folded from telemetry per UTC day (days since the epoch), so that a
# usage report reads a few rows per device and day, not every telemetry window.
usage_daily = Table(
    "usage_daily",
    metadata,
    Column("project", String(NAME_LEN), primary_key=True),
    Column("day", Integer, primary_key=True, autoincrement=False),
    Column("device_id", String(ID_LEN), primary_key=True),
    Column("skill", String(NAME_LEN), primary_key=True),
    Column("version", String(NAME_LEN), primary_key=True),
    Column("inferences", BigInteger, nullable=False),
    Column("windows", BigInteger, nullable=False),
    # Pages of a report walk the keys in order and stop after a page (covering: no row reads).
    Index(
        "ix_usage_daily_by_key",
        "project",
        "device_id",
        "skill",
        "version",
        "day",
        "inferences",
        "windows",
    ),
)

# The same counts per UTC month (months since 1970-01), folded with usage_daily, so that a
# report over whole months reads one row per device, skill and month. Keyed device first:
# a report groups by device, skill and version, which is then the order rows are stored in.
usage_monthly = Table(
    "usage_monthly",
    metadata,
    Column("project", String(NAME_LEN), primary_key=True),
    Column("device_id", String(ID_LEN), primary_key=True),
    Column("skill", String(NAME_LEN), primary_key=True),
    Column("version", String(NAME_LEN), primary_key=True),
    Column("month", Integer, primary_key=True, autoincrement=False),
    Column("inferences", BigInteger, nullable=False),
    Column("windows", BigInteger, nullable=False),
)

# A project's whole usage per UTC day, folded with usage_daily: a report's totals read one
# row a day however many devices there are.
usage_daily_totals = Table(
    "usage_daily_totals",
    metadata,
    Column("project", String(NAME_LEN), primary_key=True),
    Column("day", Integer, primary_key=True, autoincrement=False),
    Column("inferences", BigInteger, nullable=False),
    Column("windows", BigInteger, nullable=False),
)

# One row (id 1): the id of the last telemetry row folded into the usage tables.
metering_cursor = Table(
    "metering_cursor",
    metadata,
    Column("id", Integer, primary_key=True, autoincrement=False),
    Column("telemetry_id", BigInteger, nullable=False),
)
