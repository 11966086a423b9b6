"""Tables of the drift loop: devices' drift samples, drift incidents and per-group policies.

They live on the store's one :data:`cloud.store.schema.metadata`, so Alembic's
comparison covers them; ``cloud/migrations/versions/0007_drift.py`` creates them.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Column,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    Table,
    Text,
)

from cloud.store.schema import ID_LEN, NAME_LEN, metadata

__all__ = [
    "drift_incident_stages",
    "drift_incidents",
    "drift_policies",
    "drift_sample_messages",
    "drift_samples",
]

_BIG_ID = BigInteger().with_variant(Integer(), "sqlite")

# One row per DriftSamples envelope stored: what makes a resend a duplicate,
# also after its samples were dropped for newer ones.
drift_sample_messages = Table(
    "drift_sample_messages",
    metadata,
    Column("msg_id", String(ID_LEN), primary_key=True),
    Column("device_id", String(ID_LEN), nullable=False),
    Column("samples", Integer, nullable=False),
    Column("received_ms", BigInteger, nullable=False),
    Index(None, "received_ms"),
)

# The samples themselves, at most a cap per skill version (the oldest go first).
drift_samples = Table(
    "drift_samples",
    metadata,
    Column("id", _BIG_ID, primary_key=True, autoincrement=True),
    Column("msg_id", String(ID_LEN), nullable=False),
    Column("device_id", String(ID_LEN), nullable=False),
    Column("skill", String(NAME_LEN), nullable=False),
    Column("version", String(NAME_LEN), nullable=False),
    Column("label", Integer, nullable=False),
    Column("predicted", Integer, nullable=False),
    Column("confidence", Float, nullable=False),
    Column("seen_at_ms", BigInteger, nullable=False),
    Column("received_ms", BigInteger, nullable=False),
    Column("shape", String(128), nullable=False),
    Column("tensor", LargeBinary, nullable=False),
    Index(None, "skill", "version", "id"),
)

drift_incidents = Table(
    "drift_incidents",
    metadata,
    Column("id", _BIG_ID, primary_key=True, autoincrement=True),
    Column("skill", String(NAME_LEN), nullable=False),
    Column("version", String(NAME_LEN), nullable=False),
    Column("group_name", String(NAME_LEN), nullable=False),
    Column("stage", String(16), nullable=False),
    Column("reason", Text, nullable=False),
    Column("numbers", Text, nullable=False),
    Column("detail", Text, nullable=False),
    Column("opened_ms", BigInteger, nullable=False),
    Column("closed_ms", BigInteger, nullable=True),
    Column("job_id", BigInteger, nullable=True),
    Column("model_id", BigInteger, nullable=True),
    Column("skill_version", String(NAME_LEN), nullable=True),
    Column("deployment_id", BigInteger, nullable=True),
    Column("outcome", Text, nullable=False),
    Index(None, "skill", "version", "group_name", "closed_ms"),
    Index(None, "stage"),
)

drift_incident_stages = Table(
    "drift_incident_stages",
    metadata,
    Column(
        "incident_id",
        BigInteger().with_variant(Integer(), "sqlite"),
        ForeignKey("drift_incidents.id", ondelete="CASCADE"),
        primary_key=True,
    ),
    Column("seq", Integer, primary_key=True, autoincrement=False),
    Column("stage", String(16), nullable=False),
    Column("at_ms", BigInteger, nullable=False),
    Column("note", Text, nullable=False),
)

drift_policies = Table(
    "drift_policies",
    metadata,
    Column("group_name", String(NAME_LEN), primary_key=True),
    Column("settings", Text, nullable=False),
    Column("updated_ms", BigInteger, nullable=False),
)
